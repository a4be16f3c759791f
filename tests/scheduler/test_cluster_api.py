"""The extender's cluster from API objects (scheduler.cluster_api.ClusterSync): NodeTopology
changes become nodes, pods' Allocation annotations the ledger. Fed the reflector's Change
values directly; the same code against a real API server is tests/box/test_extender_api.py."""

from __future__ import annotations

import asyncio

import msgspec
from api_objects import cr, pod, synced, topology
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_helpers import hand_allocation

from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible
from railyard.kube.events import MAX_PENDING_EVENTS
from railyard.kube.objects import ObjectMeta, Pod, PodSpec, PodStatus
from railyard.kube.reflector import Change
from railyard.records.nodetopology_cr import (
    DeviceCounts,
    NodeTopologyStatus,
    UnhealthyDevice,
    status_to_json,
)
from railyard.scheduler.cluster_api import ClusterSync, PodBinder, TopologyObject
from railyard.scheduler.cluster_file import BoundPod
from railyard.scheduler.state import UNHEALTHY_HOLDER, ClusterState


def test_nodes_of_one_hardware_kind_share_one_decoded_topology():
    sync = synced("a", "b", "c")
    sync.on_topology(Change("ADDED", "d", cr("d", "dgx-a100")))
    assert sync.state.node_names() == ["a", "b", "c", "d"]
    assert len(sync.shapes) == 2 and sync.decoded == 4
    a, b = sync.state.topology("a"), sync.state.topology("b")
    assert (a.node, b.node) == ("a", "b") and a.gpus is b.gpus and a.nics is b.nics


def test_a_status_only_change_decodes_no_spec():
    sync = synced("a")
    for version in range(2, 50):
        sync.on_topology(Change("MODIFIED", "a", TopologyObject(
            ObjectMeta(name="a", generation=1, resource_version=str(version)))))
    assert sync.decoded == 1 and "a" in sync.state


def test_a_spec_change_replaces_the_node_and_keeps_its_pods():
    sync = synced("a")
    alloc = hand_allocation(topology("a"), [(0, 0, 0)])
    sync.on_pod(Change("ADDED", "ml/p-1", pod("1", alloc)))
    sync.on_topology(Change("MODIFIED", "a", cr("a", generation=2)))
    assert sync.decoded == 1  # the same hardware: same shape, nothing decoded
    sync.on_topology(Change("MODIFIED", "a", cr("a", "dgx-h100", generation=3)))
    assert sync.state.pod("1") is not None


def test_the_ledger_is_rebuilt_from_the_annotations_and_waits_for_the_node():
    t = topology("a")
    sync = ClusterSync(ClusterState(()))
    alloc = hand_allocation(t, [(0, 0, 0), (1, 0, 1)])
    sync.on_pod(Change("ADDED", "ml/p-1", pod("1", alloc)))
    assert sync.state.pod("1") is None  # no node yet
    sync.on_topology(Change("ADDED", "a", cr("a")))
    held = sync.state.pod("1")
    assert held is not None and held.allocation == alloc
    assert list(sync.state.ledger("a").holders()) == [("1", alloc)]


def test_a_finished_or_deleted_pod_frees_its_devices():
    t = topology("a")
    sync = synced("a")
    one, two = hand_allocation(t, [(0, 0, 0)]), hand_allocation(t, [(1, 3, 0)])
    sync.on_pod(Change("ADDED", "ml/p-1", pod("1", one)))
    sync.on_pod(Change("ADDED", "ml/p-2", pod("2", two)))
    sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", one, phase="Succeeded")))
    sync.on_pod(Change("DELETED", "ml/p-2", pod("2", two)))
    assert sync.state.pods() == [] and list(sync.state.ledger("a").holders()) == []


def test_a_bind_being_written_is_left_to_the_binder_and_stale_events_do_not_free_it():
    sync = synced("a")
    bound = sync.state.bind("1", "ml", "p-1", "a", Request(gpus=1, vfs=1))
    assert isinstance(bound, Allocation)
    sync.recording.add("1")
    sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", None, phase="Pending")))
    assert sync.state.pod("1") is not None
    sync.recording.discard("1")
    sync.written.add("1")
    sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", None, phase="Pending")))  # from before
    assert sync.state.pod("1") is not None
    sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", bound)))  # the annotation arrives
    assert "1" not in sync.written and sync.state.pod("1") is not None
    sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", bound, phase="Failed")))
    assert sync.state.pod("1") is None


def test_a_rewritten_record_moves_the_holding_and_a_conflicting_one_is_not_held():
    t = topology("a")
    sync = synced("a")
    first, moved = hand_allocation(t, [(0, 0, 0)]), hand_allocation(t, [(2, 4, 0)])
    sync.on_pod(Change("ADDED", "ml/p-1", pod("1", first)))
    sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", moved)))
    assert list(sync.state.ledger("a").holders()) == [("1", moved)]
    sync.on_pod(Change("ADDED", "ml/p-2", pod("2", moved)))  # the same devices: refused
    assert sync.state.pod("2") is None


def used(sync: ClusterSync, node: str = "a") -> tuple[set[str], set[str]]:
    ledger = sync.state.ledger(node)
    return set(ledger.used_gpus), set(ledger.used_vfs)


def test_two_pods_kubelet_swapped_hold_both_vfs_while_their_records_are_rewritten():
    """Kubelet gave pod 1 the VF recorded for pod 2 and pod 2 pod 1's (issue 19's burst
    drill: four pods were then bound to VFs in use). The agent rewrites the records one at a
    time; between the two rewrites, neither VF may look free."""
    t = topology("a")
    sync = synced("a")
    one, two = hand_allocation(t, [(0, 0, 0)]), hand_allocation(t, [(1, 0, 1)])
    sync.on_pod(Change("ADDED", "ml/p-1", pod("1", one)))
    sync.on_pod(Change("ADDED", "ml/p-2", pod("2", two)))
    before = used(sync)
    one_truth, two_truth = hand_allocation(t, [(0, 0, 1)]), hand_allocation(t, [(1, 0, 0)])
    sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", one_truth)))
    assert used(sync) == before
    lone = sync.state.bind("3", "ml", "p-3", "a", Request(vfs=1))
    assert isinstance(lone, Allocation) and not vfs_of(lone) & before[1]
    sync.on_pod(Change("MODIFIED", "ml/p-2", pod("2", two_truth)))
    holders = dict(sync.state.ledger("a").holders())
    assert (holders["1"], holders["2"]) == (one_truth, two_truth)
    assert sync.state.pod("1").allocation == one_truth


def test_a_rewritten_record_naming_a_free_device_and_a_held_one_holds_both_until_settled():
    """Pod 1's new record names pod 2's VF (pod 2's own rewrite is still on its way) and a
    free one: the free one is held at once, pod 1's old VF stays held, and once pod 2 moves
    everything settles on the records."""
    t = topology("a")
    sync = synced("a")
    p, q, r = [i for i, nic in enumerate(t.nics) if nic.vfs][:3]
    one, two = hand_allocation(t, [(0, p, 0)]), hand_allocation(t, [(1, q, 0)])
    sync.on_pod(Change("ADDED", "ml/p-1", pod("1", one)))
    sync.on_pod(Change("ADDED", "ml/p-2", pod("2", two)))
    one_truth = hand_allocation(t, [(0, q, 0), (2, r, 0)])  # pod 2's VF and a free one
    sync.on_pod(Change("MODIFIED", "ml/p-1", pod("1", one_truth)))
    gpus, vfs = used(sync)
    assert vfs >= vfs_of(one) | vfs_of(two) | vfs_of(one_truth)
    assert gpus >= {g.pci_address for g in one_truth.all_gpus}
    two_truth = hand_allocation(t, [(1, p, 0)])  # pod 1's old VF
    sync.on_pod(Change("MODIFIED", "ml/p-2", pod("2", two_truth)))
    holders = dict(sync.state.ledger("a").holders())
    assert (holders["1"], holders["2"]) == (one_truth, two_truth)
    sync.on_pod(Change("DELETED", "ml/p-2", pod("2", two_truth)))
    assert used(sync)[1] == vfs_of(one_truth)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_records_rewritten_one_pod_at_a_time_never_free_a_device_in_use(data):
    """Pods on one node each hold a GPU and a VF; kubelet really gave them a permutation of
    those devices, and the agent rewrites their records in any order. At every step every
    device stays held (all are in use), and at the end the ledger is exactly the records."""
    t = topology("a")
    sync = synced("a")
    count = data.draw(st.integers(2, 6))
    slots = [(i, v) for i, nic in enumerate(t.nics) if nic.vfs for v in range(2)][:count]
    first = [hand_allocation(t, [(k, n, v)]) for k, (n, v) in enumerate(slots)]
    for k, a in enumerate(first):
        sync.on_pod(Change("ADDED", f"ml/p-{k}", pod(str(k), a)))
    everything = used(sync)
    order = data.draw(st.permutations(range(count)))
    given_vfs = data.draw(st.permutations(range(count)))
    given_gpus = data.draw(st.permutations(range(count)))
    truth = {k: hand_allocation(t, [(given_gpus[k], *slots[given_vfs[k]])])
             for k in range(count)}
    for k in order:
        sync.on_pod(Change("MODIFIED", f"ml/p-{k}", pod(str(k), truth[k])))
        gpus, vfs = used(sync)
        assert vfs >= everything[1] and gpus >= {g.pci_address for a in first
                                                 for g in a.all_gpus}
    assert dict(sync.state.ledger("a").holders()) == {str(k): truth[k] for k in range(count)}


def test_a_bad_spec_makes_the_node_unknown_not_the_extender_fail():
    sync = synced("a")
    sync.on_topology(Change("MODIFIED", "a", TopologyObject(
        ObjectMeta(name="a", generation=2), msgspec.Raw(b'{"node": "a", "gpus": 3}'))))
    assert "a" not in sync.state
    sync.on_topology(Change("DELETED", "a", TopologyObject(ObjectMeta(name="a"))))
    assert len(sync.shapes) == 0


def with_status(node: str, unhealthy: list[str], version: int) -> TopologyObject:
    """The node's CR after its agent reported `unhealthy` (the spec unchanged)."""
    counts = DeviceCounts(total=16, free=16 - len(unhealthy), held=0)
    status = NodeTopologyStatus(gpus=DeviceCounts(8, 8, 0), nics=counts, vfs=counts,
                                unhealthy=tuple(UnhealthyDevice(a, "link down")
                                                for a in unhealthy))
    return TopologyObject(ObjectMeta(name=node, generation=1, resource_version=str(version)),
                          status=msgspec.Raw(msgspec.json.encode(status_to_json(status))))


def vfs_of(alloc: Allocation | Infeasible) -> set[str]:
    assert isinstance(alloc, Allocation), alloc
    return {n.pci_address for n in alloc.vfs}


def test_devices_the_status_lists_unhealthy_go_to_no_new_pod_and_come_back_when_healthy():
    t = topology("a")
    sync = synced("a")
    pf = t.nics[0]
    down = [pf.pci_address, *(v.pci_address for v in pf.vfs)]
    running = hand_allocation(t, [(0, 0, 0)])  # holds pf's first VF
    sync.on_pod(Change("ADDED", "ml/p-1", pod("1", running)))
    sync.on_topology(Change("MODIFIED", "a", with_status("a", down, 2)))
    assert sync.decoded == 1 and sync.state.unhealthy("a") == frozenset(down)
    assert sync.state.pod("1") is not None  # a running pod keeps what it holds
    # Every other healthy VF can be had; none of the down PF's.
    healthy = sum(len(n.vfs) for n in t.nics) - len(pf.vfs)
    got = vfs_of(sync.state.bind("2", "ml", "p-2", "a", Request(vfs=healthy)))
    assert not got & set(down)
    assert isinstance(sync.state.bind("3", "ml", "p-3", "a", Request(vfs=1)), Infeasible)
    # The running pod leaves: its VF is still down, so still kept from new pods.
    sync.on_pod(Change("DELETED", "ml/p-1", pod("1", running)))
    assert isinstance(sync.state.bind("3", "ml", "p-3", "a", Request(vfs=1)), Infeasible)
    assert [u for u, _ in sync.state.ledger("a").holders() if u != UNHEALTHY_HOLDER] == ["2"]
    # The link comes back: its VFs are free again.
    sync.on_topology(Change("MODIFIED", "a", with_status("a", [], 3)))
    assert vfs_of(sync.state.bind("3", "ml", "p-3", "a", Request(vfs=2))) == {
        v.pci_address for v in pf.vfs}


def test_an_unhealthy_pf_is_not_given_whole_and_an_unreadable_status_keeps_the_health():
    t = topology("a")
    sync = synced("a")
    pf = t.nics[0].pci_address
    sync.on_topology(Change("MODIFIED", "a", with_status("a", [pf], 2)))
    sync.on_topology(Change("MODIFIED", "a", TopologyObject(
        ObjectMeta(name="a", generation=1, resource_version="3"),
        status=msgspec.Raw(b'{"unhealthyDevices": 3}'))))
    assert sync.state.unhealthy("a") == {pf}
    whole = sync.state.bind("1", "ml", "p-1", "a", Request(pfs=len(t.nics)))
    assert isinstance(whole, Infeasible)
    some = sync.state.bind("1", "ml", "p-1", "a", Request(pfs=len(t.nics) - 1))
    assert isinstance(some, Allocation) and pf not in {n.pci_address for n in some.pfs}
    assert sync.state.pod_count() == 1  # the health hold is no pod


def test_events_beyond_the_pending_limit_are_dropped_not_queued_ahead_of_binds():
    class StalledClient:
        """Every create waits until released: Events pile up as on a saturated API."""

        def __init__(self) -> None:
            self.release = asyncio.Event()
            self.sent = 0

        async def create(self, path: str, body: object, type_: object, **_: object) -> None:
            await self.release.wait()
            self.sent += 1

    async def main() -> tuple[int, int]:
        client = StalledClient()
        binder = PodBinder(client, synced("a"))  # type: ignore[arg-type]
        alloc = hand_allocation(topology("a"), [(0, 0, 0)])
        for i in range(MAX_PENDING_EVENTS + 40):
            binder._event(BoundPod("ml", f"p-{i}", str(i), "a", alloc), "Allocated", "x")
        await asyncio.sleep(0)
        client.release.set()
        while binder.events.pending:
            await asyncio.sleep(0.01)
        return client.sent, binder.events.dropped

    assert asyncio.run(main()) == (MAX_PENDING_EVENTS, 40)


def test_a_pod_bound_without_devices_is_left_to_the_api_server_once_its_events_arrive():
    # The extender records the bind (so a second bind at once is refused); from the pod's
    # next event the API server is the record (it refuses a Binding for a pod that has a
    # node), and the extender keeps nothing for a pod holding no devices.
    sync = synced("a", "b")
    assert sync.state.bind_without_devices("1", "ml", "p-1", "a") is None
    assert sync.state.bind_without_devices("1", "ml", "p-1", "a") is None  # a retry
    refused = sync.state.bind_without_devices("1", "ml", "p-1", "b")
    assert refused is not None and "already bound to 'a'" in refused.reason
    bound = Pod(ObjectMeta(name="p-1", namespace="ml", uid="1"), PodSpec(node_name="a"),
                PodStatus(phase="Pending"))
    sync.on_pod(Change("MODIFIED", "ml/p-1", bound))
    assert sync.state.pods() == []


def test_a_spec_or_status_nested_past_the_decoder_is_a_bad_node_not_a_crash():
    # The fuzz sweep: msgspec recurses on raw JSON and RecursionError escaped both decoders
    # (the CRD's structural schema should stop such nesting before; the extender must not
    # count on it).
    deep = b"[" * 100_000 + b"]" * 100_000
    sync = synced("a")
    sync.on_topology(Change("MODIFIED", "a", TopologyObject(
        ObjectMeta(name="a", generation=1, resource_version="2"), status=msgspec.Raw(deep))))
    assert "a" in sync.state and sync.state.unhealthy("a") == frozenset()
    sync.on_topology(Change("MODIFIED", "b", TopologyObject(
        ObjectMeta(name="b", generation=1), msgspec.Raw(deep))))
    assert "b" not in sync.state
