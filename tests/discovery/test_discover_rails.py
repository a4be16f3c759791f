"""`railyard discover` shows each NIC's rail: profiles have them, `--rails` sets them as the
agent's config would (docs/rails.md)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from railyard.cli.main import app

runner = CliRunner()


def test_discover_profile_shows_rails_in_json_and_matrix():
    out = runner.invoke(app, ["discover", "--profile", "mi300x", "--vfs-per-pf", "0"])
    assert out.exit_code == 0, out.output
    assert [n["rail"] for n in json.loads(out.stdout)["nics"]] == list(range(8))
    matrix = runner.invoke(app, ["discover", "--profile", "mi300x", "--format", "matrix"])
    assert "NIC7: mlx5_7" in matrix.stdout and "rail 7" in matrix.stdout


def test_discover_rails_option_sets_or_refuses():
    out = runner.invoke(app, ["discover", "--profile", "generic", "--rails", '{"mlx5_1": 4}'])
    assert out.exit_code == 0, out.output
    assert [n.get("rail") for n in json.loads(out.stdout)["nics"]] == [None, 4]
    bad = runner.invoke(app, ["discover", "--profile", "generic", "--rails", '{"mlx5_9": 4}'])
    assert bad.exit_code == 2 and "no NIC of generic is named mlx5_9" in bad.output
