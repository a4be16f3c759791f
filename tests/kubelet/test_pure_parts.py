"""The pure parts behind the plugins: pod parsing, resolution, pairing and grants."""

from __future__ import annotations

import contextlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.allocation.names import DEFAULT_RESOURCES as NAMES
from railyard.kubelet.pairing import choose_local, pair_container, reconcile
from railyard.kubelet.pods import PodError, pod_view
from railyard.kubelet.resolver import candidates, ids_of, match_allocate
from railyard.kubelet.response import (
    devinfo_file_name,
    in_pair_order,
    nic_grant,
    pairs_json,
    pcidevice_env,
)
from railyard.node.state import Consumed, PodKey, PodRecord
from support.agent import GPU, NODE, PF, VF, allocation, pod, topology

TOPO = topology("dgx-h100", vfs_per_pf=2)
GPUS = [g.device_id for g in TOPO.gpus]
COMPUTE = [n for n in TOPO.nics if n.vfs]
VF_OF = {n.pci_address: [v.pci_address for v in n.vfs] for n in COMPUTE}


def near_vf(gpu_index: int, k: int = 0) -> str:
    g = TOPO.gpus[gpu_index]
    nic = min(COMPUTE, key=lambda n: (TOPO.distance[g.pci_address][n.pci_address],
                                      n.pci_address))
    return VF_OF[nic.pci_address][k]


# ------------------------------------------------------------------ pods


def test_pod_view_reads_counts_phase_and_record():
    a = allocation(TOPO, [(0, near_vf(0))])
    v = pod_view(pod("u1", {"main": {GPU: 1, VF: 1}, "side": {}}, alloc=a))
    assert v.node_name == NODE and v.pending and v.allocation == a
    assert v.total(GPU) == 1 and v.containers[1].devices == ()


def test_pod_view_keeps_a_broken_record_as_an_error_naming_the_field():
    v = pod_view(pod("u1", {"main": {VF: 1}}, annotation='{"version": 1, "node": 5}'))
    assert v.allocation is None
    assert "railyard.dev/allocation" in v.allocation_error


@settings(max_examples=150, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(
                        st.sampled_from(["metadata", "spec", "status", "uid", "name",
                                         "containers", "resources", "limits", "annotations",
                                         "nodeName", "phase"]), c, max_size=4),
                    max_leaves=20))
def test_pod_view_never_fails_with_anything_but_pod_error(data):
    with contextlib.suppress(PodError):
        pod_view(data)


def _scheduler_count(inits: list[tuple[bool, int]], apps: list[int]) -> int:
    """kube-scheduler's effective request (component-helpers PodRequests, KEP-753): app
    containers and sidecars add up; an ordinary init container needs its own request next to
    the sidecars started before it."""
    sidecars = peak = 0
    for sidecar, n in inits:
        if sidecar:
            sidecars += n
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + n)
    return max(sum(apps) + sidecars, peak)


@settings(max_examples=300, deadline=None)
@given(inits=st.lists(st.tuples(st.booleans(), st.integers(0, 4)), max_size=5),
       apps=st.lists(st.integers(0, 4), min_size=1, max_size=3))
def test_a_pods_device_count_with_init_containers_and_sidecars_is_the_schedulers(inits, apps):
    """Kubelet's reuse of init containers' devices gives a pod exactly as many devices as
    kube-scheduler's effective request counts, so a recorded decision fits its pod."""
    def c(name: str, n: int, sidecar: bool = False) -> dict:
        return {"name": name, "resources": {"limits": {VF: str(n)}} if n else {},
                **({"restartPolicy": "Always"} if sidecar else {})}

    p = pod("u", {})
    p["spec"]["containers"] = [c(f"app{i}", n) for i, n in enumerate(apps)]
    p["spec"]["initContainers"] = [c(f"init{i}", n, sidecar)
                                   for i, (sidecar, n) in enumerate(inits)]
    assert pod_view(p).total(VF) == _scheduler_count(inits, apps)


# ------------------------------------------------------------------ resolver


def _views(*pods):
    return [pod_view(p) for p in pods]


def test_kubelets_creation_order_decides_not_what_the_records_say():
    # Issue 19, class 5: ordered by `decidedAt`, a pod stamping its own record 1970 went
    # ahead of every other; and a pod with any record went ahead of pods without one.
    early = allocation(TOPO, [(0, near_vf(0))], decided_at="1970-01-01T00:00:00Z")
    late = allocation(TOPO, [(1, near_vf(1))], decided_at="2026-01-02T00:00:00Z")
    pods = _views(pod("steerer", {"c": {VF: 1}}, alloc=early, created="2026-01-03T00:00:00Z"),
                  pod("direct", {"c": {VF: 1}}, created="2026-01-01T00:00:00Z"),
                  pod("decided", {"c": {VF: 1}}, alloc=late, created="2026-01-02T00:00:00Z"))
    cands = candidates(pods, {}, NODE, NAMES, VF, 1)
    assert [c.pod.uid for c in cands] == ["direct", "decided", "steerer"]
    assert match_allocate(cands, [near_vf(5)]).pod.uid == "direct"
    assert cands[2].expected == (near_vf(0),)


def test_pods_created_in_the_same_second_keep_the_order_they_were_delivered_in():
    # Kubelet admits a batch by creation time, to the second, and keeps the order its watch
    # delivered pods in on a tie; the agent's pods source delivers them in the same order.
    pods = _views(*(pod(uid, {"c": {VF: 1}}, created="2026-01-01T00:00:00Z")
                    for uid in ("zeta", "alpha", "mid")))
    assert [c.pod.uid for c in candidates(pods, {}, NODE, NAMES, VF, 1)] == [
        "zeta", "alpha", "mid"]


def test_two_records_naming_the_same_devices_do_not_decide_which_pod_is_served():
    # A record copied from another pod's: the exact match no longer singles one out, so the
    # pod GetPreferredAllocation planned for is served, else kubelet's (creation) order.
    same = allocation(TOPO, [(0, near_vf(0))])
    copy = allocation(TOPO, [(0, near_vf(0))], decided_at="1970-01-01T00:00:00Z")
    pods = _views(pod("owner", {"c": {VF: 1}}, alloc=same, created="2026-01-01T00:00:00Z"),
                  pod("copier", {"c": {VF: 1}}, alloc=copy, created="2026-01-02T00:00:00Z"))
    cands = candidates(pods, {}, NODE, NAMES, VF, 1)
    assert match_allocate(cands, [near_vf(0)]).pod.uid == "owner"
    assert match_allocate(cands, [near_vf(0)], hint=("copier", "c")).pod.uid == "copier"
    alone = candidates(pods[1:], {}, NODE, NAMES, VF, 1)
    assert match_allocate(alone, [near_vf(0)]).pod.uid == "copier"


def test_other_nodes_running_pods_and_wrong_sizes_are_not_candidates():
    a = allocation(TOPO, [(0, near_vf(0)), (1, near_vf(1))])
    pods = _views(pod("elsewhere", {"c": {VF: 2}}, alloc=a, node="node-b"),
                  pod("running", {"c": {VF: 2}}, alloc=a, phase="Running"),
                  pod("small", {"c": {VF: 1}}, alloc=a),
                  pod("ok", {"c": {VF: 2}}, alloc=a))
    assert [c.pod.uid for c in candidates(pods, {}, NODE, NAMES, VF, 2)] == ["ok"]


def test_a_record_that_does_not_fit_the_request_is_not_used_and_the_node_decides():
    a = allocation(TOPO, [(0, near_vf(0))])
    [c] = candidates(_views(pod("u", {"c": {VF: 2}}, alloc=a)), {}, NODE, NAMES, VF, 2)
    assert c.allocation is None and c.expected == ()
    assert c.record_error == f"it holds 1 {VF}, kubelet gives the pod 2"


def test_a_record_naming_a_device_the_node_lacks_is_not_used_and_says_which():
    a = allocation(TOPO, [(0, near_vf(0))])
    [c] = candidates(_views(pod("u", {"c": {VF: 1}}, alloc=a)), {}, NODE, NAMES, VF, 1,
                     unusable=lambda alloc: "pairs[0].gpu: gone")
    assert (c.allocation, c.record_error) == (None, "pairs[0].gpu: gone")


def test_consumed_containers_move_on_to_the_next_container():
    a = allocation(TOPO, [(0, near_vf(0)), (1, near_vf(1))])
    p = pod("u", {"one": {VF: 1, GPU: 1}, "two": {VF: 1, GPU: 1}}, alloc=a)
    rec = PodRecord(PodKey("u", "team", "u"), a, (Consumed("one", VF, (near_vf(0),)),))
    c = candidates(_views(p), {"u": rec}, NODE, NAMES, VF, 1)[0]
    assert (c.container, c.expected) == ("two", (near_vf(1),))


def test_an_app_container_reuses_what_init_containers_left_and_not_a_sidecars_devices():
    a = allocation(TOPO, [], nics=(near_vf(0), near_vf(1), near_vf(2)))
    p = pod("u", {"main": {VF: 2}}, alloc=a)
    p["spec"]["initContainers"] = [
        {"name": "setup", "resources": {"limits": {VF: "2"}}},
        {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {VF: "1"}}}]
    view = pod_view(p)
    assert view.total(VF) == 3
    rec = PodRecord(PodKey("u", "team", "u"), a, (
        Consumed("setup", VF, (near_vf(0), near_vf(1))), Consumed("proxy", VF, (near_vf(1),))))
    other = pod("older", {"main": {VF: 2}}, alloc=allocation(
        TOPO, [], nics=(near_vf(4), near_vf(5)), decided_at="2025-01-01T00:00:00Z"))
    cands = candidates([view, pod_view(other)], {"u": rec}, NODE, NAMES, VF, 2)
    c = next(x for x in cands if x.pod.uid == "u")
    # proxy reused near_vf(1) and keeps it; main reuses near_vf(0) and gets one fresh VF
    assert (c.container, c.expected) == ("main", (near_vf(0), near_vf(2)))
    # IDs the pod already holds name it, whatever else kubelet chose and whoever is older
    assert match_allocate(sorted(cands, key=lambda x: x.pod.uid != "older"),
                          [near_vf(0), near_vf(4)]) is c


def test_allocate_matches_exact_ids_before_the_hint_and_the_order():
    a = allocation(TOPO, [(0, near_vf(0))], decided_at="2026-01-01T00:00:00Z")
    b = allocation(TOPO, [(1, near_vf(1))], decided_at="2026-01-02T00:00:00Z")
    cands = candidates(_views(pod("a", {"c": {VF: 1}}, alloc=a),
                              pod("b", {"c": {VF: 1}}, alloc=b)), {}, NODE, NAMES, VF, 1)
    assert match_allocate(cands, [near_vf(1)], hint=("a", "c")).pod.uid == "b"
    assert match_allocate(cands, ["0000:ff:00.1"], hint=("b", "c")).pod.uid == "b"
    assert match_allocate(cands, ["0000:ff:00.1"]).pod.uid == "a"


# ------------------------------------------------------------------ pairing


def test_reconcile_keeps_given_pairs_and_pairs_the_rest_nearest_first():
    base = allocation(TOPO, [(0, near_vf(0)), (1, near_vf(1)), (4, near_vf(4))])
    got = reconcile(TOPO, base, {"vf": [near_vf(4), near_vf(0, 1), near_vf(1)]},
                    decided_at="t")
    assert got.decided_by == "node" and got.decided_at == "t"
    assert [(p.gpu.index, p.nic.pci_address) for p in got.pairs] == [
        (0, near_vf(0, 1)), (1, near_vf(1)), (4, near_vf(4))]


@settings(max_examples=60, deadline=None)
@given(gpus=st.lists(st.integers(0, 7), unique=True, min_size=1, max_size=8),
       vfs=st.lists(st.sampled_from(sorted(v for vs in VF_OF.values() for v in vs)),
                    unique=True, min_size=1, max_size=8))
def test_reconcile_holds_exactly_the_given_ids_and_pairs_every_gpu(gpus, vfs):
    got = reconcile(TOPO, None, {"gpu": [GPUS[i] for i in gpus], "vf": vfs}, decided_at=None)
    assert set(ids_of(got, "gpu")) == {GPUS[i] for i in gpus}
    assert set(ids_of(got, "vf")) == set(vfs)
    nics = [p.nic.pci_address for p in got.pairs]
    assert len(nics) == len(gpus)  # one-to-one, or shared when NICs are fewer
    if len(vfs) >= len(gpus):
        assert len(set(nics)) == len(nics)
    else:  # shared: distance first (the allocator's key), so each GPU gets a nearest NIC
        for p in got.pairs:
            best = min(TOPO.distance[p.gpu.pci_address][TOPO.vf(v)[0].pci_address] for v in vfs)
            assert p.distance == best


def test_pair_container_pairs_a_containers_devices_among_themselves():
    base = allocation(TOPO, [(0, near_vf(0)), (1, near_vf(1)), (2, near_vf(2))])
    # the container got GPUs 0 and 1 and the VFs recorded for GPUs 1 and 2
    got = pair_container(TOPO, base, [GPUS[0], GPUS[1]], [near_vf(1), near_vf(2)],
                         decided_at="t")
    assert got.decided_by == "node" and got.decided_at == "t"
    # GPU 1 keeps its own VF and GPU 0 gets the container's other one; outside the
    # container, GPU 2 and the VF left over are paired with each other
    assert [(p.gpu.index, p.nic.pci_address) for p in got.pairs] == [
        (0, near_vf(2)), (1, near_vf(1)), (2, near_vf(0))]
    assert got.nics == () and got.gpus == ()
    assert pair_container(TOPO, base, [GPUS[0]], [near_vf(0)], decided_at="t") is None


def test_pairs_json_names_only_the_given_devices():
    a = allocation(TOPO, [(0, near_vf(0)), (1, near_vf(1))])
    got = json.loads(pairs_json(a, gpus=[GPUS[0]], nics=[near_vf(1)]))
    assert got == []  # neither recorded pair has both ends in this container


def test_choose_local_takes_must_include_then_kept_then_nearest_spreading_over_pfs():
    avail = [v for vs in VF_OF.values() for v in vs]
    got = choose_local(TOPO, "vf", avail, [near_vf(7)], 3, keep=[near_vf(2)],
                       partners=[GPUS[7], GPUS[2], GPUS[5]])
    assert got == [near_vf(7), near_vf(2), near_vf(5)]
    two = choose_local(TOPO, "vf", avail, [], 2)
    assert TOPO.vf(two[0])[0] != TOPO.vf(two[1])[0]  # not both on one PF


def test_choose_local_never_returns_ids_kubelet_did_not_offer():
    got = choose_local(TOPO, "gpu", GPUS[:2], ["not-offered"], 4)
    assert set(got) <= set(GPUS[:2])


# ------------------------------------------------------------------ grants


def test_sriov_dp_names():
    assert pcidevice_env("railyard.dev/vf") == "PCIDEVICE_RAILYARD_DEV_VF"
    assert pcidevice_env("intel.com/sriov_rdma") == "PCIDEVICE_INTEL_COM_SRIOV_RDMA"
    assert devinfo_file_name("railyard.dev/vf", "0000:3b:00.2") == \
        "railyard.dev-vf-0000:3b:00.2-device.json"


def test_in_pair_order_puts_unknown_ids_last_in_kubelets_order():
    a = allocation(TOPO, [(3, near_vf(3)), (1, near_vf(1))])
    assert in_pair_order(["x", GPUS[1], "y", GPUS[3]], a, "gpu") == [GPUS[3], GPUS[1], "x", "y"]


def test_pairs_json_lists_pairs_then_unpaired_nics():
    extra = [v for v in VF_OF[COMPUTE[7].pci_address]][1]
    a = allocation(TOPO, [(0, near_vf(0))], nics=(extra,))
    got = json.loads(pairs_json(a, gpus=[GPUS[0]], nics=[near_vf(0), extra]))
    assert got[0]["gpu"]["uuid"] == GPUS[0] and got[0]["distance"] == "PIX"
    assert got[1] == {"gpu": None, "nic": {"kind": "vf", "pciAddress": extra,
                                           "rdmaDevice": TOPO.vf(extra)[1].rdma_device,
                                           "netdev": TOPO.vf(extra)[1].netdev},
                      "distance": None}


def test_nic_grant_without_rdma_device_sets_no_nccl_hca():
    a = allocation(TOPO, [(0, near_vf(0))])
    n = a.pairs[0].nic
    bare = type(n)(n.kind, n.pci_address, n.pf_pci_address, n.vf_index, None, None)
    g = nic_grant(VF, [bare], {})
    assert "NCCL_IB_HCA" not in g.envs
    assert g.envs["PCIDEVICE_RAILYARD_DEV_VF"] == n.pci_address
    assert [d.host_path for d in g.devices] == ["/dev/infiniband/rdma_cm"]


def test_pf_names_are_whole_pfs():
    a = allocation(TOPO, [(0, COMPUTE[0].pci_address)])
    assert ids_of(a, "pf") == (COMPUTE[0].pci_address,) and ids_of(a, "vf") == ()
    assert NAMES.pf == PF


def test_a_vfio_vf_is_never_offered_even_with_a_stale_rdma_name():
    from dataclasses import replace

    from railyard.kubelet.inventory import offered_devices
    nic = COMPUTE[0]
    vfio = replace(nic.vfs[0], driver="vfio-pci")
    topo = replace(TOPO, nics=(replace(nic, vfs=(vfio, *nic.vfs[1:])),))
    ids = {d.id for d in offered_devices(topo, "vf")}
    assert vfio.pci_address not in ids and nic.vfs[1].pci_address in ids


def test_device_list_omits_unknown_numa_and_wakes_watchers_only_on_change():
    import asyncio

    from railyard.kubelet.inventory import PluginDevice
    from railyard.kubelet.plugin import DeviceList

    async def body():
        dl = DeviceList([PluginDevice("a", "vf", "a", None), PluginDevice("b", "vf", "b", 1)])
        resp = dl.response()
        assert not resp.devices[0].HasField("topology")
        assert [n.ID for n in resp.devices[1].topology.nodes] == [1]
        assert not await dl.update(unhealthy=frozenset({"zz"}))  # not ours: no change
        assert await dl.update(unhealthy=frozenset({"b"}))
        assert [d.health for d in dl.response().devices] == ["Healthy", "Unhealthy"]
        assert dl.version == 1

    asyncio.run(body())


def test_grpc_unix_target_of_a_relative_socket_path_is_absolute(tmp_path, monkeypatch):
    from railyard.kubelet.podresources import unix_target

    monkeypatch.chdir(tmp_path)
    # `unix://kd/x.sock` names authority "kd"; a relative --kubelet-dir failed to bind.
    assert unix_target("kd/x.sock") == f"unix://{tmp_path}/kd/x.sock"
    assert unix_target("/abs/x.sock") == "unix:///abs/x.sock"


# ------------------------------------------------------------------ node planning


def test_node_plan_holds_a_pf_kubelet_does_not_offer_without_also_holding_its_vfs(
        tmp_path, caplog):
    """A pod wanting a whole PF and no VFs: the planner holds the PFs kubelet does not offer
    (a held PF also holds its VFs). Naming those VFs in the same hold made the ledger refuse
    it (one holding may not name a PF whole and a VF of it), so the hold was lost, the
    allocator picked the unoffered PF and the node fell back to its greedy plan."""
    from railyard.allocation.ledger import Ledger
    from railyard.allocation.request import Request
    from railyard.kubelet.admission import Admission
    from railyard.node.state import StateStore

    class NoPods:
        def pods(self) -> list:
            return []

    g0 = TOPO.gpus[0]
    near = min(COMPUTE, key=lambda n: (TOPO.distance[g0.pci_address][n.pci_address],
                                       n.pci_address)).pci_address
    free = {"gpu": frozenset(GPUS),
            "vf": frozenset(v for pf, vfs in VF_OF.items() if pf != near for v in vfs),
            "pf": frozenset(n.pci_address for n in COMPUTE) - {near}}
    adm = Admission(TOPO, StateStore(tmp_path, NODE), NoPods(), NAMES)
    ledger = Ledger(TOPO)
    with caplog.at_level("WARNING"):
        plan = adm._allocator_plan(ledger, Request(gpus=1, pfs=1), free)
    assert not [m for m in caplog.messages if "cannot hold" in m]
    assert plan is not None  # the allocator's plan, not the greedy fallback
    assert set(ids_of(plan, "pf")) <= free["pf"] and near not in ids_of(plan, "pf")
    held = ledger.allocation("railyard/unavailable")
    assert held is not None and near in {n.pci_address for n in held.nics}
