"""The configuration without prioritize (deploy/kube-scheduler-config-filter-ranked.yaml,
decision 0104) on the box's real kube-scheduler: one extender call before the bind, and the
pods come out as with the shipped configuration (test_extender_api.py), a pod that fits
nowhere Pending with Railyard's reason."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from test_extender_api import (
    VFS_PER_PF,
    Extender,
    allocation_of,
    bound,
    create,
    devices,
    events,
    extender_box,
    gpu_pod,
)

from railyard.allocation.request import Request
from railyard.discovery.profiles import build_topology, profile
from railyard.scheduler.state import ClusterState
from support.box import get, namespace, wait_for

pytestmark = [pytest.mark.root, pytest.mark.box, pytest.mark.slow]

NODES = 3


@pytest.fixture(scope="module")
def ranked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Extender]]:
    folder = tmp_path_factory.mktemp("ranked-box")
    with extender_box(folder, NODES, lambda node: build_topology(
            profile("dgx-h100"), vfs_per_pf=VFS_PER_PF, node=node),
            "kube-scheduler-config-filter-ranked.yaml") as running:
        yield running


def calls_of(extender: Extender, verb: str) -> float:
    """How many `verb` requests the extender has answered, from its /metrics."""
    text = extender.get_text("/metrics")
    found = re.search(rf'^railyard_extender_request_duration_seconds_count\{{verb="{verb}"\}} '
                      r"(\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_pods_are_bound_with_their_pairs_after_one_extender_call_each(ranked):
    box, extender = ranked
    ns = namespace(box)
    create(box, ns, gpu_pod("first", 2, 2))
    first = bound(box, ns, "first")
    create(box, ns, gpu_pod("second", 4, 4))
    second = bound(box, ns, "second")
    for p in (first, second):
        alloc = allocation_of(p)
        assert alloc.node == p["spec"]["nodeName"] and alloc.decided_by == "scheduler"
    assert len(allocation_of(second).pairs) == 4
    if first["spec"]["nodeName"] == second["spec"]["nodeName"]:
        assert devices(first).isdisjoint(devices(second))
    assert calls_of(extender, "filter") >= 2 and calls_of(extender, "bind") >= 2
    assert calls_of(extender, "prioritize") == 0


def test_a_pod_that_fits_nowhere_stays_pending_with_railyards_reason(ranked):
    box, _ = ranked
    ns = namespace(box)
    create(box, ns, gpu_pod("too-many-vfs", 1, 8 * VFS_PER_PF + 4))
    messages = wait_for("a FailedScheduling event", lambda: [
        e["message"] for e in events(box, ns, "too-many-vfs")
        if e["reason"] == "FailedScheduling"])
    topology = build_topology(profile("dgx-h100"), vfs_per_pf=VFS_PER_PF, node="kwok-node-0")
    reason = ClusterState([topology]).filter(Request(gpus=1, vfs=8 * VFS_PER_PF + 4),
                                             ["kwok-node-0"]).unresolvable["kwok-node-0"]
    assert reason.split(":")[0] in messages[-1], messages
    assert not get(box, "pod", "too-many-vfs", "-n", ns)["spec"].get("nodeName")
