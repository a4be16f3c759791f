"""An attachment's record across the verbs: its devices' locks, a new record for ADD, the pod's
namespace it names (if still that one), and forgetting it. The record itself, its in-use notes
and the locks are node state (`railyard.node.attachments`); this is the CNI's use of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from railyard.cni.context import NodeContext
from railyard.cni.grants import Grant
from railyard.cni.netns import Netns, NetnsError, netns_identity
from railyard.cni.spec import Call, CniError, Code, NetConf
from railyard.node.attachments import AttachmentBusy, AttachmentRecord, DeviceBusy, InUse
from railyard.node.errors import StateError
from railyard.node.locks import FileLocks


def state_failure(e: StateError) -> CniError:
    """The node's state folder could not be read or written: an I/O failure (code 5)."""
    return CniError(Code.IO, str(e))


@contextlib.contextmanager
def hold(node: NodeContext, network: str, container_id: str, ifname: str) -> Iterator[None]:
    """The attachment's lock for the caller's `with`, taken before any device lock: an ADD
    holds it until it answers, DEL and GC before they read the record, so a DEL never answers
    "never added" while an ADD of the attachment is still running. Busy past the timeout:
    code 11."""
    held = contextlib.ExitStack()
    try:
        held.enter_context(node.store.lock_attachment(
            network, container_id, ifname, node.settings.attachment_lock_timeout_s))
    except AttachmentBusy as e:
        raise CniError(Code.TRY_AGAIN, e.reason) from None
    with held:
        yield


def lock(node: NodeContext, pcis: list[str]) -> FileLocks:
    """The devices' locks, held by the caller's `with`; busy past the timeout: code 11."""
    try:
        return node.store.lock_devices(pcis, node.settings.lock_timeout_s)
    except DeviceBusy as e:
        raise CniError(Code.TRY_AGAIN, e.reason) from None


def new_record(call: Call, conf: NetConf, pod_ns: Netns, grant: Grant) -> AttachmentRecord:
    """ADD's record before any device is planned: the call, the pod and its namespace."""
    return AttachmentRecord(
        network=conf.name, container_id=call.container_id, ifname=call.ifname,
        netns=call.netns, netns_id=pod_ns.identity(), pod_uid=grant.pod.uid,
        pod_namespace=grant.pod.namespace, pod_name=grant.pod.name,
        cni_args=call.args_text, cni_path=list(call.path),
        ipam_conf={k: v for k, v in conf.raw.items() if k != "prevResult"},
    )


def in_use_note(rec: AttachmentRecord) -> InUse:
    """What each of the record's devices is noted as held by."""
    return InUse(network=rec.network, container_id=rec.container_id, ifname=rec.ifname,
                 netns=rec.netns, netns_id=rec.netns_id)


def open_recorded(rec: AttachmentRecord) -> Netns | None:
    """The pod's namespace if the recorded path still names the same namespace."""
    if rec.netns_id is None or netns_identity(rec.netns) != tuple(rec.netns_id):
        return None
    try:
        return Netns.open(rec.netns)
    except NetnsError:
        return None


def forget(node: NodeContext, rec: AttachmentRecord) -> None:
    """The record and its devices' in-use notes gone: every device is back."""
    for d in rec.devices:
        node.store.clear_in_use(d.pci, rec)
    node.store.remove(rec)
