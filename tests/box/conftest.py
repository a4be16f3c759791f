"""Fixtures for the box tests: one session box for ordinary tests (with kwok nodes) and a
separate one for disruptive drills. Both are real components built from pinned Go modules by
hack/kubebox.py (docs/testing.md); they need root, and skip elsewhere with that reason."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from support.box import KWOK_NODES, kubebox


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the box needs root: network namespaces, mounts and cgroups")


@pytest.fixture(scope="session")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubebox.Box]:
    _require_root()
    running = kubebox.Box(tmp_path_factory.mktemp("box"), kwok_nodes=KWOK_NODES)
    running.up()
    try:
        yield running
    finally:
        running.down()


@pytest.fixture(scope="module")
def drill_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubebox.Box]:
    """A box of its own for drills that restart components."""
    _require_root()
    running = kubebox.Box(tmp_path_factory.mktemp("drill-box"))
    running.up()
    try:
        yield running
    finally:
        running.down()
