"""The cluster from the API server: NodeTopology CRs become the ClusterState's nodes, the pods'
`railyard.dev/allocation` annotations its ledger, and a bind is recorded on the pod (one
`pods/binding` carrying the annotation). The cluster-file mode's source and writer, on a real
cluster (issue 15, docs/decisions/0073).

Both watches feed one `ClusterSync`, whose handlers are synchronous and run on the extender's
loop, so a change is applied between two filter calls, never inside one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import os
from collections.abc import Callable
from typing import Any

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from railyard.allocation.jobs import job_of
from railyard.allocation.names import ALLOCATION_ANNOTATION, KOORDINATOR_DEVICE_ALLOCATED
from railyard.allocation.types import Allocation
from railyard.kube.client import (
    REQUEST_TIMEOUT_S,
    ApiError,
    ApiUnavailable,
    Client,
    RequestTiming,
)
from railyard.kube.events import EventSender, event_body, event_time
from railyard.kube.objects import ObjectMeta, Pod, Status
from railyard.kube.reflector import Change, Reflector
from railyard.records.allocation import RecordError, decode_allocation, encode_allocation
from railyard.records.koordinator import encode_device_allocated
from railyard.records.nodetopology_cr import (
    API_VERSION,
    PLURAL,
    NodeTopologyResourceError,
    spec_from_resource,
    status_from_json,
)
from railyard.records.signature import (
    NODE_KEY_ANNOTATION,
    TRUST_ALL,
    RecordTrust,
    SignatureKeyError,
    public_key_from_text,
    sign_record,
)
from railyard.scheduler.cluster_file import BoundPod
from railyard.scheduler.service import WriteOutcomeUnknown
from railyard.scheduler.state import ClusterState
from railyard.topology.model import NodeTopology

log = logging.getLogger("railyard.scheduler")

TOPOLOGIES = f"/apis/{API_VERSION}/{PLURAL}"
PODS = "/api/v1/pods"
FINISHED = frozenset(("Succeeded", "Failed"))  # a finished pod's devices are free again
# The pods the ledger is made of: bound and not finished. A pending pod holds nothing (the
# binder is the one who holds for a pod it is binding), so the watch leaves out each pod's
# create and its changes while it waits, and a pod that finishes leaves the watch as
# DELETED, which frees it as FINISHED does.
HOLDING_PODS = {"fieldSelector": "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"}
COMPONENT = "railyard-scheduler"
_NO_SPEC = msgspec.Raw(b"null")


class TopologyObject(msgspec.Struct):
    """A NodeTopology as the extender watches it: metadata, and the spec and status left
    undecoded. The spec is decoded only when its `generation` moves; the status (small: the
    agent lists only the devices that are not healthy) on each change, for that list."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: msgspec.Raw = _NO_SPEC
    status: msgspec.Raw = _NO_SPEC


def unhealthy_of(status: msgspec.Raw) -> frozenset[str]:
    """The PCI addresses a NodeTopology status lists as not healthy (none without a status).
    Raises NodeTopologyResourceError or msgspec.DecodeError."""
    document = msgspec.json.decode(status)
    if document is None:
        return frozenset()
    return frozenset(d.pci_address for d in status_from_json(document, "status").unhealthy)


class TopologyShapes:
    """Decoded topologies shared between nodes whose specs are equal but for the node's
    name: 5,000 nodes of a few hardware kinds hold a few decoded trees, each node a renamed
    copy pointing at the same device tuples (as the cluster file does with profiles)."""

    def __init__(self) -> None:
        self._by_key: dict[bytes, NodeTopology] = {}
        self._users: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    @staticmethod
    def key_of(spec: msgspec.Raw) -> bytes:
        """The spec with the node's name taken out, in a canonical encoding."""
        document = msgspec.json.decode(spec)
        if isinstance(document, dict):
            document["node"] = ""
        return msgspec.json.encode(document, order="sorted")

    def take(self, key: bytes, name: str, spec: msgspec.Raw) -> NodeTopology:
        """The topology of node `name`; decoded (and validated) only for a new shape.
        Raises NodeTopologyResourceError naming the field."""
        base = self._by_key.get(key)
        if base is None:
            base = spec_from_resource({"metadata": {"name": name},
                                       "spec": msgspec.json.decode(spec)})
            self._by_key[key] = base
        self._users[key] = self._users.get(key, 0) + 1
        return base if base.node == name else dataclasses.replace(base, node=name)

    def drop(self, key: bytes) -> None:
        left = self._users.get(key, 0) - 1
        if left > 0:
            self._users[key] = left
        else:
            self._users.pop(key, None)
            self._by_key.pop(key, None)


def pod_allocation(pod: Pod, trust: RecordTrust = TRUST_ALL) -> Allocation | None:
    """The devices a pod holds by its record: its Allocation, unless it has finished (a
    Job's pod must not keep capacity) or has none. A record that does not decode, or that
    `trust` does not believe (decision 0087: unsigned, or signed for another pod), is logged
    and counts as none: the pod was not placed by this codec's writer."""
    raw = pod.metadata.annotations.get(ALLOCATION_ANNOTATION)
    if raw is None or pod.status.phase in FINISHED:
        return None
    try:
        allocation = decode_allocation(raw, ALLOCATION_ANNOTATION)
    except RecordError as e:
        log.warning("pod %s/%s: ignoring its %s", pod.metadata.namespace, pod.metadata.name, e)
        return None
    why = trust.refusal(raw, pod.metadata.uid)
    if why is not None:
        log.warning("pod %s/%s: ignoring its %s: %s", pod.metadata.namespace,
                    pod.metadata.name, ALLOCATION_ANNOTATION, why)
        return None
    return allocation


class ClusterSync:
    """Keeps a ClusterState equal to what the API server says: nodes from NodeTopology
    changes, holdings from pod changes. `recording` and `written` are the binder's: a pod
    whose bind is being written is left to the binder, and after it is written, events that
    predate the annotation (the watch may still deliver them) do not free its devices."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.shapes = TopologyShapes()
        self._spec: dict[str, tuple[int, bytes]] = {}  # node -> (generation, shape key)
        self._held: dict[str, BoundPod] = {}  # uid -> the pod as its record says
        # uid -> the record text `_held[uid]` was decoded from: a pod's watch brings the same
        # record back with each later change (bound, running, status), decoded once.
        self._record_text: dict[str, str] = {}
        # Records that clash with another pod's until the agent has rewritten both (_settle).
        self._unsettled: dict[str, BoundPod] = {}
        self.recording: set[str] = set()
        self.written: set[str] = set()
        self.on_pods_changed: Callable[[], None] | None = None
        self.decoded = 0  # specs decoded (a status-only change decodes none)
        # Signed records (decision 0087): off until require_signatures. Node keys come from
        # the NodeTopologies; pods refused meanwhile are read again when a node's key changes.
        self.trust = TRUST_ALL
        self.node_keys: dict[str, Ed25519PublicKey] = {}
        self._unproven: dict[str, Pod] = {}

    def require_signatures(self, extender: list[Ed25519PublicKey]) -> None:
        """Believe only records signed for their pod: decisions by one of `extender`, a
        node's truth by the key its agent publishes on its NodeTopology."""
        self.trust = RecordTrust.keys(extender, self.node_keys.get)

    # ------------------------------------------------------------------ nodes

    def on_topology(self, change: Change[TopologyObject]) -> None:
        obj = change.object
        name = obj.metadata.name
        if change.type == "DELETED":
            self._forget_node(name)
            self._take_key(name, None)
            return
        self._take_key(name, obj.metadata.annotations.get(NODE_KEY_ANNOTATION))
        # The store keeps metadata only (and no buffer).
        spec, obj.spec = obj.spec, _NO_SPEC
        status, obj.status = obj.status, _NO_SPEC
        if self._take_spec(name, obj.metadata.generation, spec):
            self._take_health(name, status)

    def _take_spec(self, name: str, generation: int, spec: msgspec.Raw) -> bool:
        """The node's topology, decoded when its spec is new; False: the node is unusable."""
        known = self._spec.get(name)
        if known is not None and generation and known[0] == generation:
            return True  # only the status changed
        try:
            key = TopologyShapes.key_of(spec)
            if known is not None and known[1] == key:
                self._spec[name] = (generation, key)
                return True
            topology = self.shapes.take(key, name, spec)
            self.decoded += 1
        except (NodeTopologyResourceError, msgspec.DecodeError, RecursionError) as e:
            log.warning("NodeTopology %s: %s; the node is unknown to Railyard until it is "
                        "fixed", name, e)
            self._forget_node(name)
            return False
        gone = self._forget_node(name)
        self._spec[name] = (generation, key)
        self.state.add_node(topology)
        for pod in [p for p in self._held.values() if p.node == name]:
            self._restore(pod)
        for pod in gone:  # our binds whose record has not come back through the watch yet
            if pod.uid not in self._held:
                self._settle([pod])
        self._changed()
        return True

    def _take_key(self, name: str, text: str | None) -> None:
        """The public key of the node's truth, as its agent publishes it; pods whose record
        was refused are read again when it changes (their node's key may have come late)."""
        key = None
        if text is not None:
            try:
                key = public_key_from_text(text, f"NodeTopology {name}: {NODE_KEY_ANNOTATION}")
            except SignatureKeyError as e:
                log.warning("%s; the node's truth cannot be checked", e)
        old = self.node_keys.get(name)
        if key is None:
            self.node_keys.pop(name, None)
        else:
            self.node_keys[name] = key
        if old != key and self.trust.enforced:
            for pod in list(self._unproven.values()):
                self.on_pod(Change("MODIFIED", f"{pod.metadata.namespace}/{pod.metadata.name}",
                                   pod))

    def _take_health(self, name: str, status: msgspec.Raw) -> None:
        """The devices the node's agent reports unhealthy are kept from new pods."""
        try:
            bad = unhealthy_of(status)
        except (NodeTopologyResourceError, msgspec.DecodeError, RecursionError) as e:
            log.warning("NodeTopology %s: %s; keeping the health it reported before", name, e)
            return
        if bad != self.state.unhealthy(name):
            self.state.set_unhealthy(name, bad)  # no pod changed: no on_pods_changed

    def _forget_node(self, name: str) -> list[BoundPod]:
        """Drop the node and what it held; the pods it held are returned."""
        known = self._spec.pop(name, None)
        if known is not None:
            self.shapes.drop(known[1])
        gone = self.state.remove_node(name)
        if gone:
            self._changed()
        return gone

    # ------------------------------------------------------------------ pods

    def on_pod(self, change: Change[Pod]) -> None:
        pod = change.object
        uid = pod.metadata.uid
        if uid in self.recording and change.type != "DELETED" and (
                pod.status.phase not in FINISHED):
            return  # the binder decides, and rolls back itself if it fails
        # A pod gone or finished while its Binding is in flight frees its devices now,
        # whatever the Binding's outcome: no later event would (the binder's own rollback
        # on failure is then a no-op, and it does not mark a pod it no longer holds
        # `written`).
        alloc = None if change.type == "DELETED" else self._allocation(pod)
        if (alloc is None and self.trust.enforced and change.type != "DELETED"
                and ALLOCATION_ANNOTATION in pod.metadata.annotations):
            self._unproven[uid] = pod
        else:
            self._unproven.pop(uid, None)
        if alloc is None:
            if (change.type != "DELETED" and uid in self.written
                    and pod.status.phase not in FINISHED
                    and ALLOCATION_ANNOTATION not in pod.metadata.annotations):
                return  # an event from before our annotation reached the watch
            if (change.type != "DELETED" and pod.status.phase not in FINISHED
                    and not pod.spec.node_name and self.state.pod(uid) is not None):
                # The API server has not bound it: what the state holds for it is a bind of
                # ours not written yet (decided in the worker, the loop ran this queued event
                # before the binder marked it `recording`). The binder frees it if the
                # Binding fails; a pod that goes away says so with DELETED.
                return
            self._free(uid)
            return
        self.written.discard(uid)
        bound = BoundPod(pod.metadata.namespace, pod.metadata.name, uid, alloc.node, alloc,
                         job_of(pod.metadata.namespace, pod.metadata.labels))
        if self._held.get(uid) == bound and self.state.pod(uid) is not None:
            return
        self._held[uid] = bound
        self._record_text[uid] = pod.metadata.annotations[ALLOCATION_ANNOTATION]
        self._restore(bound)

    def _allocation(self, pod: Pod) -> Allocation | None:
        """`pod_allocation(pod, self.trust)`, without decoding again the record the pod's
        holding came from (the trust check still runs on every change)."""
        uid = pod.metadata.uid
        held = self._held.get(uid)
        raw = pod.metadata.annotations.get(ALLOCATION_ANNOTATION)
        if (held is None or raw is None or raw != self._record_text.get(uid)
                or pod.status.phase in FINISHED):
            return pod_allocation(pod, self.trust)
        if self.trust.refusal(raw, uid) is not None:
            return pod_allocation(pod, self.trust)  # which logs why
        return held.allocation

    def has_record(self, uid: str) -> bool:
        """Whether the pod's record has come back through the watch (it holds what it says)."""
        return uid in self._held

    def release_unlanded(self, uid: str) -> None:
        """Free what a bind of ours held for a pod whose Binding never landed (PodBinder:
        the pod stayed without a node past the time its create could still be applied)."""
        self._free(uid)

    def _free(self, uid: str) -> None:
        """The pod holds nothing any more: its devices are free, and records waiting on
        them are tried again."""
        self.written.discard(uid)
        self._held.pop(uid, None)
        self._record_text.pop(uid, None)
        settling = self._unsettled.pop(uid, None) is not None
        if self.state.release(uid) is not None or settling:
            if self._unsettled:
                self._settle([])  # what it freed may be what another record names
            self._changed()

    def _restore(self, pod: BoundPod) -> None:
        """Hold what the pod's record says (the record wins over what was held before: the
        agent rewrites it when kubelet chose differently)."""
        held = self.state.pod(pod.uid)
        if (held is not None and held.node == pod.node and held.allocation == pod.allocation
                and pod.uid not in self._unsettled):
            return
        if pod.node not in self.state:
            self._unsettled.pop(pod.uid, None)
            if held is not None:
                self.state.release(pod.uid)
            return  # held again when its node's topology arrives
        self._settle([pod])
        self._changed()

    def _settle(self, pods: list[BoundPod]) -> None:
        """Hold these records together with those still unsettled: records the agent
        rewrites one pod at a time may clash until the last one arrives (state.hold_records);
        until then every device any of them names, or held before, stays held."""
        todo = {uid: p for uid, p in self._unsettled.items() if p.node in self.state}
        todo.update((p.uid, p) for p in pods)
        waiting = self.state.hold_records(todo.values())
        for p in waiting:
            if p.uid not in self._unsettled:
                log.warning("pod %s/%s (%s): its record names devices another pod's record "
                            "holds; holding both until the records settle", p.namespace,
                            p.name, p.uid)
        for p in pods:
            if p.uid not in {w.uid for w in waiting} and self.state.pod(p.uid) is None:
                log.warning("pod %s/%s (%s): its record is not held: every device it names "
                            "is another pod's", p.namespace, p.name, p.uid)
        self._unsettled = {p.uid: p for p in waiting}

    def _changed(self) -> None:
        if self.on_pods_changed is not None:
            self.on_pods_changed()


def pairs_text(alloc: Allocation) -> str:
    """`GPU 0 (0000:19:00.0) ↔ 0000:1a:00.2 (ib0v0, PIX)`, one per pair, then unpaired."""
    parts = [f"GPU {p.gpu.index} ({p.gpu.pci_address}) ↔ {p.nic.pci_address} "
             f"({p.nic.netdev or p.nic.rdma_device or p.nic.kind}, {p.distance.name})"
             for p in alloc.pairs]
    parts += [f"NIC {n.pci_address}" for n in alloc.nics]
    parts += [f"GPU {g.index} ({g.pci_address})" for g in alloc.gpus]
    return "; ".join(parts) or "no devices"


class NotLeader(Exception):
    """A bind's write was stopped: this replica no longer holds the Lease."""


class PodBinder:
    """The `ClusterWriter` on the API: one `pods/binding` create that carries the Allocation
    annotation. The API server sets the pod's node and merges the Binding's annotations into
    the pod in one update, under the Binding's uid precondition, and only while the pod has
    no node (decision 0073): the record and the binding land together or not at all, so no
    failure leaves one without the other."""

    def __init__(self, client: Client, sync: ClusterSync,
                 fence: Callable[[], bool] | None = None,
                 signing_key: Ed25519PrivateKey | None = None,
                 koordinator: bool = False,
                 lease_left: Callable[[], float] | None = None, *,
                 allocated_events: bool = False, events_client: Client | None = None) -> None:
        self.client, self.sync = client, sync
        # The `Allocated` Event per bind (--allocated-events; off by default, decision 0116).
        # The record on the pod says the same; the Event is for `kubectl describe`.
        self.allocated_events = allocated_events
        # Seconds this replica still leads (`Elector.time_left`): checked again once the
        # client's rate limit lets the Binding go, and the create's timeout is capped to it.
        self.lease_left = lease_left
        self.signing_key = signing_key  # signs each record for its pod (decision 0087)
        # Also write Koordinator's device-allocated annotation (decision 0095): off unless
        # --koordinator-annotation, for mixed clusters whose koordlet hooks read it.
        self.koordinator = koordinator
        # Leader election's fence (decision 0074): checked right before the write, so a
        # leader that could not renew writes nothing more.
        self.fence = fence
        self.instance = os.uname().nodename
        # Bounded (MAX_PENDING_EVENTS), and on a client of their own where one is given:
        # on the binds' client, up to 256 Events in flight queued ahead of binds for its QPS
        # and connections (bind p50 1.5-3 s at 1,000 kwok nodes; decision 0104).
        self.events = EventSender(events_client or client)
        # Pods whose Binding create failed while it may still land (the pod was unbound or
        # unreadable when read back): uid -> the loop time until which it may, and the task
        # that frees the devices after it if the pod is still unbound (_release_when_unlanded).
        self._may_land: dict[str, float] = {}
        self._settling: dict[str, asyncio.Task[None]] = {}
        # Told where each Binding create's time went on this side (the extender's metrics).
        self.observe_write: Callable[[RequestTiming], None] | None = None

    def close(self) -> list[asyncio.Task[None]]:
        """Cancel the pending checks of Bindings that may still land (their pods keep what
        they hold); the tasks, to await."""
        tasks = list(self._settling.values())
        for task in tasks:
            task.cancel()
        return tasks

    async def bind(self, pod: BoundPod) -> None:
        if self.fence is not None and not self.fence():
            raise NotLeader(f"pod {pod.namespace}/{pod.name}: this replica lost the leader's "
                            "lease before writing its bind")
        metadata: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace,
                                    "uid": pod.uid}
        if pod.allocation is not None:
            text = encode_allocation(pod.allocation)
            if self.signing_key is not None:
                text = sign_record(text, pod.uid, self.signing_key)
            metadata["annotations"] = {ALLOCATION_ANNOTATION: text}
            if self.koordinator:
                koordinator = self._device_allocated(pod.allocation)
                if koordinator is not None:
                    metadata["annotations"][KOORDINATOR_DEVICE_ALLOCATED] = koordinator
        self.sync.recording.add(pod.uid)
        try:
            fenced: dict[str, Any] = {}
            if self.fence is not None or self.lease_left is not None:
                fenced["before_send"] = lambda: self._still_leading(pod)
            timing = RequestTiming()
            try:
                # The server is told the create's timeout too (decision 0101): past it, it
                # will not apply the Binding, so one that failed here stops being able to
                # land LATE_LANDING_S after, and a lease-capped one by the lease's end.
                await self.client.create(
                    f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/binding",
                    {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
                     "target": {"apiVersion": "v1", "kind": "Node", "name": pod.node}},
                    Status, timeout_s=BINDING_TIMEOUT_S, server_deadline=True,
                    timing=timing, **fenced)
                if self.observe_write is not None:
                    self.observe_write(timing)
            except (ApiUnavailable, ApiError) as e:
                if isinstance(e, ApiError) and not ambiguous(e):
                    raise  # refused before anything was applied
                landing = await self._landed(pod)
                if landing is Landing.NEVER:
                    raise
                if landing is not Landing.LANDED:
                    # Released now, the devices could go to the next pod while our create is
                    # still applied: they stay held until it no longer can be.
                    self._hold_while_it_may_land(pod)
                    raise WriteOutcomeUnknown(
                        f"{e}; and the pod " + ("is not bound yet, but the Binding may still "
                                                "land" if landing is Landing.UNBOUND else
                                                "could not be read back to tell whether the "
                                                "Binding landed")) from e
                log.info("pod %s/%s: the Binding landed on %s although its create failed "
                         "(%s)", pod.namespace, pod.name, pod.node, e)
            if pod.allocation is not None and self.sync.state.pod(pod.uid) is not None:
                self.sync.written.add(pod.uid)  # not when it went away meanwhile
        finally:
            self.sync.recording.discard(pod.uid)
        if pod.allocation is None:
            return
        if self.allocated_events:
            self._event(pod, "Allocated",
                        f"bound to {pod.node} by Railyard: {pairs_text(pod.allocation)}")
        fallback = fallback_text(pod.allocation)
        if fallback is not None:  # a preference given up: always said
            self._event(pod, AFFINITY_FALLBACK, fallback)

    def _still_leading(self, pod: BoundPod) -> float | None:
        """Right before the Binding is sent (the rate limit may have held it for seconds):
        NotLeader if the lease was lost meanwhile, else the seconds left to wait for it."""
        left = self.lease_left() if self.lease_left is not None else None
        if (self.fence is not None and not self.fence()) or (left is not None and left <= 0):
            raise NotLeader(f"pod {pod.namespace}/{pod.name}: this replica lost the leader's "
                            "lease while its bind waited to be sent")
        return left

    async def _landed(self, pod: BoundPod) -> Landing:
        """Where our Binding for `pod` stands, read back from the API server in up to
        len(READ_BACK_DELAYS_S) tries (UNKNOWN when none could read it)."""
        for delay in READ_BACK_DELAYS_S:
            await asyncio.sleep(delay)
            landing = await self._read_back(pod)
            if landing is not Landing.UNKNOWN:
                return landing
        return Landing.UNKNOWN

    async def _read_back(self, pod: BoundPod) -> Landing:
        """One GET of the pod: LANDED when it (this uid) is on our node with a record (or
        asked for none), NEVER when it is gone, another pod or bound elsewhere, UNBOUND
        while it has no node, UNKNOWN when it could not be read."""
        try:
            now = await self.client.get(
                f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}", Pod)
        except ApiError as e:
            if e.not_found:
                return Landing.NEVER
            log.warning("pod %s/%s: reading it back after a failed Binding: %s",
                        pod.namespace, pod.name, e)
            return Landing.UNKNOWN
        except (ApiUnavailable, msgspec.DecodeError) as e:
            log.warning("pod %s/%s: reading it back after a failed Binding: %s",
                        pod.namespace, pod.name, e)
            return Landing.UNKNOWN
        if now.metadata.uid != pod.uid or now.spec.node_name not in ("", pod.node):
            return Landing.NEVER
        if not now.spec.node_name:
            return Landing.UNBOUND
        landed = pod.allocation is None or ALLOCATION_ANNOTATION in now.metadata.annotations
        return Landing.LANDED if landed else Landing.NEVER

    def _hold_while_it_may_land(self, pod: BoundPod) -> None:
        """Keep `pod`'s devices held until a create that failed just now can no longer be
        applied (LATE_LANDING_S), then free them if the pod is still unbound: a pod the
        Binding never reached is not pinned to the node for good."""
        hold = self.sync.state.pod(pod.uid)
        if hold is None:  # gone meanwhile: the watch freed it
            return
        loop = asyncio.get_running_loop()
        self._may_land[pod.uid] = loop.time() + LATE_LANDING_S
        if pod.uid not in self._settling:
            self._settling[pod.uid] = asyncio.ensure_future(
                self._release_when_unlanded(pod, hold))

    async def _release_when_unlanded(self, pod: BoundPod, hold: object) -> None:
        """Past the last moment a failed create of ours could land (a later failed write of
        the same pod moves it on), read the pod: still unbound (or gone, or bound
        elsewhere), its devices are freed; unreadable, it is read again SETTLE_RETRY_S
        later. Nothing is done once the hold is settled otherwise: released, its record back
        through the watch, or a later write of ours in flight or done."""
        loop = asyncio.get_running_loop()
        sync, uid = self.sync, pod.uid

        def settled() -> bool:
            return (sync.state.pod(uid) is not hold or uid in sync.recording
                    or uid in sync.written or sync.has_record(uid))
        try:
            while not settled():
                wait = self._may_land[uid] - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                landing = await self._read_back(pod)
                if settled() or self._may_land[uid] > loop.time():
                    continue  # settled, or a later write failed meanwhile: wait for it
                if landing is Landing.UNKNOWN:
                    self._may_land[uid] = loop.time() + SETTLE_RETRY_S
                elif landing is Landing.LANDED:
                    return  # its watch event brings the record
                else:
                    log.info("pod %s/%s: its Binding did not land; the devices it held on "
                             "%s are free again", pod.namespace, pod.name, pod.node)
                    sync.release_unlanded(uid)
                    return
        finally:
            self._may_land.pop(uid, None)
            del self._settling[uid]

    def _device_allocated(self, alloc: Allocation) -> str | None:
        """Koordinator's form of `alloc`, from the node's topology as the state holds it; None
        (and a warning) if it cannot be encoded: our record is the decision, Koordinator's is
        a copy for its hooks, so a copy that cannot be made never stops a bind."""
        try:
            return encode_device_allocated(alloc, self.sync.state.topology(alloc.node))
        except (KeyError, RecordError) as e:
            log.warning("%s: no %s written: %s", alloc.node, KOORDINATOR_DEVICE_ALLOCATED, e)
            return None

    def _event(self, pod: BoundPod, reason: str, message: str) -> None:
        """An Event on the pod, written off the bind's path: losing one loses no record."""
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace,
                    "name": pod.name, "uid": pod.uid}
        self.events.send(event_body(involved, pod.namespace, reason, message,
                                    component=COMPONENT, instance=self.instance,
                                    now=event_time()))


# Reading a pod back after a Binding create failed ambiguously (PodBinder._landed): the
# waits before each GET, about 3.5 s in all, bounded whatever the API server does.
READ_BACK_DELAYS_S = (0.0, 0.5, 1.0, 2.0)
# A Binding create's timeout, here and at the API server (its `timeout` parameter: the
# server's handler runs no longer, kube-apiserver's --request-timeout capping it).
BINDING_TIMEOUT_S = REQUEST_TIMEOUT_S
# How long after its create failed a Binding may still be applied: the server received it
# before we saw it fail, and starts no storage write past BINDING_TIMEOUT_S from then; the
# margin covers a write already under way. A pod left unbound keeps its devices until then
# (PodBinder._release_when_unlanded).
LATE_LANDING_S = BINDING_TIMEOUT_S + 15.0
# Reading such a pod again while the API server cannot be read.
SETTLE_RETRY_S = 10.0


class Landing(enum.Enum):
    """Where a Binding whose create failed stands, read back from the pod."""

    LANDED = "on our node, with the record"
    NEVER = "gone, another pod, or bound elsewhere: it cannot land"
    UNBOUND = "no node yet: it may still land"
    UNKNOWN = "the pod could not be read"


def ambiguous(e: ApiError) -> bool:
    """A Binding create's error after which it may have landed all the same: 409 (the pod
    already has a node, perhaps from this very bind whose first reply was lost) and 5xx
    (a timeout or failure past the point the server may have applied it). Any other 4xx
    is a refusal: nothing was applied."""
    return e.conflict or e.status >= 500


# The Event reason of a pod whose worst pair is worse than its `preferDistance` (0091).
AFFINITY_FALLBACK = "RailyardAffinityFallback"


def fallback_text(alloc: Allocation) -> str | None:
    """The message of the fallback Event, or None when the pod met its preference (or had
    none). Normal, not Warning: the pod runs as asked, on the best pairs a node it fits could
    give; the counter `railyard_extender_affinity_achieved_total{preference="fallback"}` is
    what to alert on."""
    a = alloc.affinity
    if a is None or not a.fell_back:
        return None
    short = [p for p in alloc.pairs if p.distance > a.preferred]
    return (f"preferDistance {a.preferred.name} not met: worst pair {a.achieved.name} on "
            f"{alloc.node}, the best this node had free at bind; {len(short)} of "
            f"{len(alloc.pairs)} pairs beyond {a.preferred.name} (GPU "
            f"{', '.join(str(p.gpu.index) for p in short)})")


class ApiCluster:
    """The two reflectors, the sync they feed and the binder: `await start()` lists both,
    then watches on; `stop()` ends the watches."""

    def __init__(self, client: Client, state: ClusterState,
                 fence: Callable[[], bool] | None = None,
                 signing_key: Ed25519PrivateKey | None = None,
                 koordinator: bool = False,
                 lease_left: Callable[[], float] | None = None, *,
                 allocated_events: bool = False, events_client: Client | None = None) -> None:
        self.client = client
        self.sync = ClusterSync(state)
        if signing_key is not None:
            self.sync.require_signatures([signing_key.public_key()])
        self.topologies: Reflector[TopologyObject] = Reflector(
            client, TOPOLOGIES, TopologyObject, on_change=self.sync.on_topology)
        self.pods: Reflector[Pod] = Reflector(client, PODS, Pod, params=HOLDING_PODS,
                                              on_change=self.sync.on_pod)
        self.binder = PodBinder(client, self.sync, fence, signing_key, koordinator,
                                lease_left, allocated_events=allocated_events,
                                events_client=events_client)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, timeout_s: float = 120.0) -> None:
        """Run both reflectors and wait until each has listed once."""
        reflectors = (self.topologies, self.pods)
        self._tasks = [asyncio.ensure_future(r.run()) for r in reflectors]
        synced: asyncio.Future[Any] = asyncio.ensure_future(
            asyncio.gather(*(r.synced.wait() for r in reflectors)))
        watched: list[asyncio.Future[Any]] = [synced, *self._tasks]
        try:
            done, _ = await asyncio.wait(watched, timeout=timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not synced.done():
                synced.cancel()
        for task in self._tasks:
            if task in done:  # a reflector gave up: say why
                await self.stop()
                task.result()
        if synced not in done:
            await self.stop()
            raise TimeoutError(f"listing NodeTopologies and pods took over {timeout_s:.0f} s")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        settling = self.binder.close()
        await asyncio.gather(*self._tasks, *settling, return_exceptions=True)

