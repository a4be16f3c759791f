"""Which pod and container each kubelet call is for, end to end over gRPC.

Kubelet admits one pod at a time, container by container (init containers first), calling
each plugin separately and with device IDs only. These tests follow that order for pods with
several containers, init containers and pods pending side by side, and check that every call
reaches the right pod, that the record keeps what later containers still need, and that a
container's pair map names only its own devices.
"""

from __future__ import annotations

import json

from railyard.agent.config import AgentConfig
from railyard.kubelet.resolver import ids_of
from support.agent import GPU, VF, allocation, async_test, pod, rig, topology

TOPO = topology()
G0, G1 = (g.device_id for g in TOPO.gpus)
PF0, PF1 = (n.pci_address for n in TOPO.nics)
VFS0 = [v.pci_address for v in TOPO.nics[0].vfs]
VFS1 = [v.pci_address for v in TOPO.nics[1].vfs]


def _cfg(tmp_path, **kw) -> AgentConfig:
    return AgentConfig(devinfo_dir=str(tmp_path / "devinfo"), health_interval_s=0.1,
                       verify_delay_s=60, **kw)  # verify only when the test asks


def _two_containers() -> dict:
    """Pod p: c1 and c2 each {GPU 1, VF 1}, recorded (G0, VFS0[0]) and (G1, VFS1[0])."""
    return pod("uid-p", {"c1": {GPU: 1, VF: 1}, "c2": {GPU: 1, VF: 1}},
               alloc=allocation(TOPO, [(0, VFS0[0]), (1, VFS1[0])]), name="p")


# ------------------------------------------------------------------ several containers


@async_test
async def test_kubelet_deviating_for_one_container_keeps_the_other_containers_record(
        tmp_path, generic_tree):
    """Kubelet gives c1 another VF than recorded (the preference is advisory). The record
    rebuilt around it must still hold c2's recorded VF, or p stops fitting its request and
    c2's calls go to the next pending pod, b."""
    b = pod("uid-b", {"main": {VF: 1}}, name="b",
            alloc=allocation(TOPO, [], nics=(VFS1[3],), decided_at="2026-01-02T00:00:00Z"))
    async with rig(tmp_path, generic_tree, [_two_containers(), b], config=_cfg(tmp_path)) as r:
        gpu, vf = r.kubelet.client(GPU), r.kubelet.client(VF)
        # c1
        assert await gpu.preferred([G0, G1], 1) == [G0]
        await gpu.allocate([G0])
        assert await vf.preferred(VFS0 + VFS1, 1) == [VFS0[0]]
        await vf.allocate([VFS0[2]])  # kubelet's own choice, same PF
        assert set(ids_of(r.agent.store.get("uid-p").allocation, "vf")) == {VFS0[2], VFS1[0]}
        # c2
        assert await gpu.preferred([G1], 1) == [G1]
        await gpu.allocate([G1])
        pref = await vf.preferred([v for v in VFS0 + VFS1 if v != VFS0[2]], 1)
        await vf.allocate([VFS1[0]])
        assert r.agent.store.get("uid-b") is None, "c2 of pod p was admitted as pod b"
        assert r.agent.store.get("uid-p").is_consumed("c2", VF)
        assert pref == [VFS1[0]], "c2 was not steered to its recorded VF"
        await gpu.close()
        await vf.close()


@async_test
async def test_podresources_check_mid_admission_keeps_the_unreported_containers_record(
        tmp_path, generic_tree):
    """PodResources lists c1's devices before kubelet has admitted c2: the check must not cut
    the record down to c1's share."""
    async with rig(tmp_path, generic_tree, [_two_containers()], config=_cfg(tmp_path)) as r:
        gpu, vf = r.kubelet.client(GPU), r.kubelet.client(VF)
        await gpu.allocate([G0])
        await vf.allocate([VFS0[0]])
        r.podres.state.assign("team", "p", "c1", GPU, [G0])
        r.podres.state.assign("team", "p", "c1", VF, [VFS0[0]])
        assert await r.agent.verify() == []
        rec = r.agent.store.get("uid-p")
        assert set(ids_of(rec.allocation, "vf")) == {VFS0[0], VFS1[0]}
        assert set(ids_of(rec.allocation, "gpu")) == {G0, G1}
        assert await vf.preferred(VFS0[1:] + VFS1, 1) == [VFS1[0]]
        await gpu.close()
        await vf.close()


@async_test
async def test_pair_map_of_a_container_names_only_devices_that_container_was_given(
        tmp_path, generic_tree):
    """docs/agent.md: 'Only devices kubelet passed appear.' Kubelet gives c1 G0 and VFS1[0],
    both recorded for the pod but in different pairs. c1's map must not name G1 or VFS0[0]
    (c2's): a launcher in c1 binding rank 0 to G0's NIC would pick a VF it does not have.
    Each container's devices are paired among themselves, and the record says so."""
    async with rig(tmp_path, generic_tree, [_two_containers()], config=_cfg(tmp_path)) as r:
        gpu, vf = r.kubelet.client(GPU), r.kubelet.client(VF)
        await gpu.allocate([G0])
        c1 = await vf.allocate([VFS1[0]])
        assert _pairs(c1) == [(G0, VFS1[0])]
        await gpu.allocate([G1])
        c2 = await vf.allocate([VFS0[0]])
        assert _pairs(c2) == [(G1, VFS0[0])]
        rec = r.agent.store.get("uid-p").allocation
        assert rec.decided_by == "node"
        assert [(p.gpu.device_id, p.nic.pci_address) for p in rec.pairs] == [
            (G0, VFS1[0]), (G1, VFS0[0])]
        await gpu.close()
        await vf.close()


def _pairs(resp) -> list[tuple[str | None, str | None]]:
    return [((x["gpu"] or {}).get("uuid"), (x["nic"] or {}).get("pciAddress"))
            for x in json.loads(resp.envs["RAILYARD_PAIRS"])]


# ------------------------------------------------------------------ pods pending together


@async_test
async def test_second_plugin_of_a_pod_mid_admission_follows_that_pod(tmp_path, generic_tree):
    """Pod a {GPU 1, VF 1} (decided second) and pod b {VF 1} (decided first) are pending;
    kubelet admits a, GPU plugin first. The VF call that follows is a's, not the older b's:
    kubelet finishes one pod before it starts the next (decision 0033)."""
    a = pod("uid-a", {"main": {GPU: 1, VF: 1}}, name="a",
            alloc=allocation(TOPO, [(1, VFS1[1])], decided_at="2026-01-02T00:00:00Z"))
    b = pod("uid-b", {"main": {VF: 1}}, name="b",
            alloc=allocation(TOPO, [], nics=(VFS0[3],), decided_at="2026-01-01T00:00:00Z"))
    async with rig(tmp_path, generic_tree, [a, b], config=_cfg(tmp_path)) as r:
        gpu, vf = r.kubelet.client(GPU), r.kubelet.client(VF)
        assert await gpu.preferred([G0, G1], 1) == [G1]
        await gpu.allocate([G1])
        ids = await vf.preferred(VFS0 + VFS1, 1)
        resp = await vf.allocate(ids)
        assert ids == [VFS1[1]], f"pod a was steered to pod b's VF {ids}"
        assert r.agent.store.get("uid-b") is None
        assert "RAILYARD_PAIRS" in resp.envs
        await gpu.close()
        await vf.close()


# ------------------------------------------------------------------ init containers


def _with_init(p: dict, init: dict[str, dict[str, int]], sidecars: tuple[str, ...] = ()) -> dict:
    p["spec"]["initContainers"] = [
        {"name": c, "resources": {"limits": {r: str(n) for r, n in res.items()}},
         **({"restartPolicy": "Always"} if c in sidecars else {})}
        for c, res in init.items()]
    return p


@async_test
async def test_app_container_reusing_its_init_containers_vf_is_not_given_to_another_pod(
        tmp_path, generic_tree):
    """Kubelet allocates init containers first and lets app containers reuse their devices:
    the app container's Allocate carries the init container's IDs and no
    GetPreferredAllocation precedes it. That call is pod a's, not the next pending pod's
    (b's record would be rewritten to a's VF, and the CNI would move it into b)."""
    a = _with_init(pod("uid-a", {"main": {VF: 1}}, name="a",
                       alloc=allocation(TOPO, [], nics=(VFS0[1],))),
                   {"setup": {VF: 1}})
    b = pod("uid-b", {"main": {VF: 1}}, name="b",
            alloc=allocation(TOPO, [], nics=(VFS1[1],), decided_at="2026-01-02T00:00:00Z"))
    async with rig(tmp_path, generic_tree, [a, b], config=_cfg(tmp_path)) as r:
        vf = r.kubelet.client(VF)
        assert await vf.preferred(VFS0 + VFS1, 1) == [VFS0[1]]
        await vf.allocate([VFS0[1]])  # setup
        await vf.allocate([VFS0[1]])  # main, reusing setup's VF
        assert r.agent.store.get("uid-b") is None, "pod b was noted for pod a's VF"
        rec = r.agent.store.get("uid-a")
        assert rec.is_consumed("setup", VF) and rec.is_consumed("main", VF)
        assert ids_of(rec.allocation, "vf") == (VFS0[1],)
        rest = [v for v in VFS0 + VFS1 if v != VFS0[1]]
        assert await vf.preferred(rest, 1) == [VFS1[1]]
        await vf.close()


@async_test
async def test_an_init_container_asking_for_more_than_the_app_containers_is_resolved(
        tmp_path, generic_tree):
    """Init container {VF 2}, app container {VF 1}: the scheduler records two VFs (the pod
    needs two while `setup` runs). Kubelet gives setup both, then main one of them again."""
    a = _with_init(pod("uid-a", {"main": {GPU: 1, VF: 1}}, name="a",
                       alloc=allocation(TOPO, [(0, VFS0[1])], nics=(VFS1[1],))),
                   {"setup": {VF: 2}})
    b = pod("uid-b", {"main": {VF: 1}}, name="b",
            alloc=allocation(TOPO, [], nics=(VFS1[2],), decided_at="2026-01-02T00:00:00Z"))
    async with rig(tmp_path, generic_tree, [a, b], config=_cfg(tmp_path)) as r:
        gpu, vf = r.kubelet.client(GPU), r.kubelet.client(VF)
        assert await vf.preferred(VFS0 + VFS1, 2) == [VFS0[1], VFS1[1]]
        await vf.allocate([VFS0[1], VFS1[1]])  # setup
        await gpu.allocate([G0])  # main; then its VF, one of setup's, chosen by kubelet
        resp = await vf.allocate([VFS1[1]])
        assert r.agent.store.get("uid-b") is None
        rec = r.agent.store.get("uid-a")
        assert rec.is_consumed("main", VF) and set(ids_of(rec.allocation, "vf")) == {
            VFS0[1], VFS1[1]}
        assert "RAILYARD_PAIRS" in resp.envs
        await gpu.close()
        await vf.close()


@async_test
async def test_an_app_container_needing_more_than_it_reuses_is_steered_to_the_rest(
        tmp_path, generic_tree):
    """Init container {VF 1}, app container {VF 2}: kubelet reuses setup's VF for main and
    asks the plugin for the second one with the reused VF as a must-include."""
    a = _with_init(pod("uid-a", {"main": {VF: 2}}, name="a",
                       alloc=allocation(TOPO, [], nics=(VFS0[1], VFS1[1]))),
                   {"setup": {VF: 1}})
    b = pod("uid-b", {"main": {VF: 2}}, name="b",
            alloc=allocation(TOPO, [], nics=(VFS0[2], VFS1[2]),
                             decided_at="2026-01-02T00:00:00Z"))
    async with rig(tmp_path, generic_tree, [a, b], config=_cfg(tmp_path)) as r:
        vf = r.kubelet.client(VF)
        assert await vf.preferred(VFS0 + VFS1, 1) == [VFS0[1]]
        await vf.allocate([VFS0[1]])
        assert await vf.preferred(VFS0 + VFS1[1:], 2, must_include=[VFS0[1]]) == [
            VFS0[1], VFS1[1]]
        await vf.allocate([VFS0[1], VFS1[1]])
        assert r.agent.store.get("uid-b") is None
        assert r.agent.store.get("uid-a").is_consumed("main", VF)
        await vf.close()


@async_test
async def test_a_sidecars_devices_are_its_own_and_the_app_container_gets_fresh_ones(
        tmp_path, generic_tree):
    """A sidecar (restartPolicy: Always) keeps its VF for the pod's life: the app container
    gets another (kubelet needs the sum), which the record holds as well."""
    a = _with_init(pod("uid-a", {"main": {VF: 1}}, name="a",
                       alloc=allocation(TOPO, [], nics=(VFS0[1], VFS1[1]))),
                   {"proxy": {VF: 1}}, sidecars=("proxy",))
    async with rig(tmp_path, generic_tree, [a], config=_cfg(tmp_path)) as r:
        vf = r.kubelet.client(VF)
        assert await vf.preferred(VFS0 + VFS1, 1) == [VFS0[1]]
        await vf.allocate([VFS0[1]])
        assert await vf.preferred(VFS0[2:] + VFS1, 1) == [VFS1[1]]
        await vf.allocate([VFS1[1]])
        rec = r.agent.store.get("uid-a")
        assert [c.device_ids for c in rec.consumed] == [(VFS0[1],), (VFS1[1],)]
        await vf.close()
