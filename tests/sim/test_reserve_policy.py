"""`railyard simulate --reserve K` runs `railyard-reserve` (the extender's admission reserve)
beside the policies asked, so the trade shows side by side in metrics.json."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from railyard.cli.main import app


def test_reserve_adds_railyard_reserve_beside_railyard(tmp_path):
    result = CliRunner().invoke(app, [
        "simulate", "--cluster", "dgx-h100:4", "--trace", "openb-multigpu20", "--no-progress",
        "--policies", "railyard,random", "--reserve", "1", "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert list(metrics) == ["railyard", "railyard-reserve", "random"]
    kept, plain = metrics["railyard-reserve"], metrics["railyard"]
    # Four idle nodes, one kept: on this seeded run the small pods that would have opened
    # the last idle node are turned away, so fewer pods are placed and fewer GPUs allocated.
    assert 0 < kept["podsPlaced"] < plain["podsPlaced"]
    assert kept["gpuAllocationRatio"] < plain["gpuAllocationRatio"]


def test_a_negative_reserve_is_refused():
    result = CliRunner().invoke(app, ["simulate", "--reserve", "-1", "--no-progress"])
    assert result.exit_code != 0 and "reserve" in result.output
