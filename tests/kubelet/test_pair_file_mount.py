"""The pair map as kubelet's Allocate answers carry it, over real gRPC on a dgx-h100 fixture:
every variable and the mounted pair file against the record, per container, for 1, 2, 4 and
8 pairs, for containers holding part of the pod's pairs, and for devices an app container
reuses from its init container; the files go when the pod is forgotten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from railyard.agent.config import AgentConfig
from railyard.allocation.types import Allocation
from railyard.kubelet.pairmap import PAIRS_FILE, PairMapOptions
from support.agent import GPU, VF, allocation, async_test, make_tree, pod, rig, topology, write_pods
from support.allocations import nearest_vf

TOPO = topology("dgx-h100", vfs_per_pf=2)


@pytest.fixture(scope="module")
def h100_tree(tmp_path_factory):
    return make_tree(tmp_path_factory.mktemp("h100") / "root", "dgx-h100", vfs_per_pf=2)


def _cfg(tmp_path: Path, **kw) -> AgentConfig:
    return AgentConfig(devinfo_dir=str(tmp_path / "devinfo"), health_interval_s=0.1,
                       verify_delay_s=60, **kw)


def _pod_of(n: int) -> Allocation:
    return allocation(TOPO, [(i, nearest_vf(TOPO, i)) for i in range(n)])


def _merged(*responses) -> dict[str, str]:
    """The container's environment: kubelet keeps the first value of a variable."""
    env: dict[str, str] = {}
    for r in responses:
        for k, v in r.envs.items():
            env.setdefault(k, v)
    return env


def _pair_file(resp) -> tuple[dict, str]:
    """The answer's one pair-file mount: its content on the node and its host path."""
    (m,) = [m for m in resp.mounts if m.container_path == PAIRS_FILE]
    assert m.read_only
    return json.loads(Path(m.host_path).read_text()), m.host_path


def _expect_env(pairs) -> dict[str, str]:
    """The variables a container holding `pairs` (and nothing else) must get."""
    devs = ",".join(f"{p.nic.rdma_device}:1" for p in pairs)
    return {
        "NVIDIA_VISIBLE_DEVICES": ",".join(p.gpu.device_id for p in pairs),
        "NCCL_IB_HCA": "=" + devs,
        "UCX_NET_DEVICES": devs,
        "NVSHMEM_HCA_LIST": devs,
        "VLLM_GPU_NIC_PCIE_MAPPING": ",".join(f"{p.gpu.pci_address}={p.nic.pci_address}"
                                              for p in pairs),
        "VLLM_NIC_SELECTION_VARS": "RAILYARD_WORKER_HCA:1",
    }


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@async_test
async def test_the_containers_last_plugin_answers_every_form_and_mounts_its_pair_file(
        tmp_path, h100_tree, n):
    alloc = _pod_of(n)
    p = pod("uid-p", {"main": {GPU: n, VF: n}}, alloc=alloc, name="p")
    async with rig(tmp_path, h100_tree, [p], config=_cfg(tmp_path)) as r:
        gpu, vf = r.kubelet.client(GPU), r.kubelet.client(VF)
        g = await gpu.allocate([x.gpu.device_id for x in reversed(alloc.pairs)])
        v = await vf.allocate([x.nic.pci_address for x in reversed(alloc.pairs)])
        assert not g.mounts and "UCX_NET_DEVICES" not in g.envs  # not done with the container
        env = _merged(g, v)
        for k, want in _expect_env(alloc.pairs).items():
            assert env[k] == want, k
        assert "NCCL_GPU_NIC_AFFINITY" not in env  # opt-in
        doc, host = _pair_file(v)
        assert host.startswith(str(tmp_path / "state" / "pairs" / "uid-p"))
        assert doc["version"] == 1 and doc["container"] == "main"
        assert [(x["index"], x["gpu"]["uuid"], x["gpu"]["index"], x["gpu"]["pciAddress"],
                 x["nic"]["pciAddress"], x["nic"]["pfPciAddress"], x["nic"]["rdmaDevice"],
                 x["nic"]["podNetdev"], x["distance"], x["rail"]) for x in doc["pairs"]] == [
            (i, x.gpu.uuid, x.gpu.index, x.gpu.pci_address, x.nic.pci_address,
             x.nic.pf_pci_address, x.nic.rdma_device, "net1" if i == 0 else f"net1-{i}",
             x.distance.name, None) for i, x in enumerate(alloc.pairs)]
        await gpu.close()
        await vf.close()


@async_test
async def test_containers_holding_part_of_the_pods_pairs_each_get_only_theirs(
        tmp_path, h100_tree):
    alloc = _pod_of(4)
    p = pod("uid-p", {"c1": {GPU: 2, VF: 2}, "c2": {GPU: 2, VF: 2}}, alloc=alloc, name="p")
    async with rig(tmp_path, h100_tree, [p], config=_cfg(tmp_path)) as r:
        gpu, vf = r.kubelet.client(GPU), r.kubelet.client(VF)
        answers = {}
        for c, mine in (("c1", alloc.pairs[:2]), ("c2", alloc.pairs[2:])):
            g = await gpu.allocate([x.gpu.device_id for x in mine])
            v = await vf.allocate([x.nic.pci_address for x in mine])
            answers[c] = (g, v, mine)
        for c, (g, v, mine) in answers.items():
            env = _merged(g, v)
            for k, want in _expect_env(mine).items():
                assert env[k] == want, (c, k)
            doc, host = _pair_file(v)
            assert doc["container"] == c and host.endswith(f"/uid-p/{c}.json")
            first = alloc.pairs.index(mine[0])
            assert [x["index"] for x in doc["pairs"]] == [first, first + 1]
            assert [x["nic"]["podNetdev"] for x in doc["pairs"]] == [
                f"net1-{i}" if i else "net1" for i in (first, first + 1)]
            assert [x["gpu"]["cudaOrdinal"] for x in doc["pairs"]] == [0, 1]
        assert r.agent.store.get("uid-p").allocation == alloc
        await gpu.close()
        await vf.close()


@async_test
async def test_devices_reused_from_an_init_container_get_the_same_pairs_in_their_own_file(
        tmp_path, h100_tree):
    """Kubelet hands `main` the GPU and VF `setup` held (devicesToReuse), without a
    GetPreferredAllocation first: each container gets its own file naming the same pair."""
    alloc = _pod_of(2)
    p = pod("uid-p", {"main": {GPU: 2, VF: 2}}, alloc=alloc, name="p")
    p["spec"]["initContainers"] = [
        {"name": "setup", "resources": {"limits": {GPU: "2", VF: "2"}}}]
    gpus = [x.gpu.device_id for x in alloc.pairs]
    vfs = [x.nic.pci_address for x in alloc.pairs]
    async with rig(tmp_path, h100_tree, [p], config=_cfg(tmp_path)) as r:
        gpu, vf = r.kubelet.client(GPU), r.kubelet.client(VF)
        setup = (await gpu.allocate(gpus), await vf.allocate(vfs))
        main = (await gpu.allocate(gpus[::-1]), await vf.allocate(vfs[::-1]))
        rec = r.agent.store.get("uid-p")
        assert rec.is_consumed("setup", VF) and rec.is_consumed("main", VF)
        files = {}
        for c, (g, v) in (("setup", setup), ("main", main)):
            env = _merged(g, v)
            for k, want in _expect_env(alloc.pairs).items():
                assert env[k] == want, (c, k)
            files[c] = _pair_file(v)
        assert files["setup"][1] != files["main"][1]
        assert files["setup"][0]["pairs"] == files["main"][0]["pairs"]
        assert [x["index"] for x in files["main"][0]["pairs"]] == [0, 1]
        await gpu.close()
        await vf.close()


@async_test
async def test_the_affinity_form_when_the_node_opts_in(tmp_path, h100_tree):
    alloc = _pod_of(4)
    p = pod("uid-p", {"main": {GPU: 4, VF: 4}}, alloc=alloc, name="p")
    cfg = _cfg(tmp_path, pair_map=PairMapOptions(nccl_gpu_nic_affinity=True))
    async with rig(tmp_path, h100_tree, [p], config=cfg) as r:
        gpu, vf = r.kubelet.client(GPU), r.kubelet.client(VF)
        await gpu.allocate([x.gpu.device_id for x in alloc.pairs])
        v = await vf.allocate([x.nic.pci_address for x in alloc.pairs])
        assert v.envs["NCCL_GPU_NIC_AFFINITY"] == ",".join(
            f"cuda:{i}={x.nic.rdma_device}" for i, x in enumerate(alloc.pairs))
        assert v.envs["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        await gpu.close()
        await vf.close()


@async_test
async def test_forgetting_a_pod_removes_its_pair_files(tmp_path, h100_tree):
    alloc = _pod_of(1)
    p = pod("uid-p", {"main": {GPU: 1, VF: 1}}, alloc=alloc, name="p")
    async with rig(tmp_path, h100_tree, [p], config=_cfg(tmp_path)) as r:
        gpu, vf = r.kubelet.client(GPU), r.kubelet.client(VF)
        await gpu.allocate([alloc.pairs[0].gpu.device_id])
        v = await vf.allocate([alloc.pairs[0].nic.pci_address])
        _, host = _pair_file(v)
        stray = tmp_path / "state" / "pairs" / "uid-gone" / "main.json"
        stray.parent.mkdir(parents=True)
        stray.write_text("{}")  # a pair file whose pod has no record and no object
        assert r.agent.gc() == []
        assert Path(host).exists() and not stray.parent.exists()
        write_pods(r.pods_file, [])
        assert r.agent.gc() == ["uid-p"]
        assert not Path(host).parent.exists()
        await gpu.close()
        await vf.close()
