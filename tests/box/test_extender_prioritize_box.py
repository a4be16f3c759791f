"""The configuration with prioritize (deploy/kube-scheduler-config-prioritize.yaml, the
extender with --no-filter-ranks; decision 0104) on the box's real kube-scheduler: filter,
prioritize and bind for each pod, and the pods come out as with the shipped one-call
configuration (test_extender_api.py), a pod that fits nowhere Pending with Railyard's
reason."""

from __future__ import annotations

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
def prioritizing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Extender]]:
    folder = tmp_path_factory.mktemp("prioritize-box")
    with extender_box(folder, NODES, lambda node: build_topology(
            profile("dgx-h100"), vfs_per_pf=VFS_PER_PF, node=node),
            "kube-scheduler-config-prioritize.yaml", ("--no-filter-ranks",)) as running:
        yield running


def test_pods_are_bound_with_their_pairs_after_filter_and_prioritize(prioritizing):
    box, extender = prioritizing
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
    assert extender.calls("filter") >= 2 and extender.calls("bind") >= 2
    assert extender.calls("prioritize") >= 2


def test_a_pod_that_fits_nowhere_stays_pending_with_railyards_reason(prioritizing):
    box, _ = prioritizing
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
