"""Run Python code in a fresh interpreter where some packages cannot be imported, as on an
install that left an extra out (`pip install railyard` without `[sim]`, decision 0079).

A meta path finder placed first refuses the named top-level packages with the
ModuleNotFoundError a missing package raises, so the code under test cannot tell the
difference; nothing is uninstalled, and the test's own interpreter is left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

_BLOCKER = '''\
import sys

class _Missing:
    """Refuses {names}: a package of the blocked set imports as if not installed."""

    blocked = frozenset({names!r})

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in cls.blocked:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Missing)
'''

SRC = Path(__file__).resolve().parents[2] / "src"


def run_without(blocked: Iterable[str], code: str, argv: Sequence[str] = (),
                timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -c code argv…` with `blocked` packages unimportable; output captured as text."""
    program = _BLOCKER.format(names=sorted(blocked)) + code
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-c", program, *argv], env=env, capture_output=True,
                          text=True, timeout=timeout_s, check=False)
