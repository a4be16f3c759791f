"""The box starts Railyard from the interpreter that runs the tests, never from the PATH.

Many runners call `venv/bin/python -m pytest` without activating the venv (issue 27): this
runs one quick box test that way, in a pytest of its own whose PATH has no folder holding a
`railyard` command, and needs it to pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.box, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
QUICK = ("tests/box/test_box.py::"
         "test_the_node_has_a_stand_in_for_each_netdev_discovery_finds_in_its_sysfs")


def _path_without_railyard() -> str:
    """The PATH less the interpreter's own folder and any other that offers `railyard`."""
    mine = str(Path(sys.executable).parent)
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and d != mine and not shutil.which("railyard", path=d)]
    return os.pathsep.join(keep)


def test_a_box_test_passes_with_no_railyard_on_the_path(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the box needs root: network namespaces, mounts and cgroups")
    path = _path_without_railyard()
    assert shutil.which("railyard", path=path) is None, path
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env["PATH"] = path
    run = subprocess.run(
        [sys.executable, "-m", "pytest", QUICK, "-q", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "pytest")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, f"the box test failed without railyard on the PATH:\n{tail}"
    assert "1 passed" in run.stdout, tail  # ran, not skipped
