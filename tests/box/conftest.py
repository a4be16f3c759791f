"""Fixtures for the box tests: one session box for ordinary tests (with kwok nodes) and a
separate one for disruptive drills. Both are real components built from pinned Go modules by
hack/kubebox.py (docs/testing.md); they need root, and skip elsewhere with that reason."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.box import KWOK_NODES, kubebox, running_box


@pytest.fixture(scope="session")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubebox.Box]:
    with running_box(tmp_path_factory.mktemp("box"), kwok_nodes=KWOK_NODES) as running:
        yield running


@pytest.fixture(scope="module")
def drill_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubebox.Box]:
    """A box of its own for drills that restart components."""
    with running_box(tmp_path_factory.mktemp("drill-box")) as running:
        yield running
