"""Putting a device back: wherever a call or a crash left it, into the host namespace under its
original name, MAC and MTU.

A device may be in the pod (under its pod name), in a temporary namespace (under either name),
or already in the host (never moved; or returned by the kernel when its namespace died, under
whatever name the kernel chose — sysfs knows it by PCI address). A link found by name is taken
as ours only if it is: the kernel names a real NIC's parent PCI device, and a device without
one must carry the MAC recorded for it. Used by DEL, GC and the rollback of a failed ADD.
"""

from __future__ import annotations

import errno
import logging
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


def fallback_name(pci: str) -> str:
    """A name for a device whose original name was taken in the host meanwhile (≤ 15 bytes)."""
    return ("ry" + pci.replace(":", "").replace(".", ""))[-15:]


def need(links: Links, name: str) -> Link:
    link = links.get(name)
    if link is None:
        raise LinkError("find", f"{name} in {links.netns.label}", errno.ENODEV, "vanished")
    return link


def put_back(d: MovedDevice, *, pod: Links | None, staging: Links, tmp: Netns, host: Links,
             host_ns: Netns, sysfs_root: str, problems: Problems) -> None:
    """Return one device to the host; what cannot be done goes to `problems`."""
    try:
        link, where = None, None
        for links, name in ((staging, d.ifname), (staging, d.original_name), (pod, d.ifname)):
            found = links.get(name) if links is not None else None
            if found is not None and owns(found, d):
                link, where = found, links
                break
        if where is pod and pod is not None and link is not None:
            pod.move(link, tmp)  # the kernel takes it down on the way
            link = need(staging, d.ifname)
        if link is None:
            now = devices.netdev_of(sysfs_root, d.pci)
            home = host.get(now) if now else None
            if home is not None and home.parent not in (None, d.pci):
                home = None
            if home is not None:
                restore_in_place(host, home, d)
            elif pod is not None:
                problems.add(f"{d.pci}: found neither in the pod nor in the host")
            # else: gone with its namespace (a veth dies with it) or held elsewhere.
            return
        link = staging.set(link, name=d.original_name, mtu=d.original_mtu, mac=d.original_mac)
        try:
            staging.move(link, host_ns)
        except LinkError as e:
            if e.errno != errno.EEXIST:
                raise
            # Back in the host matters more than its name: use one derived from the PCI
            # address (discovery finds devices by address anyway) and say so in the log.
            other = fallback_name(d.pci)
            staging.move(staging.set(link, name=other), host_ns)
            log.warning("cni: %s: its name %s was taken in the host meanwhile; it is back as %s",
                        d.pci, d.original_name, other)
            return
        back = host.get(d.original_name)
        if back is not None and d.original_up:
            host.set(back, up=True)
    except LinkError as e:
        problems.add(f"{d.pci}: {e}")


def restore_in_place(host: Links, link: Link, d: MovedDevice) -> None:
    """A device already in the host: its original name, MTU, MAC and state again."""
    if link.name != d.original_name:
        link = host.down(link)
    link = host.set(link, name=d.original_name, mtu=d.original_mtu, mac=d.original_mac)
    host.set(link, up=d.original_up)
