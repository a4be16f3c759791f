"""`--koordinator-annotation` (decision 0095): a bind on the API also carries Koordinator's
`device-allocated` annotation, in the one Binding that carries our record; off by default."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import msgspec
from scheduler_helpers import hand_allocation

from railyard.allocation.names import ALLOCATION_ANNOTATION, KOORDINATOR_DEVICE_ALLOCATED
from railyard.discovery.profiles import build_topology, profile
from railyard.kube.objects import ObjectMeta
from railyard.kube.reflector import Change
from railyard.records.allocation import encode_allocation
from railyard.records.koordinator import encode_device_allocated
from railyard.records.topology import topology_to_json
from railyard.scheduler.cluster_api import ClusterSync, PodBinder, TopologyObject
from railyard.scheduler.cluster_file import BoundPod
from railyard.scheduler.state import ClusterState
from railyard.topology.model import NodeTopology


def topology(node: str) -> NodeTopology:
    return build_topology(profile("dgx-h100"), vfs_per_pf=2, node=node)


def synced(*nodes: str) -> ClusterSync:
    sync = ClusterSync(ClusterState(()))
    for n in nodes:
        spec = msgspec.json.encode(topology_to_json(topology(n)))
        sync.on_topology(Change("ADDED", n, TopologyObject(
            ObjectMeta(name=n, generation=1, resource_version="1"), msgspec.Raw(spec))))
    return sync


class Recorder:
    """The API as the binder sees it: every create recorded, Bindings apart from Events."""

    def __init__(self) -> None:
        self.bindings: list[tuple[str, Any]] = []

    async def create(self, path: str, body: Any, type_: object, **_: Any) -> None:
        if body.get("kind") == "Binding":
            self.bindings.append((path, body))


def bind(binder_of: Any, pod: BoundPod) -> list[tuple[str, Any]]:
    async def main() -> list[tuple[str, Any]]:
        client = Recorder()
        binder = binder_of(client)
        await binder.bind(pod)
        await binder.events.drain()
        return client.bindings

    return asyncio.run(main())


def test_the_bind_carries_koordinators_annotation_beside_our_record_when_asked():
    sync = synced("a")
    alloc = hand_allocation(topology("a"), [(0, 0, 0), (1, 3, 1)])
    bindings = bind(lambda c: PodBinder(c, sync, koordinator=True),
                    BoundPod("ml", "p-1", "1", "a", alloc))
    assert len(bindings) == 1  # one write: both annotations land with the binding or neither
    path, body = bindings[0]
    assert path == "/api/v1/namespaces/ml/pods/p-1/binding"
    annotations = body["metadata"]["annotations"]
    assert annotations[ALLOCATION_ANNOTATION] == encode_allocation(alloc)
    assert annotations[KOORDINATOR_DEVICE_ALLOCATED] == encode_device_allocated(alloc,
                                                                                topology("a"))
    koord = json.loads(annotations[KOORDINATOR_DEVICE_ALLOCATED])
    assert [g["id"] for g in koord["gpu"]] == [p.gpu.device_id for p in alloc.pairs]
    assert [r["extension"]["vfs"][0]["busID"] for r in koord["rdma"]] == [
        p.nic.pci_address for p in alloc.pairs]
    assert [r["id"] for r in koord["rdma"]] == [p.nic.pf_pci_address for p in alloc.pairs]


def test_without_the_flag_the_bind_writes_our_record_only():
    sync = synced("a")
    alloc = hand_allocation(topology("a"), [(0, 0, 0)])
    [(_, body)] = bind(lambda c: PodBinder(c, sync), BoundPod("ml", "p-1", "1", "a", alloc))
    assert list(body["metadata"]["annotations"]) == [ALLOCATION_ANNOTATION]


def test_a_pod_bound_without_devices_gets_no_koordinator_annotation():
    sync = synced("a")
    [(_, body)] = bind(lambda c: PodBinder(c, sync, koordinator=True),
                       BoundPod("ml", "p-1", "1", "a", None))
    assert "annotations" not in body["metadata"]


def test_a_record_the_nodes_topology_cannot_express_still_binds_without_the_copy():
    # The node left the state between decision and write: our record is the decision, the
    # Koordinator copy is a courtesy that must never stop the bind.
    sync = synced("b")
    alloc = hand_allocation(topology("a"), [(0, 0, 0)])
    [(_, body)] = bind(lambda c: PodBinder(c, sync, koordinator=True),
                       BoundPod("ml", "p-1", "1", "a", alloc))
    assert list(body["metadata"]["annotations"]) == [ALLOCATION_ANNOTATION]


def test_the_flag_with_a_cluster_file_is_refused_naming_it():
    done = subprocess.run([sys.executable, "-m", "railyard.cli.main", "scheduler",
                           "--cluster-file", "c.yaml", "--koordinator-annotation"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--koordinator-annotation needs the API" in done.stderr
