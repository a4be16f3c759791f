"""Moving a device between the host and a pod under a transit name, and putting it back from
wherever a call, a crash or the pod itself left it.

A device crosses namespaces under a transit name (`ry` + 12 random hex digits) recorded before
it is used: renamed where it is, moved, renamed where it lands. A move whose name is taken in
the target fails without moving anything, so a clash cannot leave a device half-moved, and the
kernel pays one move per crossing (decision 0047). ADD's transit name is seen by the pod as the
device arrives, so every DEL attempt crosses under a fresh one: a pod cannot squat it.

Devices are recognised by identity, never by name alone — a pod may rename its links, create
new ones under any free name and add alternative names: a link is ours if the kernel names our
PCI function as its parent; a link without a parent is never a device that had one; failing
both (veths standing in for VFs in tests), in the pod it must carry the ifindex ADD left it
with, and elsewhere the MAC recorded for it.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field

from railyard.cni import devices
from railyard.cni.netns import Link, LinkError, Links, Netns
from railyard.node.attachments import MovedDevice

log = logging.getLogger(__name__)
_DEL_NAMES_KEPT = 3  # transit names of past DEL attempts a record keeps, besides ADD's


@dataclass
class Problems:
    """Failures met while putting devices back; one message for the runtime."""

    items: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        log.warning("cni: %s", text)
        self.items.append(text)

    def __bool__(self) -> bool:
        return bool(self.items)


def owns(link: Link, d: MovedDevice, *, in_pod: bool) -> bool:
    """Is this link the recorded device, not another that took its name or its MAC?"""
    if link.parent is not None:
        return link.parent == d.pci
    if d.original_parent is not None:
        return False  # the device has a parent; a pod's veth or macvlan never does
    if in_pod and d.pod_index is not None:
        return link.index == d.pod_index
    mac = (link.mac or "").lower()
    return mac in {(d.original_mac or "").lower(), (d.mac_set or "").lower()} - {""}


def transit_name() -> str:
    """A fresh name no namespace is expected to hold (14 bytes; IFNAMSIZ allows 15)."""
    return "ry" + os.urandom(6).hex()


def fallback_name(pci: str) -> str:
    """A name for a device whose original name was taken in the host meanwhile (≤ 15 bytes)."""
    return ("ry" + pci.replace(":", "").replace(".", ""))[-15:]


def fresh_transit_name(d: MovedDevice) -> None:
    """Give a DEL attempt a name of its own; the caller records it before it is used."""
    kept = [*d.transit_names[1:], transit_name()][-_DEL_NAMES_KEPT:]
    d.transit_names = [*d.transit_names[:1], *kept]


def need(links: Links, name: str) -> Link:
    link = links.get(name)
    if link is None:
        raise LinkError("find", f"{name} in {links.netns.label}", errno.ENODEV, "vanished")
    return link


def move_in(host: Links, pod: Links, pod_ns: Netns, d: MovedDevice, *, mtu: int | None,
            mac: str | None) -> Link:
    """host (original name) → pod (pod name), up; MTU and MAC as configured."""
    link = host.get(d.original_name)
    if link is None or link.name != d.original_name or not owns(link, d, in_pod=False):
        raise LinkError("find", f"{d.original_name} ({d.pci}) in the host", errno.ENODEV,
                        "left the host namespace")
    name = d.transit_names[-1]
    if link.up:
        link = host.down(link)  # older kernels rename only a link that is down
    host.move(host.set(link, name=name, mtu=mtu, mac=mac), pod_ns)
    return pod.set(need(pod, name), name=d.ifname, up=True)


def find_in_pod(pod_links: list[Link], d: MovedDevice) -> Link | None:
    """The device among the pod's links, whatever the pod renamed it to."""
    known = {d.ifname, *d.transit_names, fallback_name(d.pci)}
    mine = [link for link in pod_links if owns(link, d, in_pod=True)]
    mine.sort(key=lambda link: link.name not in known)  # by MAC alone: prefer a known name
    return mine[0] if mine else None


def put_back(d: MovedDevice, *, pod: Links | None, pod_links: list[Link], host: Links,
             host_ns: Netns, sysfs_root: str, problems: Problems) -> None:
    """Return one device to the host; what cannot be done goes to `problems`."""
    try:
        if pod is not None:
            link = find_in_pod(pod_links, d)
            if link is not None:
                _leave_pod(pod, link, d, host_ns)
        home = None
        for name in (*reversed(d.transit_names), fallback_name(d.pci)):
            found = host.get(name)
            if found is not None and found.name == name and owns(found, d, in_pod=False):
                home = found
                break
        if home is None:
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


def _extra_altnames(link: Link, d: MovedDevice) -> list[str]:
    """Altnames the device did not have at ADD (none known for records older than that)."""
    if d.original_altnames is None:
        return []
    return [a for a in link.altnames if a not in d.original_altnames]


def _leave_pod(pod: Links, link: Link, d: MovedDevice, host_ns: Netns) -> None:
    # Names the pod gave it would follow it home, where a lookup by name matches them.
    link = pod.drop_altnames(link, _extra_altnames(link, d))
    if link.up:
        link = pod.down(link)
    # A failed rename (the pod holds the name) is a problem for this attempt only: the next
    # DEL crosses under a fresh name.
    link = pod.set(link, name=d.transit_names[-1])
    try:
        pod.move(link, host_ns)
    except LinkError as e:
        if e.errno != errno.EEXIST:
            raise
        # The host holds the name: cross under the one derived from the PCI address, the
        # node's own naming scheme, which every DEL searches for. By index, not by name.
        pod.move(pod.set(link, name=fallback_name(d.pci)), host_ns)


def restore_in_place(host: Links, link: Link, d: MovedDevice) -> None:
    """A device already in the host: its original name, MTU, MAC, altnames, flags, txqueuelen,
    group, alias and up/down state again (what the pod changed must not reach the next pod)."""
    link = host.drop_altnames(link, _extra_altnames(link, d))
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
    if d.original_altnames:
        missing = [a for a in d.original_altnames if a not in link.altnames]
        try:
            link = host.add_altnames(link, missing)
        except LinkError as e:  # taken by another link meanwhile: the device matters more
            log.warning("cni: %s: %s", d.pci, e)
    if d.original_flags is not None:
        host.restore(link, flags=d.original_flags, txqlen=d.original_txqlen,
                     group=d.original_group, alias=d.original_alias)
    host.set(link, up=d.original_up)
