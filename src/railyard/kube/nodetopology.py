"""Publish a node's NodeTopology CR: create it (owned by its Node, so it goes with the
node), and afterwards write the spec or the status only when it differs from what the API
server holds — a node whose hardware and health do not change costs one GET per round.

Writes are JSON patches that replace `/spec` or `/status` whole (a merge patch would keep a
GPU that disappeared from the distance table), with a `test` of the resourceVersion on the
spec so that two writers cannot interleave; a conflict reads the object again.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

import msgspec

from railyard.kube.client import ApiError, Client
from railyard.kube.objects import NodeTopologyObject, Object
from railyard.records.nodetopology_cr import (
    API_VERSION,
    GROUP,
    PLURAL,
    NodeTopologyStatus,
    node_topology_resource,
    resource_name,
    status_to_json,
)
from railyard.records.topology import topology_to_json
from railyard.topology.model import NodeTopology

COLLECTION = f"/apis/{API_VERSION}/{PLURAL}"
CRD_NAME = f"{PLURAL}.{GROUP}"
ATTEMPTS = 3


class Published(Enum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


def path_of(node: str) -> str:
    return f"{COLLECTION}/{resource_name(node)}"


async def publish(client: Client, topology: NodeTopology,
                  status: NodeTopologyStatus | None = None,
                  annotations: Mapping[str, str] | None = None) -> Published:
    """Create or update the NodeTopology of `topology.node`, writing only what changed;
    `annotations` are set on it too (the node's record key, decision 0087)."""
    for _ in range(ATTEMPTS - 1):
        try:
            return await _publish_once(client, topology, status, annotations or {})
        except ApiError as e:
            if not (e.conflict or e.not_found):  # someone wrote or deleted it meanwhile
                raise
    return await _publish_once(client, topology, status, annotations or {})


async def _publish_once(client: Client, topology: NodeTopology,
                        status: NodeTopologyStatus | None,
                        annotations: Mapping[str, str]) -> Published:
    path = path_of(topology.node)
    spec = topology_to_json(topology)
    try:
        current = await client.get(path, NodeTopologyObject)
    except ApiError as e:
        if not e.not_found:
            raise
        node = await client.get(f"/api/v1/nodes/{topology.node}", Object)
        resource = node_topology_resource(topology, node.metadata.uid)
        if annotations:
            resource["metadata"]["annotations"] = dict(annotations)
        created = await client.create(COLLECTION, resource, NodeTopologyObject)
        if status is not None:
            await _write_status(client, path, created.metadata.resource_version, status)
        return Published.CREATED

    ops: list[dict[str, Any]] = []
    if current.spec != spec:
        ops.append({"op": "add", "path": "/spec", "value": spec})
    if not any(o.kind == "Node" and o.name == topology.node
               for o in current.metadata.owner_references):
        node = await client.get(f"/api/v1/nodes/{topology.node}", Object)
        owner = node_topology_resource(topology, node.metadata.uid)["metadata"]
        ops.append({"op": "add", "path": "/metadata/ownerReferences",
                    "value": owner["ownerReferences"]
                    + [msgspec.to_builtins(o) for o in current.metadata.owner_references]})
    if any(current.metadata.annotations.get(k) != v for k, v in annotations.items()):
        ops.append({"op": "add", "path": "/metadata/annotations",
                    "value": {**current.metadata.annotations, **annotations}})
    rv = current.metadata.resource_version
    if ops:
        ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": rv})
        rv = (await client.patch(path, ops, Object, patch_type="json")).metadata.resource_version
    if status is not None and current.status != status_to_json(status):
        await _write_status(client, path, rv, status)
        return Published.UPDATED
    return Published.UPDATED if ops else Published.UNCHANGED


async def _write_status(client: Client, path: str, resource_version: str,
                        status: NodeTopologyStatus) -> None:
    await client.patch(f"{path}/status", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "add", "path": "/status", "value": status_to_json(status)},
    ], Object, patch_type="json")

