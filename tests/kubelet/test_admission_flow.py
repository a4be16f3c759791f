"""Admission end to end: restarts, health, call order, records that lie or are missing."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from dataclasses import replace

import pytest

from railyard.agent.config import AgentConfig
from railyard.allocation.types import GpuRef, NicRef, Pair
from railyard.kubelet.resolver import ids_of
from railyard.node.attachments import AttachmentRecord, AttachmentStore
from railyard.records.allocation import encode_allocation
from support.agent import GPU, PF, VF, allocation, async_test, pod, rig, topology, write_pods

TOPO = topology()
G0, G1 = (g.device_id for g in TOPO.gpus)
PF0, PF1 = (n.pci_address for n in TOPO.nics)
VFS0 = [v.pci_address for v in TOPO.nics[0].vfs]
VFS1 = [v.pci_address for v in TOPO.nics[1].vfs]


def pci_dir(root, address: str) -> str:
    return os.path.realpath(os.path.join(root, "sys", "bus", "pci", "devices", address))


# ------------------------------------------------------------------ kubelet restart


@async_test
async def test_kubelet_restart_reregisters_within_two_seconds_without_unhealthy(
        tmp_path, generic_tree):
    async with rig(tmp_path, generic_tree) as r:
        for res in (GPU, VF, PF):
            await r.kubelet.wait_registered(res)
        before = len(r.kubelet.registrations)
        t0 = time.monotonic()
        await r.kubelet.restart()  # deletes every socket, ours included
        for res in (GPU, VF, PF):
            await r.kubelet.wait_registered(res, count=2, timeout_s=2)
        assert time.monotonic() - t0 < 2
        assert len(r.kubelet.registrations) == before + 3
        vf = r.kubelet.client(VF)
        devices = await vf.watch()
        assert set(devices) == set(VFS0 + VFS1)
        assert set(devices.values()) == {"Healthy"}
        await vf.close()


@async_test
async def test_plugin_socket_deleted_alone_is_served_and_registered_again(tmp_path,
                                                                          generic_tree):
    async with rig(tmp_path, generic_tree) as r:
        await r.kubelet.wait_registered(VF)
        os.unlink(r.agent.endpoints["vf"].socket_path)
        await r.kubelet.wait_registered(VF, count=2, timeout_s=2)
        assert (await r.kubelet.client(VF).options()).get_preferred_allocation_available


@async_test
async def test_agent_waits_for_a_late_kubelet_and_then_registers(tmp_path, generic_tree):
    async with rig(tmp_path, generic_tree, start_kubelet=False) as r:
        await asyncio.sleep(0.3)
        assert r.kubelet.registrations == []
        await r.kubelet.start()
        for res in (GPU, VF, PF):
            await r.kubelet.wait_registered(res, timeout_s=2)


# ------------------------------------------------------------------ health


@async_test
async def test_health_follows_sysfs_and_recovers(tmp_path, fresh_tree):
    root = fresh_tree
    async with rig(tmp_path, root) as r:
        await r.kubelet.wait_registered(VF)
        vf, gpu = r.kubelet.client(VF), r.kubelet.client(GPU)
        await vf.watch()
        await gpu.watch()

        async def until(client, check):
            while not check(client.devices):
                await client.next_update(3)

        # PF link down: the PF's VFs go Unhealthy, the other PF's stay Healthy.
        nic = TOPO.nics[0]
        oper = os.path.join(pci_dir(root, PF0), "net", nic.netdev, "operstate")
        with open(oper, "w") as f:
            f.write("down\n")
        await until(vf, lambda d: all(d[v] == "Unhealthy" for v in VFS0))
        assert all(vf.devices[v] == "Healthy" for v in VFS1)
        with open(oper, "w") as f:
            f.write("up\n")
        await until(vf, lambda d: all(d[v] == "Healthy" for v in VFS0))

        # RDMA port not ACTIVE on one VF.
        v = TOPO.vf(VFS1[2])[1]
        state = os.path.join(pci_dir(root, VFS1[2]), "infiniband", v.rdma_device, "ports", "1",
                             "state")
        with open(state, "w") as f:
            f.write("1: DOWN\n")
        await until(vf, lambda d: d[VFS1[2]] == "Unhealthy")
        assert sum(h == "Unhealthy" for h in vf.devices.values()) == 1
        with open(state, "w") as f:
            f.write("4: ACTIVE\n")
        await until(vf, lambda d: d[VFS1[2]] == "Healthy")

        # VF gone, GPU gone.
        shutil.rmtree(pci_dir(root, VFS0[0]))
        await until(vf, lambda d: d[VFS0[0]] == "Unhealthy")
        shutil.rmtree(pci_dir(root, TOPO.gpus[1].pci_address))
        await until(gpu, lambda d: d[G1] == "Unhealthy" and d[G0] == "Healthy")
        await vf.close()
        await gpu.close()


@async_test
async def test_default_route_and_vfio_vfs_are_never_offered(tmp_path, fresh_tree):
    root = fresh_tree
    nic = TOPO.nics[1]
    with open(root / "proc" / "net" / "route", "a") as f:
        f.write(f"{nic.vfs[0].netdev}\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n")
        f.write(f"{TOPO.nics[0].netdev}\t00000000\t0100000A\t0003\t0\t0\t50\t00000000\t0\t0\t0\n")
    vfio = pci_dir(root, VFS1[3])
    for sub in ("infiniband", "infiniband_verbs", "net"):  # vfio-pci drops them
        shutil.rmtree(os.path.join(vfio, sub))
    os.unlink(os.path.join(vfio, "driver"))
    drivers = root / "sys" / "bus" / "pci" / "drivers" / "vfio-pci"
    drivers.mkdir(parents=True)
    os.symlink(os.path.relpath(drivers, vfio), os.path.join(vfio, "driver"))
    async with rig(tmp_path, root) as r:
        await r.kubelet.wait_registered(PF)
        vf, pf = r.kubelet.client(VF), r.kubelet.client(PF)
        offered = set(await vf.watch())
        assert VFS1[0] not in offered  # its netdev carries the default route
        assert VFS1[3] not in offered  # bound to vfio-pci
        assert set(VFS0) <= offered  # the routed PF's VFs are fine
        assert set(await pf.watch()) == {PF1}  # PF0's netdev carries the default route
        await vf.close()
        await pf.close()


# ------------------------------------------------------------------ call order, restarts


@pytest.mark.parametrize("order", [(GPU, VF), (VF, GPU)])
@async_test
async def test_gpu_and_vf_plugins_in_either_order_reach_the_same_record(tmp_path, generic_tree,
                                                                        order):
    alloc = allocation(TOPO, [(0, VFS0[1]), (1, VFS1[1])])
    other = allocation(TOPO, [(0, VFS0[2]), (1, VFS1[2])], decided_at="2026-01-02T00:00:00Z")
    pods = [pod("uid-a", {"main": {GPU: 2, VF: 2}}, alloc=alloc),
            pod("uid-b", {"main": {GPU: 2, VF: 2}}, alloc=other)]
    async with rig(tmp_path, generic_tree, pods) as r:
        await r.kubelet.wait_registered(VF)
        responses = {}
        for res in order:
            c = r.kubelet.client(res)
            avail = [G1, G0] if res == GPU else VFS1 + VFS0
            ids = await c.preferred(avail, 2)
            responses[res] = await c.allocate(ids)
            await c.close()
        rec = r.agent.store.get("uid-a")
        assert rec.consumed_ids(GPU) == (G0, G1)
        assert rec.consumed_ids(VF) == (VFS0[1], VFS1[1])
        assert r.agent.store.get("uid-b") is None  # the younger record is untouched
        last = responses[order[1]]
        pairs = json.loads(last.envs["RAILYARD_PAIRS"])
        assert [(p["gpu"]["uuid"], p["nic"]["pciAddress"]) for p in pairs] == [
            (G0, VFS0[1]), (G1, VFS1[1])]
        assert "RAILYARD_PAIRS" not in responses[order[0]].envs


@async_test
async def test_agent_restart_mid_admission_continues_the_same_pod(tmp_path, generic_tree):
    alloc = allocation(TOPO, [(0, VFS0[3]), (1, VFS1[0])])
    pods = [pod("uid-a", {"main": {GPU: 2, VF: 2}}, alloc=alloc)]
    state = tmp_path / "state"
    async with rig(tmp_path / "one", generic_tree, pods, state_dir=state) as r:
        await r.kubelet.wait_registered(GPU)
        gpu = r.kubelet.client(GPU)
        await gpu.allocate(await gpu.preferred([G0, G1], 2))
        await gpu.close()
    async with rig(tmp_path / "two", generic_tree, pods, state_dir=state) as r:
        await r.kubelet.wait_registered(VF)
        vf = r.kubelet.client(VF)
        ids = await vf.preferred(VFS0 + VFS1, 2)
        assert ids == [VFS0[3], VFS1[0]]
        resp = await vf.allocate(ids)
        pairs = json.loads(resp.envs["RAILYARD_PAIRS"])
        assert [p["gpu"]["uuid"] for p in pairs] == [G0, G1]
        rec = r.agent.store.get("uid-a")
        assert rec.consumed_ids(GPU) == (G0, G1)
        await vf.close()


# ------------------------------------------------------------------ records that lie


@async_test
async def test_malformed_record_is_treated_as_no_record_and_the_node_decides(
        tmp_path, generic_tree, caplog):
    pods = [pod("uid-bad", {"main": {GPU: 1, VF: 1}}, annotation='{"version": 1, "pairs": 3}')]
    async with rig(tmp_path, generic_tree, pods) as r:
        await r.kubelet.wait_registered(VF)
        gpu, vf = r.kubelet.client(GPU), r.kubelet.client(VF)
        with caplog.at_level(logging.WARNING):
            g = await gpu.preferred([G0, G1], 1)
        v = await vf.preferred(VFS0 + VFS1, 1)
        rec = r.agent.store.get("uid-bad")
        assert rec.allocation.decided_by == "node"
        # the node pairs the GPU with a VF of the PF under its own switch
        gpu_pci = TOPO.gpu(next(x.pci_address for x in TOPO.gpus if x.device_id == g[0]))
        assert TOPO.distance[gpu_pci.pci_address][TOPO.vf(v[0])[0].pci_address].name in (
            "PIX", "PHB")
        assert any("railyard.dev/allocation.decidedBy: missing" in m for m in caplog.messages)
        await gpu.close()
        await vf.close()


@async_test
async def test_allocate_survives_a_record_naming_a_gpu_this_node_does_not_have(
        tmp_path, generic_tree, caplog):
    """A well-formed annotation whose GPU is not on this node (one that fell off the bus
    since the scheduler looked, or a hand-edited record) is no plan for this node: when
    kubelet's VF differs from it the node decides, instead of failing Allocate (kubelet
    would reject the pod), and the log names the field."""
    ghost = GpuRef(index=7, pci_address="0000:99:00.0",
                   uuid="GPU-00000000-0000-0000-0000-000000000099")
    base = allocation(TOPO, [(0, VFS0[0])])
    alloc = replace(base, pairs=(Pair(ghost, base.pairs[0].nic, base.pairs[0].distance),))
    async with rig(tmp_path, generic_tree, [pod("uid-g", {"main": {GPU: 1, VF: 1}},
                                               alloc=alloc)]) as r:
        vf = r.kubelet.client(VF)
        with caplog.at_level(logging.WARNING):
            resp = await vf.allocate([VFS0[2]])
        assert resp.envs["PCIDEVICE_RAILYARD_DEV_VF"] == VFS0[2]
        rec = r.agent.store.get("uid-g")
        assert rec.allocation.decided_by == "node" and rec.consumed_ids(VF) == (VFS0[2],)
        assert any("pairs[0].gpu: GPU GPU-00000000-0000-0000-0000-000000000099" in m
                   for m in caplog.messages)
        await vf.close()


@async_test
async def test_a_record_naming_a_vf_as_a_whole_pf_is_not_followed(tmp_path, generic_tree,
                                                                  caplog):
    as_pf = NicRef("pf", VFS1[0], VFS1[0], None, None, None)  # a VF, recorded as a PF
    alloc = replace(allocation(TOPO, []), nics=(as_pf,))
    async with rig(tmp_path, generic_tree, [pod("uid-k", {"main": {PF: 1}},
                                               alloc=alloc)]) as r:
        pf = r.kubelet.client(PF)
        with caplog.at_level(logging.WARNING):
            pref = await pf.preferred([PF0, PF1], 1)
            resp = await pf.allocate([PF1])
        assert pref[0] in (PF0, PF1)
        assert resp.envs["PCIDEVICE_RAILYARD_DEV_PF"] == PF1
        assert r.agent.store.get("uid-k").consumed_ids(PF) == (PF1,)
        assert any(f"nics[0]: {VFS1[0]} is a VF of PF {PF1}" in m for m in caplog.messages)
        await pf.close()


@async_test
async def test_a_record_whose_cpus_repeat_one_range_is_refused_within_kubelets_deadline(
        tmp_path, generic_tree, caplog):
    """Issue 19, class 1: a few KB of `cpus` ("0-65535" over and over) took the agent to
    1.3 GB and past kubelet's 5 s deadline for Allocate, every range expanded before any was
    de-duplicated. 232 KB of it now is refused at its second range: the node decides."""
    alloc = allocation(TOPO, [(0, VFS0[0])])
    hostile = json.loads(encode_allocation(alloc))
    hostile["cpus"] = ",".join(["0-65535"] * 29_000)
    annotation = json.dumps(hostile)
    assert len(annotation) > 230_000
    async with rig(tmp_path, generic_tree, [pod("uid-cpus", {"main": {GPU: 1, VF: 1}},
                                               annotation=annotation)]) as r:
        vf = r.kubelet.client(VF)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING):
            resp = await vf.allocate([VFS0[2]])
        assert time.monotonic() - started < 2.0
        assert resp.envs["PCIDEVICE_RAILYARD_DEV_VF"] == VFS0[2]
        assert r.agent.store.get("uid-cpus").allocation.decided_by == "node"
        assert any("allocation.cpus: bad CPU list '0-65535,0-65535" in m
                   and "does not come after CPU 65535" in m for m in caplog.messages)
        await vf.close()


@async_test
async def test_a_pod_with_a_non_string_creation_timestamp_does_not_break_allocate(
        tmp_path, generic_tree):
    """Candidates without a record are ordered by creationTimestamp; one pod whose timestamp
    is a number must not fail kubelet's calls for the others (it made the sort raise)."""
    odd = pod("uid-odd", {"main": {VF: 1}}, name="odd")
    odd["metadata"]["creationTimestamp"] = 1767225600
    ok = pod("uid-ok", {"main": {VF: 1}}, name="ok")
    async with rig(tmp_path, generic_tree, [odd, ok]) as r:
        vf = r.kubelet.client(VF)
        resp = await vf.allocate([VFS0[0]])
        assert resp.envs["PCIDEVICE_RAILYARD_DEV_VF"] == VFS0[0]
        await vf.close()


@async_test
async def test_pod_that_bypassed_the_scheduler_gets_the_best_local_pairing(tmp_path,
                                                                           generic_tree):
    pods = [pod("uid-direct", {"main": {GPU: 2, VF: 2}})]
    async with rig(tmp_path, generic_tree, pods) as r:
        await r.kubelet.wait_registered(VF)
        vf, gpu = r.kubelet.client(VF), r.kubelet.client(GPU)
        v = await vf.preferred(VFS0 + VFS1, 2)
        await vf.allocate(v)
        g = await gpu.preferred([G0, G1], 2)
        resp = await gpu.allocate(g)
        rec = r.agent.store.get("uid-direct")
        assert rec.allocation.decided_by == "node"
        pairs = {(p.gpu.device_id, TOPO.vf(p.nic.pci_address)[0].pci_address)
                 for p in rec.allocation.pairs}
        assert pairs == {(G0, PF0), (G1, PF1)}  # each GPU with the PF nearest to it
        assert json.loads(resp.envs["RAILYARD_PAIRS"])
        await vf.close()
        await gpu.close()


@async_test
async def test_kubelet_choosing_other_ids_rewrites_the_record_as_node_decided(
        tmp_path, generic_tree, caplog):
    alloc = allocation(TOPO, [(0, VFS0[0]), (1, VFS1[0])])
    pods = [pod("uid-a", {"main": {GPU: 2, VF: 2}}, alloc=alloc)]
    async with rig(tmp_path, generic_tree, pods) as r:
        await r.kubelet.wait_registered(VF)
        vf = r.kubelet.client(VF)
        with caplog.at_level(logging.WARNING):
            resp = await vf.allocate([VFS0[2], VFS1[3]])  # kubelet ignored the preference
        rec = r.agent.store.get("uid-a")
        assert rec.allocation.decided_by == "node"
        assert {p.nic.pci_address for p in rec.allocation.pairs} == {VFS0[2], VFS1[3]}
        pairs = {(p.gpu.device_id, p.nic.pci_address) for p in rec.allocation.pairs}
        assert pairs == {(G0, VFS0[2]), (G1, VFS1[3])}  # still each GPU with its near PF
        assert resp.envs["PCIDEVICE_RAILYARD_DEV_VF"] == f"{VFS0[2]},{VFS1[3]}"
        assert any("recording what kubelet gave" in m for m in caplog.messages)
        await vf.close()


@async_test
async def test_podresources_check_moves_devices_to_the_pod_kubelet_gave_them_to(
        tmp_path, generic_tree):
    a = allocation(TOPO, [(0, VFS0[0])], decided_at="2026-01-01T00:00:00Z")
    b = allocation(TOPO, [(1, VFS1[0])], decided_at="2026-01-02T00:00:00Z")
    pods = [pod("uid-a", {"main": {GPU: 1, VF: 1}}, alloc=a, name="a"),
            pod("uid-b", {"main": {GPU: 1, VF: 1}}, alloc=b, name="b")]
    async with rig(tmp_path, generic_tree, pods) as r:
        await r.kubelet.wait_registered(VF)
        vf = r.kubelet.client(VF)
        # kubelet admits b first, with a VF neither record names: the resolver guesses a.
        await vf.allocate([VFS1[2]])
        assert r.agent.store.get("uid-a").consumed_ids(VF) == (VFS1[2],)
        r.podres.state.assign("team", "b", "main", VF, [VFS1[2]])
        warnings = await r.agent.verify()
        assert warnings
        rb = r.agent.store.get("uid-b")
        assert rb.consumed_ids(VF) == (VFS1[2],)
        assert rb.allocation.decided_by == "node"
        assert [p.nic.pci_address for p in rb.allocation.pairs] == [VFS1[2]]
        assert r.agent.store.get("uid-a").consumed_ids(VF) == ()
        await vf.close()


@async_test
async def test_podresources_agreeing_with_the_store_changes_nothing(tmp_path, generic_tree):
    a = allocation(TOPO, [(0, VFS0[0])])
    pods = [pod("uid-a", {"main": {GPU: 1, VF: 1}}, alloc=a, name="a")]
    async with rig(tmp_path, generic_tree, pods) as r:
        await r.kubelet.wait_registered(VF)
        vf, gpu = r.kubelet.client(VF), r.kubelet.client(GPU)
        await vf.allocate(await vf.preferred(VFS0 + VFS1, 1))
        await gpu.allocate(await gpu.preferred([G0, G1], 1))
        r.podres.state.assign("team", "a", "main", VF, [VFS0[0]])
        r.podres.state.assign("team", "a", "main", GPU, [G0])
        r.podres.state.get_implemented = False
        assert await r.agent.verify() == []
        assert r.agent.store.get("uid-a").allocation == a
        await vf.close()
        await gpu.close()


@async_test
async def test_podresources_ids_unknown_to_the_topology_do_not_stop_the_check(
        tmp_path, generic_tree):
    """gpuPlugin: false leaves nvidia.com/gpu to NVIDIA's plugin, whose IDs need not be bare
    UUIDs (time-slicing replicas 'GPU-…::0', MIG 'MIG-…'). The check skips such IDs with a
    warning, keeps the record's GPUs, and still repairs every pod, one with VFs only too."""
    alloc_a = allocation(TOPO, [(0, VFS0[0])])
    a = pod("uid-a", {"main": {GPU: 1, VF: 1}}, name="a", phase="Running", alloc=alloc_a)
    b = pod("uid-b", {"main": {VF: 1}}, name="b", phase="Running",
            alloc=allocation(TOPO, [], nics=(VFS1[0],)))
    cfg = AgentConfig(devinfo_dir=str(tmp_path / "devinfo"), gpu_plugin=False,
                      verify_delay_s=60)
    async with rig(tmp_path, generic_tree, [a, b], config=cfg) as r:
        r.podres.state.assign("team", "a", "main", GPU, [f"{G0}::0"])
        r.podres.state.assign("team", "a", "main", VF, [VFS0[0]])
        r.podres.state.assign("team", "b", "main", VF, [VFS1[2]])  # not b's record
        warnings = await r.agent.verify()
        assert any(f"{G0}::0" in w and "not device IDs" in w for w in warnings)
        ra, rb = r.agent.store.get("uid-a"), r.agent.store.get("uid-b")
        assert ra.allocation == alloc_a and ra.consumed_ids(VF) == (VFS0[0],)
        assert ra.consumed_ids(GPU) == ()  # no note of IDs the node cannot interpret
        assert [n.pci_address for n in rb.allocation.all_nics] == [VFS1[2]]


@async_test
async def test_a_failure_checking_one_pod_does_not_stop_the_check_of_the_others(
        tmp_path, generic_tree, monkeypatch):
    import railyard.kubelet.admission as admission

    a = pod("uid-a", {"main": {VF: 1}}, name="a", phase="Running",
            alloc=allocation(TOPO, [], nics=(VFS0[0],)))
    b = pod("uid-b", {"main": {VF: 1}}, name="b", phase="Running",
            alloc=allocation(TOPO, [], nics=(VFS1[0],)))
    async with rig(tmp_path, generic_tree, [a, b]) as r:
        r.podres.state.assign("team", "a", "main", VF, [VFS0[1]])
        r.podres.state.assign("team", "b", "main", VF, [VFS1[2]])
        real = admission.reconcile

        def fails_for_a(topology, base, actual, **kw):
            if actual.get("vf") == [VFS0[1]]:
                raise RuntimeError("boom")
            return real(topology, base, actual, **kw)

        monkeypatch.setattr(admission, "reconcile", fails_for_a)
        warnings = await r.agent.verify()
        assert any("team/a: PodResources check failed" in w for w in warnings)
        assert r.agent.store.get("uid-a") is None
        assert ids_of(r.agent.store.get("uid-b").allocation, "vf") == (VFS1[2],)


@async_test
async def test_records_of_gone_pods_are_forgotten_unless_the_cni_holds_them(tmp_path,
                                                                            generic_tree):
    a = allocation(TOPO, [(0, VFS0[0])])
    b = allocation(TOPO, [(1, VFS1[0])], decided_at="2026-01-02T00:00:00Z")
    pods = [pod("uid-a", {"main": {GPU: 1, VF: 1}}, alloc=a),
            pod("uid-b", {"main": {GPU: 1, VF: 1}}, alloc=b)]
    async with rig(tmp_path, generic_tree, pods) as r:
        await r.kubelet.wait_registered(VF)
        vf = r.kubelet.client(VF)
        await vf.allocate([VFS0[0]])
        await vf.allocate([VFS1[0]])
        devinfo = tmp_path / "devinfo" / f"railyard.dev-vf-{VFS0[0]}-device.json"
        assert devinfo.exists()
        # The CNI has not yet had its DEL for b: an attachment record still names the pod.
        AttachmentStore(r.agent.options.state_dir).save(AttachmentRecord(
            network="rdma", container_id="c-b", ifname="net1", netns="/proc/1/ns/net",
            netns_id=None, pod_uid="uid-b", pod_namespace="team", pod_name="uid-b"))
        write_pods(r.pods_file, [])
        assert set(r.agent.gc()) == {"uid-a"}
        assert not devinfo.exists()
        assert r.agent.store.get("uid-b") is not None
        await vf.close()


@async_test
async def test_forgetting_a_finished_pod_keeps_the_device_info_file_of_the_vfs_new_owner(
        tmp_path, generic_tree):
    """Kubelet frees a Succeeded pod's devices while its object stays (a Job's pod), so its
    VF can go to pod b, whose Allocate rewrites the VF's device-info file. Forgetting a once
    its object is deleted must leave b's file, or Multus no longer finds it for b."""
    a = pod("uid-a", {"main": {VF: 1}}, name="a", alloc=allocation(TOPO, [], nics=(VFS0[0],)))
    async with rig(tmp_path, generic_tree, [a]) as r:
        vf = r.kubelet.client(VF)
        await vf.allocate([VFS0[0]])
        a["status"]["phase"] = "Succeeded"
        b = pod("uid-b", {"main": {VF: 1}}, name="b",
                alloc=allocation(TOPO, [], nics=(VFS0[0],), decided_at="2026-01-02T00:00:00Z"))
        write_pods(r.pods_file, [a, b])
        await vf.allocate([VFS0[0]])
        assert r.agent.store.get("uid-b").consumed_ids(VF) == (VFS0[0],)
        devinfo = tmp_path / "devinfo" / f"railyard.dev-vf-{VFS0[0]}-device.json"
        assert devinfo.exists()
        write_pods(r.pods_file, [b])  # a's object is deleted
        assert r.agent.gc() == ["uid-a"]
        assert devinfo.exists(), "forgetting pod a removed pod b's device-info file"
        await vf.close()


@async_test
async def test_agent_start_rebuilds_a_lost_record_from_podresources(tmp_path, generic_tree):
    a = allocation(TOPO, [(0, VFS0[0]), (1, VFS1[0])])
    pods = [pod("uid-a", {"main": {GPU: 2, VF: 2}}, alloc=a, name="a", phase="Running")]
    assigned = {("team", "a", "main", VF): [VFS0[0], VFS1[1]],
                ("team", "a", "main", GPU): [G0, G1]}
    async with rig(tmp_path, generic_tree, pods, assigned=assigned) as r:
        for _ in range(100):  # the check at start runs in the background
            rec = r.agent.store.get("uid-a")
            if rec is not None:
                break
            await asyncio.sleep(0.02)
        assert rec is not None
        assert set(rec.consumed_ids(VF)) == {VFS0[0], VFS1[1]}
        assert rec.allocation.decided_by == "node"  # kubelet's VF differs from the record
        assert {p.nic.pci_address for p in rec.allocation.pairs} == {VFS0[0], VFS1[1]}
        assert r.agent.store.granted_nics("uid-a")[0].pci_address == VFS0[0]


@async_test
async def test_agent_start_says_which_records_it_rebuilt_and_what_it_could_not(
        tmp_path, generic_tree, caplog):
    """The state folder is gone (nothing in the store) while kubelet says pod a holds a GPU
    and a VF, and pod b a GPU: both records come back, the log names them, and says that a's
    VF has no CNI attachment record to put it back with."""
    a = allocation(TOPO, [(0, VFS0[0])])
    pods = [pod("uid-a", {"main": {GPU: 1, VF: 1}}, alloc=a, name="a", phase="Running"),
            pod("uid-b", {"main": {GPU: 1}}, name="b", phase="Running")]
    assigned = {("team", "a", "main", VF): [VFS0[0]], ("team", "a", "main", GPU): [G0],
                ("team", "b", "main", GPU): [G1]}
    caplog.set_level(logging.WARNING, logger="railyard.agent.agent")
    async with rig(tmp_path, generic_tree, pods, assigned=assigned) as r:
        for _ in range(100):  # the check at start runs in the background
            if "node state rebuilt" in caplog.text:
                break
            await asyncio.sleep(0.02)
        assert {rec.uid for rec in r.agent.store.all()} == {"uid-a", "uid-b"}
    said = [m for m in caplog.messages if "node state rebuilt" in m]
    assert len(said) == 1, caplog.messages
    assert "for 2 pod(s): " in said[0] and "team/a" in said[0] and "team/b" in said[0]
    assert "no CNI attachment record of the NICs of team/a (uid-a):" in said[0]
    assert "team/b" not in said[0].split("no CNI attachment")[1]
