"""CNI GC (1.1.0): every attachment of the network not in `cni.dev/valid-attachments` deleted,
in-use notes that protect nothing dropped, and each IPAM plugin told which leases to keep.
"""

from __future__ import annotations

from railyard.cni import addresses, records
from railyard.cni.context import NodeContext
from railyard.cni.delete import delete_record
from railyard.cni.netns import netns_identity
from railyard.cni.spec import (
    VALID_ATTACHMENTS,
    VALID_ATTACHMENTS_OLD,
    Call,
    CniError,
    Code,
    NetConf,
)
from railyard.node.attachments import DeviceBusy, InUse
from railyard.node.errors import StateError

NOTE_LOCK_S = 1.0  # GC waits this long for a device's lock before leaving its note for later


def gc(node: NodeContext, call: Call, conf: NetConf) -> None:
    if conf.valid_attachments is None:
        # Read as "none is valid" it would tear down every attachment of the network.
        raise CniError(Code.INVALID_CONFIG,
                       f"GC needs {VALID_ATTACHMENTS} (the attachments to keep); "
                       "nothing was removed")
    valid = {(a.container_id, a.ifname) for a in conf.valid_attachments}
    # IPAM ran once per interface under that interface's own name: it must hear those.
    keep = [{"containerID": a.container_id, "ifname": a.ifname}
            for a in conf.valid_attachments]
    problems = []
    for rec in node.store.records(conf.name):
        if (rec.container_id, rec.ifname) in valid:
            keep.extend({"containerID": rec.container_id, "ifname": d.ifname}
                        for d in rec.devices if d.ifname != rec.ifname)
            continue
        try:
            with records.hold(node, rec.network, rec.container_id, rec.ifname):
                delete_record(node, rec, call.path)
        except (CniError, StateError) as e:
            err = e if isinstance(e, CniError) else records.state_failure(e)
            problems.append(f"{err.msg}: {err.details}")
    for pci, note in node.store.in_use_notes():
        # A note whose attachment is gone and whose namespace died protects nothing.
        if note.network == conf.name and \
                node.store.load(note.network, note.container_id, note.ifname) is None and \
                (note.netns_id is None or netns_identity(note.netns) != tuple(note.netns_id)):
            _drop_note(node, pci, note)
    for spec in addresses.distinct_ipams(conf):
        exe = node.ipam.find(spec["type"], call.path)
        node.ipam.gc_or_status(exe, "GC", conf.raw, spec, call.path,
                               {VALID_ATTACHMENTS: keep, VALID_ATTACHMENTS_OLD: keep})
    if problems:
        raise CniError(Code.MOVE_FAILED, "GC incomplete", "; ".join(problems))
    return None


def _drop_note(node: NodeContext, pci: str, note: InUse) -> None:
    """Drop the note found stale, unless it changed since it was read: an ADD (holding the
    device's lock) may have noted the device for a live attachment in between."""
    try:
        with node.store.lock_devices([pci], NOTE_LOCK_S):
            if node.store.load(note.network, note.container_id, note.ifname) is None:
                node.store.drop_in_use(pci, note)
    except DeviceBusy:
        pass  # a call is using the device now; the next GC decides on the note again
