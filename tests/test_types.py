"""The type check, as configured in pyproject.toml's [tool.mypy] (decision 0069).

A bare `python -m mypy` from the repository root checks the configured `files`; this test
runs exactly that, so the README's test command (and `.ci/run`) type-checks too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_is_clean() -> None:
    assert (ROOT / "pyproject.toml").is_file(), f"not the repository root: {ROOT}"
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, f"python -m mypy failed:\n{run.stdout}{run.stderr}"
