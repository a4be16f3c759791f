"""The benchmarks are scripts in benchmarks/, not a package: their tests import them by name,
as the scripts import each other (`from scheduling import ...`)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
