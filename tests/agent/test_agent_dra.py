"""The agent warns once when a DRA driver also serves its node's GPUs (decision 0090): it lists
ResourceSlices of its node (resource.k8s.io, the newest version the API server serves) and,
when a GPU driver has one, logs a warning and raises a Node Event. Against a local stand-in API
server (aiohttp) that records what it is asked; the same on the real components:
tests/box/test_nvidia_ownership_box.py."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from railyard.agent.agent import Agent, AgentOptions
from railyard.agent.config import AgentConfig
from railyard.kube.client import Client
from railyard.kube.config import KubeConfig
from support.agent import NODE, async_test
from support.http import serve_app

NODE_UID = "7a1e-node-uid"


class FakeApi:
    """ResourceSlices per version (a version absent: 404, as an API server without it), the
    Node, and Events."""

    def __init__(self, slices: dict[str, list[dict[str, Any]]], status: int = 200) -> None:
        self.slices = slices
        self.status = status
        self.asked: list[tuple[str, str | None]] = []
        self.events: list[dict[str, Any]] = []

    async def resourceslices(self, request: web.Request) -> web.Response:
        version = request.match_info["version"]
        self.asked.append((version, request.query.get("fieldSelector")))
        if self.status != 200:
            return web.json_response({"kind": "Status", "reason": "Forbidden",
                                      "message": "no"}, status=self.status)
        if version not in self.slices:
            return web.json_response({"kind": "Status", "reason": "NotFound",
                                      "message": "the server could not find the requested "
                                                 "resource"}, status=404)
        return web.json_response({"kind": "ResourceSliceList", "items": self.slices[version]})

    async def node(self, request: web.Request) -> web.Response:
        return web.json_response({"metadata": {"name": request.match_info["name"],
                                               "uid": NODE_UID}})

    async def create_event(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.events.append(body)
        return web.json_response(body, status=201)


@contextlib.asynccontextmanager
async def agent_beside(api: FakeApi, tmp, gpu_plugin: bool = False) -> AsyncIterator[Agent]:
    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/{version}/resourceslices", api.resourceslices)
    app.router.add_get("/api/v1/nodes/{name}", api.node)
    app.router.add_post("/api/v1/namespaces/{namespace}/events", api.create_event)
    runner, url = await serve_app(app)
    agent = Agent(AgentOptions(node_name=NODE, state_dir=str(tmp / "state")), None,
                  AgentConfig(gpu_plugin=gpu_plugin), kube=Client(KubeConfig(server=url)))
    try:
        yield agent
    finally:
        assert agent.kube is not None
        await agent.kube.close()
        await runner.cleanup()


def gpu_slice(driver: str, node: str = NODE) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]}}


@async_test
async def test_a_gpu_dra_driver_on_the_node_is_warned_about_with_one_node_event(
        tmp_path, caplog):
    api = FakeApi({"v1": [gpu_slice("gpu.nvidia.com"), gpu_slice("dra.net"),
                          gpu_slice("gpu.amd.com", node="node-b")]})
    async with agent_beside(api, tmp_path) as agent:
        with caplog.at_level(logging.WARNING):
            assert await agent.look_for_dra() == ["gpu.nvidia.com"]
        assert agent.events is not None
        await agent.events.drain()
    assert api.asked == [("v1", f"spec.nodeName={NODE}")]
    [event] = api.events
    assert event["reason"] == "RailyardGpusAlsoServedByDra" and event["type"] == "Warning"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE,
                                       "uid": NODE_UID}
    assert "(gpu.nvidia.com)" in event["message"]
    assert "another device plugin serves nvidia.com/gpu" in event["message"]
    assert any("also served by DRA" in m for m in caplog.messages)


@async_test
async def test_an_api_server_with_an_older_dra_version_is_asked_in_that_version(tmp_path):
    api = FakeApi({"v1beta1": [gpu_slice("gpu.nvidia.com")]})
    async with agent_beside(api, tmp_path, gpu_plugin=True) as agent:
        assert await agent.look_for_dra() == ["gpu.nvidia.com"]
        assert agent.events is not None
        await agent.events.drain()
    assert [v for v, _ in api.asked] == ["v1", "v1beta2", "v1beta1"]
    assert "Railyard's GPU plugin serves" in api.events[0]["message"]


@async_test
async def test_no_gpu_driver_no_dra_or_no_permission_means_no_warning(tmp_path, caplog):
    for api in (FakeApi({"v1": [gpu_slice("dra.net")]}), FakeApi({}),
                FakeApi({"v1": [gpu_slice("gpu.nvidia.com")]}, status=403)):
        async with agent_beside(api, tmp_path) as agent:
            with caplog.at_level(logging.WARNING):
                assert await agent.look_for_dra() == []
            assert agent.events is not None
            await agent.events.drain()
        assert api.events == []
    assert not any("also served by DRA" in m for m in caplog.messages)
