"""A 4-pod job across 4 kwok nodes gets one rail sequence through the real kube-scheduler
and Railyard's extender on the API (docs/rails.md), and keeps it across an extender restart
(the job comes back from the pods' labels). Not run in every session: it needs root and the
box's components (`hack/box build`), like the other tests here.

The nodes' NodeTopology CRs are the `dgx-h100` profile's, which carries rails (NIC i under
GPU i on rail i); discovery of a fixture tree has none. kwok-node-0 first holds a pod of no
job on GPUs 0-1, so the job's first pod there takes GPUs 2-3, rails (2, 3); each later pod of
the job is pinned to another node, where packing alone would take GPUs 0-1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from test_extender_api import Extender, allocation_of, bound, create, extender_box, gpu_pod

from railyard.allocation.jobs import JOBSET_LABEL
from railyard.allocation.names import REQUEST_ANNOTATION
from railyard.discovery.profiles import DGX_H100, build_topology
from support.box import namespace

pytestmark = [pytest.mark.root, pytest.mark.box, pytest.mark.slow]

NODES = 4
VFS_PER_PF = 2


@pytest.fixture(scope="module")
def railed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Extender]]:
    folder = tmp_path_factory.mktemp("rails-box")
    with extender_box(folder, NODES, lambda node: build_topology(DGX_H100, VFS_PER_PF,
                                                                 node=node)) as running:
        yield running


def job_pod(name: str, node: str, required: bool = False) -> dict:
    manifest = gpu_pod(name, 2, 2, node=node)
    manifest["metadata"]["labels"] = {JOBSET_LABEL: "llama"}
    if required:
        manifest["metadata"]["annotations"] = {REQUEST_ANNOTATION: json.dumps(
            {"rails": "required"})}
    return manifest


def test_a_four_pod_job_across_four_nodes_gets_one_rail_sequence(railed):
    box, extender = railed
    ns = namespace(box)
    create(box, ns, gpu_pod("other", 2, 2, node="kwok-node-0"))
    assert allocation_of(bound(box, ns, "other")).rails == (0, 1)
    rails = []
    for i in range(NODES):
        create(box, ns, job_pod(f"worker-{i}", f"kwok-node-{i}"))
        rails.append(allocation_of(bound(box, ns, f"worker-{i}")).rails)
    assert rails == [(2, 3)] * NODES
    # After a restart the extender rebuilds the job from the pods' labels and records: a
    # fifth pod, required, keeps the sequence on a node whose GPUs 2-3 are taken.
    extender.kill()
    extender.start()
    create(box, ns, job_pod("worker-4", "kwok-node-3", required=True))
    assert allocation_of(bound(box, ns, "worker-4")).rails == (2, 3)
