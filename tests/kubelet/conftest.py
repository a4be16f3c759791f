"""Fixture sysfs trees for the kubelet tests (`generic_tree` is in tests/conftest.py)."""

from __future__ import annotations

import pytest

from support.agent import make_tree


@pytest.fixture
def fresh_tree(tmp_path):
    """A tree the test may break (health tests)."""
    return make_tree(tmp_path / "root")
