"""An attachment's devices between the host and the pod: checked and noted before ADD moves
them, moved in (RDMA device first, in exclusive mode), and all put back (by DEL, GC, or ADD's
rollback) from wherever a call, a crash or the pod left them. One device's crossing is
restore.py's; this is the whole attachment's.
"""

from __future__ import annotations

import contextlib
import os

from railyard.allocation.types import NicRef
from railyard.cni import addresses, devices
from railyard.cni.context import NodeContext
from railyard.cni.netns import (
    RESTORED_FLAGS,
    Link,
    LinkError,
    Links,
    NetlinkFailure,
    Netns,
    netns_identity,
)
from railyard.cni.rdma import RdmaError
from railyard.cni.restore import (
    Problems,
    fresh_transit_name,
    identity_of,
    move_in,
    put_back,
    transit_name,
)
from railyard.cni.spec import CniError, Code, NetConf
from railyard.node.attachments import AttachmentRecord, MovedDevice


def plan_device(node: NodeContext, host: Links, nic: NicRef, name: str, i: int, conf: NetConf,
                rec: AttachmentRecord) -> MovedDevice:
    """Check one granted device is free and in the host namespace; note its originals."""
    pci = nic.pci_address
    note = node.store.in_use(pci)
    if note is not None and (note.network, note.container_id, note.ifname) != (
            rec.network, rec.container_id, rec.ifname) and note.netns_id is not None and \
            netns_identity(note.netns) == tuple(note.netns_id):
        raise CniError(Code.DEVICE_UNAVAILABLE,
                       f"{nic.kind.upper()} {pci} is in use by container "
                       f"{note.container_id} ({note.ifname}) whose network namespace "
                       f"{note.netns} still exists")
    sysfs_root = node.settings.sysfs_root
    netdev = devices.netdev_of(sysfs_root, pci)
    link = host.get(netdev) if netdev else None
    if link is None:
        raise CniError(Code.DEVICE_UNAVAILABLE,
                       f"{nic.kind.upper()} {pci} has no netdev in the host network "
                       "namespace (held by another pod, or its driver is not bound)")
    if link.parent is not None and sysfs_root == "/" and link.parent != pci:
        # The kernel names the netdev's parent device: believe it over a path lookup.
        raise CniError(Code.DEVICE_UNAVAILABLE,
                       f"netdev {link.name} belongs to {link.parent}, not to {pci}")
    bus_info, peer_index = identity_of(host, link)
    if link.parent is None and bus_info not in (None, pci) and sysfs_root == "/":
        raise CniError(Code.DEVICE_UNAVAILABLE,
                       f"netdev {link.name} belongs to {bus_info}, not to {pci}")
    ifc = conf.interface(i)
    # Only sysfs says which RDMA device is this function's: a name from the record (which
    # a pod's own annotation can seed) could be another pod's device.
    rdma_dev = devices.rdma_device_of(sysfs_root, pci)
    return MovedDevice(
        pci=pci, kind=nic.kind, ifname=name, original_name=link.name,
        original_mac=link.mac, original_mtu=link.mtu, original_up=link.up, mac_set=ifc.mac,
        rdma_device=rdma_dev, ipam_type=ifc.ipam["type"] if ifc.ipam else None,
        original_parent=link.parent, bus_info=bus_info, peer_index=peer_index,
        original_altnames=list(link.altnames),
        original_flags=link.flags & RESTORED_FLAGS, original_txqlen=link.txqlen,
        original_group=link.group, original_alias=link.alias,
        transit_names=[transit_name()],
    )


def move_all_in(node: NodeContext, host: Links, pod: Links, pod_ns: Netns,
                rec: AttachmentRecord, conf: NetConf) -> dict[str, Link]:
    """Each device host → pod under its transit name, then named, configured and up."""
    out = {}
    for i, d in enumerate(rec.devices):
        if d.rdma_device and node.rdma_mode == "exclusive":
            # Before the netdev: an IPoIB netdev may only follow its RDMA device. Noted
            # first: a crash after the move must leave a record that undoes it (the undo
            # checks where the device is, so a note without the move is harmless).
            d.rdma_moved = True
            node.store.save(rec)
            node.rdma.move(d.rdma_device, node.host, pod_ns)
        ifc = conf.interface(i)
        out[d.ifname] = move_in(host, pod, pod_ns, d, mtu=ifc.mtu, mac=ifc.mac)
        d.pod_index = out[d.ifname].index  # on disk with the record's next save
    return out


def put_all_back(node: NodeContext, rec: AttachmentRecord, pod_ns: Netns | None,
                 path: tuple[str, ...], host: Links | None = None,
                 pod: Links | None = None) -> Problems:
    """Every device back in the host under its original name, MAC and MTU; IPAM released.

    Works from whatever state a crash (or the pod) left: each device is looked for among
    the pod's links by identity, in the host under a transit or fallback name, or wherever
    sysfs says its netdev is now.
    """
    problems = Problems()
    for d in rec.devices:
        fresh_transit_name(d)
    node.store.save(rec)  # this attempt's names, on disk before any is used
    # IPAM DEL runs while the devices move back (both are slow, neither needs the other).
    releases = addresses.release(node, rec, path or tuple(rec.cni_path))
    with contextlib.ExitStack() as stack:
        if host is None:
            host = stack.enter_context(node.host.links())
        if pod is None and pod_ns is not None:
            pod = stack.enter_context(pod_ns.links())
        pod_links = _links_or_none(pod, problems)
        host_id = _host_id(pod, node.host, problems) if pod_links is not None else None
        for d in reversed(rec.devices):
            put_back(d, pod=pod if pod_links is not None else None,
                     pod_links=pod_links or [], host_id=host_id, host=host, host_ns=node.host,
                     sysfs_root=node.settings.sysfs_root, problems=problems)
            if d.rdma_moved:
                _rdma_back(node, d, pod_ns, problems)
                if not d.rdma_moved:
                    node.store.save(rec)  # a crash later must not move it "back" again
    for d, f in releases:
        try:
            f.result()
            d.ipam_started = False
        except CniError as e:
            problems.add(e.msg)
    for d in rec.devices:
        if d.device_info_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(d.device_info_path)
            d.device_info_path = None
    return problems


def _links_or_none(pod: Links | None, problems: Problems) -> list[Link] | None:
    """The pod's links, one dump for every device; None (and a problem, so DEL is retried
    rather than answered) when the pod's namespace cannot be listed."""
    if pod is None:
        return None
    try:
        return pod.all()
    except (NetlinkFailure, OSError) as e:
        problems.add(f"listing the links of {pod.netns.label}: {e}")
        return None


def _host_id(pod: Links | None, host: Netns, problems: Problems) -> int | None:
    """The id the pod's namespace gives the host's: a link there whose peer is in the host
    names it so (asked after the dump, which assigns one where such a peer exists)."""
    if pod is None:
        return None
    try:
        return pod.id_of(host)
    except LinkError as e:
        problems.add(str(e))
        return None


def _rdma_back(node: NodeContext, d: MovedDevice, pod_ns: Netns | None,
               problems: Problems) -> None:
    """The device's RDMA device home; done already (a repeated DEL) counts as done."""
    if pod_ns is None:
        d.rdma_moved = False  # the kernel returns an RDMA device when its netns dies
        return
    device = d.rdma_device or ""
    try:
        if not node.rdma.holds(device, node.host):
            node.rdma.move(device, pod_ns, node.host)
        d.rdma_moved = False
    except RdmaError as e:
        problems.add(str(e))
