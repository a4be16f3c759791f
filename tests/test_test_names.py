"""pytest imports test modules by basename (its default "prepend" mode, no packages): two test
files with one name in different folders stop the whole run at collection. Say which, early."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_no_two_test_modules_share_a_name():
    tests = Path(__file__).resolve().parent
    names = Counter(p.name for p in tests.rglob("*.py")
                    if p.name not in {"__init__.py", "conftest.py"} and "support" not in p.parts)
    assert [name for name, count in names.items() if count > 1] == []
