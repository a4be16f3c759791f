"""The device plugins against a fake kubelet over real unix-socket gRPC, on fixture sysfs."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

from railyard.agent.config import AgentConfig, config_from_dict
from support.agent import GPU, PF, VF, allocation, async_test, pod, rig, topology
from support.fake_kubelet import watcher_info

TOPO = topology()
G0, G1 = (g.device_id for g in TOPO.gpus)
PF0, PF1 = (n.pci_address for n in TOPO.nics)
VFS0 = [v.pci_address for v in TOPO.nics[0].vfs]
VFS1 = [v.pci_address for v in TOPO.nics[1].vfs]


@async_test
async def test_plugins_serve_then_register_each_resource_with_preferred_allocation(
        tmp_path, generic_tree):
    async with rig(tmp_path, generic_tree) as r:
        for res in (GPU, VF, PF):
            await r.kubelet.wait_registered(res)
        regs = {x.resource: x for x in r.kubelet.registrations}
        assert set(regs) == {GPU, VF, PF}
        assert regs[VF].version == "v1beta1"
        assert regs[VF].endpoint == "railyard.dev_vf.sock"  # relative to device-plugins/
        assert all(x.options.get_preferred_allocation_available for x in regs.values())


@async_test
async def test_list_and_watch_offers_ids_with_numa_topology(tmp_path, generic_tree):
    async with rig(tmp_path, generic_tree) as r:
        for res in (GPU, VF, PF):
            await r.kubelet.wait_registered(res)
        gpu, vf, pf = (r.kubelet.client(x) for x in (GPU, VF, PF))
        assert await gpu.watch() == {G0: "Healthy", G1: "Healthy"}
        assert set(await vf.watch()) == set(VFS0 + VFS1)
        assert set(await pf.watch()) == {PF0, PF1}
        assert vf.topology[VFS0[0]] == [0]
        for c in (gpu, vf, pf):
            await c.close()


@async_test
async def test_gpu_plugin_can_be_switched_off(tmp_path, generic_tree):
    cfg = AgentConfig(gpu_plugin=False, devinfo_dir=str(tmp_path / "d"))
    async with rig(tmp_path, generic_tree, config=cfg) as r:
        await r.kubelet.wait_registered(VF)
        await r.kubelet.wait_registered(PF)
        await asyncio.sleep(0.1)
        assert GPU not in r.kubelet.resources()


@async_test
async def test_pool_selectors_narrow_the_offered_vfs(tmp_path, generic_tree):
    cfg = config_from_dict({"pools": {"vf": [{"pfNames": ["enp19s0f0np0#1-2"]}],
                                      "pf": [{"vendors": ["8086"]}]},
                            "devinfoDir": str(tmp_path / "d")})
    async with rig(tmp_path, generic_tree, config=cfg) as r:
        await r.kubelet.wait_registered(PF)
        vf, pf = r.kubelet.client(VF), r.kubelet.client(PF)
        assert set(await vf.watch()) == set(VFS0[1:3])
        assert await pf.watch() == {}
        await vf.close()
        await pf.close()


@async_test
async def test_preferred_allocation_steers_kubelet_to_the_recorded_ids(tmp_path, generic_tree):
    # The record pairs GPU1 with a VF of the *far* PF: kubelet must still be steered there.
    alloc = allocation(TOPO, [(0, VFS1[2]), (1, VFS0[3])])
    p = pod("uid-1", {"main": {GPU: 2, VF: 2}}, alloc=alloc)
    async with rig(tmp_path, generic_tree, [p]) as r:
        await r.kubelet.wait_registered(VF)
        vf, gpu = r.kubelet.client(VF), r.kubelet.client(GPU)
        assert await vf.preferred(VFS0 + VFS1, 2) == [VFS1[2], VFS0[3]]
        assert await gpu.preferred([G1, G0], 2) == [G0, G1]
        await vf.close()
        await gpu.close()


@async_test
async def test_allocate_contents_in_pair_order(tmp_path, generic_tree):
    alloc = allocation(TOPO, [(0, VFS1[0]), (1, VFS0[1])])
    p = pod("uid-1", {"main": {GPU: 2, VF: 2}}, alloc=alloc)
    async with rig(tmp_path, generic_tree, [p]) as r:
        await r.kubelet.wait_registered(VF)
        vf, gpu = r.kubelet.client(VF), r.kubelet.client(GPU)
        # kubelet passes IDs in its own order; the answer is in pair order
        g = await gpu.allocate([G1, G0])
        v = await vf.allocate([VFS0[1], VFS1[0]])
        assert g.envs["NVIDIA_VISIBLE_DEVICES"] == f"{G0},{G1}"
        n1, v0 = TOPO.vf(VFS1[0])[1], TOPO.vf(VFS0[1])[1]
        assert v.envs["NCCL_IB_HCA"] == f"={n1.rdma_device}:1,{v0.rdma_device}:1"
        assert v.envs["PCIDEVICE_RAILYARD_DEV_VF"] == f"{VFS1[0]},{VFS0[1]}"
        info = json.loads(v.envs["PCIDEVICE_RAILYARD_DEV_VF_INFO"])
        assert info[VFS1[0]]["rdma"]["rdma_dev"] == n1.rdma_device
        assert info[VFS1[0]]["rdma"]["uverbs"] == f"/dev/infiniband/{n1.uverbs}"
        paths = {(d.host_path, d.container_path, d.permissions) for d in v.devices}
        assert paths == {(f"/dev/infiniband/{x}",) * 2 + ("rw",)
                         for x in (n1.uverbs, v0.uverbs, "rdma_cm")}
        # The last plugin of the container carries the pair map, GPU i -> NIC i.
        pairs = json.loads(v.envs["RAILYARD_PAIRS"])
        assert [(x["gpu"]["uuid"], x["nic"]["pciAddress"], x["nic"]["rdmaDevice"])
                for x in pairs] == [(G0, VFS1[0], n1.rdma_device), (G1, VFS0[1], v0.rdma_device)]
        assert "RAILYARD_PAIRS" not in g.envs
        devinfo = tmp_path / "devinfo" / f"railyard.dev-vf-{VFS1[0]}-device.json"
        assert json.loads(devinfo.read_text()) == {
            "type": "pci", "version": "1.1.0",
            "pci": {"pci-address": VFS1[0], "rdma-device": n1.rdma_device}}
        rec = r.agent.store.get("uid-1")
        assert rec.allocation == alloc
        assert set(rec.consumed_ids(VF)) == {VFS0[1], VFS1[0]}
        await vf.close()
        await gpu.close()


@async_test
async def test_allocate_of_a_whole_pf_gives_its_verbs_device(tmp_path, generic_tree):
    alloc = allocation(TOPO, [(0, PF0)])
    p = pod("uid-pf", {"main": {GPU: 1, PF: 1}}, alloc=alloc)
    async with rig(tmp_path, generic_tree, [p]) as r:
        await r.kubelet.wait_registered(PF)
        pf = r.kubelet.client(PF)
        assert await pf.preferred([PF0, PF1], 1) == [PF0]
        resp = await pf.allocate([PF0])
        nic = TOPO.nics[0]
        assert resp.envs["NCCL_IB_HCA"] == f"={nic.rdma_device}:1"
        assert f"/dev/infiniband/{nic.uverbs}" in {d.host_path for d in resp.devices}
        assert resp.envs["PCIDEVICE_RAILYARD_DEV_PF"] == PF0
        await pf.close()


@async_test
async def test_plugin_watcher_mode_serves_registration_and_never_calls_register(
        tmp_path, generic_tree):
    kdir = Path(tempfile.mkdtemp(prefix="ry-"))
    (kdir / "plugins_registry").mkdir()
    async with rig(tmp_path, generic_tree, kubelet_dir=kdir) as r:
        sock = kdir / "plugins_registry" / "railyard.dev_vf.sock"
        info = await watcher_info(str(sock))
        assert info.type == "DevicePlugin"
        assert info.name == VF
        assert list(info.supported_versions) == ["v1beta1"]
        assert info.endpoint == str(sock)
        await asyncio.sleep(0.2)
        assert r.kubelet.registrations == []
        assert not os.path.exists(kdir / "device-plugins" / "railyard.dev_vf.sock")
    shutil.rmtree(kdir, ignore_errors=True)


@async_test
async def test_vfs_and_a_pf_in_one_container_get_one_nccl_hca_from_the_last_plugin(
        tmp_path, generic_tree):
    alloc = allocation(TOPO, [(0, VFS0[0]), (1, PF1)])
    p = pod("uid-mix", {"main": {GPU: 2, VF: 1, PF: 1}}, alloc=alloc)
    async with rig(tmp_path, generic_tree, [p]) as r:
        vf, pf, gpu = (r.kubelet.client(x) for x in (VF, PF, GPU))
        v = await vf.allocate([VFS0[0]])
        f = await pf.allocate([PF1])
        g = await gpu.allocate([G0, G1])
        assert "NCCL_IB_HCA" not in v.envs and "NCCL_IB_HCA" not in f.envs
        v0 = TOPO.vf(VFS0[0])[1]
        assert g.envs["NCCL_IB_HCA"] == f"={v0.rdma_device}:1,{TOPO.nics[1].rdma_device}:1"
        assert len(json.loads(g.envs["RAILYARD_PAIRS"])) == 2


@async_test
async def test_without_the_gpu_plugin_a_vf_and_pf_container_still_gets_nccl_ib_hca(
        tmp_path, generic_tree):
    """With gpuPlugin: false the GPUs are NVIDIA's plugin's and never allocated through us;
    the container's last plugin of ours (here PF) sets NCCL_IB_HCA. Variables naming GPUs
    are left out (kubelet may not have given the GPUs yet, decision 0090): the pair file,
    named by RAILYARD_PAIRS_FILE, holds the record's partners until the check corrects it."""
    alloc = allocation(TOPO, [(0, VFS0[0]), (1, PF1)])
    p = pod("uid-mix", {"main": {GPU: 2, VF: 1, PF: 1}}, alloc=alloc)
    cfg = AgentConfig(devinfo_dir=str(tmp_path / "devinfo"), gpu_plugin=False)
    async with rig(tmp_path, generic_tree, [p], config=cfg) as r:
        vf, pf = r.kubelet.client(VF), r.kubelet.client(PF)
        v = await vf.allocate([VFS0[0]])
        f = await pf.allocate([PF1])
        assert "NCCL_IB_HCA" not in v.envs and "RAILYARD_PAIRS" not in v.envs
        v0 = TOPO.vf(VFS0[0])[1]
        assert f.envs["NCCL_IB_HCA"] == f"={v0.rdma_device}:1,{TOPO.nics[1].rdma_device}:1"
        assert "RAILYARD_PAIRS" not in f.envs and "VLLM_GPU_NIC_PCIE_MAPPING" not in f.envs
        assert f.envs["RAILYARD_PAIRS_FILE"] == "/run/railyard/pairs.json"
        [mount] = [m for m in f.mounts if m.container_path == "/run/railyard/pairs.json"]
        assert [(x["gpu"]["uuid"], x["nic"]["pciAddress"])
                for x in json.loads(Path(mount.host_path).read_text())["pairs"]] == [
            (G0, VFS0[0]), (G1, PF1)]
        await vf.close()
        await pf.close()


@async_test
async def test_renamed_resources_register_and_name_their_variables(tmp_path, generic_tree):
    cfg = config_from_dict({"resources": {"vf": "example.com/rdma_vf"}, "gpuPlugin": False,
                            "pfPlugin": False, "devinfoDir": str(tmp_path / "d")})
    async with rig(tmp_path, generic_tree, config=cfg) as r:
        assert r.kubelet.resources() == ["example.com/rdma_vf"]
        c = r.kubelet.client("example.com/rdma_vf")
        resp = await c.allocate([VFS0[0]])
        assert resp.envs["PCIDEVICE_EXAMPLE_COM_RDMA_VF"] == VFS0[0]
        assert (tmp_path / "d" / f"example.com-rdma_vf-{VFS0[0]}-device.json").exists()
        await c.close()
