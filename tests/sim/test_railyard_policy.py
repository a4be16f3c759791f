"""The `railyard` policy is the extender's ClusterState and allocator, and it wins where the
issue says it must (openb multi-GPU trace over the default cluster)."""

from __future__ import annotations

import pytest

from railyard.allocation.allocator import Allocator
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.scheduler.state import ClusterState
from railyard.sim.arrivals import draw_arrivals
from railyard.sim.railyard_policy import RailyardPolicy
from railyard.sim.run import DEFAULT_POLICIES, make_policy, simulate
from railyard.sim.trace import load_trace
from railyard.topology.model import Distance

DEFAULT_CLUSTER = "dgx-h100:32,dgx-a100:16,hgx-h100-4nic:8"


def test_railyard_policy_runs_the_extenders_cluster_state_and_allocator():
    policy = RailyardPolicy(list(cluster_from_spec("dgx-h100:2")), seed=0)
    assert type(policy.state) is ClusterState
    assert type(policy.state.allocator) is Allocator
    alloc = policy.place("uid-1", Request(gpus=2, vfs=2))
    assert isinstance(alloc, Allocation)
    bound = {p.uid: p for p in policy.state.pods()}
    assert bound["uid-1"].allocation == alloc  # recorded by bind, as the extender does
    assert policy.ledgers()[alloc.node].allocation("uid-1") == alloc
    assert [p.distance for p in alloc.pairs] == [Distance.PIX, Distance.PIX]


def test_railyard_policy_says_why_when_nothing_fits():
    policy = RailyardPolicy(list(cluster_from_spec("hgx-h100-4nic:1")), seed=0)
    result = policy.place("big", Request(gpus=8, vfs=8, max_distance=Distance.PXB))
    assert isinstance(result, Infeasible)
    assert "no node fits" in result.reason


def test_railyard_pairs_hgx_4nic_gpus_that_have_their_own_nic():
    topologies = list(cluster_from_spec("hgx-h100-4nic:1"))
    policy = make_policy("railyard", topologies, 0)
    alloc = policy.place("p", Request(gpus=2, vfs=2))
    assert all(p.distance <= Distance.PXB for p in alloc.pairs)


def test_spread_variant_is_the_same_allocator_with_spread_packing():
    policy = make_policy("railyard-spread", list(cluster_from_spec("dgx-h100:2")), 0)
    assert policy.name == "railyard-spread"
    assert policy.state.allocator.packing == "spread"
    a = policy.place("a", Request(gpus=1))
    b = policy.place("b", Request(gpus=1))
    assert a.node != b.node


def _open_a_share_then_two_pairs(policy: RailyardPolicy) -> tuple[str, list[bool]]:
    """Node a holds 6 of its 8 GPUs, node b 5: a one-GPU pod scores alike on both. A share
    of 600 finds no shared GPU and opens one; then two 2-GPU pods arrive."""
    a, b = policy.state.node_names()
    for i in range(6):
        assert isinstance(policy.place(f"a{i}", Request(gpus=1), [a]), Allocation)
    for i in range(5):
        assert isinstance(policy.place(f"b{i}", Request(gpus=1), [b]), Allocation)
    scores = policy.state.scores(Request(gpus=1), [a, b])
    assert scores[a] == scores[b]  # a tie the extender's score cannot break
    share = policy.place("share", Request(gpus=1), gpu_milli=600)
    assert isinstance(share, Allocation)
    pairs = [policy.place(f"pair{i}", Request(gpus=2)) for i in range(2)]
    return share.node, [isinstance(p, Allocation) for p in pairs]


def test_a_share_opens_its_gpu_where_fragmentation_grows_least_among_best_scored_nodes():
    """Decision 0098: opened on node a, the share would leave a with one whole free GPU,
    too few for a 2-GPU pod (all of a's free milli a fragment for that shape), and only one
    pair would fit; on b both fit. Without a workload the tie breaks at random, and some
    seed loses a pair."""
    topologies = list(cluster_from_spec("dgx-h100:2"))
    workload = [(0, 2, 1000)] * 3 + [(0, 1, 600)]
    for seed in range(8):
        node, placed = _open_a_share_then_two_pairs(
            RailyardPolicy(topologies, seed, workload=workload))
        assert node == topologies[1].node and placed == [True, True]
    at_random = [_open_a_share_then_two_pairs(RailyardPolicy(topologies, seed))[1]
                 for seed in range(8)]
    assert [True, False] in at_random


def test_railyard_results_are_reproducible_in_one_process():
    topologies = list(cluster_from_spec("dgx-h100:2,dgx-a100:1,hgx-h100-4nic:1"))
    arrivals = draw_arrivals(load_trace("openb-multigpu20"), 32, seed=5)
    a = simulate(topologies, arrivals, ["railyard"], 5).metrics_json(with_latency=False)
    b = simulate(topologies, arrivals, ["railyard"], 5).metrics_json(with_latency=False)
    assert a == b


@pytest.mark.slow
def test_on_openb_multigpu_railyard_places_as_many_gpus_and_more_gdr_pods_than_any_baseline():
    """The issue's acceptance criterion, on the default cluster and seed."""
    topologies = list(cluster_from_spec(DEFAULT_CLUSTER))
    gpus = sum(len(t.gpus) for t in topologies)
    arrivals = draw_arrivals(load_trace("openb-multigpu20"), gpus, seed=0)
    result = simulate(topologies, arrivals, DEFAULT_POLICIES, seed=0)
    ry = result.results["railyard"].metrics
    baselines = [r.metrics for n, r in result.results.items() if n != "railyard"]
    # GPU allocation when arrivals reach 100% (gpuAllocationRatio). With shared GPUs
    # (decision 0094) best-fit ends this 130% draw holding one share (0.23 GPU) more.
    assert ry.headline_allocation_ratio >= max(b.headline_allocation_ratio for b in baselines)
    assert ry.multi_gdr > max(b.multi_gdr for b in baselines)
    assert ry.as_json()["maxDistanceViolations"] == 0
