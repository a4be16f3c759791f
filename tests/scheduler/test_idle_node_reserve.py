"""The admission reserve (docs/scheduler.md): while at most K nodes of 8+ GPUs are idle, a
pod that would not fill one is refused on them (unresolvably: preemption frees nothing
there), pods that fill one and nodes already in use are not touched, and it is off at 0."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from railyard.allocation.request import Request
from railyard.allocation.types import Allocation
from railyard.cli.main import app
from railyard.discovery.profiles import build_topology, profile
from railyard.scheduler.state import ClusterState


def cluster(reserve: int) -> ClusterState:
    return ClusterState([build_topology(profile("dgx-h100"), 2, node=f"n{i}")
                         for i in range(3)], idle_reserve=reserve)


def test_small_pods_stop_opening_idle_nodes_once_only_the_reserve_is_left():
    state = cluster(reserve=2)
    names = state.node_names()
    small = Request(gpus=2, vfs=2)
    assert state.idle_whole_nodes() == 3
    first = state.filter(small, names)
    assert first.fits == names  # 3 idle > 2: any node
    assert isinstance(state.bind("a", "default", "a", "n0", small), Allocation)
    assert state.idle_whole_nodes() == 2
    second = state.filter(small, names)
    assert second.fits == ["n0"]  # the node in use still takes small pods
    assert set(second.unresolvable) == {"n1", "n2"}
    assert "admission reserve 2" in second.unresolvable["n1"]
    assert state.filter(Request(gpus=8, vfs=8), names).fits == ["n1", "n2"]  # fills one
    assert state.filter(Request(vfs=1), names).fits == ["n0"]  # a VF-only pod is small too
    state.release("a")
    assert state.filter(small, names).fits == names


def test_the_reserve_is_off_at_zero_and_refuses_a_negative_count():
    state = cluster(reserve=0)
    assert isinstance(state.bind("a", "default", "a", "n0", Request(gpus=1)), Allocation)
    assert state.filter(Request(gpus=1), state.node_names()).fits == ["n0", "n1", "n2"]
    with pytest.raises(ValueError, match="≥ 0"):
        cluster(reserve=-1)


def test_the_extender_takes_the_reserve_as_a_flag():
    help_text = CliRunner().invoke(app, ["scheduler", "--help"], terminal_width=200).output
    assert "--idle-node-reserve" in help_text
    bad = CliRunner().invoke(app, ["scheduler", "--idle-node-reserve", "-1",
                                   "--cluster-file", "/nonexistent"])
    assert bad.exit_code != 0 and "idle-node-reserve" in bad.output
