"""How a pod's Railyard interfaces are named: one rule for the CNI that names them and the
device plugin that tells the container what they will be called.

The NIC at position *i* of the pod's NICs (paired ones in pair order, then unpaired ones:
`Allocation.all_nics`, what the CNI moves) takes the attachment's interface name for
*i* = 0 and `<name>-<i>` after it: `net1`, `net1-1`, `net1-2`, … Multus names a pod's first
secondary network `net1`, which is what the device plugin assumes unless told otherwise.
"""

from __future__ import annotations

import re

IFNAMSIZ_BYTES = 15  # the kernel's limit on an interface name (IFNAMSIZ less its NUL)
# What dev_valid_name refuses, and what no tool should print: '/', ':', space, '%' (a format
# for the kernel), control characters. Searched, not matched: any one of them refuses.
_BAD = re.compile(r"[/:\s%\x00-\x1f\x7f]")

DEFAULT_POD_IFNAME = "net1"  # Multus's name for a pod's first secondary network


def pod_ifname(base: str, position: int) -> str:
    """The name of the pod's NIC at `position` (0-based) when the attachment is `base`."""
    return base if position == 0 else f"{base}-{position}"


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

