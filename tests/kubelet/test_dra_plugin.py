"""The DRA kubelet plugin over real gRPC on unix sockets, called as kubelet calls it.

A client speaking kubelet's protos finds the registration socket, reads the plugin's info and
dials the service it names; claims come from a stand-in for the API server that serves
ResourceClaims in their v1 JSON form. The node is the dgx-h100 fixture with 2 VFs per PF.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from railyard.discovery.profiles import PROFILES, build_topology
from railyard.kubelet.api import dra_pb2 as dra
from railyard.kubelet.api import dra_pb2_grpc as dra_grpc
from railyard.kubelet.dra_cdi import KIND, CdiSpecs
from railyard.kubelet.dra_plugin import DraPlugin
from railyard.kubelet.dra_prepare import ClaimPreparer, slice_gpus
from railyard.kubelet.plugin import KubeletPaths
from railyard.kubelet.podresources import AssignedClaim, AssignedPod
from railyard.node.state import StateStore
from railyard.records.dra_names import device_name
from support.agent import async_test
from support.fake_kubelet import watcher_info

TOPO = build_topology(PROFILES["dgx-h100"], 2)
NODE = TOPO.node
GPU = [g.pci_address for g in TOPO.gpus]
COMPUTE = [n for n in TOPO.nics if n.total_vfs]  # the 8 compute PFs, rail order
VF = [[v.pci_address for v in n.vfs] for n in COMPUTE]
NS = "team"
STAMP = "2026-12-06T12:00:00Z"


def claim_doc(name: str, results: list[tuple[str, str]], *, pods: int = 1,
              node: str = NODE, claim_uid: str | None = None,
              pod_uid: str | None = None) -> dict[str, Any]:
    """A ResourceClaim as the API server serves it once kube-scheduler allocated it."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": NS, "name": name, "uid": claim_uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": r} for r, _ in results]}},
        "status": {
            "allocation": {
                "devices": {"results": [
                    {"request": r, "driver": "railyard.dev", "pool": NODE,
                     "device": device_name(pci)} for r, pci in results]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
            },
            "reservedFor": [{"resource": "pods", "name": f"pod-{i}-{name}",
                             "uid": pod_uid if pod_uid and i == 0 else str(uuid.uuid4())}
                            for i in range(pods)],
        },
    }


def two_pairs(name: str = "job-a", **kw: Any) -> dict[str, Any]:
    """gpu-0/nic-0 on rail 0, gpu-1/nic-1 on rail 1, as a `--pairs 2` template asks."""
    return claim_doc(name, [("gpu-0", GPU[0]), ("nic-0", VF[0][0]),
                            ("gpu-1", GPU[1]), ("nic-1", VF[1][0])], **kw)


class StandInApi:
    """Claims by (namespace, name), as the API server would answer the node's GET."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets = 0

    def add(self, doc: dict[str, Any]) -> dra.Claim:
        m = doc["metadata"]
        self.claims[(m["namespace"], m["name"])] = doc
        return dra.Claim(namespace=m["namespace"], uid=m["uid"], name=m["name"])

    async def claim(self, namespace: str, name: str) -> Any:
        self.gets += 1
        doc = self.claims.get((namespace, name))
        if doc is None:
            raise LookupError(f"resourceclaims {name!r} not found")
        return copy.deepcopy(doc)


class Node:
    """One node's folders: kubelet's, the state store's, the CDI spec folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.kubelet = KubeletPaths(str(root / "kubelet"))
        os.makedirs(self.kubelet.plugins_registry)
        self.state_dir = str(root / "state")
        self.cdi_dir = root / "cdi"
        self.api = StandInApi()
        self.slices: list[dict[str, Any]] = []

    def preparer(self) -> ClaimPreparer:
        """A fresh agent's preparer: nothing in memory, everything from the folders; GPUs of
        NVIDIA's driver found in the slices `self.slices` holds."""
        async def other_gpus():
            return slice_gpus(self.slices, TOPO)

        return ClaimPreparer(TOPO, StateStore(self.state_dir, NODE), self.api,
                             state_dir=self.state_dir, cdi=CdiSpecs(self.cdi_dir),
                             clock=lambda: STAMP, other_gpus=other_gpus)

    def store(self) -> StateStore:
        return StateStore(self.state_dir, NODE)

    def leftovers(self) -> list[str]:
        """Every file the plugin made that is still on the node."""
        out = sorted(str(p.relative_to(self.root)) for p in self.cdi_dir.glob("*"))
        state = Path(self.state_dir)
        out += sorted(str(p.relative_to(self.root)) for p in state.rglob("*")
                      if p.is_file() and p.name != ".lock")
        return out


@contextlib.asynccontextmanager
async def running(node: Node, kubelet_holds: list[AssignedPod] | None = None
                  ) -> AsyncIterator[dra_grpc.DRAPluginStub]:
    """The plugin served, and kubelet's client on the service its registration names;
    `kubelet_holds`: the pods and claims PodResources lists (None: kubelet unreachable)."""
    async def assigned() -> list[AssignedPod]:
        if kubelet_holds is None:
            raise ConnectionError("no PodResources socket")
        return kubelet_holds

    plugin = DraPlugin(node.preparer(), node.kubelet, assigned=assigned)
    await plugin.start()
    try:
        info = await watcher_info(plugin.registration_socket)
        async with grpc.aio.insecure_channel("unix://" + info.endpoint) as ch:
            yield dra_grpc.DRAPluginStub(ch)
    finally:
        await plugin.stop()


@pytest.fixture
def node():
    # A short folder: unix socket paths are limited to 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield Node(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def prepare(stub: dra_grpc.DRAPluginStub, *claims: dra.Claim
                  ) -> dra.NodePrepareResourcesResponse:
    return await stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=claims),
                                           timeout=10)


async def unprepare(stub: dra_grpc.DRAPluginStub, *claims: dra.Claim
                    ) -> dra.NodeUnprepareResourcesResponse:
    return await stub.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=claims),
                                             timeout=10)


def pod_uid(node: Node, claim: dra.Claim) -> str:
    return node.api.claims[(claim.namespace, claim.name)]["status"]["reservedFor"][0]["uid"]


# ----------------------------------------------------------------------- registration


@async_test
async def test_registration_names_the_driver_its_v1_service_and_the_socket_kubelet_dials(
        node):
    plugin = DraPlugin(node.preparer(), node.kubelet)
    await plugin.start()
    try:
        assert os.path.dirname(plugin.registration_socket) == node.kubelet.plugins_registry
        info = await watcher_info(plugin.registration_socket)
        assert (info.type, info.name, list(info.supported_versions)) == \
            ("DRAPlugin", "railyard.dev", ["v1.DRAPlugin"])
        assert info.endpoint == os.path.abspath(
            os.path.join(node.kubelet.kubelet_dir, "plugins", "railyard.dev", "dra.sock"))
        assert plugin.registration.registered.is_set()
        async with grpc.aio.insecure_channel("unix://" + info.endpoint) as ch:
            resp = await unprepare(dra_grpc.DRAPluginStub(ch),
                                   dra.Claim(namespace=NS, uid="never-prepared", name="x"))
        assert dict(resp.claims)["never-prepared"].error == ""
    finally:
        await plugin.stop()
    assert not os.path.exists(plugin.registration_socket)  # kubelet deregisters the driver


@async_test
async def test_a_removed_registration_socket_is_served_again(node):
    plugin = DraPlugin(node.preparer(), node.kubelet)
    await plugin.start()
    try:
        os.unlink(plugin.registration_socket)
        for _ in range(50):
            await asyncio.sleep(0.1)
            if os.path.exists(plugin.registration_socket):
                break
        info = await watcher_info(plugin.registration_socket)
        assert info.name == "railyard.dev"
    finally:
        await plugin.stop()


@async_test
async def test_health_stream_lists_every_device_and_a_sick_pf_takes_its_vfs_with_it(node):
    from railyard.kubelet.api import dra_health_pb2 as health
    from railyard.kubelet.api import dra_health_pb2_grpc as health_grpc

    plugin = DraPlugin(node.preparer(), node.kubelet)
    await plugin.start()
    try:
        async with grpc.aio.insecure_channel("unix://" + plugin.service_socket) as ch:
            stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
                health.NodeWatchResourcesRequest())
            first = await stream.read()
            names = {d.device.device_name for d in first.devices}
            assert device_name(GPU[0]) in names and device_name(VF[7][1]) in names
            assert {(d.device.pool_name, d.health, d.health_check_timeout_seconds)
                    for d in first.devices} == {(NODE, health.HEALTHY, 30)}
            sick = COMPUTE[1].pci_address
            assert await plugin.health.update({sick})
            second = await stream.read()
            stream.cancel()
        bad = {d.device.device_name for d in second.devices if d.health == health.UNHEALTHY}
        assert bad == {device_name(a) for a in (sick, *VF[1])}
    finally:
        await plugin.stop()


# ----------------------------------------------------------------------- prepare


@async_test
async def test_prepare_records_the_pairs_in_request_order_and_answers_cdi_ids_per_request(
        node):
    claim = node.api.add(two_pairs())
    async with running(node) as stub:
        resp = await prepare(stub, claim)
    answer = dict(resp.claims)[claim.uid]
    assert answer.error == ""
    assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
            for d in answer.devices] == [
        ([req], NODE, device_name(pci), [f"{KIND}={claim.uid}-{device_name(pci)}"])
        for req, pci in (("gpu-0", GPU[0]), ("nic-0", VF[0][0]),
                         ("gpu-1", GPU[1]), ("nic-1", VF[1][0]))]
    rec = node.store().get(pod_uid(node, claim))
    assert rec is not None
    alloc = rec.allocation
    assert [(p.gpu.pci_address, p.nic.pci_address, p.rail) for p in alloc.pairs] == \
        [(GPU[0], VF[0][0], 0), (GPU[1], VF[1][0], 1)]
    assert (alloc.decided_by, alloc.node, alloc.nics, alloc.gpus) == ("node", NODE, (), ())
    assert node.store().granted_nics(rec.uid) == alloc.all_nics  # what the CNI may move


@async_test
async def test_cdi_spec_carries_the_pair_map_the_plugins_set_and_each_vfs_verbs_node(node):
    claim = node.api.add(two_pairs())
    async with running(node) as stub:
        await prepare(stub, claim)
    spec = json.loads(CdiSpecs(node.cdi_dir).path(claim.uid).read_text())
    assert spec["kind"] == "railyard.dev/claim"
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    rdma = [COMPUTE[0].vfs[0].rdma_device, COMPUTE[1].vfs[0].rdma_device]
    assert env["NCCL_IB_HCA"] == f"={rdma[0]}:1,{rdma[1]}:1"  # exact names, pair order
    assert env["PCIDEVICE_RAILYARD_DEV_VF"] == f"{VF[0][0]},{VF[1][0]}"
    assert [p["nic"]["pciAddress"] for p in json.loads(env["RAILYARD_PAIRS"])] == \
        [VF[0][0], VF[1][0]]
    assert env["VLLM_GPU_NIC_PCIE_MAPPING"] == f"{GPU[0]}={VF[0][0]},{GPU[1]}={VF[1][0]}"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(g.uuid or g.pci_address
                                                    for g in TOPO.gpus[:2])
    (mount,) = spec["containerEdits"]["mounts"]
    assert mount["containerPath"] == "/run/railyard/pairs.json"
    pair_file = json.loads(Path(mount["hostPath"]).read_text())
    assert [(p["gpu"]["pciAddress"], p["nic"]["pciAddress"]) for p in pair_file["pairs"]] == \
        [(GPU[0], VF[0][0]), (GPU[1], VF[1][0])]
    devices = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    nic0 = devices[f"{claim.uid}-{device_name(VF[0][0])}"]["deviceNodes"]
    assert [n["path"] for n in nic0] == [f"/dev/infiniband/{COMPUTE[0].vfs[0].uverbs}",
                                         "/dev/infiniband/rdma_cm"]


@async_test
async def test_nvidias_gpus_in_the_claim_pair_by_pci_bus_id_and_stay_theirs_to_show(node):
    node.slices = [{"spec": {"driver": "gpu.nvidia.com", "pool": {"name": NODE}, "devices": [
        {"name": f"gpu-{i}", "attributes": {
            "resource.kubernetes.io/pciBusID": {"string": GPU[i]}}} for i in (2, 3)]}}]
    doc = claim_doc("mixed", [("gpu-0", GPU[2]), ("nic-0", VF[2][0]),
                              ("gpu-1", GPU[3]), ("nic-1", VF[3][0])])
    for r, i in zip(doc["status"]["allocation"]["devices"]["results"][::2], (2, 3), strict=True):
        r.update(driver="gpu.nvidia.com", device=f"gpu-{i}")
    claim = node.api.add(doc)
    async with running(node) as stub:
        answer = dict((await prepare(stub, claim)).claims)[claim.uid]
    assert [d.device_name for d in answer.devices] == [device_name(VF[2][0]),
                                                       device_name(VF[3][0])]
    alloc = node.store().get(pod_uid(node, claim)).allocation
    assert [(p.gpu.pci_address, p.nic.pci_address) for p in alloc.pairs] == \
        [(GPU[2], VF[2][0]), (GPU[3], VF[3][0])]
    spec = json.loads(CdiSpecs(node.cdi_dir).path(claim.uid).read_text())
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # NVIDIA's own CDI spec shows its GPUs
    assert env["VLLM_GPU_NIC_PCIE_MAPPING"] == f"{GPU[2]}={VF[2][0]},{GPU[3]}={VF[3][0]}"


@async_test
async def test_prepare_again_answers_the_same_and_keeps_one_record(node):
    claim = node.api.add(two_pairs())
    async with running(node) as stub:
        first = await prepare(stub, claim)
        files = node.leftovers()
        second = await prepare(stub, claim)
    assert second == first
    assert node.leftovers() == files
    assert len(node.store().all()) == 1


@async_test
async def test_a_pf_with_one_of_its_own_vfs_is_refused_and_leaves_nothing(node):
    pf = COMPUTE[2].pci_address
    claim = node.api.add(claim_doc("pf-and-vf", [("gpu-0", GPU[2]), ("nic-0", pf),
                                                 ("gpu-1", GPU[3]), ("nic-1", VF[2][1])]))
    async with running(node) as stub:
        resp = await prepare(stub, claim)
    error = dict(resp.claims)[claim.uid].error
    assert f"PF {pf} is asked whole together with its own VF {VF[2][1]}" in error
    assert node.leftovers() == []


@async_test
async def test_a_vf_of_a_pf_another_pod_holds_whole_is_refused(node):
    whole = node.api.add(claim_doc("whole", [("gpu-0", GPU[4]), ("nic-0", COMPUTE[4].pci_address)]))
    vf = node.api.add(claim_doc("vf", [("gpu-0", GPU[5]), ("nic-0", VF[4][0])]))
    async with running(node) as stub:
        assert dict((await prepare(stub, whole)).claims)[whole.uid].error == ""
        error = dict((await prepare(stub, vf)).claims)[vf.uid].error
    assert f"VF {VF[4][0]} overlaps PF {COMPUTE[4].pci_address}, held by pod" in error
    assert [r.uid for r in node.store().all()] == [pod_uid(node, whole)]


@pytest.mark.parametrize("doc,words", [
    (lambda: two_pairs(node="other-node"), "allocated for node 'other-node'"),
    (lambda: two_pairs(pods=2), "reserved for 2 pods"),
    (lambda: two_pairs(pods=0), "reserved for 0 pods"),
    (lambda: {**two_pairs(), "status": {}}, "not allocated"),
    (lambda: claim_doc("ghost", [("nic-0", "0000:77:00.3")]), "is not a device of node"),
])
def test_claims_this_node_cannot_prepare_fail_with_the_reason(node, doc, words):
    @async_test
    async def run():
        claim = node.api.add(doc())
        async with running(node) as stub:
            resp = await prepare(stub, claim)
        assert words in dict(resp.claims)[claim.uid].error
        assert node.leftovers() == []
    run()


@async_test
async def test_a_claim_without_devices_of_ours_is_prepared_with_nothing_recorded(node):
    doc = claim_doc("theirs", [("gpu-0", GPU[0])])
    doc["status"]["allocation"]["devices"]["results"][0]["driver"] = "gpu.nvidia.com"
    claim = node.api.add(doc)
    async with running(node) as stub:
        answer = dict((await prepare(stub, claim)).claims)[claim.uid]
    assert (answer.error, list(answer.devices)) == ("", [])
    assert node.leftovers() == []


@async_test
async def test_a_claim_made_again_under_the_same_name_is_not_prepared(node):
    claim = node.api.add(two_pairs())
    stale = dra.Claim(namespace=claim.namespace, name=claim.name, uid=str(uuid.uuid4()))
    async with running(node) as stub:
        resp = await prepare(stub, stale)
    assert "the claim was deleted and made again" in dict(resp.claims)[stale.uid].error


@async_test
async def test_a_second_claim_for_one_pod_is_refused(node):
    first = node.api.add(two_pairs("first"))
    second = node.api.add(claim_doc("second", [("nic-0", VF[5][0])],
                                    pod_uid=pod_uid(node, first)))
    async with running(node) as stub:
        await prepare(stub, first)
        resp = await prepare(stub, second)
    assert "serves one claim per pod" in dict(resp.claims)[second.uid].error


@async_test
async def test_one_bad_claim_fails_alone_in_a_call(node):
    good = node.api.add(two_pairs("good"))
    gone = dra.Claim(namespace=NS, name="gone", uid=str(uuid.uuid4()))
    async with running(node) as stub:
        resp = await prepare(stub, good, gone)
    assert dict(resp.claims)[good.uid].error == ""
    assert "not found" in dict(resp.claims)[gone.uid].error


# ----------------------------------------------------------------------- unprepare


@async_test
async def test_unprepare_frees_exactly_what_prepare_took_and_again_is_fine(node):
    mine = node.api.add(two_pairs("mine"))
    other = node.api.add(claim_doc("other", [("gpu-0", GPU[6]), ("nic-0", VF[6][0])]))
    async with running(node) as stub:
        await prepare(stub, other)
        kept = node.leftovers()
        await prepare(stub, mine)
        assert node.leftovers() != kept
        for _ in range(2):
            resp = await unprepare(stub, mine)
            assert dict(resp.claims)[mine.uid].error == ""
    assert node.leftovers() == kept
    assert [r.uid for r in node.store().all()] == [pod_uid(node, other)]


@async_test
async def test_a_uid_that_is_not_one_path_component_touches_no_file(node):
    planted = node.root / "planted.json"
    planted.write_text("{}")
    bad = dra.Claim(namespace=NS, name="x", uid="../planted")
    async with running(node) as stub:
        resp = await unprepare(stub, bad)
    assert "not a claim UID" in dict(resp.claims)[bad.uid].error
    assert planted.exists()


@async_test
async def test_an_agent_restarted_between_prepare_and_unprepare_frees_everything(node):
    claim = node.api.add(two_pairs())
    async with running(node) as stub:
        await prepare(stub, claim)
    node.api.claims.clear()  # the claim is deleted meanwhile: unprepare needs it not
    async with running(node) as stub:  # a new agent: nothing of the first in memory
        resp = await unprepare(stub, claim)
    assert dict(resp.claims)[claim.uid].error == ""
    assert node.leftovers() == []


@async_test
async def test_unprepare_after_the_node_state_was_lost_removes_the_cdi_spec(node):
    claim = node.api.add(two_pairs())
    async with running(node) as stub:
        await prepare(stub, claim)
    shutil.rmtree(node.state_dir)
    async with running(node) as stub:
        resp = await unprepare(stub, claim)
    assert dict(resp.claims)[claim.uid].error == ""
    assert node.leftovers() == []


@async_test
async def test_unprepare_after_the_prepared_claims_were_lost_frees_the_pods_record_too(node):
    """Only `dra/claims` gone: the claim's pair file names the pod, so its record goes at
    unprepare (not at the agent's next clean-up), and another claim may have its devices."""
    claim = node.api.add(two_pairs())
    async with running(node) as stub:
        await prepare(stub, claim)
    shutil.rmtree(Path(node.state_dir) / "dra")
    async with running(node) as stub:
        resp = await unprepare(stub, claim)
        assert dict(resp.claims)[claim.uid].error == ""
        assert node.leftovers() == []
        again = node.api.add(two_pairs("job-b"))  # the same devices, another pod
        assert dict((await prepare(stub, again)).claims)[again.uid].error == ""


@async_test
async def test_unprepare_of_an_unreadable_prepared_claim_frees_what_the_node_keeps(node):
    claim = node.api.add(two_pairs())
    async with running(node) as stub:
        await prepare(stub, claim)
    document = Path(node.state_dir) / "dra" / "claims" / f"{claim.uid}.json"
    document.write_text("{half")
    async with running(node) as stub:
        resp = await unprepare(stub, claim)
    assert dict(resp.claims)[claim.uid].error == ""
    assert node.leftovers() == []


@async_test
async def test_unprepare_without_its_document_keeps_the_record_the_cni_still_holds(node):
    """As with the document: while the CNI has the pod's devices in its namespace, the record
    stays for the DEL (the agent's clean-up forgets it after)."""
    from railyard.node.attachments import AttachmentRecord, AttachmentStore

    claim = node.api.add(two_pairs())
    async with running(node) as stub:
        await prepare(stub, claim)
    uid = pod_uid(node, claim)
    shutil.rmtree(Path(node.state_dir) / "dra")
    AttachmentStore(node.state_dir).save(AttachmentRecord(
        network="rdma", container_id="sandbox", ifname="net1", netns="/proc/1/ns/net",
        netns_id=None, pod_uid=uid, pod_namespace=NS, pod_name="pod-0-job-a"))
    async with running(node) as stub:
        resp = await unprepare(stub, claim)
    assert dict(resp.claims)[claim.uid].error == ""
    assert node.store().get(uid) is not None
    assert not CdiSpecs(node.cdi_dir).path(claim.uid).exists()
    assert not (Path(node.state_dir) / "pairs" / uid).exists()


def held_by_kubelet(node: Node, *claims: dra.Claim) -> list[AssignedPod]:
    """PodResources' word on the claims' pods: each holds its claim of our driver."""
    out = []
    for c in claims:
        pod = node.api.claims[(c.namespace, c.name)]["status"]["reservedFor"][0]["name"]
        out.append(AssignedPod(c.namespace, pod, {"main": {}},
                               (AssignedClaim(c.namespace, c.name, frozenset({"railyard.dev"})),)))
    return out


async def restored(node: Node, *looks: list[AssignedPod]) -> None:
    """A new agent's plugin started beside kubelet's prepared claims, until its restore is
    done; kubelet's PodResources answers `looks`, one per call, the last one from then on."""
    answers = list(looks)

    async def assigned() -> list[AssignedPod]:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    plugin = DraPlugin(node.preparer(), node.kubelet, assigned=assigned)
    await plugin.start()
    try:
        assert plugin._restore is not None
        await plugin._restore
    finally:
        await plugin.stop()


@async_test
async def test_a_claim_kubelet_holds_prepared_is_prepared_again_after_the_state_was_lost(node):
    """The state folder lost under a running pod: kubelet will not ask again (its checkpoint
    says prepared), so the plugin's start prepares the claims PodResources lists for pods
    without a record, and the CNI finds the record again; unprepare then frees it all."""
    claim = node.api.add(two_pairs())
    async with running(node) as stub:
        await prepare(stub, claim)
    record = node.store().get(pod_uid(node, claim))
    spec = CdiSpecs(node.cdi_dir).path(claim.uid).read_text()
    shutil.rmtree(node.state_dir)
    await restored(node, held_by_kubelet(node, claim))
    again = node.store().get(pod_uid(node, claim))
    assert again is not None and again.allocation == record.allocation
    assert CdiSpecs(node.cdi_dir).path(claim.uid).read_text() == spec
    async with running(node) as stub:
        assert dict((await unprepare(stub, claim)).claims)[claim.uid].error == ""
    assert node.leftovers() == []


@async_test
async def test_the_start_prepares_nothing_for_pods_with_a_record_or_claims_of_other_drivers(
        node):
    mine = node.api.add(two_pairs("mine"))
    async with running(node) as stub:
        await prepare(stub, mine)
    node.api.add(claim_doc("theirs", [("gpu-0", GPU[6])]))
    theirs = AssignedPod(NS, "pod-0-theirs", {"main": {}},
                         (AssignedClaim(NS, "theirs", frozenset({"gpu.nvidia.com"})),))
    kept = node.leftovers()
    gets = node.api.gets
    await restored(node, [*held_by_kubelet(node, mine), theirs])
    assert node.api.gets == gets  # not even read: a record, or not a claim of ours
    assert node.leftovers() == kept


@async_test
async def test_a_claim_kubelet_unprepared_meanwhile_is_not_prepared_again(node):
    claim = node.api.add(two_pairs())
    async with running(node) as stub:
        await prepare(stub, claim)
    shutil.rmtree(node.state_dir)
    for c in CdiSpecs(node.cdi_dir).folder.glob("*"):
        c.unlink()
    await restored(node, held_by_kubelet(node, claim), [])  # deleted between the two looks
    assert node.leftovers() == []


@async_test
async def test_prepare_after_a_crash_mid_prepare_completes_it(node):
    claim = node.api.add(two_pairs())
    async with running(node) as stub:
        await prepare(stub, claim)
    # A crash after the record but before the CDI spec: kubelet asks again.
    CdiSpecs(node.cdi_dir).remove(claim.uid)
    async with running(node) as stub:
        resp = await prepare(stub, claim)
    assert dict(resp.claims)[claim.uid].error == ""
    assert CdiSpecs(node.cdi_dir).path(claim.uid).exists()


def test_cdi_specs_refuse_a_uid_that_is_not_one_path_component(tmp_path):
    from railyard.node.errors import StateError

    specs = CdiSpecs(tmp_path)
    for bad in ("../x", "a/b", ""):
        with pytest.raises(StateError, match="not a claim UID"):
            specs.remove(bad)


def test_podresources_lists_a_pods_dra_claims_once_with_their_devices_drivers():
    from railyard.kubelet.api import podresources_pb2 as pr
    from railyard.kubelet.podresources import _assigned

    def claim(name: str, *drivers: str) -> pr.DynamicResource:
        return pr.DynamicResource(claim_name=name, claim_namespace=NS, claim_resources=[
            pr.ClaimResource(driver_name=d, pool_name=NODE, device_name="x") for d in drivers])

    listed = _assigned(pr.PodResources(name="p", namespace=NS, containers=[
        pr.ContainerResources(name="a", dynamic_resources=[claim("pairs", "railyard.dev")]),
        pr.ContainerResources(name="b", dynamic_resources=[
            claim("pairs", "gpu.nvidia.com"), claim("other", "gpu.nvidia.com")])]))
    assert listed.claims == (
        AssignedClaim(NS, "pairs", frozenset({"railyard.dev", "gpu.nvidia.com"})),
        AssignedClaim(NS, "other", frozenset({"gpu.nvidia.com"})))
    assert listed.containers == {"a": {}, "b": {}}
