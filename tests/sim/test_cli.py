"""`railyard simulate` end to end on small clusters: files written, errors as messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import railyard.sim.run
from railyard.cli.main import app

SMALL = ["--cluster", "dgx-h100:2,dgx-a100:1,hgx-h100-4nic:1", "--no-progress"]
BASELINES = "random,numa,koordinator,best-fit"


def run(*args: str):
    return CliRunner().invoke(app, ["simulate", *args])


def test_simulate_writes_metrics_charts_and_a_self_contained_report(tmp_path):
    out = tmp_path / "report"
    result = run(*SMALL, "--policies", BASELINES, "--output", str(out))
    assert result.exit_code == 0, result.output
    assert f"report: {out / 'report.html'}" in result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == set(BASELINES.split(","))
    for m in metrics.values():
        assert 0 <= m["gpuAllocationRatio"] <= 1
        assert 0 <= m["gdrCapablePodShare"] <= 1
    for png in ("allocation.png", "pairs.png", "heatmap.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3
    assert "http://" not in page and "src=\"http" not in page
    assert "CC BY 4.0" in page


def test_table_lists_each_policy_and_the_shared_gpus_footnote(tmp_path):
    result = run(*SMALL, "--policies", "random,best-fit,fgd", "--output", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert all(p in result.output for p in ("random", "best-fit", "fgd"))
    assert "share of one GPU shares it" in " ".join(result.output.split())


def test_bad_inputs_are_one_line_errors(tmp_path):
    cases = [
        (["--policies", "fifo"], "unknown policy 'fifo'"),
        (["--cluster", "dgx-h100:x"], "count must be a positive integer"),
        (["--cluster", "no-such-profile:2"], "unknown profile"),
        (["--cluster", str(tmp_path / "cluster.yaml")], "no such file"),
        (["--trace", str(tmp_path / "missing.csv")], "neither a built-in trace"),
        (["--vf-share", "2"], "vf share must be within 0..1"),
        (["--load", "0"], "--load must be within"),
    ]
    for args, message in cases:
        result = run("--no-progress", "--output", str(tmp_path / "o"), *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output


def test_simulate_rejects_an_unusable_output_before_simulating(tmp_path, monkeypatch):
    """`--output` naming a file: the run can take minutes and would be thrown away; the
    option is bad input like any other and fails first."""
    calls = []
    real = railyard.sim.run.simulate

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(railyard.sim.run, "simulate", spy)
    not_a_folder = tmp_path / "report"
    not_a_folder.write_text("a file, not a folder\n")
    result = run("--cluster", "dgx-h100:1", "--no-progress", "--policies", "random",
                 "--output", str(not_a_folder))
    assert result.exit_code == 2, result.output
    assert "cannot write the report" in result.output
    assert calls == [], "the whole simulation ran before --output was checked"
    assert not_a_folder.read_text() == "a file, not a folder\n"


def test_ctrl_c_ends_with_a_message_and_exit_130(tmp_path, monkeypatch, capsys):
    """Typer turns KeyboardInterrupt into exit 130 without a word; the user is told."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(railyard.sim.run, "simulate", interrupted)
    with pytest.raises(SystemExit) as exit_:
        app(["simulate", *SMALL, "--policies", "random", "--output", str(tmp_path / "r")])
    assert exit_.value.code == 130
    assert capsys.readouterr().err.strip().endswith("railyard: interrupted")
    assert not (tmp_path / "r" / "metrics.json").exists()


def test_cluster_file_is_accepted(tmp_path):
    f = tmp_path / "cluster.yaml"
    f.write_text("nodes:\n- {name: a, profile: dgx-h100}\n- {name: b, profile: dgx-a100}\n")
    result = run("--cluster", str(f), "--policies", "random", "--no-progress",
                 "--output", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["random"][
        "clusterGpus"] == 16


# The metrics of a run, printed as JSON by a fresh interpreter (no charts: they cost seconds).
_RUN = """
import json, sys
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import draw_arrivals
from railyard.sim.run import DEFAULT_POLICIES, simulate
from railyard.sim.trace import load_trace
nodes = list(cluster_from_spec("dgx-h100:2,dgx-a100:1,hgx-h100-4nic:1"))
arrivals = draw_arrivals(load_trace("openb-multigpu20"), 32, seed=3)
result = simulate(nodes, arrivals, DEFAULT_POLICIES, seed=3)
print(json.dumps(result.metrics_json(with_latency=False), sort_keys=True))
"""


def test_seed_reproduces_every_number_across_processes():
    """Two interpreters with different string-hash seeds: the same metrics, every policy
    (latency aside, which --seed cannot fix)."""
    def once(hash_seed: str) -> dict:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-c", _RUN], check=True, env=env,
                              capture_output=True, text=True)
        return json.loads(done.stdout)

    first = once("1")
    assert set(first) == {"railyard", "random", "numa", "koordinator", "best-fit", "fgd"}
    assert first == once("2")
