"""The agent's DRA mode (decision 0111): `mode` and `dra` in the config file, `--mode` on the
command line, no device plugin for the kinds DRA serves, and cluster mode required. The mode
at work (slices published, the DRA plugin registered, a restart) is on the box:
tests/box/test_dra_kubelet_box.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from aiohttp import web

from railyard.agent.agent import Agent, AgentOptions
from railyard.agent.config import (
    MODE_DRA,
    MODE_EXTENDER,
    AgentConfig,
    ConfigError,
    DraOptions,
    config_from_dict,
)
from railyard.kube.client import Client
from railyard.kube.config import KubeConfig
from railyard.kube.resourceslices import SlicesPublished
from railyard.kubelet.pods import PodsFile
from railyard.records.dra_names import device_name
from support.agent import NODE, async_test, make_tree, topology, write_pods
from support.http import serve_app

CMD = [sys.executable, "-m", "railyard.cli.main", "agent"]


def test_the_mode_is_extender_unless_the_config_says_dra():
    assert config_from_dict({}).mode == MODE_EXTENDER
    cfg = config_from_dict({"mode": "dra", "dra": {"publishGpus": True,
                                                   "cdiDir": "/etc/cdi"}})
    assert cfg.mode == MODE_DRA
    assert cfg.dra == DraOptions(publish_gpus=True, cdi_dir="/etc/cdi")
    assert config_from_dict({"mode": "dra"}).dra == DraOptions(False, "/var/run/cdi")


@pytest.mark.parametrize(("doc", "field"), [({"mode": "kubelet"}, "mode"),
                                            ({"dra": {"publishGPUs": True}}, "dra"),
                                            ({"dra": {"publishGpus": "yes"}}, "publishGpus")])
def test_a_bad_mode_or_dra_setting_is_refused_by_name(doc, field):
    with pytest.raises(ConfigError, match=field):
        config_from_dict(doc)


def test_dra_serves_vfs_and_pfs_and_the_gpus_only_when_it_publishes_them():
    assert AgentConfig().dra_kinds == frozenset()
    assert AgentConfig(mode=MODE_DRA).dra_kinds == {"vf", "pf"}
    assert AgentConfig(mode=MODE_DRA, dra=DraOptions(publish_gpus=True)).dra_kinds == {
        "vf", "pf", "gpu"}


def inventory_kinds(tmp_path, config: AgentConfig) -> set[str]:
    tree = make_tree(tmp_path / "root")
    write_pods(tmp_path / "pods.json", [])
    agent = Agent(AgentOptions(node_name=NODE, sysfs_root=str(tree),
                               state_dir=str(tmp_path / "state")),
                  PodsFile(tmp_path / "pods.json", config.resources), config)
    agent._topology = agent._discover()
    return set(agent._inventory(agent.probe.facts(agent.topology)))


def test_in_dra_mode_no_device_plugin_serves_what_dra_serves(tmp_path):
    assert inventory_kinds(tmp_path / "e", AgentConfig()) == {"gpu", "vf", "pf"}
    assert inventory_kinds(tmp_path / "d", AgentConfig(mode=MODE_DRA)) == {"gpu"}
    assert inventory_kinds(tmp_path / "g", AgentConfig(
        mode=MODE_DRA, dra=DraOptions(publish_gpus=True))) == set()


@async_test
async def test_dra_mode_without_an_api_server_stops_the_start(tmp_path):
    write_pods(tmp_path / "pods.json", [])
    agent = Agent(AgentOptions(node_name=NODE, state_dir=str(tmp_path / "state")),
                  PodsFile(tmp_path / "pods.json", AgentConfig().resources),
                  AgentConfig(mode=MODE_DRA))
    with pytest.raises(ConfigError, match="DRA mode needs cluster mode"):
        await agent.start()
    assert agent.dra is None and agent.endpoints == {}


@pytest.mark.parametrize(("args", "said"), [
    (["--mode", "dra"], "--mode dra needs cluster mode"),
    (["--mode", "kubelet"], "--mode: expected extender or dra, got 'kubelet'")])
def test_the_command_refuses_dra_mode_on_a_pods_file_and_an_unknown_mode(tmp_path, args, said):
    write_pods(tmp_path / "pods.json", [])
    r = subprocess.run([*CMD, "--node-name", "n", "--pods-file", str(tmp_path / "pods.json"),
                        "--state-dir", str(tmp_path / "s"), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert said in r.stderr


def test_the_help_explains_both_modes():
    r = subprocess.run([*CMD, "--help"], capture_output=True, text=True, timeout=60,
                       env={"COLUMNS": "200", "PATH": ""})
    text = " ".join(r.stdout.split())
    assert "--mode" in text and "DRA driver railyard.dev" in text
    assert "registers no device plugin for what DRA serves" in text


class SliceApi:
    """ResourceSlices (v1) and the Node over HTTP, as the agent's client speaks to them."""

    def __init__(self) -> None:
        self.slices: dict[str, dict] = {}
        self.writes: list[tuple[str, str]] = []

    async def list(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "ResourceSliceList",
                                  "items": list(self.slices.values())})

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        body["metadata"]["resourceVersion"] = "1"
        self.slices[body["metadata"]["name"]] = body
        self.writes.append(("POST", body["metadata"]["name"]))
        return web.json_response(body, status=201)

    async def update(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.slices[request.match_info["name"]] = body
        self.writes.append(("PUT", request.match_info["name"]))
        return web.json_response(body)

    async def node(self, request: web.Request) -> web.Response:
        return web.json_response({"metadata": {"name": NODE, "uid": "node-uid"}})


@async_test
async def test_the_agent_publishes_its_slices_with_gpus_as_configured_and_taints_the_sick(
        tmp_path):
    api = SliceApi()
    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/resourceslices", api.list)
    app.router.add_post("/apis/resource.k8s.io/v1/resourceslices", api.create)
    app.router.add_put("/apis/resource.k8s.io/v1/resourceslices/{name}", api.update)
    app.router.add_get("/api/v1/nodes/{name}", api.node)
    runner, url = await serve_app(app)
    topo = topology("dgx-h100", vfs_per_pf=2)
    write_pods(tmp_path / "pods.json", [])
    cfg = AgentConfig(mode=MODE_DRA, dra=DraOptions(publish_gpus=True))
    agent = Agent(AgentOptions(node_name=NODE, state_dir=str(tmp_path / "state")),
                  PodsFile(tmp_path / "pods.json", cfg.resources), cfg, topology=topo,
                  kube=Client(KubeConfig(server=url)))
    agent._topology = topo
    try:
        assert await agent.publish_own_slices()
        assert agent.slices_published is SlicesPublished.CREATED
        assert [w for w, _ in api.writes] == ["POST"] * len(api.slices)
        devices = {d["name"]: d for s in api.slices.values()
                   for d in s["spec"].get("devices", [])}
        assert {device_name(g.pci_address) for g in topo.gpus} <= set(devices)
        api.writes.clear()
        assert await agent.publish_own_slices()
        assert agent.slices_published is SlicesPublished.UNCHANGED and api.writes == []
        vf = next(n for n in topo.nics if n.vfs).vfs[0]
        agent.unhealthy = {vf.pci_address: "RDMA port mlx5_x/1 is DOWN"}
        assert await agent.publish_own_slices()
        assert agent.slices_published is SlicesPublished.UPDATED
        devices = {d["name"]: d for s in api.slices.values()
                   for d in s["spec"].get("devices", [])}
        assert [n for n, d in devices.items() if d.get("taints")] == [
            device_name(vf.pci_address)]
    finally:
        assert agent.kube is not None
        await agent.kube.close()
        await runner.cleanup()


def test_the_slices_offer_what_the_config_offers_pfs_only_with_pf_plugin(tmp_path):
    tree = make_tree(tmp_path / "root")
    write_pods(tmp_path / "pods.json", [])

    def offered(config: AgentConfig) -> frozenset[str]:
        agent = Agent(AgentOptions(node_name=NODE, sysfs_root=str(tree),
                                   state_dir=str(tmp_path / "state")),
                      PodsFile(tmp_path / "pods.json", config.resources), config)
        agent._topology = agent._discover()
        return agent.dra_offered()

    topo = topology()
    pfs = {n.pci_address for n in topo.nics if not n.default_route}
    vfs = {v.pci_address for n in topo.nics for v in n.vfs if v.is_rdma}
    assert offered(AgentConfig(mode=MODE_DRA)) == pfs | vfs
    assert offered(AgentConfig(mode=MODE_DRA, pf_plugin=False)) == vfs
    assert offered(AgentConfig(mode=MODE_DRA, vf_plugin=False)) == pfs
