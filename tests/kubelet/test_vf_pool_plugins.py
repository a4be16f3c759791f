"""Two VF pools over real gRPC (docs/decisions/0085): one device plugin per pool, each
offering its own pool's VFs; kubelet's calls for a pool are matched against the record's
VFs of that pool, and what kubelet really gives is recorded in its pool."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from railyard.agent.agent import Agent, AgentOptions
from railyard.agent.config import ConfigError, config_from_dict
from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.kubelet.pods import PodsFile
from railyard.kubelet.resolver import ids_of
from railyard.kubelet.response import pcidevice_env
from railyard.records.allocation import decode_allocation, encode_allocation
from support.agent import GPU, NODE, VF, async_test, pod, rig, topology

RAIL = "railyard.dev/vf-rail"
TOPO = topology()
G0, G1 = (g.device_id for g in TOPO.gpus)
VFS0 = [v.pci_address for v in TOPO.nics[0].vfs]
VFS1 = [v.pci_address for v in TOPO.nics[1].vfs]
# The default pool: the first PF's VFs; RAIL: the second's.
POOLS = {"resourceList": [
    {"resourceName": "vf", "selectors": {"pfNames": ["enp19s0f0np0"], "isRdma": True}},
    {"resourceName": "vf-rail", "resourcePrefix": "railyard.dev",
     "selectors": {"pfNames": ["enp66s0f0np0"]}}]}


def config(tmp_path, pools=POOLS):
    return config_from_dict({"vfPools": pools, "devinfoDir": str(tmp_path / "devinfo")})


def pooled_topology():
    nic = TOPO.nics[1]
    return replace(TOPO, nics=(TOPO.nics[0], replace(
        nic, vfs=tuple(replace(v, pool=RAIL) for v in nic.vfs))))


def record() -> Allocation:
    """G0 paired with a default-pool VF, G1 unpaired; one RAIL VF unpaired."""
    t = pooled_topology()
    pf0, pf1 = t.nics
    return Allocation(NODE, (0,), None, (), pairs=(
        Pair(GpuRef.of(t.gpus[0]), NicRef.of_vf(pf0, pf0.vfs[2]), TOPO.distance[
            t.gpus[0].pci_address][pf0.pci_address]),),
        nics=(NicRef.of_vf(pf1, pf1.vfs[3]),), gpus=(GpuRef.of(t.gpus[1]),))


@async_test
async def test_each_pool_is_its_own_plugin_offering_its_own_vfs(tmp_path, generic_tree):
    async with rig(tmp_path, generic_tree, config=config(tmp_path)) as r:
        await r.kubelet.wait_registered(RAIL)
        await r.kubelet.wait_registered(VF)
        vf, rail = r.kubelet.client(VF), r.kubelet.client(RAIL)
        assert set(await vf.watch()) == set(VFS0)
        assert set(await rail.watch()) == set(VFS1)
        # The node's topology names each VF's pool: what NodeTopology publishes.
        pools = {v.pci_address: v.pool for n in r.agent.topology.nics for v in n.vfs}
        assert {pools[a] for a in VFS0} == {None} and {pools[a] for a in VFS1} == {RAIL}
        await vf.close()
        await rail.close()


@async_test
async def test_kubelets_calls_for_each_pool_follow_the_records_vfs_of_that_pool(
        tmp_path, generic_tree):
    alloc = record()
    p = pod("uid-1", {"main": {GPU: 2, VF: 1, RAIL: 1}}, alloc=alloc)
    async with rig(tmp_path, generic_tree, [p], config=config(tmp_path)) as r:
        await r.kubelet.wait_registered(RAIL)
        gpu, vf, rail = (r.kubelet.client(x) for x in (GPU, VF, RAIL))
        assert await rail.preferred(VFS1, 1) == [VFS1[3]]
        assert await vf.preferred(VFS0, 1) == [VFS0[2]]
        got = await rail.allocate([VFS1[3]])
        assert got.envs[pcidevice_env(RAIL)] == VFS1[3]
        assert (tmp_path / "devinfo" / f"railyard.dev-vf-rail-{VFS1[3]}-device.json").exists()
        await vf.allocate([VFS0[2]])
        last = await gpu.allocate(await gpu.preferred([G0, G1], 2))
        pairs = json.loads(last.envs["RAILYARD_PAIRS"])
        assert {(x["gpu"] and x["gpu"]["uuid"], x["nic"] and x["nic"]["pciAddress"])
                for x in pairs} == {(G0, VFS0[2]), (G1, None), (None, VFS1[3])}
        stored = r.agent.store.get("uid-1")
        assert stored.allocation == alloc  # kubelet followed the record: nothing rewritten
        assert set(stored.consumed_ids(RAIL)) == {VFS1[3]}
        for c in (gpu, vf, rail):
            await c.close()


@async_test
async def test_another_vf_of_a_pool_is_recorded_in_that_pool(tmp_path, generic_tree):
    p = pod("uid-1", {"main": {GPU: 2, VF: 1, RAIL: 1}}, alloc=record())
    async with rig(tmp_path, generic_tree, [p], config=config(tmp_path)) as r:
        await r.kubelet.wait_registered(RAIL)
        rail = r.kubelet.client(RAIL)
        await rail.allocate([VFS1[0]])  # kubelet ignored the preference
        a = r.agent.store.get("uid-1").allocation
        assert a.decided_by == "node"
        assert ids_of(a, RAIL) == (VFS1[0],) and ids_of(a, "vf") == (VFS0[2],)
        assert [p.nic.pci_address for p in a.pairs] == [VFS0[2]]  # RAIL never pairs here
        assert decode_allocation(encode_allocation(a)) == a
        await rail.close()


@async_test
async def test_a_pod_without_a_record_gets_a_node_plan_across_both_pools(tmp_path,
                                                                        generic_tree):
    p = pod("uid-2", {"main": {GPU: 1, VF: 1, RAIL: 2}})
    async with rig(tmp_path, generic_tree, [p], config=config(tmp_path)) as r:
        await r.kubelet.wait_registered(RAIL)
        rail = r.kubelet.client(RAIL)
        ids = await rail.preferred(VFS1, 2)
        assert set(ids) <= set(VFS1) and len(ids) == 2
        a = r.agent.store.get("uid-2").allocation
        assert a.decided_by == "node"
        assert len(ids_of(a, "vf")) == 1 and set(ids_of(a, RAIL)) == set(ids)
        assert all(p.nic.pool is None for p in a.pairs)
        await rail.close()


@async_test
async def test_a_vf_two_pools_match_stops_the_agent_naming_both_pools(tmp_path, generic_tree):
    both = {"resourceList": [
        {"resourceName": "vf", "selectors": {"pfNames": ["enp19s0f0np0"]}},
        {"resourceName": "vf-rail", "selectors": [{"vendors": ["8086"]},
                                                  {"pfNames": ["enp19s0f0np0#2-3"]}]}]}
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"kind": "PodList", "items": []}))
    agent = Agent(AgentOptions(NODE, sysfs_root=str(generic_tree),
                               kubelet_dir=str(tmp_path / "k"), state_dir=str(tmp_path / "s")),
                  PodsFile(pods), config(tmp_path, both))
    with pytest.raises(ConfigError) as e:
        await agent.start()
    message = str(e.value)
    assert message.startswith("vfPools")
    assert VFS0[2] in message and "selector 0 of railyard.dev/vf and" in message
    assert "selector 1 of railyard.dev/vf-rail" in message
    await agent.stop()


@async_test
async def test_a_record_naming_a_vf_under_another_pool_is_not_followed(tmp_path, generic_tree):
    """The record says RAIL's VF is a default-pool VF: no plugin would hand it out under
    that name, so the node decides instead, and names the pool right."""
    wrong = record()
    lone = replace(wrong.nics[0], pool=None)
    p = pod("uid-1", {"main": {GPU: 2, VF: 1, RAIL: 1}}, alloc=replace(wrong, nics=(lone,)))
    async with rig(tmp_path, generic_tree, [p], config=config(tmp_path)) as r:
        await r.kubelet.wait_registered(RAIL)
        assert "is in pool railyard.dev/vf-rail" in (r.agent.admission.unusable(
            replace(wrong, nics=(lone,))) or "")
        rail = r.kubelet.client(RAIL)
        ids = await rail.preferred(VFS1, 1)
        a = r.agent.store.get("uid-1").allocation
        assert a.decided_by == "node" and ids_of(a, RAIL) == tuple(ids)
        await rail.close()
