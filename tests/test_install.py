"""A fresh install, as CI and a new user make it: from the lock, into a venv of its own.

The venv shares pip's download cache with this machine but not its site-packages, so a
package that only this machine's Python happens to hold cannot make the install look whole
(issue 27: typer 0.28 dropped click and only fresh machines saw the type check fail). The
same venv then steps typer down to the floor pyproject.toml allows, so both ends of the
range type-check and run (decision 0102).
"""

from __future__ import annotations

import os
import re
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "test-lock.txt"

pytestmark = pytest.mark.slow


def _typer_floor() -> str:
    """The lowest typer pyproject.toml allows: `typer>=X,...` → X."""
    found = re.search(r'"typer>=([0-9.]+)', (ROOT / "pyproject.toml").read_text())
    assert found, "pyproject.toml no longer gives typer a floor"
    return found.group(1)


def _run(*argv: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PIP_CONSTRAINT", "PYTHONPATH"}}
    return subprocess.run([str(a) for a in argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False, env=env)


def _ok(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 0, f"{run.args} exited {run.returncode}:\n{run.stdout}{run.stderr}"
    return run.stdout


def test_a_fresh_venv_from_the_lock_type_checks_on_the_lock_and_on_typers_floor(
        tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    pip = (python, "-m", "pip", "--disable-pip-version-check", "-q")
    _ok(_run(*pip, "install", "--no-deps", "-r", LOCK))
    _ok(_run(*pip, "install", "--no-deps", "-e", "."))
    _ok(_run(python, "-m", "pip", "check"))  # the lock satisfies every range, nothing missing
    outside = _ok(_run(python, "-c", "import railyard, typer, sys; "
                                     "print(typer.__file__); print(sys.prefix)")).split()
    assert all(path.startswith(str(tmp_path)) for path in outside), outside
    _ok(_run(python, "-m", "mypy"))

    floor = _typer_floor()
    _ok(_run(*pip, "install", "--no-deps", f"typer=={floor}"))
    _ok(_run(python, "-m", "pip", "check"))
    installed = _ok(_run(python, "-c", "import typer; print(typer.__version__)")).strip()
    assert f"{installed}.0".startswith(f"{floor}."), (installed, floor)  # 0.26.0 is 0.26
    _ok(_run(python, "-m", "mypy"))
    assert "discover" in _ok(_run(python, "-m", "railyard", "--help"))
    usage = _run(python, "-m", "railyard", "discover", "--no-such-option")
    assert usage.returncode == 2 and "No such option" in usage.stderr, usage
