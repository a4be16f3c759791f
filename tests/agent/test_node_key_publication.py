"""The agent's node key reaches the extender on its NodeTopology (kube.nodetopology.publish,
decision 0087): set when the object is created, patched in when an existing one lacks it or
holds another, left alone when it is there. A recording API client stands in for the server
(tests/box/test_kube_nodetopology.py runs publish against a real one)."""

from __future__ import annotations

import asyncio
from typing import Any

from railyard.discovery.profiles import build_topology, profile
from railyard.kube.client import ApiError
from railyard.kube.nodetopology import publish
from railyard.kube.objects import NodeTopologyObject, ObjectMeta, OwnerReference
from railyard.records.signature import NODE_KEY_ANNOTATION
from railyard.records.topology import topology_to_json

TOPO = build_topology(profile("dgx-h100"), vfs_per_pf=2, node="node-a")
KEY = {NODE_KEY_ANNOTATION: "AAAA"}


class Recorder:
    def __init__(self, current: NodeTopologyObject | None) -> None:
        self.current, self.created, self.patches = current, [], []  # type: ignore[var-annotated]

    async def get(self, path: str, type_: Any) -> Any:
        if path.startswith("/api/v1/nodes/"):
            return type_(metadata=ObjectMeta(name="node-a", uid="node-uid"))
        if self.current is None:
            raise ApiError(404, "NotFound", "", path)
        return self.current

    async def create(self, path: str, body: Any, type_: Any) -> Any:
        self.created.append(body)
        return NodeTopologyObject(ObjectMeta(name="node-a", resource_version="1"))

    async def patch(self, path: str, body: Any, type_: Any, patch_type: str = "") -> Any:
        self.patches.append(body)
        return type_(metadata=ObjectMeta(resource_version="2"))


def existing(annotations: dict[str, str]) -> NodeTopologyObject:
    return NodeTopologyObject(
        ObjectMeta(name="node-a", resource_version="1", annotations=annotations,
                   owner_references=[OwnerReference(api_version="v1", kind="Node",
                                                    name="node-a", uid="node-uid")]),
        spec=topology_to_json(TOPO))


def test_a_new_nodetopology_carries_the_key():
    client = Recorder(None)
    asyncio.run(publish(client, TOPO, annotations=KEY))  # type: ignore[arg-type]
    assert client.created[0]["metadata"]["annotations"] == KEY


def test_an_existing_one_gets_the_key_patched_in_keeping_other_annotations():
    client = Recorder(existing({"team": "x", NODE_KEY_ANNOTATION: "old"}))
    asyncio.run(publish(client, TOPO, annotations=KEY))  # type: ignore[arg-type]
    [ops] = client.patches
    assert {"op": "add", "path": "/metadata/annotations",
            "value": {"team": "x", **KEY}} in ops


def test_a_key_already_there_is_not_written_again():
    client = Recorder(existing(dict(KEY)))
    asyncio.run(publish(client, TOPO, annotations=KEY))  # type: ignore[arg-type]
    assert client.patches == []
