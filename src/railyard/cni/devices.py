"""Where a granted PCI function's netdev and RDMA device are now, read from sysfs.

Devices are named by PCI address, never by netdev name: a netdev's name changes when it moves
or is renamed, its PCI address does not. `<root>/sys/bus/pci/devices/<pci>/net/` lists the
function's netdevs in the namespace that mounted sysfs (the host's), so a VF inside a pod is
simply absent there.
"""

from __future__ import annotations

import os

from railyard.cni.spec import CniError, Code
from railyard.topology.model import PCI_ADDRESS_RE


def _function_dir(sysfs_root: str, pci: str) -> str:
    if not PCI_ADDRESS_RE.fullmatch(pci):  # never let a recorded value walk the file system
        raise CniError(Code.IO, f"node state store: {pci!r} is not a PCI address")
    return os.path.join(sysfs_root, "sys", "bus", "pci", "devices", pci)


def _only_entry(folder: str) -> str | None:
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    return names[0] if names else None


def netdev_of(sysfs_root: str, pci: str) -> str | None:
    """The function's netdev in the host namespace (the first by name if it has several)."""
    return _only_entry(os.path.join(_function_dir(sysfs_root, pci), "net"))


def rdma_device_of(sysfs_root: str, pci: str) -> str | None:
    return _only_entry(os.path.join(_function_dir(sysfs_root, pci), "infiniband"))
