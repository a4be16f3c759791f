"""In DRA mode the agent hooks its CNI service to the claim-status writer (decision 0113): an
ADD's interfaces reach the API server as the claim's status.devices, on the agent's loop. In
extender mode there are no claims, and no hook. The API server is a recording stand-in."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile

from aiohttp import web

from railyard.agent.agent import Agent, AgentOptions
from railyard.agent.config import MODE_DRA, AgentConfig
from railyard.cni.context import PodInterface
from railyard.cni.spec import PodArgs
from railyard.kube.client import Client
from railyard.kube.config import KubeConfig
from railyard.kubelet.dra_claim import ClaimRef
from railyard.kubelet.dra_prepared import PreparedClaim, PreparedClaims, PreparedDevice
from railyard.kubelet.pods import PodsFile
from railyard.node.state import PodKey
from railyard.records.dra_names import device_name
from support.agent import NODE, async_test, topology, write_pods
from support.http import serve_app

POD = PodKey("6f1c2d4e-0a1b-4c3d-9e8f-7a6b5c4d3e2f", "team", "train")
CLAIM = ClaimRef("team", "2b0c6e3e-8c7a-4f2e-9a51-3f1d2a7e4b10", "train-pairs")


async def started_cni(tmp_path, short: str, config: AgentConfig, url: str) -> Agent:
    write_pods(tmp_path / "pods.json", [])
    agent = Agent(AgentOptions(node_name=NODE, state_dir=str(tmp_path / "state"),
                               cni_socket=os.path.join(short, "cni.sock")),
                  PodsFile(tmp_path / "pods.json", config.resources), config,
                  topology=topology(), kube=Client(KubeConfig(server=url)))
    agent._topology = topology()
    await agent._start_cni()
    return agent


async def stopped(agent: Agent) -> None:
    await asyncio.to_thread(agent._cni.stop)  # type: ignore[attr-defined]
    assert agent.kube is not None
    await agent.kube.close()


@async_test
async def test_in_dra_mode_an_adds_interfaces_become_the_claims_status(tmp_path):
    applied: asyncio.Queue[tuple[str, dict]] = asyncio.Queue()

    async def patch(request: web.Request) -> web.Response:
        body = json.loads(await request.read())  # apply-patch+yaml: JSON is YAML
        await applied.put((request.path, body))
        return web.json_response(body)

    app = web.Application()
    app.router.add_patch("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status",
                         patch)
    runner, url = await serve_app(app)
    vf = next(n for n in topology().nics if n.vfs).vfs[0].pci_address
    with tempfile.TemporaryDirectory(prefix="ry-cni-") as short:
        agent = await started_cni(tmp_path, short, AgentConfig(mode=MODE_DRA), url)
        try:
            PreparedClaims(agent.options.state_dir).put(PreparedClaim(CLAIM, POD, (
                PreparedDevice("nic-0", NODE, device_name(vf), ("x",)),)))
            plugin = agent._cni.server.plugin  # type: ignore[attr-defined]
            # As the ADD does, on its own thread:
            await asyncio.to_thread(plugin.added, PodArgs(uid=POD.uid), (
                PodInterface(vf, "net1", "02:00:00:00:00:01", ("10.56.0.2/16",)),))
            path, body = await asyncio.wait_for(applied.get(), 10)
        finally:
            await stopped(agent)
            await runner.cleanup()
    assert path.endswith(f"/namespaces/team/resourceclaims/{CLAIM.name}/status")
    assert body["status"]["devices"] == [
        {"driver": "railyard.dev", "pool": NODE, "device": device_name(vf),
         "networkData": {"interfaceName": "net1", "ips": ["10.56.0.2/16"],
                         "hardwareAddress": "02:00:00:00:00:01"}}]


@async_test
async def test_in_extender_mode_there_is_no_hook(tmp_path):
    with tempfile.TemporaryDirectory(prefix="ry-cni-") as short:
        agent = await started_cni(tmp_path, short, AgentConfig(), "http://127.0.0.1:9")
        try:
            assert agent._cni.server.plugin.on_added is None  # type: ignore[attr-defined]
            assert agent.claim_status is None
        finally:
            await stopped(agent)
