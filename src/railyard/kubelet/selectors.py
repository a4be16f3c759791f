"""Device-pool selectors: which VFs and PFs a plugin offers, in sriov-network-device-plugin's
vocabulary (`vendors`, `devices`, `drivers`, `pfNames`, `linkTypes`), so operators can carry
their rules over.

A device is offered when it matches any selector of its pool; within a selector every given
field must match, and a field matches when any of its values does. No selectors: every RDMA
device is offered. The agent's config file parses them (`railyard.agent.config`); the
inventory applies them (`railyard.kubelet.inventory`). Pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What a selector can look at for one PCI function (a VF or a PF)."""

    pci_address: str
    vendor: str | None  # "15b3", no 0x
    device: str | None  # "101e"
    driver: str | None
    pf_netdev: str | None  # the PF's netdev (the PF's own for a PF)
    vf_index: int | None  # None for a PF
    link_type: str | None  # sysfs link_layer: "InfiniBand" | "Ethernet"


@dataclass(frozen=True, slots=True)
class PfName:
    """`ibp24s0` (every VF) or `ibp24s0#0-3` (VFs 0 to 3, sriov-dp's range form)."""

    name: str
    first_vf: int | None = None
    last_vf: int | None = None

    def matches(self, facts: DeviceFacts) -> bool:
        if facts.pf_netdev != self.name:
            return False
        if self.first_vf is None or facts.vf_index is None:
            return True
        return self.first_vf <= facts.vf_index <= (self.last_vf or self.first_vf)


@dataclass(frozen=True, slots=True)
class Selector:
    vendors: frozenset[str] = frozenset()
    devices: frozenset[str] = frozenset()
    drivers: frozenset[str] = frozenset()
    pf_names: tuple[PfName, ...] = ()
    link_types: frozenset[str] = frozenset()  # sysfs link_layer values

    def matches(self, facts: DeviceFacts) -> bool:
        if self.vendors and facts.vendor not in self.vendors:
            return False
        if self.devices and facts.device not in self.devices:
            return False
        if self.drivers and facts.driver not in self.drivers:
            return False
        if self.pf_names and not any(p.matches(facts) for p in self.pf_names):
            return False
        return not (self.link_types and facts.link_type not in self.link_types)


def offered(selectors: tuple[Selector, ...], facts: DeviceFacts) -> bool:
    """No selectors offer everything; otherwise any one matching selector does."""
    return not selectors or any(s.matches(facts) for s in selectors)
