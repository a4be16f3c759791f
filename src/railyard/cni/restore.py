"""Moving a device between the host and a pod under a transit name, and putting it back from
wherever a call, a crash or the pod itself left it.

A device crosses namespaces under a transit name (`ry` + 12 random hex digits) recorded before
it is used: renamed where it is, moved, renamed where it lands. A move whose name is taken in
the target fails without moving anything, so a clash cannot leave a device half-moved, and the
kernel pays one move per crossing (decision 0047). ADD's transit name is seen by the pod as the
device arrives, so every DEL attempt crosses under a fresh one: a pod cannot squat it.

Devices are recognised by identity, never by name, ifindex or MAC — a pod may rename its
links, create new ones under any free name, ifindex and MAC, and add alternative names. The
strongest identity ADD saw decides (decision 0082): the parent the kernel names; else the PCI
address the driver reports (ethtool bus_info), which no link a pod can create reports; else,
for a veth standing in for a VF, its peer, which stays in the host where no pod can put a link.
A link pulled out of the pod is checked again in the host, where nobody else renames it, before
it gets the device's name: one that fails goes back to the pod and DEL fails, the record kept.
Records written before those identities fall back to the ifindex ADD left in the pod and the
MAC.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field

from railyard.cni import devices
from railyard.cni.netns import Link, LinkError, Links, Netns
from railyard.node.attachments import MovedDevice
from railyard.topology.model import PCI_ADDRESS_RE

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


def owns(links: Links, link: Link, d: MovedDevice, *, in_pod: bool,
         host_id: int | None = None) -> bool:
    """Is this link (as `links`, its namespace's, shows it) the recorded device, not another
    that took its name, ifindex or MAC? In the pod, `host_id` is the id the pod's namespace
    gives the host's (Links.id_of), None when it gives it none."""
    if link.parent is not None:
        return link.parent == d.pci
    if d.original_parent is not None:
        return False  # the device has a parent; a pod's veth or macvlan never does
    if d.bus_info is not None:
        # By name: in the pod a rename can race this (so the host checks again).
        return links.bus_info(link) == d.bus_info
    if d.peer_index is not None:
        # The peer stayed in the host: seen from the pod it is in the namespace the pod calls
        # host_id; seen from the host, in the host (no netnsid). A pod can forge the index.
        if in_pod:
            return host_id is not None and link.link_netnsid == host_id and \
                link.link_index == d.peer_index
        return link.link_netnsid is None and link.link_index == d.peer_index
    if in_pod and d.pod_index is not None:
        return link.index == d.pod_index
    mac = (link.mac or "").lower()
    return mac in {(d.original_mac or "").lower(), (d.mac_set or "").lower()} - {""}


def identity_of(links: Links, link: Link) -> tuple[str | None, int | None]:
    """What ADD records besides the parent: the PCI address the driver reports (when it is
    one) and the ifindex of a peer or lower device in the same namespace."""
    bus = (links.bus_info(link) or "").lower()
    peer = link.link_index if link.link_netnsid is None and link.link_index not in (
        None, link.index) else None
    return (bus if PCI_ADDRESS_RE.fullmatch(bus) else None), peer


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
    if link is None or link.name != d.original_name or not owns(host, link, d, in_pod=False):
        raise LinkError("find", f"{d.original_name} ({d.pci}) in the host", errno.ENODEV,
                        "left the host namespace")
    name = d.transit_names[-1]
    if link.up:
        link = host.down(link)  # older kernels rename only a link that is down
    host.move(host.set(link, name=name, mtu=mtu, mac=mac), pod_ns)
    return pod.set(need(pod, name), name=d.ifname, up=True)


def find_in_pod(pod: Links, pod_links: list[Link], d: MovedDevice,
                host_id: int | None) -> Link | None:
    """The device among the pod's links, whatever the pod renamed it to."""
    known = {d.ifname, *d.transit_names, fallback_name(d.pci)}
    # Where ADD left it first (one bus_info ioctl, not one per link the pod made), then names
    # of ours; several match only by MAC or a raced bus_info, and the host checks again.
    likely = sorted(pod_links, key=lambda link: (link.index != d.pod_index,
                                                 link.name not in known))
    return next((link for link in likely
                 if owns(pod, link, d, in_pod=True, host_id=host_id)), None)


def put_back(d: MovedDevice, *, pod: Links | None, pod_links: list[Link], host_id: int | None,
             host: Links, host_ns: Netns, sysfs_root: str, problems: Problems) -> None:
    """Return one device to the host; what cannot be done goes to `problems`."""
    try:
        refused = None
        if pod is not None:
            link = find_in_pod(pod, pod_links, d, host_id)
            if link is not None:
                pulled = need(host, _leave_pod(pod, link, d, host_ns))
                if owns(host, pulled, d, in_pod=False):
                    restore_in_place(host, pulled, d)
                    return
                refused = (f"{link.name} (ifindex {link.index}) in the pod is not the device "
                           "ADD moved there (checked in the host); "
                           + _send_back(host, pulled, pod.netns))
        home, stranger = None, None
        for name in (*reversed(d.transit_names), fallback_name(d.pci)):
            found = host.get(name)
            if found is None or found.name != name:
                continue
            if owns(host, found, d, in_pod=False):
                home = found
                break
            if name in d.transit_names and stranger is None:
                stranger = name
        if home is None:
            now = devices.netdev_of(sysfs_root, d.pci)
            home = host.get(now) if now else None
            if home is not None and home.parent not in (None, d.pci):
                home = None
        if home is not None:
            restore_in_place(host, home, d)
        elif refused is not None:
            problems.add(f"{d.pci}: {refused}")
        elif stranger is not None:
            # Only this attachment names links so: never success while that one stays there.
            problems.add(f"{d.pci}: {stranger} in the host is not the device ADD moved, or no "
                         "longer shows it; left as it is")
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


def _leave_pod(pod: Links, link: Link, d: MovedDevice, host_ns: Netns) -> str:
    """Move the link into the host under this attempt's transit name; the name it has there."""
    # Names the pod gave it would follow it home, where a lookup by name matches them.
    link = pod.drop_altnames(link, _extra_altnames(link, d))
    if link.up:
        link = pod.down(link)
    # A failed rename (the pod holds the name) is a problem for this attempt only: the next
    # DEL crosses under a fresh name.
    link = pod.set(link, name=d.transit_names[-1])
    try:
        pod.move(link, host_ns)
        return link.name
    except LinkError as e:
        if e.errno != errno.EEXIST:
            raise
        # The host holds the name: cross under the one derived from the PCI address, the
        # node's own naming scheme, which every DEL searches for. By index, not by name.
        link = pod.set(link, name=fallback_name(d.pci))
        pod.move(link, host_ns)
        return link.name


def _send_back(host: Links, link: Link, pod_ns: Netns) -> str:
    """A link that came out of the pod but is not the device goes back, under a name the pod
    has not seen (it saw the transit name leave, and could squat it to keep the link here);
    what became of it, for the error."""
    link = host.set(link, name=transit_name())
    try:
        host.move(link, pod_ns)
    except LinkError as e:
        return f"it stays in the host, down, as {link.name}: {e.reason}"
    return f"it is back in the pod as {link.name}"


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
