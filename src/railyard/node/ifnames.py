"""How a pod's Railyard interfaces are named: one rule for the CNI that names them and the
device plugin that tells the container what they will be called (docs/cni.md, "Interface
names").

Two schemes. `sequential`, the default: the NIC at position *i* of the pod's NICs (paired ones
in pair order, then unpaired ones: `Allocation.all_nics`, what the CNI moves) takes the
attachment's interface name for *i* = 0 and `<name>-<i>` after it: `net1`, `net1-1`, `net1-2`,
… Multus names a pod's first secondary network `net1`, which is what the device plugin assumes
unless told otherwise. `gpu-index`, opt-in: the NIC of pair *i* (the pod's GPU *i*) is
`rdma<i>`, the same on every node; a NIC several pairs share takes its first pair's name; the
NICs paired with no GPU are `rdmau0`, `rdmau1`, … in their order (decision 0086).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from railyard.allocation.types import Allocation

IFNAMSIZ_BYTES = 15  # the kernel's limit on an interface name (IFNAMSIZ less its NUL)
# What dev_valid_name refuses, and what no tool should print: '/', ':', space, '%' (a format
# for the kernel), control characters. Searched, not matched: any one of them refuses.
_BAD = re.compile(r"[/:\s%\x00-\x1f\x7f]")

DEFAULT_POD_IFNAME = "net1"  # Multus's name for a pod's first secondary network

SEQUENTIAL = "sequential"  # net1, net1-1, …: the attachment's name, then numbered
GPU_INDEX = "gpu-index"  # rdma<pair index>, then rdmau<j> for NICs paired with no GPU
IFNAME_SCHEMES = (SEQUENTIAL, GPU_INDEX)
GPU_INDEX_PREFIX = "rdma"
UNPAIRED_PREFIX = "rdmau"  # never reads as a GPU's: `rdmau0` is no pair's NIC


def pod_ifname(base: str, position: int) -> str:
    """The name of the pod's NIC at `position` (0-based) when the attachment is `base`."""
    return base if position == 0 else f"{base}-{position}"


def nic_pair_indexes(alloc: Allocation) -> tuple[int | None, ...]:
    """For each NIC of `alloc.all_nics`, the index of the first pair holding it; None for a
    NIC paired with no GPU."""
    first: dict[str, int] = {}
    for i, p in enumerate(alloc.pairs):
        first.setdefault(p.nic.pci_address, i)
    return tuple(first.get(n.pci_address) for n in alloc.all_nics)


def pod_ifnames(pair_indexes: Sequence[int | None], scheme: str = SEQUENTIAL,
                base: str = DEFAULT_POD_IFNAME) -> tuple[str, ...]:
    """The names of the pod's NICs in `all_nics` order, given each one's first pair index
    (`nic_pair_indexes`). `base` names them under `sequential` only."""
    if scheme == SEQUENTIAL:
        return tuple(pod_ifname(base, i) for i in range(len(pair_indexes)))
    if scheme != GPU_INDEX:
        raise ValueError(f"unknown interface name scheme {scheme!r}: expected "
                         f"{' or '.join(IFNAME_SCHEMES)}")
    names: list[str] = []
    unpaired = 0
    for index in pair_indexes:
        if index is None:
            names.append(f"{UNPAIRED_PREFIX}{unpaired}")
            unpaired += 1
        else:
            names.append(f"{GPU_INDEX_PREFIX}{index}")
    return tuple(names)


def allocation_ifnames(alloc: Allocation, scheme: str = SEQUENTIAL,
                       base: str = DEFAULT_POD_IFNAME) -> dict[str, str]:
    """NIC PCI address → its name in the pod, for every NIC of `alloc`."""
    names = pod_ifnames(nic_pair_indexes(alloc), scheme, base)
    return {n.pci_address: name for n, name in zip(alloc.all_nics, names, strict=True)}


def ifname_problem(name: str, max_bytes: int = IFNAMSIZ_BYTES) -> str | None:
    """Why `name` is not an interface name Linux takes (dev_valid_name), at most `max_bytes`
    long in UTF-8; None when it is one. A name that is not UTF-8 is the caller's to refuse."""
    if not name:
        return "is empty"
    if len(name.encode("utf-8", "surrogateescape")) > max_bytes:
        return f"is longer than {max_bytes} bytes"
    if name in (".", "..") or _BAD.search(name):
        return "is not a valid interface name"
    return None

