"""ClusterState: grouped answers equal per-node answers; binds never double-allocate."""

from __future__ import annotations

import dataclasses
import re
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_helpers import hand_allocation

from railyard.allocation.allocator import Allocator
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible
from railyard.scheduler.cluster_file import BoundPod, ClusterFileError, cluster_from_spec
from railyard.scheduler.state import ClusterState


class CountingAllocator:
    """The real allocator, counting how often the state asks it."""

    def __init__(self) -> None:
        self.inner = Allocator()
        self.allocate_calls = 0
        self.score_calls = 0

    def allocate(self, topology, ledger, request):
        self.allocate_calls += 1
        return self.inner.allocate(topology, ledger, request)

    def node_score(self, topology, ledger, request):
        self.score_calls += 1
        return self.inner.node_score(topology, ledger, request)

    def group_key(self, topology, ledger):
        return self.inner.group_key(topology, ledger)


def state(spec: str = "dgx-h100:4,dgx-a100:2", allocator=None) -> ClusterState:
    return ClusterState(cluster_from_spec(spec), allocator)


def gpu_vf(n: int) -> Request:
    return Request(gpus=n, vfs=n)


def test_filter_splits_fits_blocked_and_unresolvable():
    s = state("dgx-h100:3")
    assert isinstance(s.bind("full", "ml", "full", "dgx-h100-000", gpu_vf(8)), Allocation)
    out = s.filter(gpu_vf(1), ["dgx-h100-000", "dgx-h100-001", "ghost", "dgx-h100-002"])
    assert out.fits == ["dgx-h100-001", "dgx-h100-002"]
    assert list(out.failed) == ["dgx-h100-000"]
    assert list(out.unresolvable) == ["ghost"] and "not known" in out.unresolvable["ghost"]
    too_big = s.filter(gpu_vf(9), ["dgx-h100-001"])
    assert too_big.fits == [] and list(too_big.unresolvable) == ["dgx-h100-001"]


def test_pod_without_railyard_resources_fits_everywhere_untouched():
    alloc = CountingAllocator()
    s = state(allocator=alloc)
    out = s.filter(Request(exclusive_cpus=4, memory_bytes=1 << 30), ["dgx-h100-000", "ghost"])
    assert out.fits == ["dgx-h100-000", "ghost"] and not out.failed and not out.unresolvable
    assert s.scores(Request(), ["dgx-h100-000"]) == {"dgx-h100-000": 0}
    assert alloc.allocate_calls == alloc.score_calls == 0


def test_filter_asks_the_allocator_once_per_shape_and_free_state():
    alloc = CountingAllocator()
    s = state("dgx-h100:50,dgx-a100:50", alloc)
    names = s.node_names()
    s.filter(gpu_vf(2), names)
    assert alloc.allocate_calls == 2  # two shapes, all empty
    s.bind("p", "ml", "p", "dgx-h100-007", gpu_vf(2))
    alloc.allocate_calls = 0
    out = s.filter(gpu_vf(2), names)
    assert alloc.allocate_calls == 1 and len(out.fits) == 100  # only the new free state
    s.filter(gpu_vf(2), names)
    assert alloc.allocate_calls == 1  # answers are kept per group and request shape
    s.filter(gpu_vf(1), names)
    assert alloc.allocate_calls == 4
    s.scores(gpu_vf(2), names)
    s.scores(gpu_vf(2), names)
    assert alloc.score_calls == 3


def test_scores_are_zero_to_ten_for_every_name_and_equal_within_a_group():
    s = state("dgx-h100:3,hgx-h100-4nic:2")
    s.bind("p", "ml", "p", "dgx-h100-001", gpu_vf(4))
    names = [*s.node_names(), "ghost"]
    scores = s.scores(gpu_vf(2), names)
    assert list(scores) == names
    assert all(0 <= v <= 10 for v in scores.values()) and scores["ghost"] == 0
    assert scores["dgx-h100-000"] == scores["dgx-h100-002"]
    assert scores["hgx-h100-4nic-000"] == scores["hgx-h100-4nic-001"]


def test_bind_stamps_the_decision_and_holds_the_devices():
    s = state()
    a = s.bind("u1", "ml", "train", "dgx-h100-000", gpu_vf(2))
    assert isinstance(a, Allocation)
    assert a.decided_by == "scheduler" and a.node == "dgx-h100-000"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", a.decided_at)
    assert s.ledger("dgx-h100-000").allocation("u1") == a
    assert s.pods() == [BoundPod("ml", "train", "u1", "dgx-h100-000", a)]


def test_rebinding_the_same_uid_is_idempotent_and_elsewhere_refused():
    s = state()
    a = s.bind("u1", "ml", "train", "dgx-h100-000", gpu_vf(2))
    assert s.bind("u1", "ml", "train", "dgx-h100-000", gpu_vf(2)) == a
    assert len(s.ledger("dgx-h100-000")) == 1
    other = s.bind("u1", "ml", "train", "dgx-h100-001", gpu_vf(2))
    assert isinstance(other, Infeasible) and "already bound to 'dgx-h100-000'" in other.reason
    assert len(s.ledger("dgx-h100-001")) == 0


def test_second_bind_on_full_node_fails_and_frees_nothing():
    s = state()
    s.bind("a", "ml", "a", "dgx-h100-000", gpu_vf(8))
    before = s.ledger("dgx-h100-000").signature()
    r = s.bind("b", "ml", "b", "dgx-h100-000", gpu_vf(1))
    assert isinstance(r, Infeasible) and not r.unresolvable
    assert s.ledger("dgx-h100-000").signature() == before and s.pod("b") is None
    assert isinstance(s.bind("c", "ml", "c", "ghost", gpu_vf(1)), Infeasible)


def test_release_frees_the_devices_once():
    s = state()
    s.bind("a", "ml", "a", "dgx-h100-000", gpu_vf(8))
    assert s.release("a").uid == "a"
    assert s.release("a") is None
    assert len(s.ledger("dgx-h100-000")) == 0
    assert isinstance(s.bind("b", "ml", "b", "dgx-h100-000", gpu_vf(8)), Allocation)


def test_restore_is_all_or_nothing():
    s = state("dgx-h100:2")
    t = s.topology("dgx-h100-000")
    ok = BoundPod("ml", "a", "a", t.node, hand_allocation(t, [(0, 0, 0)]))
    clash = BoundPod("ml", "b", "b", t.node, hand_allocation(t, [(0, 0, 1)]))
    with pytest.raises(ClusterFileError, match=r"pod ml/b \(b\): GPU .* already held by a"):
        s.restore([ok, clash])
    assert s.pods() == [] and len(s.ledger(t.node)) == 0
    s.restore([ok])
    assert s.pods() == [ok]
    out = s.filter(gpu_vf(8), [t.node, "dgx-h100-001"])
    assert out.fits == ["dgx-h100-001"]  # the restored ledger is what filter sees


def test_victims_are_all_the_candidates_when_evicting_them_all_makes_room():
    # kube-scheduler needs each pod it proposes for its own filters: never fewer, never none.
    s = state("dgx-h100:1")
    node = "dgx-h100-000"
    for i in range(8):
        assert isinstance(s.bind(f"v{i}", "ml", f"v{i}", node, gpu_vf(1)), Allocation)
    proposed = ["outsider", *(f"v{i}" for i in range(8))]
    assert s.victims(gpu_vf(2), node, proposed) == proposed
    assert s.victims(gpu_vf(1), node, ["outsider"]) is None  # holds nothing: no room made
    assert s.victims(gpu_vf(2), node, ["v0"]) is None  # one GPU freed is not enough
    assert s.victims(gpu_vf(2), node, []) is None  # nothing proposed: never answered empty
    assert s.victims(gpu_vf(2), "ghost", ["v0"]) is None
    assert len(s.ledger(node)) == 8  # asking changes nothing


def test_a_pod_already_holding_devices_fits_only_its_node_and_scores_highest_there():
    s = state("dgx-h100:3")
    assert isinstance(s.bind("u1", "ml", "train", "dgx-h100-001", gpu_vf(8)), Allocation)
    names = ["dgx-h100-000", "dgx-h100-001", "ghost"]
    out = s.filter(gpu_vf(8), names, uid="u1")
    assert out.fits == ["dgx-h100-001"] and out.failed == {}
    assert out.unresolvable == dict.fromkeys(
        ["dgx-h100-000", "ghost"], "pod ml/train (u1) is already bound to 'dgx-h100-001'")
    assert s.scores(gpu_vf(8), names, uid="u1") == {
        "dgx-h100-000": 0, "dgx-h100-001": 10, "ghost": 0}
    # Without the UID (another pod of the same shape) the held node is full, as before.
    assert s.filter(gpu_vf(8), names).fits == ["dgx-h100-000"]
    s.release("u1")
    assert s.filter(gpu_vf(8), names, uid="u1").fits == ["dgx-h100-000", "dgx-h100-001"]


def test_concurrent_binds_from_threads_never_share_a_device():
    s = state("dgx-h100:2")
    results: list = []

    def worker(i: int) -> None:
        results.append(s.bind(f"u{i}", "ml", f"u{i}", f"dgx-h100-00{i % 2}", gpu_vf(1)))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, Allocation) for r in results) == 16
    held = [a for p in s.pods() for a in (*p.allocation.all_gpus, *p.allocation.vfs)]
    keys = [(p.node, x.pci_address) for p in s.pods()
            for x in (*p.allocation.all_gpus, *p.allocation.vfs)]
    assert len(keys) == len(set(keys)) == len(held)


ops = st.lists(st.tuples(st.sampled_from(["bind", "release"]), st.integers(0, 5),
                         st.sampled_from([0, 1, 2, 4, 8]), st.integers(0, 11)),
               max_size=25)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_grouped_filter_always_equals_asking_each_node(sequence):
    s = state("dgx-h100:3,hgx-h100-4nic:3")
    names = s.node_names()
    for i, (op, node, gpus, uid) in enumerate(sequence):
        if op == "bind":
            s.bind(f"u{uid}", "ml", f"u{uid}", names[node], Request(gpus=gpus, vfs=max(gpus, 1)))
        else:
            s.release(f"u{uid}")
        req = Request(gpus=sequence[-1][2], vfs=i % 3)
        out = s.filter(req, names)
        for n in names:
            direct = s.allocator.allocate(s.topology(n), s.ledger(n), req)
            assert (n in out.fits) == (not isinstance(direct, Infeasible))
            if isinstance(direct, Infeasible):
                assert (n in out.unresolvable) == direct.unresolvable


def test_each_node_of_a_group_gets_a_reason_naming_itself():
    s = state("dgx-h100:3")
    out = s.filter(gpu_vf(16), ["dgx-h100-002", "dgx-h100-001"])
    for name, reason in out.unresolvable.items():
        others = {"dgx-h100-000", "dgx-h100-001", "dgx-h100-002"} - {name}
        assert name in reason and not any(o in reason for o in others), reason


def renamed(t, node: str):
    """The same machine with other interface names and GPU UUIDs (as discovery would see
    a second server of one model)."""
    nics = tuple(dataclasses.replace(
        n, netdev=n.netdev and f"x{n.netdev}",
        vfs=tuple(dataclasses.replace(v, netdev=v.netdev and f"x{v.netdev}") for v in n.vfs))
        for n in t.nics)
    gpus = tuple(dataclasses.replace(g, uuid=f"GPU-{node}-{g.index}") for g in t.gpus)
    return dataclasses.replace(t, node=node, nics=nics, gpus=gpus)


def test_binds_name_each_nodes_own_devices_and_equal_asking_the_allocator_directly():
    (a,) = cluster_from_spec("dgx-h100:1")
    b = renamed(a, "other")
    s = ClusterState([a, b])
    assert s._nodes["other"].empty is s._nodes["dgx-h100-000"].empty  # one group
    direct = Allocator()
    for i, n in enumerate([1, 2, 1, 4]):
        for node in ("dgx-h100-000", "other"):
            want = direct.allocate(s.topology(node), s.ledger(node), gpu_vf(n))
            got = s.bind(f"{node}-{i}", "ml", "p", node, gpu_vf(n), decided_at="T")
            assert got == want.stamped("scheduler", "T")
    for p in s.pods():
        if p.node == "other":
            assert all(x.nic.netdev.startswith("x") for x in p.allocation.pairs)
            assert all(x.gpu.uuid.startswith("GPU-other-") for x in p.allocation.pairs)


def test_a_groups_reason_names_each_node_without_rewriting_other_words():
    # Node "16" and a request for 16 GPUs: the name went into the reason by a word regex,
    # which rewrote the count for the other member ("n2 GPUs requested but n2 has 8").
    (t,) = cluster_from_spec("dgx-h100:1")
    for order in (["16", "n2"], ["n2", "16"]):
        s = ClusterState([renamed(t, "16"), renamed(t, "n2")])
        out = s.filter(gpu_vf(16), order)
        assert out.unresolvable == {"16": "16 GPUs requested but 16 has 8",
                                    "n2": "16 GPUs requested but n2 has 8"}


health_ops = st.lists(st.tuples(
    st.sampled_from(["bind", "bind-pf", "release", "health"]), st.integers(0, 7),
    st.integers(0, 11), st.sets(st.integers(0, 40), max_size=6)), max_size=30)


@settings(max_examples=80, deadline=None)
@given(health_ops)
def test_no_new_pod_gets_an_unhealthy_device_and_pods_keep_theirs(sequence):
    """Health reports, binds (VFs or whole PFs) and releases in any order: a bind never
    gets a device then reported unhealthy (nor a VF of an unhealthy PF), a pod's holding
    never changes under it, and every unhealthy device no pod holds is kept back."""
    s = state("dgx-h100:1")
    (node,) = s.node_names()
    t = s.topology(node)
    devices = [g.pci_address for g in t.gpus] + [n.pci_address for n in t.nics] + [
        v.pci_address for n in t.nics for v in n.vfs]
    pf_of = {v.pci_address: n.pci_address for n in t.nics for v in n.vfs}
    vfs_of = {n.pci_address: {v.pci_address for v in n.vfs} for n in t.nics}
    bad: frozenset[str] = frozenset()
    held: dict[str, Allocation] = {}

    def free(ledger, a: str) -> bool:
        """Could a new pod have device `a` (a GPU, a VF, or a PF whole)?"""
        if a in pf_of:
            return a not in ledger.used_vfs and pf_of[a] not in ledger.used_pfs
        if a in vfs_of:
            return a not in ledger.used_pfs and not ledger.vfs_used_on(a)
        return a not in ledger.used_gpus

    for op, count, uid, picks in sequence:
        if op == "health":
            bad = frozenset(devices[i % len(devices)] for i in picks)
            s.set_unhealthy(node, bad)
        elif op == "release":
            s.release(f"u{uid}")
            held.pop(f"u{uid}", None)
        elif f"u{uid}" not in held:
            req = Request(pfs=count % 3 + 1) if op == "bind-pf" else gpu_vf(count % 5)
            got = s.bind(f"u{uid}", "ml", f"u{uid}", node, req)
            if isinstance(got, Allocation):
                held[f"u{uid}"] = got
                names = {x.pci_address for x in (*got.all_gpus, *got.all_nics)}
                assert not names & bad, names & bad
                assert not {pf_of[v.pci_address] for v in got.vfs} & bad
        assert {p.uid: p.allocation for p in s.pods()} == held
        down = bad | {v for pf in bad & vfs_of.keys() for v in vfs_of[pf]}
        assert not [a for a in down if free(s.ledger(node), a)]
