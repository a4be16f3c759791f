"""The extender's one line per decision (docs/observability.md): a filter's outcome per pod at
DEBUG, a bind at INFO, both logfmt; nothing per node."""

from __future__ import annotations

import logging

import pytest
from scheduler_helpers import args, calls, pod

from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState

NAMES = ["dgx-h100-000", "dgx-h100-001", "hgx-h100-4nic-000"]
LOGGER = "railyard.scheduler"


def _lines(caplog: pytest.LogCaptureFixture, decision: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.getMessage().startswith(f"decision={decision} ")]


def _extender() -> Extender:
    return Extender(ClusterState(cluster_from_spec("dgx-h100:2,hgx-h100-4nic:1")))


def test_a_bind_logs_one_info_line_with_the_pod_node_pairs_and_distance(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    bind = {"PodName": "trainer", "PodNamespace": "ml", "PodUID": "u1", "Node": NAMES[0]}
    p = pod("u1", gpus=2, vfs=2)
    p["metadata"].update(name="trainer", namespace="ml")
    _, bound = calls(_extender(), [("filter", args(p, NAMES)), ("bind", bind)])
    assert bound["Error"] == ""
    [line] = _lines(caplog, "bind")
    assert line.startswith("decision=bind outcome=bound pod=ml/trainer uid=u1 "
                           f"node={NAMES[0]} decidedBy=scheduler pairs=")
    assert line.count(":PIX") == 2 and " worst=PIX sum=0" in line
    assert not _lines(caplog, "filter")  # filter details are DEBUG


def test_a_refused_bind_logs_why(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    bind = {"PodName": "p", "PodNamespace": "ml", "PodUID": "never-filtered", "Node": NAMES[0]}
    [reply] = calls(_extender(), [("bind", bind)])
    assert reply["Error"]
    [line] = _lines(caplog, "bind")
    assert line.startswith("decision=bind outcome=refused pod=ml/p uid=never-filtered")
    assert 'why="' in line and "not seen in a filter call" in line


def test_a_filter_logs_one_debug_line_per_pod_not_per_node(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    p = pod("u1", gpus=8, pfs=5)
    calls(_extender(), [("filter", args(p, [*NAMES, "ghost"]))])
    [line] = _lines(caplog, "filter")
    assert " nodes=4 fit=2 blocked=0 unresolvable=2 " in line
    assert line.startswith("decision=filter pod=default/") and ' why="' in line
    assert len([r for r in caplog.records if r.name == LOGGER]) == 1
