"""Moving a device between the host and a pod under a transit name, and putting it back from
wherever a call or a crash left it.

A device crosses namespaces under its transit name (`ry` + 12 random hex digits, chosen and
recorded before anything moves): renamed where it is, moved, renamed where it lands. A move
whose name is taken in the target fails without moving anything, so a clash cannot leave a
device half-moved, and the kernel pays one move per crossing (decision 0047).

A device may therefore be in the pod (under its pod name or its transit name), in the host
under its transit name, or in the host under whatever name sysfs gives it (never moved; or
returned by the kernel when its namespace died).
A link found by name is taken as ours only if it is: the kernel names a real NIC's parent PCI
device, and a device without one must carry the MAC recorded for it. Used by ADD, DEL, GC and
the rollback of a failed ADD.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field

from railyard.cni import devices
from railyard.cni.cache import MovedDevice
from railyard.cni.netns import Link, LinkError, Links, Netns

log = logging.getLogger(__name__)


@dataclass
class Problems:
    """Failures met while putting devices back; one message for the runtime."""

    items: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        log.warning("cni: %s", text)
        self.items.append(text)

    def __bool__(self) -> bool:
        return bool(self.items)


def owns(link: Link, d: MovedDevice) -> bool:
    """Is this link the recorded device, not another that took its name?"""
    if link.parent is not None:
        return link.parent == d.pci
    mac = (link.mac or "").lower()
    return mac in {(d.original_mac or "").lower(), (d.mac_set or "").lower()} - {""}


def transit_name() -> str:
    """A fresh name no namespace is expected to hold (14 bytes; IFNAMSIZ allows 15)."""
    return "ry" + os.urandom(6).hex()


def fallback_name(pci: str) -> str:
    """A name for a device whose original name was taken in the host meanwhile (≤ 15 bytes)."""
    return ("ry" + pci.replace(":", "").replace(".", ""))[-15:]


def need(links: Links, name: str) -> Link:
    link = links.get(name)
    if link is None:
        raise LinkError("find", f"{name} in {links.netns.label}", errno.ENODEV, "vanished")
    return link


def cross(source: Links, link: Link, name: str, target: Netns, *, mtu: int | None = None,
          mac: str | None = None) -> None:
    """Rename `link` to `name` where it is (setting MTU/MAC on the way), then move it to
    `target`. Either step failing leaves it in `source`, where the caller's undo finds it."""
    if link.up and link.name != name:
        link = source.down(link)  # the kernel renames only a link that is down
    link = source.set(link, name=name, mtu=mtu, mac=mac)
    source.move(link, target)


def move_in(host: Links, pod: Links, pod_ns: Netns, d: MovedDevice, *, mtu: int | None,
            mac: str | None) -> Link:
    """host (original name) → pod (pod name), up; MTU and MAC as configured."""
    assert d.transit_name is not None
    link = host.get(d.original_name)
    if link is None or not owns(link, d):
        raise LinkError("find", f"{d.original_name} ({d.pci}) in the host", errno.ENODEV,
                        "left the host namespace")
    cross(host, link, d.transit_name, pod_ns, mtu=mtu, mac=mac)
    return pod.set(need(pod, d.transit_name), name=d.ifname, up=True)


def put_back(d: MovedDevice, *, pod: Links | None, host: Links, host_ns: Netns,
             sysfs_root: str, problems: Problems) -> None:
    """Return one device to the host; what cannot be done goes to `problems`."""
    assert d.transit_name is not None
    try:
        if pod is not None:
            for name in (d.ifname, d.transit_name):
                found = pod.get(name)
                if found is not None and owns(found, d):
                    _leave_pod(pod, found, d, host_ns)
                    break
        home = host.get(d.transit_name)
        if home is None or not owns(home, d):
            now = devices.netdev_of(sysfs_root, d.pci)
            home = host.get(now) if now else None
            if home is not None and home.parent not in (None, d.pci):
                home = None
        if home is not None:
            restore_in_place(host, home, d)
        elif pod is not None:
            problems.add(f"{d.pci}: found neither in the pod nor in the host")
        # else: gone with its namespace (a veth dies with it) or held elsewhere.
    except LinkError as e:
        problems.add(f"{d.pci}: {e}")


def _leave_pod(pod: Links, link: Link, d: MovedDevice, host_ns: Netns) -> None:
    assert d.transit_name is not None
    try:
        cross(pod, link, d.transit_name, host_ns)
    except LinkError as e:
        if e.errno != errno.EEXIST:
            raise
        # Something in the host holds the transit name: the one derived from the PCI address
        # is the node's own naming scheme, unlikely to be taken as well.
        cross(pod, need(pod, d.transit_name), fallback_name(d.pci), host_ns)
        d.transit_name = fallback_name(d.pci)


def restore_in_place(host: Links, link: Link, d: MovedDevice) -> None:
    """A device already in the host: its original name, MTU, MAC and state again."""
    if link.name != d.original_name:
        link = host.down(link)
    try:
        link = host.set(link, name=d.original_name, mtu=d.original_mtu, mac=d.original_mac)
    except LinkError as e:
        if e.errno != errno.EEXIST:
            raise
        # Back in the host matters more than its name: use one derived from the PCI address
        # (discovery finds devices by address anyway) and say so in the log.
        other = fallback_name(d.pci)
        link = host.set(link, name=other, mtu=d.original_mtu, mac=d.original_mac)
        log.warning("cni: %s: its name %s was taken in the host meanwhile; it is back as %s",
                    d.pci, d.original_name, other)
    host.set(link, up=d.original_up)
