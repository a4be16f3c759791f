"""Fixture sysfs trees shared by the kubelet tests (written once: the writer is not free)."""

from __future__ import annotations

import pytest
from kubelet_harness import make_tree


@pytest.fixture(scope="session")
def generic_tree(tmp_path_factory):
    """A read-only generic node: 2 GPUs, 2 RoCE PFs with 4 VFs each."""
    return make_tree(tmp_path_factory.mktemp("generic") / "root")


@pytest.fixture
def fresh_tree(tmp_path):
    """A tree the test may break (health tests)."""
    return make_tree(tmp_path / "root")
