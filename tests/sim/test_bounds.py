"""The offline bound: never below any policy's figure, tight where the argument is simple, null
and said so when not computed. (`simulate` itself raises BoundViolation when a policy beats
a computed bound, so every run in the tests checks it.)"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import railyard.sim.bounds as bounds_module
from railyard.allocation.request import Request
from railyard.cli.main import app
from railyard.discovery.profiles import PROFILES, build_topology
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import Arrival
from railyard.sim.bounds import busiest_moments, node_groups, offline_bounds
from railyard.sim.run import DEFAULT_POLICIES, simulate
from railyard.sim.trace import TracePod


def pod_arrival(seq: int, gpus: int, arrive: float = 0.0, depart: float | None = None,
                cpu_milli: int = 1000) -> Arrival:
    kind = "training" if gpus > 1 else "plain"
    return Arrival(seq, f"u{seq}", TracePod(f"p{seq}", cpu_milli, 1024, gpus, 1000), kind,
                   Request(gpus=gpus, vfs=gpus if gpus > 1 else 0), arrive, depart)


@pytest.mark.parametrize(("profile", "pairs"), [("dgx-h100", 8), ("dgx-a100", 8),
                                                 ("hgx-h100-4nic", 4), ("generic", 1)])
def test_gdr_pairs_of_a_node_are_its_gpus_that_can_each_have_their_own_near_vf(profile, pairs):
    (group,) = node_groups([build_topology(PROFILES[profile])])
    assert group.gdr_pairs == pairs == group.gdr_gpus


def test_no_8_gpu_pod_can_be_gdr_capable_where_only_4_gpus_have_a_nic_within_pxb():
    topologies = list(cluster_from_spec("hgx-h100-4nic:2"))
    b = offline_bounds(topologies, [pod_arrival(0, 8), pod_arrival(1, 4)])
    assert b.gdr_capable_pod_share.count == 1 and b.gdr_capable_pod_share.value == 0.5


def test_two_pods_of_more_than_half_a_node_never_share_one():
    topologies = list(cluster_from_spec("dgx-h100:1"))
    arrivals = [pod_arrival(0, 5), pod_arrival(1, 5)]  # demand reaches 10 of 8 GPUs
    b = offline_bounds(topologies, arrivals)
    assert b.gpu_allocation_ratio.count == 5 and b.gpu_allocation_ratio.value == 5 / 8
    result = simulate(topologies, arrivals, list(DEFAULT_POLICIES), seed=0)
    for r in result.results.values():
        assert r.metrics.headline_allocation_ratio == 5 / 8  # tight here


def test_cpus_bound_the_gpus_too():
    topologies = list(cluster_from_spec("generic:2"))  # 16 CPUs, 2 GPUs each
    arrivals = [pod_arrival(i, 1, cpu_milli=10_000) for i in range(4)]
    b = offline_bounds(topologies, arrivals)
    assert b.gpu_allocation_ratio.count == 2  # one 10-CPU pod per 16-CPU node


def test_only_the_busiest_moments_are_checked():
    a = pod_arrival(0, 1, 0.0, 10.0)
    b = pod_arrival(1, 1, 1.0, 2.0)
    c = pod_arrival(2, 1, 5.0, None)
    moments = busiest_moments([a, b, c])
    assert [[x.uid for x in m] for m in moments] == [["u0", "u1"], ["u0", "u2"]]


@st.composite
def churn(draw: st.DrawFn) -> list[Arrival]:
    out = []
    for seq in range(draw(st.integers(1, 30))):
        gpus = draw(st.sampled_from([1, 1, 2, 4, 8]))
        arrive = float(draw(st.integers(0, 30)))
        life = draw(st.one_of(st.none(), st.integers(0, 20)))
        out.append(pod_arrival(seq, gpus, arrive, None if life is None else arrive + life,
                               cpu_milli=draw(st.integers(0, 120_000))))
    return out


@settings(max_examples=15, deadline=None)
@given(arrivals=churn(), seed=st.integers(0, 2))
def test_no_policy_beats_the_bound_on_random_churn(arrivals: list[Arrival], seed: int) -> None:
    topologies = list(cluster_from_spec("dgx-h100:1,hgx-h100-4nic:1,dgx-a100:1"))
    result = simulate(topologies, arrivals, list(DEFAULT_POLICIES), seed)  # raises if one does
    assert result.bounds is not None
    for r in result.results.values():
        assert r.metrics.multi_gdr <= (result.bounds.gdr_capable_pod_share.count or 0)


def test_report_writes_bounds_beside_metrics_which_keeps_one_object_per_policy(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--cluster", "dgx-h100:2,hgx-h100-4nic:1",
                                      "--no-progress", "--policies", "railyard,best-fit",
                                      "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert set(metrics) == {"railyard", "best-fit"}
    bounds = json.loads((tmp_path / "bounds.json").read_text())
    assert {"gpuAllocationRatio", "gdrCapablePodShare", "class", "assumptions"} <= set(bounds)
    for name, m in metrics.items():
        assert m["gpuAllocationRatio"] <= bounds["gpuAllocationRatio"]["value"], name
        assert m["gdrCapablePodShare"] <= bounds["gdrCapablePodShare"]["value"], name
    assert "Offline bound" in (tmp_path / "report.html").read_text()


def test_a_bound_too_costly_to_compute_is_null_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(bounds_module, "MAX_PROGRAM_SIZE", 0)
    result = CliRunner().invoke(app, ["simulate", "--cluster", "dgx-h100:2", "--no-progress",
                                      "--trace", "openb-multigpu20", "--policies", "random",
                                      "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    bounds = json.loads((tmp_path / "bounds.json").read_text())
    for key in ("gpuAllocationRatio", "gdrCapablePodShare"):
        assert bounds[key]["value"] is None and bounds[key]["method"] == "none"
        assert "not computed" in bounds[key]["note"]
    assert "GPU allocation not computed" in " ".join(result.output.split())


def test_a_policy_at_its_bound_is_no_violation_after_rounding():
    """metrics.json rounds ratios to 6 places: 447/448 rounds up past the exact bound."""
    from railyard.sim.bounds import Bound, Bounds
    from railyard.sim.metrics import PolicyMetrics
    from railyard.sim.run import PolicyResult, SimResult

    m = PolicyMetrics("p", 448)
    m.snapshots["atFullLoad"] = {"gpuAllocationRatio": round(447 / 448, 6)}
    result = SimResult(448, [], {"p": PolicyResult(m, [])},
                       Bounds(Bound(447 / 448, 447, "milp"), Bound(0.0, 0, "none")))
    assert round(447 / 448, 6) > 447 / 448
    assert result.bound_violations() == []
    m.snapshots["atFullLoad"] = {"gpuAllocationRatio": round(448 / 448, 6)}
    assert result.bound_violations() == ["p: gpuAllocationRatio 1.0 > bound 0.9977678571428571"]
