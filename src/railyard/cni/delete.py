"""CNI DEL: every device of the attachment back in the host as it was, IPAM released, the
record forgotten. Idempotent: an attachment never added, or already deleted, is success. An
incomplete DEL keeps the record and fails, so the runtime retries it (GC calls it too).
"""

from __future__ import annotations

from railyard.cni import moves, records
from railyard.cni.context import NodeContext
from railyard.cni.spec import Call, CniError, Code, NetConf
from railyard.node.attachments import AttachmentRecord


def delete(node: NodeContext, call: Call, conf: NetConf) -> None:
    # The attachment's lock first: an ADD of it still running (a runtime that gave up on it
    # sends DEL) has written its record, or failed, by the time this DEL reads.
    with records.hold(node, conf.name, call.container_id, call.ifname):
        rec = node.store.load(conf.name, call.container_id, call.ifname)
        if rec is None:
            return None  # never added, or already deleted: success (DEL is idempotent)
        delete_record(node, rec, call.path)
    return None


def delete_record(node: NodeContext, rec: AttachmentRecord, path: tuple[str, ...]) -> None:
    """Put back what `rec` moved and forget it; CniError (code 104) when something stays.
    The caller holds the attachment's lock (records.hold)."""
    with records.lock(node, [d.pci for d in rec.devices]):
        # Read again under the locks: an ADD still running when this call read the record
        # has since finished it (its IPAM calls, its device-info files), or a DEL has.
        found = node.store.load(rec.network, rec.container_id, rec.ifname)
        if found is None:
            return
        rec = found
        pod_ns = records.open_recorded(rec)
        try:
            problems = moves.put_all_back(node, rec, pod_ns, path)
        finally:
            if pod_ns is not None:
                pod_ns.close()
        if problems:
            node.store.save(rec)
            raise CniError(Code.MOVE_FAILED,
                           f"DEL of ({rec.container_id}, {rec.ifname}) incomplete",
                           "; ".join(problems.items))
        records.forget(node, rec)
