"""What the report says first: whether Railyard did better than the best baseline, by how
much and why (naming the measure it wins, never a tie); and the level each policy's pods
achieved (`podsByWorstPair`, decision 0091), inside each policy's object of metrics.json."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from railyard.cli.main import app
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import draw_arrivals
from railyard.sim.metrics import PolicyMetrics
from railyard.sim.report import comparisons, headline
from railyard.sim.run import PolicyResult, SimResult, simulate
from railyard.sim.trace import load_trace
from railyard.topology.model import Distance

POLICIES = ["railyard", "random", "numa", "koordinator", "best-fit", "fgd"]


def _result(**by_policy: PolicyMetrics) -> SimResult:
    return SimResult(448, [], {n.replace("_", "-"): PolicyResult(m, [])
                               for n, m in by_policy.items()})


def _metrics(name: str, *, multi: int = 0, gdr: int = 0, placed: int = 10) -> PolicyMetrics:
    m = PolicyMetrics(name, 448, arrived=10, placed=placed, multi_arrived=multi,
                      multi_placed=multi, multi_gdr=gdr)
    m.multi_efficiency = [1.0] * gdr + [0.5] * (multi - gdr)
    return m


# ----------------------------------------------------------------- the headline


def test_the_headline_leads_with_the_win_its_size_and_why():
    result = _result(railyard=_metrics("railyard", multi=8, gdr=8),
                     random=_metrics("random", multi=8, gdr=0),
                     koordinator=_metrics("koordinator", multi=8, gdr=2))
    text = headline(result)
    assert text.startswith("Railyard is ahead on 2 of 4 measures. Above all, multi-GPU pods "
                           "with GPUDirect RDMA on every rank: 100.0% vs 25.0% for "
                           "koordinator (4.0× the share, +75.0 points) — because it picks "
                           "GPUs and NICs together"), text
    assert "Level on " in text and "pods placed (10, random too)" in text


def test_a_run_where_railyard_wins_nothing_says_so_and_names_where_it_is_behind():
    result = _result(railyard=_metrics("railyard", placed=9), random=_metrics("random"))
    text = headline(result)
    assert text.startswith("Railyard is not ahead of the best baseline on any of")
    assert "Behind on pods placed: 9 vs 10 for random." in text
    assert "Above all" not in text


def test_each_measure_is_against_the_best_baseline_on_that_measure():
    ry = _metrics("railyard", multi=4, gdr=4, placed=10)
    numa, fit = _metrics("numa", multi=4, gdr=3, placed=8), _metrics("best-fit", multi=4,
                                                                       placed=10)
    by_what = {c.what: c for c in comparisons(_result(railyard=ry, numa=numa, best_fit=fit))}
    gdr = by_what["multi-GPU pods with GPUDirect RDMA on every rank"]
    assert (gdr.best_name, gdr.best, gdr.won) == ("numa", 0.75, True)
    placed = by_what["pods placed"]
    assert (placed.best_name, placed.won, placed.lost) == ("best-fit", False, False)


def test_a_run_without_gangs_does_not_mention_rails():
    nodes = list(cluster_from_spec("dgx-h100:3,hgx-h100-4nic:1"))
    arrivals = draw_arrivals(load_trace("openb-multigpu20"), len(nodes) * 8, 0, load=0.6)
    plain = headline(simulate(nodes, arrivals, POLICIES, 0, bounds=False))
    assert plain.startswith("Railyard is ")
    assert "rail sequence" not in plain


def test_with_gangs_the_console_answers_first_leading_with_the_rail_sequence(tmp_path):
    out = CliRunner().invoke(app, ["simulate", "--cluster", "dgx-h100:2,hgx-h100-4nic:1",
                                   "--trace", "openb-multigpu20", "--load", "0.8",
                                   "--jobs", "3", "--no-progress", "--output", str(tmp_path)])
    assert out.exit_code == 0, out.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["railyard"]["railConsistentJobShare"] == 1.0
    assert all(m["railConsistentJobShare"] in (None, 0.0)
               for n, m in metrics.items() if n != "railyard")
    text = " ".join(out.output.split())
    assert re.match(r"Railyard is ahead on \d of \d measures\. Above all, gangs whose pods "
                    r"all keep one rail sequence: 100\.0% vs 0\.0% for random \(\+100\.0 "
                    r"points\) — because each later pod of a job is given the rail "
                    r"sequence", text), text[:400]
    assert text.index("Railyard is ahead") < text.index("pods placed ")  # before the table
    page = (tmp_path / "report.html").read_text()
    assert page.index('<p class="lead">Railyard is ahead') < page.index("<table>")


# ----------------------------------------------------------------- the achieved level


def test_metrics_json_has_a_worst_pair_histogram_in_each_policys_object_and_nothing_else(
        tmp_path):
    out = CliRunner().invoke(app, ["simulate", "--cluster", "dgx-h100:2,hgx-h100-4nic:2",
                                   "--trace", "openb-multigpu20", "--load", "1.0",
                                   "--no-progress", "--output", str(tmp_path)])
    assert out.exit_code == 0, out.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert list(metrics) == POLICIES  # one object per policy, nothing else at the top
    for m in metrics.values():
        hist = m["podsByWorstPair"]
        assert list(hist) == [d.name for d in Distance]
        assert all(isinstance(v, int) and v >= 0 for v in hist.values())
        # every pod with a pair is counted once, at its worst pair's class
        assert sum(hist.values()) <= m["podsPlaced"]
        assert sum(hist.values()) >= m["multiGpuPodsPlaced"]
        assert [k for k in m if "rail" in k.lower()] == ["railConsistentJobShare"]
    ours, theirs = metrics["railyard"]["podsByWorstPair"], metrics["random"]["podsByWorstPair"]
    assert ours["NODE"] + ours["SYS"] < theirs["NODE"] + theirs["SYS"]


def test_the_histogram_counts_each_placed_pod_at_its_worst_pair():
    nodes = list(cluster_from_spec("hgx-h100-4nic:1"))
    arrivals = draw_arrivals(load_trace("openb-multigpu20"), 8, 0, load=0.9)
    m = simulate(nodes, arrivals, ["railyard"], 0, bounds=False).results["railyard"].metrics
    worst = [max(p.distance for p in pairs).name for pairs in m.judged.values() if pairs]
    assert sum(m.worst_pairs.values()) == len(worst) > 0
    assert m.as_json()["podsByWorstPair"] == {d.name: worst.count(d.name) for d in Distance}
