"""Publish a node's Koordinator `Device` CR (decision 0095; the object is
`records.koordinator_device`): create it owned by its Node, and afterwards replace the spec
only when it differs, with a `test` of the resourceVersion so that two writers cannot
interleave. A Device of the node that Railyard did not write (koordlet's) is left alone.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum
from typing import Any

import msgspec

from railyard.kube.client import ApiError, Client
from railyard.kube.objects import Object, ObjectMeta
from railyard.records.koordinator_device import (
    API_VERSION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLURAL,
    device_resource,
    device_spec,
)
from railyard.topology.model import NodeTopology

COLLECTION = f"/apis/{API_VERSION}/{PLURAL}"
ATTEMPTS = 3


class DevicePublished(Enum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    FOREIGN = "left alone: written by another component (koordlet?)"


class DeviceObject(msgspec.Struct, omit_defaults=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: dict[str, Any] = {}


def path_of(node: str) -> str:
    return f"{COLLECTION}/{node}"


async def publish_device(client: Client, topology: NodeTopology,
                         unhealthy: Collection[str] = ()) -> DevicePublished:
    """Create or update the Device of `topology.node`, writing only what changed."""
    for _ in range(ATTEMPTS - 1):
        try:
            return await _publish_once(client, topology, unhealthy)
        except ApiError as e:
            if not (e.conflict or e.not_found):  # someone wrote or deleted it meanwhile
                raise
    return await _publish_once(client, topology, unhealthy)


async def _publish_once(client: Client, topology: NodeTopology,
                        unhealthy: Collection[str]) -> DevicePublished:
    path = path_of(topology.node)
    try:
        current = await client.get(path, DeviceObject)
    except ApiError as e:
        if not e.not_found:
            raise
        resource = device_resource(topology, unhealthy)
        node = await client.get(f"/api/v1/nodes/{topology.node}", Object)
        if node.metadata.uid:  # goes with its Node, as the NodeTopology does
            resource["metadata"]["ownerReferences"] = [{
                "apiVersion": "v1", "kind": "Node", "name": topology.node,
                "uid": node.metadata.uid}]
        await client.create(COLLECTION, resource, Object)
        return DevicePublished.CREATED
    if current.metadata.labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
        return DevicePublished.FOREIGN
    spec = device_spec(topology, unhealthy)
    if current.spec == spec:
        return DevicePublished.UNCHANGED
    await client.patch(path, [
        {"op": "test", "path": "/metadata/resourceVersion",
         "value": current.metadata.resource_version},
        {"op": "add", "path": "/spec", "value": spec},
    ], Object, patch_type="json")
    return DevicePublished.UPDATED
