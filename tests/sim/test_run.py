"""The simulation run and its metrics, on small clusters with baseline policies."""

from __future__ import annotations

import pytest

from railyard.allocation.request import Request
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import Arrival, draw_arrivals
from railyard.sim.metrics import CELL_FREE, CELL_NO_NIC, CELL_PAIRED, _quantile, nic_states
from railyard.sim.policies import BestFitPolicy, make_allocation
from railyard.sim.run import PolicyError, parse_policies, sample_nodes, simulate
from railyard.sim.trace import TracePod, load_trace
from railyard.topology.model import Distance

BASELINE_NAMES = ["random", "numa", "koordinator", "best-fit"]


def arrival(seq: int, gpus: int, vfs: int, kind: str = "training") -> Arrival:
    return Arrival(seq, f"u{seq}", TracePod(f"p{seq}", 1, 1, gpus, 1000), kind,
                   Request(gpus=gpus, vfs=vfs))


def test_policies_parse_and_unknown_ones_are_named():
    assert parse_policies("random, numa,random") == ["random", "numa"]
    with pytest.raises(PolicyError, match="unknown policy 'fifo'"):
        parse_policies("random,fifo")
    with pytest.raises(PolicyError, match="no policy"):
        parse_policies(" , ")


def test_every_policy_faces_the_same_arrivals_and_metrics_add_up():
    topologies = list(cluster_from_spec("dgx-h100:2,dgx-a100:1,hgx-h100-4nic:1"))
    arrivals = draw_arrivals(load_trace("openb-multigpu20"), 32, seed=4)
    result = simulate(topologies, arrivals, BASELINE_NAMES, seed=4)
    assert list(result.results) == BASELINE_NAMES
    for r in result.results.values():
        m = r.metrics.as_json()
        assert m["podsArrived"] == len(arrivals)
        assert m["podsPlaced"] + m["podsFailed"] == len(arrivals)
        assert m["gpusAllocated"] <= m["clusterGpus"] == 32
        assert m["gpuAllocationRatioAtEnd"] == pytest.approx(m["gpusAllocated"] / 32, abs=1e-6)
        assert m["gpuAllocationRatio"] == m["atFullLoad"]["gpuAllocationRatio"]
        assert 0 <= m["gdrCapablePodShare"] <= 1
        assert m["gdrCapableMultiGpuPods"] <= m["multiGpuPodsPlaced"] <= m["multiGpuPodsArrived"]
        assert len(r.metrics.curve) == len(arrivals)
        assert len(r.heatmap) == len(result.nodes)


def test_first_failure_ratio_is_the_allocation_when_the_first_pod_failed():
    topologies = list(cluster_from_spec("dgx-h100:1"))
    arrivals = [arrival(0, 4, 4), arrival(1, 2, 2), arrival(2, 4, 4), arrival(3, 2, 2)]
    m = simulate(topologies, arrivals, ["best-fit"], seed=0).results["best-fit"].metrics
    assert m.placed == 3
    assert m.first_failure_ratio == pytest.approx(6 / 8)
    assert m.gpu_allocation_ratio == 1.0


def test_koordinator_makes_aligned_pods_gdr_capable_on_dgx_h100():
    topologies = list(cluster_from_spec("dgx-h100:1"))
    arrivals = [arrival(0, 2, 2), arrival(1, 4, 4)]
    m = simulate(topologies, arrivals, ["koordinator"], 0).results["koordinator"].metrics
    js = m.as_json()
    assert js["gdrCapableMultiGpuPods"] == 2 and js["gdrCapablePodShare"] == 1.0
    assert js["pairsByDistance"]["PIX"] == 6
    assert js["collectiveEfficiencyMultiGpu"] == 1.0


def test_strict_limit_violations_are_counted_for_policies_that_ignore_them():
    topologies = list(cluster_from_spec("hgx-h100-4nic:1"))
    strict = Request(gpus=8, vfs=8, max_distance=Distance.PXB)
    arrivals = [Arrival(0, "u0", TracePod("p", 1, 1, 8, 1000), "training", strict)]
    m = simulate(topologies, arrivals, ["random"], 0).results["random"].metrics
    assert m.placed == 1 and m.limit_violations == 1  # 4 of 8 GPUs have no NIC within PXB


def test_stranded_nics_are_free_vfs_without_a_free_gpu_within_pxb():
    topologies = list(cluster_from_spec("dgx-h100:1"))
    policy = BestFitPolicy(topologies, 0)
    t = topologies[0]
    assert nic_states(topologies, policy.ledgers())["strandedNics"] == 0
    # Take GPU 0 without a NIC: its PIX NIC (the only one within PXB) is stranded.
    policy.ledgers()[t.node].add("x", make_allocation(t.node, [t.gpus[0]], []))
    states = nic_states(topologies, policy.ledgers())
    assert states["strandedNics"] == 1 and states["strandedVfs"] == 8
    assert states["freeGpusWithoutGdrNic"] == 0


def test_a_full_node_strands_nothing():
    topologies = list(cluster_from_spec("hgx-h100-4nic:1"))
    policy = BestFitPolicy(topologies, 0)
    t = topologies[0]
    policy.ledgers()[t.node].add("odd", make_allocation(t.node, list(t.gpus[1::2]), []))
    assert nic_states(topologies, policy.ledgers())["strandedNics"] == 0  # GPUs 0,2,4,6 free
    policy.ledgers()[t.node].add("even", make_allocation(t.node, list(t.gpus[0::2]), []))
    states = nic_states(topologies, policy.ledgers())
    assert states["strandedNics"] == 0 and states["freeVfs"] == 32


def test_heatmap_cells_say_free_no_nic_or_pair_class():
    topologies = list(cluster_from_spec("dgx-h100:1"))
    arrivals = [arrival(0, 2, 2), arrival(1, 1, 0, "plain")]
    result = simulate(topologies, arrivals, ["koordinator"], 0)
    row = result.results["koordinator"].heatmap[0]
    assert row[:3] == [(CELL_PAIRED[Distance.PIX], 2), (CELL_PAIRED[Distance.PIX], 2),
                       (CELL_NO_NIC, 1)]
    assert row[3:] == [(CELL_FREE, 0)] * 5


def test_heatmap_sample_shows_every_profile():
    topologies = list(cluster_from_spec("dgx-h100:40,dgx-a100:10,hgx-h100-4nic:2"))
    sample = sample_nodes(topologies, 12)
    assert len(sample) <= 12
    assert {n.rsplit("-", 1)[0] for n in sample} == {"dgx-h100", "dgx-a100", "hgx-h100-4nic"}


def test_same_seed_gives_the_same_metrics_apart_from_latency():
    topologies = list(cluster_from_spec("dgx-h100:2,hgx-h100-4nic:1"))
    arrivals = draw_arrivals(load_trace("openb-default"), 24, seed=9)
    a = simulate(topologies, arrivals, BASELINE_NAMES, 9).metrics_json(with_latency=False)
    b = simulate(topologies, arrivals, BASELINE_NAMES, 9).metrics_json(with_latency=False)
    c = simulate(topologies, arrivals, BASELINE_NAMES, 10).metrics_json(with_latency=False)
    assert a == b
    assert a != c


def test_latency_leaves_out_every_policys_first_decision():
    """The first decision pays one-time costs; left out alike for every policy, it no longer
    is the p99 of a short run."""
    topologies = list(cluster_from_spec("dgx-h100:1"))
    arrivals = [arrival(i, 1, 1, "rdma") for i in range(3)]
    m = simulate(topologies, arrivals, ["random"], 0).results["random"].metrics
    m.latencies_s = [0.5, 0.001, 0.002, 0.003]
    out = m.as_json()
    assert (out["decisionLatencyP50Ms"], out["decisionLatencyP99Ms"]) == (2.0, 3.0)
    m.latencies_s = [0.5]  # one decision: nothing else to report
    assert m.as_json()["decisionLatencyP99Ms"] == 500.0


def ranks(n: int) -> list[float]:
    return [float(i) for i in range(1, n + 1)]


@pytest.mark.parametrize(("xs", "q", "expected"), [
    (ranks(2), 0.5, 1.0), (ranks(3), 0.5, 2.0), (ranks(4), 0.5, 2.0),
    (ranks(100), 0.99, 99.0), (ranks(300), 0.99, 297.0), (ranks(537), 0.99, 532.0),
    ([7.0], 0.99, 7.0), ([], 0.5, 0.0),
])
def test_quantile_is_the_nearest_rank(xs, q, expected):
    """The ⌈q·n⌉-th smallest value (round() rounded halves to even and took the next)."""
    assert _quantile(xs, q) == expected
