"""Interleavings of the API-backed extender (scheduler.cluster_api, service._bind) that once
lost or doubled a holding, or stopped a watch: each test states the order of events it
replays. Fed the reflector's Change values and the state's calls directly, as in
test_cluster_api.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from api_objects import cr, pod, synced, topology
from scheduler_helpers import hand_allocation

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible
from railyard.kube.client import ApiError, ApiUnavailable
from railyard.kube.objects import ObjectMeta, Pod, PodSpec, PodStatus
from railyard.kube.reflector import Change
from railyard.scheduler import cluster_api
from railyard.scheduler.cluster_api import ClusterSync, PodBinder
from railyard.scheduler.cluster_file import BoundPod
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState
from railyard.topology.model import NodeTopology


def devices(a: Allocation) -> set[str]:
    return {g.pci_address for g in a.all_gpus} | {n.pci_address for n in a.all_nics}


# ---------------------------------------------------------------- records that cannot be held

def test_a_record_naming_a_device_the_node_lacks_is_refused_not_raised():
    """A pod's record (trusted without --signing-key) names VF 3 of a node with two VFs per
    PF. It once raised LedgerConflict out of on_pod, through the reflector's handler, and the
    pod watch stopped for good (during the first list: the extender never started). Now it
    is refused: what of it the node has and is free (its GPU) stays held, the rest is
    nobody's, and later pods still bind."""
    sync = synced("a")
    bogus = hand_allocation(topology("a", vfs=4), [(0, 0, 3)])
    sync.on_pod(Change("ADDED", "ml/p-x", pod("x", bogus)))
    assert sync.state.refused_records == 1
    held = sync.state.ledger("a").allocation("x")
    assert held is not None and devices(held) == {bogus.all_gpus[0].pci_address}
    ok = sync.state.bind("1", "ml", "p-1", "a", Request(gpus=1, vfs=1))
    assert isinstance(ok, Allocation) and not devices(ok) & devices(held)
    sync.on_pod(Change("DELETED", "ml/p-x", pod("x", bogus)))
    assert sync.state.ledger("a").allocation("x") is None


def test_a_spec_change_dropping_a_held_vf_keeps_the_rest_held():
    """The agent republishes node a with two VFs per PF while a pod holds VF 3 (of four):
    restoring the node's pods once raised out of on_topology (the NodeTopology watch). Now
    the pod keeps its GPU; VF 3 no longer exists."""
    sync = ClusterSync(ClusterState(()))
    sync.on_topology(Change("ADDED", "a", cr("a", generation=1, vfs=4)))
    held = hand_allocation(topology("a", vfs=4), [(0, 0, 3)])
    sync.on_pod(Change("ADDED", "ml/p-1", pod("1", held)))
    sync.on_topology(Change("MODIFIED", "a", cr("a", generation=2, vfs=2)))
    now = sync.state.ledger("a").allocation("1")
    assert now is not None and devices(now) == {held.all_gpus[0].pci_address}
    assert sync.state.pod("1") is not None


# ---------------------------------------------------------------- a bind not written yet

def test_a_stale_pod_event_between_a_worker_bind_and_its_write_does_not_free_it():
    """service._bind: state.bind searched in the worker and committed; before the coroutine
    resumes into PodBinder.bind (which marks the uid `recording`), the loop runs a queued
    MODIFIED event from before the bind (no node, no record). It once released the hold,
    the Binding was still written, and the next pod was given the same devices. A pod the
    API server has not bound frees nothing but by DELETED or a finished phase."""
    sync = synced("a")
    req = Request(gpus=8, vfs=8)
    first = sync.state.bind("1", "ml", "p-1", "a", req)
    assert isinstance(first, Allocation)
    sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", None, phase="Pending")))
    assert sync.state.pod("1") is not None
    second = sync.state.bind("2", "ml", "p-2", "a", req)
    assert not isinstance(second, Allocation)
    sync.on_pod(Change("DELETED", "ml/p-1", pod("1", None, phase="Pending")))
    assert sync.state.pod("1") is None and isinstance(
        sync.state.bind("2", "ml", "p-2", "a", req), Allocation)


def test_an_unbound_pod_that_failed_frees_what_a_bind_held_for_it():
    sync = synced("a")
    assert isinstance(sync.state.bind("1", "ml", "p-1", "a", Request(gpus=1, vfs=1)),
                      Allocation)
    sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", None, phase="Failed")))
    assert sync.state.pod("1") is None


# ---------------------------------------------------------------- a node replaced mid-bind

class _HookAfterSearch(Allocator):
    """Runs `hook` once, after the search and before state.bind commits: what the loop may
    do while the worker searches."""

    hook: Callable[[], None] | None = None

    def allocate(self, topology: NodeTopology, ledger: Ledger,
                 request: Request) -> Allocation | Infeasible:
        out = super().allocate(topology, ledger, request)
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return out


def test_a_bind_whose_node_is_replaced_during_its_search_is_held_on_the_new_node():
    """The worker searches node a; meanwhile the loop applies a NodeTopology spec change
    (remove_node + add_node). The commit once compared the old node's ledger, untouched,
    and held the devices there, in a ledger nobody reads: the pod was recorded on a but the
    new ledger never held it, and a second pod got the same GPUs. The commit now checks the
    node is still the one registered under its name, and searches again on the new one."""
    allocator = _HookAfterSearch()
    sync = ClusterSync(ClusterState((), allocator))
    sync.on_topology(Change("ADDED", "a", cr("a")))
    allocator.hook = lambda: sync.on_topology(Change("MODIFIED", "a", cr("a", generation=2, vfs=4)))
    req = Request(gpus=8, vfs=8)
    first = sync.state.bind("1", "ml", "p-1", "a", req)
    assert isinstance(first, Allocation) and sync.state.pod("1") is not None
    assert sync.state.ledger("a").allocation("1") == first
    assert not isinstance(sync.state.bind("2", "ml", "p-2", "a", req), Allocation)


def test_a_bind_being_written_when_its_node_is_replaced_is_held_on_the_new_node():
    """Bound (the Binding in flight, no event for the pod yet), then node a's spec changes:
    the replaced node dropped the pod, and only records seen on the watch were held again,
    so the new ledger had the devices free. The dropped binds are now held again too."""
    sync = synced("a")
    req = Request(gpus=8, vfs=8)
    first = sync.state.bind("1", "ml", "p-1", "a", req)
    assert isinstance(first, Allocation)
    sync.recording.add("1")
    sync.on_topology(Change("MODIFIED", "a", cr("a", generation=2, vfs=4)))
    assert sync.state.pod("1") is not None
    assert devices(sync.state.ledger("a").allocation("1")) == devices(first)  # type: ignore[arg-type]
    assert not isinstance(sync.state.bind("2", "ml", "p-2", "a", req), Allocation)


def test_a_bind_whose_node_leaves_during_its_search_is_refused_and_nothing_raises():
    """The node is deleted while the worker searches: the bind once committed to the gone
    node's ledger, and the pod's later release raised KeyError out of on_pod (the pod watch).
    Now the bind answers unknown node, and a release never needs the node."""
    allocator = _HookAfterSearch()
    sync = ClusterSync(ClusterState((), allocator))
    sync.on_topology(Change("ADDED", "a", cr("a")))
    allocator.hook = lambda: sync.on_topology(Change("DELETED", "a", cr("a")))
    got = sync.state.bind("1", "ml", "p-1", "a", Request(gpus=1, vfs=1))
    assert isinstance(got, Infeasible) and got.unresolvable and sync.state.pod("1") is None
    sync.on_pod(Change("DELETED", "ml/p-1", pod("1", None)))


def test_releasing_a_pod_whose_node_is_gone_forgets_it():
    state = ClusterState([topology("a")])
    assert isinstance(state.bind("1", "ml", "p-1", "a", Request(gpus=1, vfs=1)), Allocation)
    del state._nodes["a"]  # what a commit to a replaced node once left behind
    assert state.release("1") is not None and state.pod("1") is None


# ---------------------------------------------------------------- a pod gone mid-Binding

class _EventsDuringCreate:
    """The API as PodBinder sees it: the Binding lands, and before its reply reaches the
    binder the watch delivers `events` (run on the loop while the create is awaited)."""

    def __init__(self, events: list[Callable[[], None]]) -> None:
        self.events = events

    async def create(self, path: str, body: Any, type_: object, **_: Any) -> None:
        if body.get("kind") == "Binding":
            for event in self.events:
                event()


def _bind_through(sync: ClusterSync, bound: Allocation,
                  events: list[Callable[[], None]]) -> None:
    async def main() -> None:
        binder = PodBinder(_EventsDuringCreate(events), sync)  # type: ignore[arg-type]
        await binder.bind(BoundPod("ml", "p-1", "1", "a", bound))
        await binder.events.drain()
    asyncio.run(main())


def test_a_pod_deleted_while_its_binding_is_in_flight_is_freed():
    """The Binding lands, the pod is bound, then deleted, and both events arrive while the
    create's reply is still on its way (the uid is `recording`). on_pod once dropped every
    event of a recording pod, DELETED included: no later event came, the devices stayed
    held for good and the uid stayed in `written`. A DELETED or finished pod is now freed at
    once, whatever the Binding's outcome."""
    sync = synced("a")
    bound = sync.state.bind("1", "ml", "p-1", "a", Request(gpus=8, vfs=8))
    assert isinstance(bound, Allocation)
    _bind_through(sync, bound, [
        lambda: sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", bound))),
        lambda: sync.on_pod(Change("DELETED", "ml/p-1", pod("1", bound)))])
    assert sync.state.pod("1") is None and "1" not in sync.written
    assert list(sync.state.ledger("a").holders()) == []


def test_a_pod_that_finished_while_its_binding_was_in_flight_is_freed():
    sync = synced("a")
    bound = sync.state.bind("1", "ml", "p-1", "a", Request(gpus=1, vfs=1))
    assert isinstance(bound, Allocation)
    _bind_through(sync, bound, [
        lambda: sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", bound, phase="Succeeded")))])
    assert sync.state.pod("1") is None and "1" not in sync.written


def test_a_recording_pods_own_events_are_still_left_to_the_binder():
    sync = synced("a")
    bound = sync.state.bind("1", "ml", "p-1", "a", Request(gpus=1, vfs=1))
    assert isinstance(bound, Allocation)
    _bind_through(sync, bound, [
        lambda: sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", None, phase="Pending"))),
        lambda: sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", bound)))])
    assert sync.state.pod("1") is not None and "1" in sync.written


# ---------------------------------------------------------------- a Binding that failed late

class _LandsThenFails:
    """The API server applies the Binding (or not: `lands`), then the create fails as a
    timeout or a 5xx would; GET answers the pod as it is then (or fails: `readable`), bound
    to `elsewhere` by another scheduler, or gone (`gone`). `late` keeps a Binding that did
    not land for `apply_late()`: a create the server applies after it was read back."""

    def __init__(self, error: Exception | None, lands: bool, readable: bool = True,
                 elsewhere: str = "", gone: bool = False) -> None:
        self.error, self.lands, self.readable = error, lands, readable
        self.elsewhere, self.gone = elsewhere, gone
        self.bound: Pod | None = None
        self.late: dict[str, Any] | None = None
        self.gets = self.creates = 0

    async def create(self, path: str, body: Any, type_: object, **_: Any) -> None:
        if body.get("kind") != "Binding":
            return
        self.creates += 1
        if self.lands or self.error is None:
            self.bound = self._applied(body)
        else:
            self.late = body
        if self.error is not None:
            raise self.error

    def apply_late(self) -> Pod:
        assert self.late is not None and self.bound is None
        self.bound = self._applied(self.late)
        return self.bound

    @staticmethod
    def _applied(body: dict[str, Any]) -> Pod:
        meta = body["metadata"]
        return Pod(ObjectMeta(name=meta["name"], namespace=meta["namespace"],
                              uid=meta["uid"], annotations=meta["annotations"]),
                   PodSpec(node_name=body["target"]["name"]), PodStatus(phase="Pending"))

    async def get(self, path: str, type_: object) -> Pod:
        self.gets += 1
        if not self.readable:
            raise ApiUnavailable(f"GET {path}: connection reset")
        if self.gone:
            raise ApiError(404, "NotFound", "pods \"p-1\" not found", f"GET {path}")
        if self.bound is not None:
            return self.bound
        return Pod(ObjectMeta(name="p-1", namespace="ml", uid="1"),
                   PodSpec(node_name=self.elsewhere), PodStatus(phase="Pending"))


def _write_through(client: _LandsThenFails) -> tuple[ClusterSync, str]:
    sync = synced("a")
    bound = sync.state.bind("1", "ml", "p-1", "a", Request(gpus=8, vfs=8))
    assert isinstance(bound, Allocation)
    ext = Extender(sync.state, PodBinder(client, sync))  # type: ignore[arg-type]

    async def main() -> str:
        error = await ext._write(BoundPod("ml", "p-1", "1", "a", bound), "pod ml/p-1 (1)")
        assert ext.writer is not None
        await ext.writer.events.drain()  # type: ignore[attr-defined]
        return error
    return sync, asyncio.run(main())


def test_a_binding_that_landed_before_its_create_timed_out_keeps_its_devices(
        monkeypatch: pytest.MonkeyPatch):
    """The Binding is applied, then the create's reply is lost (timeout, connection reset,
    a 5xx, or a 409 on a retry of it). _write once released the devices on any failure: the
    pod ran with them while the next pod was given them. The binder now reads the pod back
    and, finding it on our node with the record, counts the bind as written."""
    monkeypatch.setattr(cluster_api, "READ_BACK_DELAYS_S", (0.0, 0.0, 0.0), raising=False)
    for error in (ApiUnavailable("POST binding: TimeoutError"),
                  ApiError(504, "Timeout", "", "POST binding"),
                  ApiError(409, "Conflict", "pod already assigned", "POST binding")):
        client = _LandsThenFails(error, lands=True)
        sync, answer = _write_through(client)
        assert answer == "" and sync.state.pod("1") is not None and "1" in sync.written, error


def test_a_binding_that_cannot_land_is_rolled_back_and_a_refusal_is_not_read_back(
        monkeypatch: pytest.MonkeyPatch):
    """Read back gone or bound elsewhere, the failed create can never land: the devices are
    free at once. A clean 4xx refusal applied nothing and is not read back."""
    monkeypatch.setattr(cluster_api, "READ_BACK_DELAYS_S", (0.0, 0.0, 0.0), raising=False)
    for client in (_LandsThenFails(ApiUnavailable("POST binding: reset"), lands=False,
                                   gone=True),
                   _LandsThenFails(ApiError(504, "Timeout", "", "POST binding"), lands=False,
                                   elsewhere="b")):
        sync, answer = _write_through(client)
        assert "nothing held" in answer and sync.state.pod("1") is None and client.gets == 1
    client = _LandsThenFails(ApiError(403, "Forbidden", "", "POST binding"), lands=False)
    sync, answer = _write_through(client)
    assert "nothing held" in answer and sync.state.pod("1") is None and client.gets == 0


@pytest.fixture
def fast_landing(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """One read-back, and a failed create that can no longer land 0.2 s after it failed."""
    monkeypatch.setattr(cluster_api, "READ_BACK_DELAYS_S", (0.0,), raising=False)
    monkeypatch.setattr(cluster_api, "LATE_LANDING_S", 0.2, raising=False)
    return monkeypatch


async def _bind_failing(client: _LandsThenFails
                        ) -> tuple[ClusterSync, Extender, Allocation, str]:
    """Pod 1 takes every GPU and VF of node a; its Binding create fails as `client` says."""
    sync = synced("a")
    bound = sync.state.bind("1", "ml", "p-1", "a", Request(gpus=8, vfs=8))
    assert isinstance(bound, Allocation)
    ext = Extender(sync.state, PodBinder(client, sync))  # type: ignore[arg-type]
    return sync, ext, bound, await ext._write(BoundPod("ml", "p-1", "1", "a", bound),
                                              "pod ml/p-1 (1)")


def _next_pod_gets_node_a(sync: ClusterSync) -> bool:
    taken = sync.state.bind("2", "ml", "p-2", "a", Request(gpus=1, vfs=1))
    return isinstance(taken, Allocation)


@pytest.mark.usefixtures("fast_landing")
def test_a_binding_read_back_unbound_keeps_its_devices_while_it_may_still_land():
    """The create failed (a reset) and the pod read back has no node yet, but the API server
    applies the Binding a moment later. The devices were once freed on that read, so the
    next pod could be given them while the pod ran with them. They now stay held until the
    create can no longer land (LATE_LANDING_S); the late Binding's record then keeps them."""
    async def main() -> None:
        client = _LandsThenFails(ApiUnavailable("POST binding: reset"), lands=False)
        sync, ext, bound, answer = await _bind_failing(client)
        assert "stay held" in answer and "may still land" in answer
        assert sync.state.pod("1") is not None and not _next_pod_gets_node_a(sync)
        sync.on_pod(Change("MODIFIED", "ml/p-1", client.apply_late()))  # it landed late
        await asyncio.sleep(0.4)  # past LATE_LANDING_S: the check finds it settled
        held = sync.state.pod("1")
        assert held is not None and held.allocation == bound
        assert not _next_pod_gets_node_a(sync), "the late Binding's devices given again"
        assert client.gets == 1  # its record came back through the watch: no need to read
        assert ext.writer is not None and ext.writer._settling == {}  # type: ignore[attr-defined]
    asyncio.run(main())


@pytest.mark.usefixtures("fast_landing")
def test_a_binding_that_never_lands_frees_its_devices_once_it_no_longer_can():
    """The same failure, and the Binding never lands: past LATE_LANDING_S the pod is read
    again, still unbound, and the devices are freed (the pod is not pinned to the node for
    good); before that they stay held."""
    async def main() -> None:
        client = _LandsThenFails(ApiError(503, "ServiceUnavailable", "", "POST binding"),
                                 lands=False)
        sync, _, _, answer = await _bind_failing(client)
        assert "stay held" in answer
        await asyncio.sleep(0.05)
        assert sync.state.pod("1") is not None and client.gets == 1
        await asyncio.sleep(0.3)
        assert sync.state.pod("1") is None and client.gets == 2
        assert _next_pod_gets_node_a(sync)
    asyncio.run(main())


@pytest.mark.usefixtures("fast_landing")
def test_a_retry_that_wrote_the_binding_is_not_undone_by_the_first_ones_check():
    """kube-scheduler retries the bind to the same node before the first create's deadline
    and that create lands: the first one's check must leave the devices held."""
    async def main() -> None:
        client = _LandsThenFails(ApiUnavailable("POST binding: reset"), lands=False)
        sync, ext, bound, answer = await _bind_failing(client)
        assert "stay held" in answer
        client.error = None  # the retry's create goes through
        retry = await ext._write(BoundPod("ml", "p-1", "1", "a", bound), "pod ml/p-1 (1)")
        assert retry == "" and client.creates == 2 and "1" in sync.written
        await asyncio.sleep(0.4)
        assert sync.state.pod("1") is not None and client.gets == 1
    asyncio.run(main())


def test_a_binding_whose_outcome_cannot_be_read_back_keeps_its_devices(
        monkeypatch: pytest.MonkeyPatch):
    """The create failed ambiguously and every GET of the pod failed too (bounded): the
    devices stay held (the pod may be running with them), kube-scheduler is answered an
    error and retries to the same node."""
    monkeypatch.setattr(cluster_api, "READ_BACK_DELAYS_S", (0.0, 0.0, 0.0), raising=False)
    client = _LandsThenFails(ApiUnavailable("POST binding: reset"), lands=True,
                             readable=False)
    sync, answer = _write_through(client)
    assert "stay held" in answer and sync.state.pod("1") is not None and client.gets == 3
    assert "1" not in sync.recording


def test_an_unreadable_pod_is_read_again_until_it_tells(fast_landing: pytest.MonkeyPatch):
    """Unreadable past LATE_LANDING_S too: the devices stay held and the pod is read again
    every SETTLE_RETRY_S; once it reads unbound, they are freed."""
    fast_landing.setattr(cluster_api, "LATE_LANDING_S", 0.1, raising=False)
    fast_landing.setattr(cluster_api, "SETTLE_RETRY_S", 0.1, raising=False)

    async def main() -> None:
        client = _LandsThenFails(ApiUnavailable("POST binding: reset"), lands=False,
                                 readable=False)
        sync, _, _, answer = await _bind_failing(client)
        assert "could not be read back" in answer
        await asyncio.sleep(0.35)
        assert sync.state.pod("1") is not None and client.gets >= 3
        client.readable = True
        await asyncio.sleep(0.25)
        assert sync.state.pod("1") is None
    asyncio.run(main())


# ---------------------------------------------------------------- one job, two binds at once

def test_two_binds_of_one_required_job_in_flight_at_once_get_one_rail_sequence():
    """Pod A of a `rails: required` job needs a search: its bind waits for the worker.
    Meanwhile pod B of the same job is bound on another node. B once read the job's rails
    before A had committed (none yet) and picked its own, and state.bind never re-checks them:
    the job held two sequences. A job's binds now take turns from reading its rails to
    committing, so B waits for A and follows its rails."""
    from test_extender_rails import cluster, job_pod

    from railyard.scheduler.wire import ExtenderBindingArgs, pod_facts

    state = cluster()
    ext = Extender(state)
    hints = {"rails": "required"}
    pa, pb = job_pod("ja", hints), job_pod("jb", hints)
    for p in (pa, pb):
        ext.pods.put(pod_facts(p))
    real = ext._in_worker
    first = True
    b_done: list[asyncio.Task[str]] = []

    async def worker_with_b_meanwhile(fn: Any, *args: Any) -> Any:
        nonlocal first
        if first:  # A's search is queued: B's bind arrives and is served meanwhile
            first = False
            b_done.append(asyncio.ensure_future(
                ext.bind_pod(ExtenderBindingArgs("pod-jb", "ml", "jb", "n2"))))
            for _ in range(20):
                await asyncio.sleep(0)
        return await real(fn, *args)
    ext._in_worker = worker_with_b_meanwhile  # type: ignore[method-assign]

    async def go() -> None:
        assert await ext.bind_pod(ExtenderBindingArgs("pod-ja", "ml", "ja", "n1")) == ""
        assert await b_done[0] == ""
    asyncio.run(go())
    a, b = state.pod("ja"), state.pod("jb")
    assert a is not None and b is not None and a.allocation and b.allocation
    assert a.allocation.rails == b.allocation.rails, "one required job, two rail sequences"
    assert ext._job_turns == {}
