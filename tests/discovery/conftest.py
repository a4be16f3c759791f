"""Fake sysfs trees for discovery tests, built by the same writer users get."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import DGX_H100


@pytest.fixture
def tree_dir(tmp_path: Path) -> Iterator[Path]:
    """A scratch folder for fake trees, in memory (/dev/shm) when the machine has one.

    Like sysfs itself; and a tree is tens of thousands of tiny files, which a busy disk
    writes ten times slower.
    """
    if os.access("/dev/shm", os.W_OK):
        folder = Path(tempfile.mkdtemp(prefix="railyard-test-", dir="/dev/shm"))
        yield folder
        shutil.rmtree(folder, ignore_errors=True)
    else:
        yield tmp_path


@pytest.fixture
def h100(tree_dir: Path) -> Path:
    """A dgx-h100 tree with 2 VFs per compute PF: small, but every shape is there."""
    return write_fixture(DGX_H100, tree_dir / "root", vfs_per_pf=2)
