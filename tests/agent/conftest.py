"""The agent tests share the fake kubelet and harness that live in tests/kubelet."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kubelet"))


@pytest.fixture(scope="session")
def generic_tree(tmp_path_factory):
    from kubelet_harness import make_tree

    return make_tree(tmp_path_factory.mktemp("generic") / "root")
