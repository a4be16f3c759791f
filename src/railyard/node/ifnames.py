"""How a pod's Railyard interfaces are named: one rule for the CNI that names them and the
device plugin that tells the container what they will be called.

The NIC at position *i* of the pod's NICs (paired ones in pair order, then unpaired ones:
`Allocation.all_nics`, what the CNI moves) takes the attachment's interface name for
*i* = 0 and `<name>-<i>` after it: `net1`, `net1-1`, `net1-2`, … Multus names a pod's first
secondary network `net1`, which is what the device plugin assumes unless told otherwise.
"""

from __future__ import annotations

DEFAULT_POD_IFNAME = "net1"  # Multus's name for a pod's first secondary network


def pod_ifname(base: str, position: int) -> str:
    """The name of the pod's NIC at `position` (0-based) when the attachment is `base`."""
    return base if position == 0 else f"{base}-{position}"
