"""The agent in cluster mode raises an Event on its Node for each device health change, against
a local stand-in API server (aiohttp) that records what it is sent: one Event when a PF's link
goes down naming the PF and its VFs, one when it comes back, none for scans that change
nothing or for a restart, and an API server that refuses Events breaks nothing else. The same
against the real components: tests/box/test_drills_railyard.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from railyard.agent.agent import Agent, AgentOptions
from railyard.agent.config import AgentConfig
from railyard.kube.client import Client
from railyard.kube.config import KubeConfig
from support.agent import NODE, async_test, make_tree, rig, topology
from support.http import serve_app

TOPO = topology()
NIC = TOPO.nics[0]
NODE_UID = "3f0c-node-uid"
TOPOLOGIES = "/apis/railyard.dev/v1alpha1/nodetopologies"


@pytest.fixture
def fresh_tree(tmp_path):
    """A tree the test may break: its first PF's link goes down."""
    return make_tree(tmp_path / "root")


class FakeApi:
    """What the agent asks of an API server: its node's pods (none), its Node, its
    NodeTopology (kept in memory, JSON patches of `add` applied), and Events."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.refuse_events = False
        self.topology: dict[str, Any] | None = None
        self.version = 0
        self.done = asyncio.Event()  # ends the watches

    async def pods(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch"):
            response = web.StreamResponse()
            await response.prepare(request)
            await self.done.wait()
            return response
        return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "1"},
                                  "items": []})

    async def node(self, request: web.Request) -> web.Response:
        return web.json_response({"metadata": {"name": request.match_info["name"],
                                               "uid": NODE_UID}})

    def _stored(self) -> web.Response:
        self.version += 1
        assert self.topology is not None
        self.topology["metadata"]["resourceVersion"] = str(self.version)
        return web.json_response(self.topology)

    async def get_topology(self, request: web.Request) -> web.Response:
        if self.topology is None:
            return web.json_response({"kind": "Status", "reason": "NotFound",
                                      "message": "not found"}, status=404)
        return web.json_response(self.topology)

    async def create_topology(self, request: web.Request) -> web.Response:
        self.topology = await request.json()
        return self._stored()

    async def patch_topology(self, request: web.Request) -> web.Response:
        assert self.topology is not None
        for op in await request.json():
            if op["op"] == "add":
                *parents, last = op["path"].strip("/").split("/")
                target = self.topology
                for key in parents:
                    target = target[key]
                target[last] = op["value"]
        return self._stored()

    async def create_event(self, request: web.Request) -> web.Response:
        if self.refuse_events:
            return web.json_response({"kind": "Status", "reason": "InternalError",
                                      "message": "etcd is unhappy"}, status=500)
        body = await request.json()
        body["metadata"]["namespace"] = request.match_info["namespace"]
        self.events.append(body)
        return web.json_response(body, status=201)

    def told(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["reason"] == reason]


@contextlib.asynccontextmanager
async def api_server() -> AsyncIterator[tuple[FakeApi, str]]:
    api = FakeApi()
    app = web.Application()
    app.router.add_get("/api/v1/pods", api.pods)
    app.router.add_get("/api/v1/nodes/{name}", api.node)
    app.router.add_get(TOPOLOGIES + "/{name}", api.get_topology)
    app.router.add_post(TOPOLOGIES, api.create_topology)
    app.router.add_patch(TOPOLOGIES + "/{name}", api.patch_topology)
    app.router.add_patch(TOPOLOGIES + "/{name}/status", api.patch_topology)
    app.router.add_post("/api/v1/namespaces/{namespace}/events", api.create_event)
    runner, url = await serve_app(app)
    try:
        yield api, url
    finally:
        api.done.set()
        await runner.cleanup()


@contextlib.asynccontextmanager
async def agent_on(url: str, tree: Path, tmp: Path) -> AsyncIterator[Agent]:
    kubelet_dir = Path(tempfile.mkdtemp(prefix="ry-kubelet-"))  # socket paths are short
    config = AgentConfig(devinfo_dir=str(tmp / "devinfo"), health_interval_s=0.05,
                         verify_delay_s=0.05)
    agent = Agent(AgentOptions(node_name=NODE, sysfs_root=str(tree),
                               kubelet_dir=str(kubelet_dir), state_dir=str(tmp / "state")),
                  None, config, kube=Client(KubeConfig(server=url)))
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()
        shutil.rmtree(kubelet_dir, ignore_errors=True)


def link(tree: Path, state: str) -> None:
    pf = os.path.realpath(tree / "sys/bus/pci/devices" / NIC.pci_address)
    Path(pf, "net", str(NIC.netdev), "operstate").write_text(f"{state}\n")


async def until(check, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)


async def settle(agent: Agent) -> None:
    """A few health scans, then whatever Events they sent."""
    await asyncio.sleep(10 * agent.config.health_interval_s)
    assert agent.events is not None
    await agent.events.drain()


@async_test
async def test_a_link_down_and_up_raise_one_warning_and_one_normal_event_on_the_node(
        tmp_path, fresh_tree):
    async with api_server() as (api, url), agent_on(url, fresh_tree, tmp_path) as agent:
        await settle(agent)
        assert api.events == []  # a healthy node at start: nothing to tell
        link(fresh_tree, "down")
        await until(lambda: api.told("RailyardDeviceUnhealthy"))
        await settle(agent)  # further scans, still down: nothing more
        (bad,) = api.events
        assert bad["type"] == "Warning"
        assert bad["metadata"]["namespace"] == "default"
        assert bad["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE,
                                         "uid": NODE_UID}
        assert bad["source"] == {"component": "railyard-agent", "host": NODE}
        assert f"PF {NIC.pci_address}" in bad["message"]
        for vf in NIC.vfs:
            assert f"VF {vf.pci_address}" in bad["message"]
        assert f"PF {NIC.netdev} link is down" in bad["message"]
        assert all(v.pci_address not in bad["message"] for v in TOPO.nics[1].vfs)

        assert agent.health_changes is not None
        agent.health_changes.interval_s = 0.0  # no quiet time: the recovery is told at once
        link(fresh_tree, "up")
        await until(lambda: api.told("RailyardDeviceHealthy"))
        await settle(agent)
        assert [e["reason"] for e in api.events] == ["RailyardDeviceUnhealthy",
                                                     "RailyardDeviceHealthy"]
        good = api.events[1]
        assert good["type"] == "Normal" and good["involvedObject"]["uid"] == NODE_UID
        assert good["message"].startswith("healthy again: ")
        assert all(v.pci_address in good["message"] for v in NIC.vfs)


@async_test
async def test_a_restarted_agent_does_not_tell_again_what_the_nodetopology_already_says(
        tmp_path, fresh_tree):
    async with api_server() as (api, url):
        link(fresh_tree, "down")
        async with agent_on(url, fresh_tree, tmp_path) as agent:  # a node down at start
            await until(lambda: api.topology is not None and api.told("RailyardDeviceUnhealthy"))
            await settle(agent)
        assert len(api.events) == 1
        status = (api.topology or {}).get("status", {})
        assert status.get("unhealthyDevices"), json.dumps(status)
        async with agent_on(url, fresh_tree, tmp_path) as agent:
            await settle(agent)
        assert len(api.events) == 1


@async_test
async def test_an_api_server_refusing_events_breaks_neither_health_nor_publication(
        tmp_path, fresh_tree):
    async with api_server() as (api, url), agent_on(url, fresh_tree, tmp_path) as agent:
        api.refuse_events = True
        link(fresh_tree, "down")
        await until(lambda: NIC.pci_address in agent.unhealthy)
        await until(lambda: bool(((api.topology or {}).get("status") or {}).get(
            "unhealthyDevices")))
        await settle(agent)
        assert agent.events is not None and not agent.events.pending
        assert api.events == []
        # Still scanning: the link back up is seen and published.
        link(fresh_tree, "up")
        await until(lambda: not agent.unhealthy)
        await until(lambda: not ((api.topology or {}).get("status") or {}).get(
            "unhealthyDevices"))
        assert not any(t.done() for t in agent._tasks)  # no loop of the agent died


@async_test
async def test_the_pods_file_mode_has_no_api_and_raises_no_events(tmp_path, fresh_tree):
    async with rig(tmp_path, fresh_tree) as r:
        assert r.agent.events is None and r.agent.health_changes is None
        link(fresh_tree, "down")
        await until(lambda: NIC.pci_address in r.agent.unhealthy)
