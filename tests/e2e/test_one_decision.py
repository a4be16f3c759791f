"""Railyard's promise end to end: one decision, made once by the scheduler, recorded once on
the pod, honoured by every component after it.

extender (HTTP: filter → prioritize → bind) → the pod's `railyard.dev/allocation` annotation →
agent device plugins (gRPC from the fake kubelet: GetPreferredAllocation, Allocate) →
`railyard-cni` shim → the agent's CNI socket → VFs moved into the pod's netns in pair order,
Debian's IPAM plugins → DEL puts them back. At every hop the devices must be the scheduler's.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid

import pytest
from e2e_harness import CNI_PATH, GPU, NODE, VF, Cluster, cluster

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.allocation.types import Allocation
from railyard.node.state import StateStore
from railyard.records.allocation import decode_allocation, encode_allocation
from support.agent import async_test
from support.cni import Pod, addresses, links
from support.pods import asking as scheduler_pod

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="needs root: creates network namespaces and moves links"),
    pytest.mark.skipif(not os.path.exists(f"{CNI_PATH}/static"),
                       reason=f"needs Debian's IPAM plugins in {CNI_PATH} "
                              "(containernetworking-plugins)"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip"),
]


def bound_pod(p: dict, decision: Allocation) -> dict:
    """The pod as the API server shows it after the extender's bind: annotated, on the node,
    still pending."""
    p = json.loads(json.dumps(p))
    p["metadata"].setdefault("annotations", {})[ALLOCATION_ANNOTATION] = encode_allocation(
        decision)
    p["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    p["spec"]["nodeName"] = NODE
    p["status"] = {"phase": "Pending"}
    return p


def gpus(a: Allocation) -> list[str]:
    return [p.gpu.device_id for p in a.pairs]


def vfs(a: Allocation) -> list[str]:
    return [p.nic.pci_address for p in a.pairs]


def netdev(c: Cluster, pci: str) -> str:
    return c.topology.vf(pci)[1].netdev


def cni_pod(c: Cluster, p: dict, *, uid: str | None = None, name: str | None = None) -> Pod:
    meta = p["metadata"]
    return Pod(uid or meta["uid"], meta["namespace"], name or meta["name"], c.pod_netns(),
               "c" + os.urandom(6).hex())


def assert_node_honours(c: Cluster, p: dict, decision: Allocation, admitted) -> None:
    """GetPreferredAllocation steered kubelet to the record; Allocate told the container the
    scheduler's pairs in the scheduler's order; the node's record is still the scheduler's."""
    assert admitted.preferred == {GPU: gpus(decision), VF: vfs(decision)}
    envs = admitted.envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(gpus(decision))
    assert envs["NCCL_IB_HCA"] == "=" + ",".join(
        f"{c.topology.vf(pci)[1].rdma_device}:1" for pci in vfs(decision))
    assert envs["PCIDEVICE_RAILYARD_DEV_VF"] == ",".join(vfs(decision))
    pairs = json.loads(envs["RAILYARD_PAIRS"])
    assert [(x["gpu"]["uuid"], x["gpu"]["pciAddress"], x["nic"]["pciAddress"], x["distance"])
            for x in pairs] == [(q.gpu.uuid, q.gpu.pci_address, q.nic.pci_address,
                                 q.distance.name) for q in decision.pairs]
    record = StateStore(c.agent_state).get(p["metadata"]["uid"])
    assert record is not None
    assert record.allocation == decision  # decidedBy scheduler, decidedAt kept: not redone
    # consumed: what kubelet passed, in kubelet's order; the NICs the CNI may move: pair order
    assert sorted(record.consumed_ids(GPU)) == sorted(gpus(decision))
    assert sorted(record.consumed_ids(VF)) == sorted(vfs(decision))
    assert [n.pci_address for n in record.granted_nics] == vfs(decision)


# dgx-h100: a PF per GPU; hgx-h100-4nic: two GPUs per PF (the pairs must still spread over
# PFs); mi300x: AMD GPUs, named by PCI address (no UUID).
@pytest.mark.parametrize("hardware", ["dgx-h100", "hgx-h100-4nic", "mi300x"])
@async_test
async def test_the_schedulers_decision_is_honoured_by_every_component_after_it(hardware):
    t0 = time.monotonic()
    async with cluster(hardware) as c:
        host_before = links(c.host)
        assert {netdev(c, v.pci_address) for n in c.topology.nics for v in n.vfs} <= set(
            host_before)

        # -------------------------------------------------------------- scheduler
        a = scheduler_pod(str(uuid.uuid4()), gpus=2, vfs=2, name="train-a", namespace="ml")
        b = scheduler_pod(str(uuid.uuid4()), gpus=2, vfs=2, name="train-b", namespace="ml")
        decision_a = c.schedule(a)
        decision_b = c.schedule(b)  # sees A's devices held
        for d in (decision_a, decision_b):
            assert d.node == NODE and d.decided_by == "scheduler" and len(d.pairs) == 2
        assert not set(gpus(decision_a)) & set(gpus(decision_b))
        assert not set(vfs(decision_a)) & set(vfs(decision_b))

        # -------------------------------------------------------------- the record
        pod_a, pod_b = bound_pod(a, decision_a), bound_pod(b, decision_b)
        assert decode_allocation(
            pod_a["metadata"]["annotations"][ALLOCATION_ANNOTATION]) == decision_a
        c.publish(pod_a)
        c.publish(pod_b)

        # -------------------------------------------------------------- kubelet + agent
        # Kubelet calls the plugins in any order; A: VF first, B: GPU first.
        admitted_a = await c.admit(pod_a, (VF, GPU), held=set())
        assert_node_honours(c, pod_a, decision_a, admitted_a)
        assert "RAILYARD_PAIRS" in admitted_a.responses[GPU]  # the container's last plugin
        admitted_b = await c.admit(pod_b, (GPU, VF),
                                   held=set(gpus(decision_a)) | set(vfs(decision_a)))
        assert_node_honours(c, pod_b, decision_b, admitted_b)

        # -------------------------------------------------------------- agent restart
        # The node's record survives it, and the check at start against PodResources agrees
        # with it, so nothing is rewritten as node-decided.
        assert await c.restart_agent() == 0
        for p, d in ((pod_a, decision_a), (pod_b, decision_b)):
            assert StateStore(c.agent_state).get(p["metadata"]["uid"]).allocation == d

        # -------------------------------------------------------------- CNI ADD
        cni_a = cni_pod(c, pod_a)
        per_pair_ipam = {"interfaces": [
            {"ipam": {"type": "static", "addresses": [{"address": "10.56.0.2/24"}]}},
            {"ipam": {"type": "static", "addresses": [{"address": "10.56.1.2/24"}]}}]}
        added = await c.cni("ADD", cni_a, per_pair_ipam)
        assert added.code == 0, (added.out, added.stderr)
        in_pod = [i for i in added.out["interfaces"] if i.get("sandbox") == cni_a.netns_path]
        assert [(i["name"], i["pciID"]) for i in in_pod] == [
            ("net1", vfs(decision_a)[0]), ("net1-1", vfs(decision_a)[1])]
        pod_links = links(cni_a.netns)
        assert set(pod_links) == {"net1", "net1-1"}
        # The link named for pair i is pair i's VF: its MAC is the one its host netdev had.
        for name, pci in zip(("net1", "net1-1"), vfs(decision_a), strict=True):
            assert pod_links[name]["mac"] == host_before[netdev(c, pci)]["mac"]
            assert pod_links[name]["up"]
        assert addresses(cni_a.netns, "net1") == ["10.56.0.2/24"]
        assert addresses(cni_a.netns, "net1-1") == ["10.56.1.2/24"]
        ifaces = added.out["interfaces"]
        assert {ifaces[ip["interface"]]["name"]: ip["address"] for ip in added.out["ips"]} == {
            "net1": "10.56.0.2/24", "net1-1": "10.56.1.2/24"}
        # Multus's device-info files name the same VFs, per interface.
        devinfo = c.root / "devinfo" / "cni"
        for name, pci in zip(("net1", "net1-1"), vfs(decision_a), strict=True):
            info = json.loads((devinfo / f"rdma-{cni_a.container_id}-{name}-device-info.json")
                              .read_text())
            assert info["pci"] == {"pci-address": pci,
                                   "rdma-device": c.topology.vf(pci)[1].rdma_device}
        checked = await c.cni("CHECK", cni_a, {**per_pair_ipam, "prevResult": added.out})
        assert checked.code == 0, (checked.out, checked.stderr)
        assert set(links(c.host)) == set(host_before) - {netdev(c, x) for x in vfs(decision_a)}

        # -------------------------------------------------------------- B cannot take A's VFs
        # B's config names A's VFs in every key other plugins read devices from: ignored.
        cni_b = cni_pod(c, pod_b)
        hostile = {"ipam": {"type": "host-local", "ranges": [[{"subnet": "10.57.0.0/24"}]],
                            "dataDir": str(c.root / "ipam")},
                   "deviceID": vfs(decision_a)[0], "pciBusID": vfs(decision_a)[1],
                   "runtimeConfig": {"deviceID": vfs(decision_a)[0]}}
        added_b = await c.cni("ADD", cni_b, hostile)
        assert added_b.code == 0, (added_b.out, added_b.stderr)
        assert [(i["name"], i["pciID"]) for i in added_b.out["interfaces"]
                if i.get("sandbox") == cni_b.netns_path] == [
            ("net1", vfs(decision_b)[0]), ("net1-1", vfs(decision_b)[1])]
        assert links(cni_a.netns) == pod_links
        # A pod claiming A's UID under another name is refused; nothing moves.
        impostor = cni_pod(c, pod_b, uid=cni_a.uid, name="train-c")
        refused = await c.cni("ADD", impostor, {"ipam": {}})
        assert refused.code != 0 and refused.error is not None, refused
        assert links(impostor.netns) == {}
        assert links(cni_a.netns) == pod_links

        # -------------------------------------------------------------- CNI DEL
        for p, conf in ((cni_a, per_pair_ipam), (cni_b, hostile)):
            deleted = await c.cni("DEL", p, conf)
            assert deleted.code == 0, (deleted.out, deleted.stderr)
            assert links(p.netns) == {}
        assert links(c.host) == host_before  # every VF home, original name, MAC and MTU
        leases = c.root / "ipam" / "rdma"
        assert not [f for f in os.listdir(leases) if f[0].isdigit()]  # B's leases released
        assert os.listdir(devinfo) == []
        # And after all of it (the restarted agent's PodResources check long done), the node
        # still holds the scheduler's decision, not one of its own.
        for p, d in ((pod_a, decision_a), (pod_b, decision_b)):
            assert StateStore(c.agent_state).get(p["metadata"]["uid"]).allocation == d
    assert c.exit_codes == {"scheduler": 0, "agent": 0}  # both stopped cleanly on SIGTERM
    assert time.monotonic() - t0 < 20
