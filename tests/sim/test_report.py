"""The simulator's report: it states the run it describes (load, headline, heatmap moment),
and it is written whole or not at all."""

from __future__ import annotations

import json
import warnings

import pytest
from typer.testing import CliRunner

from railyard.cli.main import app
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import draw_arrivals
from railyard.sim.report import REPORT_FILES, RunInfo, write_report
from railyard.sim.run import SimResult, simulate
from railyard.sim.trace import load_trace

SMALL = ["--cluster", "dgx-h100:1,dgx-a100:1", "--no-progress"]


def run(*args: str):
    return CliRunner().invoke(app, ["simulate", *args])


def small_result(seed: int, policies: list[str], load: float = 1.3) -> SimResult:
    nodes = list(cluster_from_spec("dgx-h100:1,dgx-a100:1"))
    arrivals = draw_arrivals(load_trace("openb-multigpu20"), 16, seed, load=load)
    return simulate(nodes, arrivals, policies, seed)


def info(seed: int, load: float = 1.3) -> RunInfo:
    return RunInfo(cluster="c", trace="t", seed=seed, vf_share=0.25, strict=False, load=load,
                   arrivals=1, multi_gpu_arrivals=0, fractional_pods=0, cpu_only_rows=0,
                   nodes=2)


# ----------------------------------------------------------------- says what was run

def test_headline_does_not_claim_a_100_percent_snapshot_that_never_happened(tmp_path):
    result = run(*SMALL, "--load", "0.4", "--policies", "railyard,random",
                 "--output", str(tmp_path))
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert "atFullLoad" not in metrics["railyard"]  # arrivals stopped at 40%
    text = " ".join(result.output.split())
    assert "Railyard had" in text and "at the end" in text
    assert "when live pods' requests reached" not in text, text


def test_headline_states_the_100_percent_snapshot_when_there_is_one(tmp_path):
    result = run(*SMALL, "--policies", "railyard,random", "--output", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "when live pods' requests reached the cluster's GPUs" in " ".join(
        result.output.split())


@pytest.mark.parametrize(("load", "shown"), [("0.4", "40%"), ("2", "200%"), ("1.3", "130%")])
def test_report_states_the_load_it_was_run_with(tmp_path, load, shown):
    result = run(*SMALL, "--load", load, "--policies", "random", "--output", str(tmp_path))
    assert result.exit_code == 0, result.output
    page = " ".join((tmp_path / "report.html").read_text().split())
    assert f"reach {shown} of the cluster's GPUs (<code>--load {load}</code>" in page


def test_a_run_short_of_100_percent_shows_its_end_in_the_heatmap_without_layout_warnings(
        tmp_path):
    """The 100% marker sat beyond a short run's axes: matplotlib warned that tight_layout
    could not fit it, and the heatmap claimed a 100% moment that never came."""
    result = small_result(0, ["random"], load=0.4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        page = write_report(result, info(0, load=0.4), tmp_path).read_text()
    reached = result.results["random"].metrics.arrived_load  # under 1: the draw stopped short
    assert reached < 1
    assert f"A sample of nodes at the end of the run (arrivals reached {100 * reached:.1f}%" in page
    assert "when arrivals reach 100%" not in page


# ----------------------------------------------------------------- never half-written

def test_an_interrupted_report_leaves_no_truncated_chart_and_no_mixed_runs(tmp_path,
                                                                           monkeypatch):
    """Ctrl-C while the charts are written: what is in the folder must be one whole run
    (the old one), never a truncated PNG or new metrics beside an old report."""
    from PIL import Image

    out = tmp_path / "r"
    write_report(small_result(1, ["random"]), info(1), out)
    old = {name: (out / name).read_bytes() for name in REPORT_FILES}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setitem(Image.SAVE, "PNG", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_report(small_result(2, ["random"]), info(2), out)
    monkeypatch.undo()

    changed = [name for name in REPORT_FILES if (out / name).read_bytes() != old[name]]
    assert changed == []
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES)  # no temp folder


def test_a_report_replaces_the_previous_one_whole(tmp_path):
    write_report(small_result(1, ["random"]), info(1), tmp_path)
    old = {name: (tmp_path / name).read_bytes() for name in REPORT_FILES}
    (tmp_path / "notes.txt").write_text("the user's own file\n")
    write_report(small_result(2, ["random"]), info(2), tmp_path)
    assert all((tmp_path / name).read_bytes() != old[name] for name in REPORT_FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted((*REPORT_FILES, "notes.txt"))
