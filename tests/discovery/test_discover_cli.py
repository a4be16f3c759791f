"""`railyard discover` and `railyard fixture` as users run them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from railyard.cli.main import app
from railyard.discovery.profiles import DGX_H100, GENERIC, build_topology
from railyard.records.topology import topology_from_json

runner = CliRunner()


def test_profile_json_is_the_topology_document() -> None:
    result = runner.invoke(app, ["discover", "--profile", "generic", "--vfs-per-pf", "3"])
    assert result.exit_code == 0, result.output
    assert topology_from_json(json.loads(result.stdout)) == build_topology(GENERIC, 3)


def test_fixture_then_discover_sysfs_root_round_trips(tree_dir: Path) -> None:
    out = tree_dir / "tree"
    made = runner.invoke(app, ["fixture", "--profile", "dgx-h100", "--vfs-per-pf", "2",
                               str(out)])
    assert made.exit_code == 0, made.output
    found = runner.invoke(app, ["discover", "--sysfs-root", str(out)])
    assert found.exit_code == 0, found.output
    assert topology_from_json(json.loads(found.stdout)) == build_topology(DGX_H100, 2, rails=False)


def test_warnings_go_to_stderr_and_the_document_still_prints(tree_dir: Path) -> None:
    out = tree_dir / "tree"
    runner.invoke(app, ["fixture", "--profile", "generic", str(out)])
    (out / "proc/sys/kernel/hostname").unlink()
    result = subprocess.run(
        [sys.executable, "-m", "railyard.cli.main", "discover", "--sysfs-root", str(out)],
        capture_output=True, text=True, check=False)
    assert result.returncode == 0
    assert json.loads(result.stdout)["node"] == "unknown"
    assert result.stderr.startswith("railyard: warning: ")
    assert "proc/sys/kernel/hostname" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["discover", "--sysfs-root", "/etc"], "not a sysfs tree"),
    (["discover", "--profile", "nope"], "unknown profile 'nope'"),
    (["discover", "--profile", "generic", "--sysfs-root", "/"], "exclude each other"),
    (["discover", "--vfs-per-pf", "3"], "--profile only"),
    (["discover", "--profile", "generic", "--vfs-per-pf", "500"], "0..127"),
])
def test_errors_are_one_line_without_traceback(args: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "railyard.cli.main", *args],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("railyard: error: ") and message in result.stderr


def test_fixture_refuses_a_folder_that_is_not_empty(tree_dir: Path) -> None:
    (tree_dir / "keep").write_text("")
    test_errors_are_one_line_without_traceback(
        ["fixture", "--profile", "generic", str(tree_dir)], "not an empty folder")


def test_discover_on_this_machine_does_not_fail() -> None:
    result = runner.invoke(app, ["discover", "--format", "matrix"])
    assert result.exit_code == 0, result.output
    assert any(line.startswith("Node ") for line in result.stdout.splitlines())
