"""The API objects the extender's cluster mode reads, built for tests: a node's NodeTopology
object, a pod with or without its record, and a `ClusterSync` that has seen some nodes."""

from __future__ import annotations

import msgspec

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.allocation.types import Allocation
from railyard.discovery.profiles import build_topology, profile
from railyard.kube.objects import ObjectMeta, Pod, PodSpec, PodStatus
from railyard.kube.reflector import Change
from railyard.records.allocation import encode_allocation
from railyard.records.topology import topology_to_json
from railyard.scheduler.cluster_api import ClusterSync, TopologyObject
from railyard.scheduler.state import ClusterState
from railyard.topology.model import NodeTopology


def topology(node: str, kind: str = "dgx-h100", vfs: int = 2) -> NodeTopology:
    return build_topology(profile(kind), vfs_per_pf=vfs, node=node)


def cr(node: str, kind: str = "dgx-h100", generation: int = 1, vfs: int = 2) -> TopologyObject:
    """The node's NodeTopology object as the watch hands it over (spec still raw)."""
    spec = msgspec.json.encode(topology_to_json(topology(node, kind, vfs)))
    return TopologyObject(ObjectMeta(name=node, generation=generation,
                                     resource_version=str(generation)), msgspec.Raw(spec))


def pod(uid: str, alloc: Allocation | None, phase: str = "Running") -> Pod:
    """Pod `p-<uid>` in namespace ml: bound to the record's node with the record, or unbound."""
    annotations = {ALLOCATION_ANNOTATION: encode_allocation(alloc)} if alloc else {}
    return Pod(ObjectMeta(name=f"p-{uid}", namespace="ml", uid=uid, annotations=annotations),
               PodSpec(node_name=alloc.node if alloc else ""), PodStatus(phase=phase))


def synced(*nodes: str) -> ClusterSync:
    """A ClusterSync that has seen a dgx-h100 NodeTopology for each of `nodes`."""
    sync = ClusterSync(ClusterState(()))
    for n in nodes:
        sync.on_topology(Change("ADDED", n, cr(n)))
    return sync
