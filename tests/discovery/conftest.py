"""Fake sysfs trees for discovery tests, built by the same writer users get."""

from __future__ import annotations

from pathlib import Path

import pytest

from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import DGX_H100


@pytest.fixture
def h100(tmp_path: Path) -> Path:
    """A dgx-h100 tree with 2 VFs per compute PF: small, but every shape is there."""
    return write_fixture(DGX_H100, tmp_path / "root", vfs_per_pf=2)
