"""Railyard's DRA driver name and its devices' names in ResourceSlices and claim results: the
one rule every component that meets a claim derives them by (decision 0109). Pure."""

from __future__ import annotations

DRIVER = "railyard.dev"  # the driver name in our ResourceSlices and in claims' results


def device_name(pci_address: str) -> str:
    """A slice device's name for a PCI function: a DNS label (`0000:3b:00.2` →
    `pci-0000-3b-00-2`)."""
    return "pci-" + pci_address.lower().replace(":", "-").replace(".", "-")
