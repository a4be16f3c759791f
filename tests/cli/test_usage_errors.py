"""Usage errors from the command line: one line on stderr and exit 2, as a person sees them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def railyard(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "railyard.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, words", [
    (("discover", "--format", "xml"), ("--format", "xml")),
    (("fixture", "out"), ("--profile",)),
    (("cni", "serve", "--bogus"), ("--bogus",)),
])
def test_a_usage_error_is_one_line_naming_the_option_and_exit_2(args, words):
    r = railyard(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("railyard ") and "error:" in lines[0]
    assert all(w in lines[0] for w in words)
    assert "Traceback" not in r.stderr


def test_a_bare_group_shows_its_commands_and_exits_2():
    r = railyard("cni")
    assert r.returncode == 2
    assert "serve" in r.stdout and "install" in r.stdout


@pytest.mark.parametrize("content", [
    "[" * 100_000,  # RecursionError inside json.loads
    '[{"version": 1, "node": "generic", "decidedBy": "scheduler", "numaNodes": [0], '
    '"memoryBytes": {"\u00b2": 1}, "pairs": []}]',  # "²".isdigit(), but int("²") fails
], ids=["deeply-nested-json", "superscript-numa-key"])
def test_allocate_used_file_errors_are_one_line_without_traceback(tmp_path: Path,
                                                                  content: str) -> None:
    used = tmp_path / "used.json"
    used.write_text(content, encoding="utf-8")
    r = railyard("allocate", "--profile", "generic", "--request", "gpus=1", "--used", str(used))
    assert "Traceback" not in r.stderr
    assert r.returncode == 2 and r.stderr.startswith("railyard: error: --used")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
