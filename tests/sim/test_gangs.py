"""`railyard simulate --jobs N` (docs/simulator.md, "Gangs"): gangs drawn as documented beside
the trace's pods, each placed all-or-nothing; Railyard keeps every placed gang on one rail
sequence; metrics.json keeps one object per policy, with railConsistentJobShare the only key
naming rails and gdrCapablePlacedShare over placed multi-GPU pods."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from railyard.cli.main import app
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import draw_arrivals
from railyard.sim.gangs import GANG_GPUS, GANG_PODS, add_gangs, gangs_of
from railyard.sim.run import simulate
from railyard.sim.trace import load_trace

POLICIES = ["railyard", "random", "numa", "koordinator", "best-fit", "fgd"]


def arrivals(cluster: str, jobs: int, seed: int = 3):
    tops = list(cluster_from_spec(cluster))
    drawn = draw_arrivals(load_trace("openb-multigpu20"), sum(len(t.gpus) for t in tops), seed,
                          load=0.7)
    return tops, drawn, add_gangs(drawn, jobs, seed)


def test_gangs_are_drawn_as_documented_and_leave_the_trace_pods_alone():
    _, drawn, with_gangs = arrivals("dgx-h100:4", 12)
    assert [a.uid for a in with_gangs if a.job is None] == [a.uid for a in drawn]
    assert [a.seq for a in with_gangs] == list(range(len(with_gangs)))
    sizes = gangs_of(with_gangs)
    assert len(sizes) == 12 and set(sizes.values()) <= set(GANG_PODS)
    for job in sizes:
        pods = [a for a in with_gangs if a.job == job]
        seqs = [a.seq for a in pods]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # consecutive
        assert len({(a.request.gpus, a.request.vfs) for a in pods}) == 1
        assert pods[0].request.gpus in GANG_GPUS and pods[0].request.vfs == pods[0].request.gpus
        assert pods[0].request.rail_policy == "required"
    assert add_gangs(drawn, 12, 3) == with_gangs  # the seed reproduces them
    with pytest.raises(ValueError):
        add_gangs(drawn, -1, 3)


def test_gangs_are_placed_all_or_nothing_and_railyard_keeps_their_rails():
    tops, _, with_gangs = arrivals("dgx-h100:6,dgx-a100:2", 10)
    result = simulate(tops, with_gangs, POLICIES, 3)
    sizes = gangs_of(with_gangs)
    for name, r in result.results.items():
        m = r.metrics
        for job, rails in m.job_rails.items():
            assert len(rails) in (0, sizes[job]), (name, job)  # all or nothing
        assert all(job not in m.job_rails or len(m.job_rails[job]) == n
                   for job, n in sizes.items())
        js = m.as_json()
        assert [k for k in js if "rail" in k.lower()] == ["railConsistentJobShare"]
        assert js["gangsArrived"] == 10
        if m.multi_placed:
            assert js["gdrCapablePlacedShare"] == round(m.multi_gdr / m.multi_placed, 6)
        assert js["gdrCapablePodShare"] == round(m.multi_gdr / m.multi_arrived, 6)
    ours = result.results["railyard"].metrics.as_json()
    assert ours["gangsPlaced"] > 0 and ours["railConsistentJobShare"] == 1.0


def test_a_gang_too_large_for_the_cluster_places_none_of_its_pods():
    tops = list(cluster_from_spec("dgx-h100:1"))
    drawn = draw_arrivals(load_trace("openb-multigpu20"), 8, 0, load=0.2)
    with_gangs = add_gangs(drawn, 1, 0)
    job = next(a.job for a in with_gangs if a.job)
    gang = [a for a in with_gangs if a.job == job]
    big = [a.__class__(a.seq, a.uid, a.pod, a.kind, a.request.__class__(gpus=8, vfs=8),
                       a.arrive_s, a.depart_s, job=a.job) for a in gang]
    mixed = [a for a in with_gangs if a.job != job] + big
    mixed = [a.__class__(i, a.uid, a.pod, a.kind, a.request, a.arrive_s, a.depart_s,
                         job=a.job) for i, a in enumerate(mixed)]
    result = simulate(tops, mixed, ["railyard"], 0, bounds=False)
    m = result.results["railyard"].metrics
    assert job not in m.job_rails
    assert m.as_json()["railConsistentJobShare"] is None


def test_simulate_jobs_writes_one_object_per_policy_and_nothing_else(tmp_path):
    out = CliRunner().invoke(app, ["simulate", "--cluster", "dgx-h100:4,hgx-h100-4nic:2",
                                   "--trace", "openb-multigpu20", "--load", "0.5",
                                   "--jobs", "4", "--no-progress", "--output", str(tmp_path)])
    assert out.exit_code == 0, out.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert list(metrics) == POLICIES
    for m in metrics.values():
        share = m["railConsistentJobShare"]
        assert share is None or 0 <= share <= 1
        assert 0 <= m["gdrCapablePlacedShare"] <= 1
    bad = CliRunner().invoke(app, ["simulate", "--jobs", "-2", "--output", str(tmp_path)])
    assert bad.exit_code == 2 and "--jobs" in bad.output
