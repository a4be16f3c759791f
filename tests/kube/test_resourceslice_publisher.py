"""Our ResourceSlices written to the API server (kube.resourceslices.publish_slices, decision
0111): created owned by the Node, written again only on change with the pool's generation
bumped, stale ones deleted, a conflict read again, another driver's slices never touched.
A recording API server in memory stands in here; the box test runs the real one."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import Any

import msgspec
import pytest

from railyard.discovery.profiles import PROFILES, build_topology
from railyard.kube.client import ApiError
from railyard.kube.objects import ObjectMeta
from railyard.kube.resourceslices import COLLECTION, SlicesPublished, publish_slices
from railyard.records.dra_slices import node_slices

TOPO = build_topology(PROFILES["dgx-h100"], 2, node="node-a")
BIG = build_topology(PROFILES["dgx-h100"], 8, node="node-a")  # two device slices


class Server:
    """ResourceSlices by name, with resourceVersions and the two field selectors."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.writes: list[tuple[str, str]] = []
        self.conflicts = 0  # the next PUTs that find the object changed meanwhile

    def add(self, obj: dict[str, Any]) -> None:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        for d in obj["spec"].get("devices", []):
            for t in d.get("taints", []):
                t.setdefault("timeAdded", "2026-01-01T00:00:00Z")  # as the server stamps it
        self.objects[obj["metadata"]["name"]] = obj

    async def request(self, method: str, path: str, params: dict[str, str]) -> bytes:
        assert (method, path) == ("GET", COLLECTION)
        wanted = dict(p.split("=") for p in params["fieldSelector"].split(","))
        items = [o for o in self.objects.values()
                 if o["spec"]["nodeName"] == wanted["spec.nodeName"]
                 and o["spec"]["driver"] == wanted["spec.driver"]]
        return msgspec.json.encode({"items": copy.deepcopy(items)})

    async def get(self, path: str, type_: Any) -> Any:
        assert path == "/api/v1/nodes/node-a"
        return type_(metadata=ObjectMeta(name="node-a", uid="node-uid"))

    async def create(self, path: str, body: Any, type_: Any) -> Any:
        name = body["metadata"]["name"]
        if name in self.objects:
            raise ApiError(409, "AlreadyExists", "", path)
        self.writes.append(("create", name))
        self.add(body)
        return type_()

    async def put(self, path: str, body: Any, type_: Any) -> Any:
        name = path.rsplit("/", 1)[1]
        if self.conflicts:
            self.conflicts -= 1
            self.objects[name]["metadata"]["resourceVersion"] += "x"  # someone else wrote
            raise ApiError(409, "Conflict", "the object has been modified", path)
        if body["metadata"]["resourceVersion"] != self.objects[name]["metadata"][
                "resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified", path)
        self.writes.append(("update", name))
        self.add(body)
        return type_()

    async def delete(self, path: str) -> None:
        name = path.rsplit("/", 1)[1]
        self.writes.append(("delete", name))
        if self.objects.pop(name, None) is None:
            raise ApiError(404, "NotFound", "", path)


def publish(server: Server, wanted: list[dict]) -> SlicesPublished:
    return asyncio.run(publish_slices(server, "node-a", wanted))  # type: ignore[arg-type]


def generations(server: Server) -> set[int]:
    return {o["spec"]["pool"]["generation"] for o in server.objects.values()
            if o["spec"]["driver"] == "railyard.dev"}


def test_missing_slices_are_created_owned_by_the_node_at_generation_one():
    server = Server()
    wanted = node_slices(TOPO, publish_gpus=True)
    assert publish(server, wanted) is SlicesPublished.CREATED
    assert sorted(server.objects) == sorted(s["metadata"]["name"] for s in wanted)
    for o in server.objects.values():
        assert o["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node",
                                                     "name": "node-a", "uid": "node-uid",
                                                     "controller": True}]
    assert generations(server) == {1}


def test_slices_already_there_cost_one_list_and_no_write_despite_the_servers_stamps():
    server = Server()
    bad = {TOPO.nics[0].pci_address}
    publish(server, node_slices(TOPO, bad))
    server.writes.clear()
    assert publish(server, node_slices(TOPO, bad)) is SlicesPublished.UNCHANGED
    assert server.writes == []


def test_a_health_change_writes_every_slice_again_one_generation_up():
    server = Server()
    publish(server, node_slices(TOPO))
    server.writes.clear()
    assert publish(server, node_slices(TOPO, {TOPO.nics[0].pci_address})) is \
        SlicesPublished.UPDATED
    assert {w for w, _ in server.writes} == {"update"}
    assert len(server.writes) == len(server.objects)
    assert generations(server) == {2}
    tainted = [d for o in server.objects.values() for d in o["spec"].get("devices", [])
               if d.get("taints")]
    assert len(tainted) == 1 + len(TOPO.nics[0].vfs)


def test_slices_no_longer_wanted_are_deleted_and_another_drivers_are_left_alone():
    server = Server()
    publish(server, node_slices(BIG, publish_gpus=True))
    theirs = {"metadata": {"name": "node-a-gpu.nvidia.com-x"},
              "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-a",
                       "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                       "devices": []}}
    server.add(theirs)
    one = node_slices(replace(TOPO, gpus=(), nics=TOPO.nics[:1]))
    assert len(one) < len(server.objects) - 1
    server.writes.clear()
    publish(server, one)
    assert sorted(server.objects) == sorted([*(s["metadata"]["name"] for s in one),
                                             "node-a-gpu.nvidia.com-x"])
    assert server.objects["node-a-gpu.nvidia.com-x"]["metadata"]["resourceVersion"] == \
        str(server.version - len(one))  # never written again
    assert all(n != "node-a-gpu.nvidia.com-x" for _, n in server.writes)
    assert all(o["spec"]["pool"]["resourceSliceCount"] == len(one)
               for o in server.objects.values() if o["spec"]["driver"] == "railyard.dev")


def test_a_conflict_reads_the_slices_again_and_writes_them_all_at_a_newer_generation():
    server = Server()
    publish(server, node_slices(TOPO))
    server.conflicts = 1
    assert publish(server, node_slices(TOPO, {TOPO.gpus[0].pci_address},
                                       publish_gpus=True)) is SlicesPublished.UPDATED
    assert server.conflicts == 0 and generations(server) == {2}


def test_conflicts_that_never_end_are_raised():
    server = Server()
    publish(server, node_slices(TOPO))
    server.conflicts = 10
    with pytest.raises(ApiError) as e:
        publish(server, node_slices(TOPO, {TOPO.gpus[0].pci_address}, publish_gpus=True))
    assert e.value.conflict


def test_slices_of_another_node_or_driver_are_refused_before_anything_is_written():
    server = Server()
    other = node_slices(replace(TOPO, node="node-b"))
    with pytest.raises(ValueError, match="node node-a only"):
        publish(server, other)
    assert server.objects == {}


def test_a_taint_or_an_attribute_no_longer_written_is_a_change():
    server = Server()
    bad = {TOPO.nics[0].pci_address}
    publish(server, node_slices(TOPO, bad))
    assert publish(server, node_slices(TOPO)) is SlicesPublished.UPDATED  # healthy again
    assert not any(d.get("taints") for o in server.objects.values()
                   for d in o["spec"].get("devices", []))
    unrailed = replace(TOPO, nics=tuple(replace(n, rail=None) for n in TOPO.nics))
    assert publish(server, node_slices(unrailed)) is SlicesPublished.UPDATED
    assert not any("rail" in d["attributes"] for o in server.objects.values()
                   for d in o["spec"].get("devices", []))
    assert publish(server, node_slices(unrailed)) is SlicesPublished.UNCHANGED


def test_fields_the_server_adds_beside_ours_are_not_a_change():
    server = Server()
    publish(server, node_slices(TOPO))
    for o in server.objects.values():  # a default the API server might fill in
        o["spec"]["perDeviceNodeSelection"] = None
        for d in o["spec"].get("devices", []):
            d["allowMultipleAllocations"] = False
    server.writes.clear()
    assert publish(server, node_slices(TOPO)) is SlicesPublished.UNCHANGED
    assert server.writes == []
