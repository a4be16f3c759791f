"""Railyard as the DRA driver on the box's real kube-apiserver, kube-scheduler, kubelet v1.36.3
and containerd (CDI): `hack/box up --with-railyard --dra`.

The agent runs in DRA mode (decision 0111): it publishes the node's ResourceSlices (GPUs, VFs
and whole PFs, a PF exclusive of its own VFs by shared counters), registers its DRA plugin
through kubelet's plugin watcher, and keeps its CNI service chained after the bridge.
kube-scheduler allocates a two-pair claim from those slices, kubelet calls
NodePrepareResources, containerd injects the claim's CDI spec, and railyard-cni moves exactly
the claim's VFs into the pod in pair order. Deleting the pod unprepares the claim. A PF and one
of its own VFs cannot be had together, a claim for more pairs than the node has stays
Pending, and after an agent restart the slices are back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from railyard.kubelet.dra_cdi import CdiSpecs
from railyard.kubelet.dra_prepared import PreparedClaims
from railyard.node.state import StateStore
from railyard.records.dra_names import DRIVER, device_name
from railyard.records.dra_slices import node_slices
from support.box import get, kubebox, namespace, phase, pod, wait_for
from support.dra_box import (
    AGENT,
    Node,
    allocated_claim,
    claim_vfs,
    env_of,
    registrations,
    running_dra_box,
    start_pod,
)

pytestmark = [pytest.mark.root, pytest.mark.box]


@pytest.fixture(scope="module")
def dra_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Node]]:
    with running_dra_box(tmp_path_factory.mktemp("dra-box")) as running:
        yield running


def our_slices(box) -> list[dict]:
    return get(box, "resourceslices", "--field-selector",
               f"spec.nodeName={kubebox.NODE_NAME},spec.driver={DRIVER}")["items"]


def pod_resources(box, ns: str, name: str) -> list[tuple[str, str, str, list[str]]]:
    """kubelet's PodResources account of the pod's claim devices: (driver, pool, device, CDI)."""
    import grpc

    from railyard.kubelet.api import podresources_pb2 as pr
    from railyard.kubelet.api import podresources_pb2_grpc as pr_grpc

    socket = box.layout.kubelet_dir / "pod-resources" / "kubelet.sock"
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        listed = pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(),
                                                               timeout=5)
    return [(r.driver_name, r.pool_name, r.device_name, [c.name for c in r.cdi_devices])
            for p in listed.pod_resources if (p.namespace, p.name) == (ns, name)
            for c in p.containers for d in c.dynamic_resources for r in d.claim_resources]


def test_kubelet_registers_the_plugin_prepares_the_claim_and_unprepares_it(dra_box):
    box, node = dra_box
    ns = namespace(box)
    start_pod(box, ns, "train", (2, 5))
    claim = allocated_claim(box, ns)
    uid = claim["metadata"]["uid"]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [r["request"] for r in results] == ["gpu-0", "nic-0", "gpu-1", "nic-1"]
    nics = claim_vfs(node, claim)
    assert [rail for rail, _ in nics] == [2, 5]  # each pair on its rail, as the template asks
    vfs = [v for _, v in nics]

    # kubelet called NodePrepareResources: the CDI spec containerd reads, and the pod's record.
    cdi = CdiSpecs(node.cdi_dir).path(uid)
    wait_for("kubelet to prepare the claim", cdi.exists, timeout=60)
    spec = json.loads(cdi.read_text())
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    assert env["NCCL_IB_HCA"] == "=" + ",".join(f"{v.rdma_device}:1" for v in vfs)
    pod_uid = get(box, "pod", "train", "-n", ns)["metadata"]["uid"]
    record = StateStore(node.state_dir, kubebox.NODE_NAME).get(pod_uid)
    assert record is not None
    assert [p.nic.pci_address for p in record.allocation.pairs] == [v.pci_address for v in vfs]

    # kubelet's own account names our devices and CDI IDs (what railyard-cni could confirm).
    listed = wait_for("PodResources to list the claim's devices",
                      lambda: pod_resources(box, ns, "train"), timeout=60)
    assert [(d, n) for d, _, n, _ in listed] == [(DRIVER, r["device"]) for r in results]
    # Each device lists its own CDI ID. Kubelet v1.36.3 lists each with those of the claim's
    # devices before it (pkg/kubelet/cm/container_manager_linux.go builds one cdiDevices slice
    # per driver and appends to it device after device): seen here, not ours to fix.
    assert all(f"railyard.dev/claim={uid}-{n}" in cdi_ids for _, _, n, cdi_ids in listed), listed

    # Deleted: kubelet unprepares the claim, and everything prepare made is gone.
    box.kubectl("delete", "pod", "train", "-n", ns, "--wait=true", "--timeout=120s")
    wait_for("the claim to be unprepared",
             lambda: not cdi.exists() and PreparedClaims(node.state_dir).get(uid) is None,
             timeout=90)
    assert StateStore(node.state_dir, kubebox.NODE_NAME).get(pod_uid) is None
    assert not (Path(node.state_dir) / "pairs" / pod_uid).exists()


def test_the_pod_runs_with_exactly_its_pairs_vfs_in_pair_order(dra_box):
    box, node = dra_box
    ns = namespace(box)
    start_pod(box, ns, "run", (0, 1))
    vfs = [v for _, v in claim_vfs(node, allocated_claim(box, ns))]

    def finished() -> str:
        p = phase(box, ns, "run")
        return p if p in ("Succeeded", "Failed") else ""

    try:
        assert wait_for("pod run to finish", finished, timeout=60) == "Succeeded"
        log = box.kubectl("logs", "-n", ns, "run")
        env = env_of(log)
        assert env["NCCL_IB_HCA"] == "=" + ",".join(f"{v.rdma_device}:1" for v in vfs)
        mounted = json.loads(log.split("<pairs>", 1)[1].split("</pairs>", 1)[0])
        assert [(p["nic"]["pciAddress"], p["nic"]["podNetdev"]) for p in mounted["pairs"]] == \
            [(v.pci_address, name) for v, name in zip(vfs, ("net1", "net1-1"), strict=True)]
        inside = {line.split(":")[1].strip().split("@")[0] for line in log.splitlines()
                  if ": <" in line}
        assert {"net1", "net1-1"} <= inside and "net1-2" not in inside
        listed = set(log.split())
        assert {v.uverbs for v in vfs} <= listed and "rdma_cm" in listed
    finally:
        box.kubectl("delete", "pod", "run", "-n", ns, "--wait=false", check=False)


def test_a_kubelet_restart_with_a_prepared_claim_registers_again_and_unprepare_ends_it(
        dra_box):
    """Drill: kubelet restarts while a claim is prepared; its plugin watcher finds our
    registration socket again, and the pod's deletion still frees everything."""
    box, node = dra_box
    ns = namespace(box)
    start_pod(box, ns, "held", (3, 4))
    uid = allocated_claim(box, ns)["metadata"]["uid"]
    cdi = CdiSpecs(node.cdi_dir).path(uid)
    wait_for("kubelet to prepare the claim", cdi.exists, timeout=60)
    pod_uid = get(box, "pod", "held", "-n", ns)["metadata"]["uid"]
    before = registrations(box)
    box.restart("kubelet")
    wait_for("kubelet to register the DRA driver again", lambda: registrations(box) > before,
             timeout=60)
    assert cdi.exists()  # a restart is no unprepare: the claim stays prepared
    assert StateStore(node.state_dir, kubebox.NODE_NAME).get(pod_uid) is not None

    box.kubectl("delete", "pod", "held", "-n", ns, "--wait=true", "--timeout=120s")
    wait_for("the claim to be unprepared",
             lambda: not cdi.exists() and PreparedClaims(node.state_dir).get(uid) is None,
             timeout=90)
    assert StateStore(node.state_dir, kubebox.NODE_NAME).get(pod_uid) is None


def test_the_api_server_keeps_the_agents_slices_counters_and_attributes_as_built(dra_box):
    box, node = dra_box
    stored = wait_for("the agent's slices", lambda: our_slices(box), timeout=60)
    built = node_slices(node.topology, publish_gpus=True)
    assert sorted(s["metadata"]["name"] for s in stored) == \
        sorted(s["metadata"]["name"] for s in built)
    generation = {s["spec"]["pool"]["generation"] for s in stored}
    assert len(generation) == 1
    # Nothing dropped: a feature gate that is off (partitionable devices, device taints)
    # would make the API server drop its fields silently.
    by_name = {s["metadata"]["name"]: s["spec"] for s in stored}
    for b in built:
        spec = by_name[b["metadata"]["name"]]
        assert spec.get("sharedCounters") == b["spec"].get("sharedCounters")
        assert [d["name"] for d in spec.get("devices", [])] == \
            [d["name"] for d in b["spec"].get("devices", [])]
        for d, want in zip(spec.get("devices", []), b["spec"].get("devices", []), strict=True):
            assert d["attributes"] == want["attributes"]
            assert d.get("consumesCounters") == want.get("consumesCounters")
    assert all(s["metadata"]["ownerReferences"][0]["kind"] == "Node" for s in stored)


def claim_pod(box, ns: str, name: str, requests: list[dict], constraints=()) -> None:
    """A pod whose one claim comes from a template of `requests`."""
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name},
                "spec": {"spec": {"devices": {"requests": requests,
                                              "constraints": list(constraints)}}}}
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(template))
    manifest = pod(name, ["sh", "-c", "sleep 3600"])
    manifest["spec"]["resourceClaims"] = [{"name": "c", "resourceClaimTemplateName": name}]
    manifest["spec"]["containers"][0]["resources"] = {"claims": [{"name": "c"}]}
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))


def unschedulable(box, ns: str, name: str) -> str:
    """kube-scheduler's message on a pod it could not place ("" while it has not said)."""
    conditions = get(box, "pod", name, "-n", ns).get("status", {}).get("conditions", [])
    return next((c.get("message", "") for c in conditions if c["type"] == "PodScheduled"
                 and c["status"] == "False" and c.get("reason") == "Unschedulable"), "")


def allocated_for(box, ns: str, name: str) -> list[str]:
    """The devices kube-scheduler allocated to pod `name`'s claim ([] while none)."""
    for c in get(box, "resourceclaims", "-n", ns)["items"]:
        if any(o["name"] == name for o in c["metadata"].get("ownerReferences", [])):
            allocation = c.get("status", {}).get("allocation")
            return [r["device"] for r in allocation["devices"]["results"]] if allocation \
                else []
    return []


def of_pf(kind: str, pf: str) -> dict:
    return {"deviceClassName": f"railyard-{kind}", "selectors": [{"cel": {"expression":
            f'device.attributes["{DRIVER}"].pf == "{pf}"'}}]}


def test_a_pf_and_one_of_its_own_vfs_cannot_be_had_together(dra_box):
    box, node = dra_box
    ns = namespace(box)
    nic = next(n for n in node.topology.nics if n.vfs)
    pf = device_name(nic.pci_address)
    claim_pod(box, ns, "both", [{"name": "pf", "exactly": of_pf("pf", pf)},
                                {"name": "vf", "exactly": of_pf("vf", pf)}])
    said = wait_for("kube-scheduler to give up on the PF with its own VF",
                    lambda: unschedulable(box, ns, "both"), timeout=60)
    assert "cannot allocate all claims" in said, said
    # Either alone is allocatable: the counters, nothing else, kept them apart.
    for kind in ("pf", "vf"):
        claim_pod(box, ns, f"only-{kind}", [{"name": kind, "exactly": of_pf(kind, pf)}])
        wait_for(f"the {kind} alone to be allocated",
                 lambda kind=kind: allocated_for(box, ns, f"only-{kind}"), timeout=60)
        box.kubectl("delete", "pod", f"only-{kind}", "-n", ns, "--wait=true",
                    "--timeout=120s")
    box.kubectl("delete", "pod", "both", "-n", ns, "--wait=false", check=False)


def test_more_pairs_than_the_node_has_stay_pending_with_kube_schedulers_reason(dra_box):
    box, node = dra_box
    ns = namespace(box)
    pairs = len(node.topology.gpus) + 1
    # As counts, not one request per device: with 9 GPU and 9 VF requests of one device each
    # kube-scheduler said nothing on the pod within a minute on the box (its allocator tries
    # device after device per request, a search that large is our guess at why).
    requests = [{"name": "gpus", "exactly": {"deviceClassName": "railyard-gpu",
                                             "allocationMode": "ExactCount", "count": pairs}},
                {"name": "nics", "exactly": {"deviceClassName": "railyard-vf",
                                             "allocationMode": "ExactCount", "count": pairs}}]
    claim_pod(box, ns, "greedy", requests)
    said = wait_for("kube-scheduler to say why", lambda: unschedulable(box, ns, "greedy"),
                    timeout=60)
    assert "cannot allocate all claims" in said, said
    assert phase(box, ns, "greedy") == "Pending"
    box.kubectl("delete", "pod", "greedy", "-n", ns, "--wait=false", check=False)


def test_after_an_agent_restart_the_slices_kubelet_wiped_are_back(dra_box):
    box, node = dra_box
    before = {s["metadata"]["name"]: s["spec"]["pool"]["generation"] for s in our_slices(box)}
    assert before
    # What kubelet does 30 s after the plugin stopped answering: our slices deleted.
    box.kubectl("delete", "resourceslices", "--field-selector",
                f"spec.nodeName={kubebox.NODE_NAME},spec.driver={DRIVER}")
    assert our_slices(box) == []
    registered = registrations(box)
    box.restart(AGENT)
    back = wait_for("the agent to publish its slices again", lambda: our_slices(box),
                    timeout=90)
    assert sorted(s["metadata"]["name"] for s in back) == sorted(before)
    wait_for("kubelet to register the restarted agent's DRA plugin",
             lambda: registrations(box) > registered, timeout=60)
    # And they serve: a two-pair claim is allocated from them again.
    ns = namespace(box)
    start_pod(box, ns, "again", (6, 7))
    assert [rail for rail, _ in claim_vfs(node, allocated_claim(box, ns))] == [6, 7]
    box.kubectl("delete", "pod", "again", "-n", ns, "--wait=false", check=False)


def taints(box) -> dict[str, list[dict]]:
    return {d["name"]: d["taints"] for s in our_slices(box)
            for d in s["spec"].get("devices", []) if d.get("taints")}


def test_a_vf_whose_port_goes_down_is_tainted_in_the_slices_and_untainted_when_it_is_back(
        dra_box):
    box, node = dra_box
    nic = next(n for n in node.topology.nics if n.vfs)
    vf = nic.vfs[0]
    state = (node.sysfs / "sys/bus/pci/devices" / vf.pci_address / "infiniband" /
             str(vf.rdma_device) / "ports/1/state").resolve()
    before = state.read_text()
    assert taints(box) == {}
    state.write_text("1: DOWN\n")
    try:
        found = wait_for("the agent to taint the VF", lambda: taints(box), timeout=60)
        assert list(found) == [device_name(vf.pci_address)]
        [taint] = found[device_name(vf.pci_address)]
        assert (taint["key"], taint["effect"]) == ("railyard.dev/unhealthy", "NoSchedule")
        assert taint.get("timeAdded")  # the API server kept the taint and stamped it
    finally:
        state.write_text(before)
    wait_for("the taint to go", lambda: taints(box) == {}, timeout=60)
