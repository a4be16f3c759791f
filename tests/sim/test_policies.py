"""Baseline policies: real decisions on the Ledger, each behaving as the stack it stands for."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import DemandRule, draw_arrivals
from railyard.sim.judge import judge
from railyard.sim.metrics import nic_states
from railyard.sim.policies import (
    BASELINES,
    BestFitPolicy,
    KoordinatorPolicy,
    NumaPolicy,
    RandomPolicy,
    make_allocation,
)
from railyard.sim.run import DEFAULT_POLICIES, make_policy
from railyard.sim.trace import load_trace
from railyard.topology.model import Distance


def nodes(spec: str):
    return list(cluster_from_spec(spec))


def generic_with(change) -> list:
    """One `generic` node (2 GPUs, 2 RoCE NICs with 8 VFs each), every NIC changed."""
    base = nodes("generic:1")[0]
    return [dataclasses.replace(base, nics=tuple(change(n) for n in base.nics))]


# What a discovered node (a cluster file with `topology`) can really hold.
NIC_STATES = {
    # One ConnectX carrying the default route as well as RDMA: its VFs are offered
    # (docs/allocation.md: "never offered whole; its VFs are").
    "default-route-pf": lambda n: dataclasses.replace(n, default_route=True),
    # A port without a link: the allocator offers none of its VFs (shape.port_usable).
    "port-down": lambda n: dataclasses.replace(n, port_state="1: DOWN"),
    # VFs already moved into pods (netdev and RDMA device gone from the host view).
    "vfs-inside-pods": lambda n: dataclasses.replace(n, vfs=tuple(
        dataclasses.replace(v, netdev=None, rdma_device=None) for v in n.vfs)),
}


@pytest.mark.parametrize("state", sorted(NIC_STATES))
def test_every_policy_is_offered_the_same_vfs_as_railyard(state):
    """Same cluster for every policy: a baseline may use exactly the VFs Railyard's allocator
    may hand out, or the comparison handicaps one side."""
    topologies = generic_with(NIC_STATES[state])
    outcome = {}
    for name in DEFAULT_POLICIES:
        policy = make_policy(name, topologies, seed=0)
        outcome[name] = isinstance(policy.place("u1", Request(gpus=1, vfs=1)), Allocation)
    assert len(set(outcome.values())) == 1, outcome
    assert outcome["railyard"] == (state == "default-route-pf")


def held_gpus(policy) -> int:
    return sum(len(led.used_gpus) for led in policy.ledgers().values())


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_every_baseline_fills_a_node_and_then_refuses(name):
    policy = BASELINES[name](nodes("dgx-h100:1"), seed=0)
    for i in range(8):
        assert isinstance(policy.place(f"p{i}", Request(gpus=1, vfs=1)), Allocation)
    refused = policy.place("p8", Request(gpus=1))
    assert isinstance(refused, Infeasible)
    assert held_gpus(policy) == 8


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(sorted(BASELINES)), st.integers(0, 1000),
       st.lists(st.sampled_from([(1, 0), (1, 1), (2, 2), (4, 4), (8, 8)]), max_size=30))
def test_baselines_never_hand_out_a_device_twice(name, seed, shapes):
    topologies = nodes("dgx-h100:1,dgx-a100:1,hgx-h100-4nic:1")
    policy = BASELINES[name](topologies, seed)
    placed = []
    for i, (g, v) in enumerate(shapes):
        result = policy.place(f"p{i}", Request(gpus=g, vfs=v))
        if isinstance(result, Allocation):
            assert len(result.all_gpus) == g and len(result.vfs) == v
            placed.append(result)
    gpus = [(a.node, g.pci_address) for a in placed for g in a.all_gpus]
    vfs = [(a.node, n.pci_address) for a in placed for n in a.vfs]
    assert len(gpus) == len(set(gpus)) and len(vfs) == len(set(vfs))
    assert held_gpus(policy) == len(gpus)


@pytest.mark.parametrize(("state", "free"), [
    ("default-route-pf", 16), ("port-down", 0), ("vfs-inside-pods", 0)])
def test_free_vfs_count_the_vfs_railyard_can_hand_out(state, free):
    """nic_states judges every policy by the VFs the allocator offers: a default-route PF's
    VFs are free, a down port's and those already inside pods are not."""
    topologies = generic_with(NIC_STATES[state])
    railyard = make_policy("railyard", topologies, seed=0)
    assert nic_states(topologies, railyard.ledgers())["freeVfs"] == free


def test_random_policy_is_reproducible_from_its_seed():
    def run(seed):
        p = RandomPolicy(nodes("dgx-h100:3"), seed)
        return [p.place(f"p{i}", Request(gpus=1, vfs=1)) for i in range(10)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_numa_policy_keeps_a_pod_on_one_numa_node_when_it_can():
    topo = nodes("dgx-a100:1")
    policy = NumaPolicy(topo, seed=3)
    for i in range(4):
        alloc = policy.place(f"p{i}", Request(gpus=2, vfs=2))
        assert isinstance(alloc, Allocation)
        assert len(alloc.numa_nodes) == 1
        # On DGX A100 a NUMA node is a switch group: every pair is PXB.
        assert {p.distance for p in judge(topo[0], alloc)} == {Distance.PXB}


def test_numa_policy_spans_numa_nodes_when_none_can_hold_the_pod():
    policy = NumaPolicy(nodes("dgx-h100:1"), seed=0)
    alloc = policy.place("big", Request(gpus=8, vfs=8))
    assert isinstance(alloc, Allocation) and alloc.numa_nodes == (0, 1)


def test_koordinator_takes_lowest_gpus_and_nics_on_their_root_bus():
    topo = nodes("dgx-h100:1")
    policy = KoordinatorPolicy(topo, seed=0)
    alloc = policy.place("p", Request(gpus=2, vfs=2))
    assert [g.index for g in alloc.all_gpus] == [0, 1]
    assert {p.distance for p in judge(topo[0], alloc)} == {Distance.PIX}


def test_koordinator_on_hgx_4nic_gives_gpu1_a_nic_off_its_root():
    topo = nodes("hgx-h100-4nic:1")
    alloc = KoordinatorPolicy(topo, seed=0).place("p", Request(gpus=2, vfs=2))
    assert [g.index for g in alloc.all_gpus] == [0, 1]
    assert max(p.distance for p in judge(topo[0], alloc)) > Distance.PXB


def test_koordinator_with_a_hard_limit_filters_nodes_without_same_pcie_nics():
    topo = nodes("hgx-h100-4nic:1")
    policy = KoordinatorPolicy(topo, seed=0)
    first = policy.place("a", Request(gpus=1, vfs=1, max_distance=Distance.PXB))
    assert isinstance(first, Allocation) and first.all_gpus[0].index == 0
    # Next lowest GPU is 1, whose root bus has no NIC: SamePCIe fails.
    second = policy.place("b", Request(gpus=1, vfs=1, max_distance=Distance.PXB))
    assert isinstance(second, Infeasible)


def test_koordinator_spreads_by_least_allocated():
    policy = KoordinatorPolicy(nodes("dgx-h100:2"), seed=0)
    first = policy.place("a", Request(gpus=1))
    second = policy.place("b", Request(gpus=1))
    assert first.node != second.node


class UnrememberedKoordinator(KoordinatorPolicy):
    """The reference: every node re-planned for every pod, as before plans were kept."""

    def _plan(self, node, request, strict):
        self._plans.clear()
        return super()._plan(node, request, strict)


@pytest.mark.parametrize("strict", [False, True])
def test_koordinator_keeping_plans_changes_no_decision(strict):
    topologies = nodes("hgx-h100-4nic:4,dgx-h100:2,dgx-a100:2,mi300x:1,generic:2")
    gpus = sum(len(t.gpus) for t in topologies)
    rule = DemandRule(vf_share=1.0, strict=strict)
    arrivals = draw_arrivals(load_trace("openb-multigpu20"), gpus, 3, rule, load=2.0)
    kept, fresh = KoordinatorPolicy(topologies, 3), UnrememberedKoordinator(topologies, 3)
    decisions = [(kept.place(a.uid, a.request), fresh.place(a.uid, a.request))
                 for a in arrivals]
    assert all(a == b for a, b in decisions)
    assert sum(isinstance(a, Allocation) for a, _ in decisions) > len(arrivals) // 4
    assert any(isinstance(a, Infeasible) for a, _ in decisions)


def test_koordinator_sees_a_ledger_change_made_outside_it():
    topo = nodes("dgx-h100:2")
    policy = KoordinatorPolicy(topo, seed=0)
    first = policy.place("a", Request(gpus=1, vfs=1))  # plans the other node: its GPU 0
    other = next(t for t in topo if t.node != first.node)
    policy.ledgers()[other.node].add("x", make_allocation(other.node, [other.gpus[0]], []))
    second = policy.place("b", Request(gpus=1, vfs=1))  # the other node has more VFs free
    assert isinstance(second, Allocation) and second.node == other.node
    assert [g.index for g in second.all_gpus] == [1]


def test_best_fit_packs_the_fullest_node_first():
    policy = BestFitPolicy(nodes("dgx-h100:3"), seed=0)
    first = policy.place("a", Request(gpus=1))
    for i in range(7):
        assert policy.place(f"b{i}", Request(gpus=1)).node == first.node
    assert policy.place("c", Request(gpus=1)).node != first.node


def test_baselines_leave_pairing_to_the_judge():
    alloc = RandomPolicy(nodes("dgx-h100:1"), 0).place("p", Request(gpus=2, vfs=2))
    assert alloc.pairs == () and len(alloc.gpus) == 2 and len(alloc.nics) == 2


def test_baselines_refuse_what_they_do_not_model():
    result = RandomPolicy(nodes("dgx-h100:1"), 0).place("p", Request(gpus=1, pfs=1))
    assert isinstance(result, Infeasible)
