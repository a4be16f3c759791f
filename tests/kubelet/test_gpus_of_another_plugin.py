"""GPUs from another plugin (`gpuPlugin: false`, decision 0090): our Allocate leaves out the
variables that name GPUs and points at the pair file; the PodResources check learns the GPUs
kubelet really gave, corrects the node's truth, pairs the NICs again with them, writes the
pair file again and raises an Event on the pod; a CNI call and kubelet's PreStartContainer
run that check first."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from railyard.agent.agent import CheckedGrants
from railyard.agent.config import AgentConfig
from railyard.cni.spec import PodArgs
from railyard.kubelet.api import deviceplugin_pb2 as pb
from support.agent import GPU, VF, allocation, async_test, make_tree, pod, rig, topology

TOPO = topology("dgx-h100", vfs_per_pf=2)
G = [g.device_id for g in TOPO.gpus]
VF18, VF40 = "0000:18:00.1", "0000:40:00.1"  # under GPU 0's and GPU 1's switches
PAIRS_FILE = "/run/railyard/pairs.json"
# Pod a's record: GPU 0 with VF18, GPU 1 with VF40.
RECORDED = allocation(TOPO, [(0, VF18), (1, VF40)])
ONE_CONTAINER = {"main": {GPU: 2, VF: 2}}


@pytest.fixture
def dgx_tree(tmp_path):
    return make_tree(tmp_path / "root", "dgx-h100", vfs_per_pf=2)


def config(tmp_path: Path) -> AgentConfig:
    # No check of its own after Allocate: each test runs it when kubelet's account is set.
    return AgentConfig(devinfo_dir=str(tmp_path / "devinfo"), gpu_plugin=False,
                       verify_delay_s=60)


class Events:
    """Stands in for the agent's EventSender: what it was asked to send."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.pending: set = set()

    def send(self, body: dict[str, Any], *, fill=None) -> bool:
        self.sent.append(body)
        return True


@contextlib.asynccontextmanager
async def pod_a(tmp_path: Path, tree: Path, containers: dict = ONE_CONTAINER,
                cfg: AgentConfig | None = None) -> AsyncIterator[tuple[Any, Any]]:
    """The agent's rig with pod a (namespace team) recorded as RECORDED, and a kubelet client
    of the VF plugin (closed on the way out)."""
    p = pod("uid-a", containers, alloc=RECORDED, name="a")
    async with rig(tmp_path, tree, [p], config=cfg or config(tmp_path)) as r:
        vf = r.kubelet.client(VF)
        try:
            yield r, vf
        finally:
            await vf.close()


def pair_file(resp) -> tuple[Path, dict]:
    [mount] = [m for m in resp.mounts if m.container_path == PAIRS_FILE]
    path = Path(mount.host_path)
    return path, json.loads(path.read_text())


def held(doc: dict) -> set[tuple[str, str]]:
    return {(p["gpu"]["uuid"], p["nic"]["pciAddress"]) for p in doc["pairs"]}


@async_test
async def test_other_gpus_from_kubelet_correct_the_record_and_the_pair_file_and_say_so(
        tmp_path, dgx_tree):
    async with pod_a(tmp_path, dgx_tree) as (r, vf):
        r.agent.events = events = Events()  # type: ignore[assignment]
        resp = await vf.allocate([VF18, VF40])
        # Fixed at Allocate, before NVIDIA's plugin may have been called: no GPU named.
        for name in ("RAILYARD_PAIRS", "VLLM_GPU_NIC_PCIE_MAPPING", "VLLM_NIC_SELECTION_VARS"):
            assert name not in resp.envs
        assert resp.envs["RAILYARD_PAIRS_FILE"] == PAIRS_FILE
        rdma = [TOPO.vf(v)[1].rdma_device for v in (VF18, VF40)]
        assert resp.envs["NCCL_IB_HCA"] == f"={rdma[0]}:1,{rdma[1]}:1"  # NICs: a right set
        path, before = pair_file(resp)
        assert held(before) == {(G[0], VF18), (G[1], VF40)}  # the record, for now

        # NVIDIA's plugin gave GPUs 1 and 5 (kubelet never read our record).
        r.podres.state.assign("team", "a", "main", GPU, [G[5], G[1]])
        r.podres.state.assign("team", "a", "main", VF, [VF40, VF18])
        warnings = await r.agent.verify()
        assert any("differs from the record" in w for w in warnings)

        rec = r.agent.store.get("uid-a")
        assert rec.allocation.decided_by == "node"
        # GPU 1 keeps its recorded VF; GPU 5 takes the VF GPU 0 left.
        pairs = {(x.gpu.device_id, x.nic.pci_address) for x in rec.allocation.pairs}
        assert pairs == {(G[1], VF40), (G[5], VF18)}
        after = json.loads(path.read_text())
        assert held(after) == pairs and after["decidedBy"] == "node"
        assert after["gpus"] == [] and after["nics"] == []

        await asyncio.sleep(0.05)  # the Event is sent from the agent's loop
        [event] = events.sent
        assert event["reason"] == "RailyardRecordCorrected" and event["type"] == "Warning"
        assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod",
                                           "namespace": "team", "name": "a", "uid": "uid-a"}
        assert (f"nvidia.com/gpu {sorted([G[1], G[5]])}, not the recorded "
                f"{sorted([G[0], G[1]])}") in event["message"], event["message"]


@async_test
async def test_gpus_from_kubelet_as_recorded_change_neither_record_nor_pair_file(
        tmp_path, dgx_tree):
    async with pod_a(tmp_path, dgx_tree) as (r, vf):
        r.agent.events = events = Events()  # type: ignore[assignment]
        path, _ = pair_file(await vf.allocate([VF18, VF40]))
        written = path.stat().st_mtime_ns, path.stat().st_ino
        r.podres.state.assign("team", "a", "main", GPU, [G[1], G[0]])
        r.podres.state.assign("team", "a", "main", VF, [VF40, VF18])
        assert await r.agent.verify() == []
        assert r.agent.store.get("uid-a").allocation == RECORDED
        assert (path.stat().st_mtime_ns, path.stat().st_ino) == written
        await asyncio.sleep(0.05)
        assert events.sent == []


@async_test
async def test_gpus_swapped_between_containers_pair_within_each_container(tmp_path, dgx_tree):
    """The pod holds the recorded GPUs, but NVIDIA's plugin gave c1 the GPU the record pairs
    with c2's VF: each GPU is paired again with its own container's NIC."""
    two_containers = {"c1": {GPU: 1, VF: 1}, "c2": {GPU: 1, VF: 1}}
    async with pod_a(tmp_path, dgx_tree, two_containers) as (r, vf):
        path1, _ = pair_file(await vf.allocate([VF18]))
        path2, _ = pair_file(await vf.allocate([VF40]))
        assert {path1.name, path2.name} == {"c1.json", "c2.json"}
        r.podres.state.assign("team", "a", "c1", GPU, [G[1]])
        r.podres.state.assign("team", "a", "c1", VF, [VF18])
        r.podres.state.assign("team", "a", "c2", GPU, [G[0]])
        r.podres.state.assign("team", "a", "c2", VF, [VF40])
        assert await r.agent.verify()
        rec = r.agent.store.get("uid-a")
        assert {(x.gpu.device_id, x.nic.pci_address) for x in rec.allocation.pairs} == {
            (G[1], VF18), (G[0], VF40)}
        files = {p.stem: json.loads(p.read_text()) for p in (path1, path2)}
        assert held(files["c1"]) == {(G[1], VF18)}
        assert held(files["c2"]) == {(G[0], VF40)}


class Killed(BaseException):
    """Stands for a SIGKILL of the agent at that write."""


@pytest.mark.parametrize("killed_at", ["pair file", "record"])
@async_test
async def test_a_kill_between_the_corrections_writes_is_made_good_by_the_next_check(
        tmp_path, dgx_tree, killed_at):
    """Interleaving: the check corrects a record and the agent is killed at one of the two
    writes (the pair file, the record); the restarted agent's check must leave the record and
    the pair file both naming the new pairs. Written record-first, a kill before the pair
    file left a record that already agreed with kubelet, and the pair file was never made
    again. The Event may be said again after a kill; it is never lost."""
    async with pod_a(tmp_path, dgx_tree) as (r, vf):
        r.agent.events = events = Events()  # type: ignore[assignment]
        path, _ = pair_file(await vf.allocate([VF18, VF40]))
        r.podres.state.assign("team", "a", "main", GPU, [G[5], G[1]])
        r.podres.state.assign("team", "a", "main", VF, [VF40, VF18])

        def kill(*args, **kwargs):
            raise Killed()

        target = r.agent.pair_files if killed_at == "pair file" else r.agent.store
        method = "write" if killed_at == "pair file" else "put"
        setattr(target, method, kill)
        with pytest.raises(Killed):
            await r.agent.verify()
        delattr(target, method)  # "restarted": the check runs again
        await r.agent.verify()

        rec = r.agent.store.get("uid-a")
        pairs = {(x.gpu.device_id, x.nic.pci_address) for x in rec.allocation.pairs}
        assert pairs == {(G[1], VF40), (G[5], VF18)}
        assert held(json.loads(path.read_text())) == pairs
        await asyncio.sleep(0.05)  # the Event is sent from the agent's loop
        assert events.sent and all(e["reason"] == "RailyardRecordCorrected"
                                   for e in events.sent)


@async_test
async def test_a_cni_call_runs_the_check_first_from_its_own_thread(tmp_path, dgx_tree):
    async with pod_a(tmp_path, dgx_tree) as (r, vf):
        await vf.allocate([VF18, VF40])
        r.podres.state.assign("team", "a", "main", GPU, [G[6], G[7]])
        r.podres.state.assign("team", "a", "main", VF, [VF18, VF40])
        seen: list[set[str]] = []

        class Grants:
            def grant(self, args: PodArgs):
                seen.append({g.device_id for g in
                             r.agent.store.get("uid-a").allocation.all_gpus})
                return None

        grants = CheckedGrants(Grants(), r.agent._verify_from_thread)
        args = PodArgs(uid="uid-a", namespace="team", name="a")
        assert await asyncio.to_thread(grants.grant, args) is None
        assert seen == [{G[6], G[7]}]  # the grant was looked up after the correction


@async_test
async def test_with_our_own_gpu_plugin_the_variables_name_the_gpus(tmp_path, dgx_tree):
    cfg = AgentConfig(devinfo_dir=str(tmp_path / "devinfo"), verify_delay_s=60)
    async with pod_a(tmp_path, dgx_tree, cfg=cfg) as (r, vf):
        gpu = r.kubelet.client(GPU)
        await gpu.allocate([G[0], G[1]])
        resp = await vf.allocate([VF18, VF40])
        assert "RAILYARD_PAIRS_FILE" not in resp.envs
        assert {x["gpu"]["uuid"] for x in json.loads(resp.envs["RAILYARD_PAIRS"])} == {
            G[0], G[1]}
        await gpu.close()


@async_test
async def test_with_gpus_not_ours_kubelet_is_asked_to_call_before_each_container_starts(
        tmp_path, dgx_tree):
    async with rig(tmp_path, dgx_tree, [], config=config(tmp_path)) as r:
        [reg] = [x for x in r.kubelet.registrations if x.resource == VF]
        assert reg.options.pre_start_required and reg.options.get_preferred_allocation_available
        vf = r.kubelet.client(VF)
        assert (await vf.options()).pre_start_required
        await vf.close()
    cfg = AgentConfig(devinfo_dir=str(tmp_path / "devinfo2"))
    async with rig(tmp_path / "own", dgx_tree, [], config=cfg) as r:
        assert not any(x.options.pre_start_required for x in r.kubelet.registrations)


@async_test
async def test_prestartcontainer_corrects_the_pair_file_before_the_container_is_made(
        tmp_path, dgx_tree):
    async with pod_a(tmp_path, dgx_tree) as (r, vf):
        path, _ = pair_file(await vf.allocate([VF18, VF40]))
        r.podres.state.assign("team", "a", "main", GPU, [G[3], G[2]])
        r.podres.state.assign("team", "a", "main", VF, [VF18, VF40])
        await vf.stub.PreStartContainer(pb.PreStartContainerRequest(
            devices_ids=[VF18, VF40]), timeout=5)
        assert {x["gpu"]["uuid"] for x in json.loads(path.read_text())["pairs"]} == {
            G[2], G[3]}


@async_test
async def test_a_failing_check_before_start_never_fails_the_containers_start():
    from railyard.kubelet.plugin import DeviceList, DevicePluginServicer

    async def broken(resource: str, ids) -> None:
        raise RuntimeError("PodResources is gone")

    servicer = DevicePluginServicer(VF, DeviceList(), handler=None,  # type: ignore[arg-type]
                                    before_start=broken)
    answer = await servicer.PreStartContainer(
        pb.PreStartContainerRequest(devices_ids=[VF18]), None)  # type: ignore[arg-type]
    assert answer == pb.PreStartContainerResponse()
    assert (await servicer.GetDevicePluginOptions(pb.Empty(), None)  # type: ignore[arg-type]
            ).pre_start_required
