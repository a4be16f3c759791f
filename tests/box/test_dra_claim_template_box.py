"""`railyard dra claim-template` against the box's real kube-apiserver and kube-scheduler v1.36.3.

The API server validates every template the command prints, and refuses one constraint past
the limit the command computes. kube-scheduler's DRA allocator allocates a pod's claim from a
`--pairs 2` template against a ResourceSlice of a dgx-h100 on a kwok node (allocation is
kube-scheduler's alone, no kubelet takes part), each pair's GPU and VF under one PCIe switch
on distinct PFs; a claim for more pairs than the node has stays Pending with the scheduler's
reason; `--gpus nvidia` pairs our VFs with GPUs in NVIDIA's GPU DRA driver's slice form by
pcieRoot; and on a node built to show it, the NIC-first request order finds the switch-level
pair that a GPU-first order misses (decision 0112).

The dgx-h100 nodes' slices and the DeviceClasses are what the agent publishes
(`records.dra_slices`); the trap node's slice is written by hand with the same attribute names.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from railyard.discovery.profiles import PROFILES, build_topology
from railyard.kubelet.dra_claim import ClaimRef, DeviceNames, claim_to_allocation, read_claim
from railyard.kubelet.dra_prepare import slice_gpus
from railyard.kubelet.pairing import DeviceIndex
from railyard.records.dra_claims import NVIDIA_GPU_CLASS
from railyard.records.dra_names import (
    DRIVER,
    KIND,
    KIND_GPU,
    KIND_VF,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    PCIE_SWITCH,
    PF,
    device_name,
)
from railyard.records.dra_slices import device_classes, node_slices
from railyard.topology.model import Distance, NodeTopology
from support.box import get, kubebox, namespace, pod, running_box, wait_for
from support.nvidia_dra_standin import device_class, resource_slice

pytestmark = [pytest.mark.root, pytest.mark.box]

DGX = "kwok-node-0"  # a dgx-h100, 2 VFs per compute PF
TRAP = "kwok-node-1"  # two GPUs, two VFs: first-fit's trap (see test_nic_first_...)
SPARE = "kwok-node-2"  # another dgx-h100, for the claims that ask it all
NVIDIA = "kwok-node-3"  # a dgx-h100 whose GPUs NVIDIA's GPU DRA driver publishes


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    with running_box(tmp_path_factory.mktemp("dra-template-box"), kwok_nodes=4) as box:
        topology = dgx_topology()
        box.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "List",
            "items": [*device_classes(), *node_slices(topology, publish_gpus=True),
                      node_slice(TRAP, trap_devices()),
                      *node_slices(dgx_topology(SPARE), publish_gpus=True),
                      *node_slices(dgx_topology(NVIDIA)), *nvidia_objects(dgx_topology(NVIDIA))]}))
        yield box


def dgx_topology(node: str = DGX) -> NodeTopology:
    t = build_topology(PROFILES["dgx-h100"], 2)
    return type(t)(node, t.numa_nodes, t.gpus, t.nics, t.distance)


def attrs(kind: str, switch: str | None, root: str, numa: int | None,
          pf: str | None = None) -> dict:
    a: dict = {KIND: {"string": kind}, PCIE_ROOT: {"string": root}}
    if switch is not None:
        a[PCIE_SWITCH] = {"string": switch}
    if numa is not None:
        a[NUMA_NODE] = {"int": numa}
    if pf is not None:
        a[PF] = {"string": pf}
    return a


def trap_devices() -> list[dict]:
    """GPU a (switch s1, root r0) first, GPU b (switch s2, root r1); VF y (switch s3, root r0)
    before VF x (switch s2, root r1). The only switch-level pair is b-x; a-y is root-level."""
    return [{"name": "gpu-a", "attributes": attrs(KIND_GPU, "s1", "pci0000:00", 0)},
            {"name": "gpu-b", "attributes": attrs(KIND_GPU, "s2", "pci0000:80", 0)},
            {"name": "vf-y", "attributes": attrs(KIND_VF, "s3", "pci0000:00", 0, "pf-y")},
            {"name": "vf-x", "attributes": attrs(KIND_VF, "s2", "pci0000:80", 0, "pf-x")}]


def nvidia_objects(t: NodeTopology) -> list[dict]:
    """NVIDIA's GPU DRA driver's DeviceClass (as its chart writes it) and a slice of the node's
    GPUs in its form (`gpu-<minor>`, its own attributes unqualified, the standard pciBusID,
    pcieRoot and numaNode): the NVIDIA GPU DRA driver stand-in's, named for `kubectl apply`."""
    slice_ = resource_slice(t)
    return [device_class(), {**slice_, "metadata": {"name": f"{t.node}-gpu-nvidia-com"}}]


def node_slice(node: str, devices: list[dict]) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}


def cli_template(*args: str) -> dict:
    out = kubebox.run([*kubebox.railyard_command(), "dra", "claim-template", *args,
                       "--output", "json"]).stdout
    return json.loads(out)


def start_pod(box, ns: str, name: str, template: dict, node: str) -> None:
    template = json.loads(json.dumps(template))
    template["metadata"]["name"] = f"{name}-pairs"
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(template))
    manifest = pod(name, ["sleep", "3600"], nodeSelector={"kubernetes.io/hostname": node},
                   tolerations=[{"key": "kwok.x-k8s.io/node", "operator": "Exists",
                                 "effect": "NoSchedule"}],
                   resourceClaims=[{"name": "pairs",
                                    "resourceClaimTemplateName": f"{name}-pairs"}])
    manifest["spec"]["containers"][0]["resources"] = {"claims": [{"name": "pairs"}]}
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))


def allocated_claim(box, ns: str, pod_name: str) -> dict:
    def claim() -> dict | None:
        for c in get(box, "resourceclaims", "-n", ns)["items"]:
            owners = [o["name"] for o in c["metadata"].get("ownerReferences", [])]
            if pod_name in owners and "allocation" in c.get("status", {}):
                return c
        return None
    return wait_for(f"kube-scheduler to allocate {pod_name}'s claim", claim, timeout=60)


def results(claim: dict) -> list[tuple[str, str]]:
    return [(r["request"], r["device"])
            for r in claim["status"]["allocation"]["devices"]["results"]]


def test_the_api_server_accepts_every_template_the_command_prints(box):
    ns = namespace(box)
    items, names = [], []
    for level in ("switch", "root", "numa"):
        for gpus in ("railyard", "nvidia"):
            if (gpus, level) == ("nvidia", "switch"):
                continue
            for nics, spread in (("vf", "preferred"), ("vf", "required"), ("vf", "none"),
                                 ("pf", "preferred")):
                for n in range(1, 9):
                    name = f"p{n}-{level}-{gpus}-{nics}-{spread}"
                    items.append(cli_template("--pairs", str(n), "--name", name, "--level",
                                              level, "--gpus", gpus, "--nics", nics,
                                              "--pf-spread", spread))
                    names.append(name)
    # The largest each option set allows, too: 10 pairs tried at three levels, 16 at one.
    items.append(cli_template("--pairs", "10", "--name", "most-numa"))
    items.append(cli_template("--pairs", "16", "--name", "most-switch", "--level", "switch"))
    box.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-",
                input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    kubebox.say(f"kube-apiserver accepted {len(items)} claim templates (dry run)")

    # One pair past the limit the command computed (10 at three levels), written by hand as
    # the command would: the API server refuses it for its constraints.
    over = with_one_more_pair(items[-2])
    assert len(over["spec"]["spec"]["devices"]["constraints"]) == 34
    refused = kubebox.run([box.bin("kubectl"), "--kubeconfig", str(box.layout.admin_kubeconfig),
                           "apply", "--dry-run=server", "-n", ns, "-f", "-"],
                          check=False, input=json.dumps(over))
    assert refused.returncode != 0
    assert "spec.spec.devices.constraints: Too many: 34: must have at most 32 items" in \
        refused.stderr, refused.stderr


def with_one_more_pair(template: dict) -> dict:
    """`template` with pair n (n = its pairs) added the way the builder writes pair 0."""
    devices = json.loads(json.dumps(template))["spec"]["spec"]["devices"]
    n = len(devices["requests"]) // 2

    def renamed(item: dict) -> dict:
        return json.loads(json.dumps(item).replace('"nic-0', f'"nic-{n}')
                          .replace('"gpu-0"', f'"gpu-{n}"'))
    devices["requests"] += [renamed(r) for r in devices["requests"][:2]]
    spread = devices["constraints"].pop()
    devices["constraints"] += [renamed(c) for c in devices["constraints"]
                               if "gpu-0" in c["requests"]]
    spread["requests"] += [r.replace("nic-0", f"nic-{n}") for r in spread["requests"]
                           if r.startswith("nic-0")]
    devices["constraints"].append(spread)
    out = json.loads(json.dumps(template))
    out["metadata"]["name"] = "over-the-limit"
    out["spec"]["spec"]["devices"] = devices
    return out


def test_kube_scheduler_allocates_two_pairs_each_under_one_switch_on_distinct_pfs(box):
    ns = namespace(box)
    template = cli_template("--pairs", "2", "--name", "two")
    start_pod(box, ns, "train", template, DGX)
    claim = allocated_claim(box, ns, "train")
    got = results(claim)
    # Request order, the switch subrequest chosen for both NICs: the tightest level first.
    assert [r for r, _ in got] == ["nic-0/switch", "gpu-0", "nic-1/switch", "gpu-1"]
    by_name = {d["name"]: d["attributes"] for s in node_slices(dgx_topology(), publish_gpus=True)
               for d in s["spec"].get("devices", [])}
    for k in range(2):
        nic, gpu = by_name[got[2 * k][1]], by_name[got[2 * k + 1][1]]
        assert nic[PCIE_SWITCH] == gpu[PCIE_SWITCH], (k, nic, gpu)
    assert by_name[got[0][1]][PF] != by_name[got[2][1]][PF]

    # The kubelet plugin's reading of the same claim: pair k is GPU k with NIC k, PIX.
    wait_for("kwok to run the pod", lambda: get(box, "pod", "train", "-n", ns)
             .get("status", {}).get("phase") == "Running", timeout=60)
    claim = get(box, "resourceclaim", claim["metadata"]["name"], "-n", ns)
    ref = ClaimRef(ns, claim["metadata"]["uid"], claim["metadata"]["name"])
    names = DeviceNames(DeviceIndex(dgx_topology()))
    alloc = claim_to_allocation(read_claim(claim, ref, DGX), names, decided_at="t")
    assert [p.distance for p in alloc.pairs] == [Distance.PIX, Distance.PIX]
    assert [device_name(p.gpu.pci_address) for p in alloc.pairs] == [got[1][1], got[3][1]]
    assert [device_name(p.nic.pci_address) for p in alloc.pairs] == [got[0][1], got[2][1]]

    # A second pod gets two other pairs: nothing of the first claim is given twice.
    start_pod(box, ns, "second", template, DGX)
    second = results(allocated_claim(box, ns, "second"))
    assert not {d for _, d in second} & {d for _, d in got}
    assert [r for r, _ in second] == ["nic-0/switch", "gpu-0", "nic-1/switch", "gpu-1"]


def scheduled_condition(box, ns: str, name: str) -> dict | None:
    """The pod's PodScheduled=False condition once kube-scheduler has written one."""
    conditions = get(box, "pod", name, "-n", ns).get("status", {}).get("conditions", [])
    return next((c for c in conditions
                 if c["type"] == "PodScheduled" and c["status"] == "False"), None)


def test_more_pairs_than_the_node_has_stay_pending_with_the_schedulers_reason(box):
    ns = namespace(box)
    # Two GPUs, three pairs asked: the allocator's search is small and says so.
    started = time.monotonic()
    start_pod(box, ns, "three", cli_template("--pairs", "3", "--name", "three"), TRAP)
    small = wait_for("kube-scheduler's reason", lambda: scheduled_condition(box, ns, "three"))
    kubebox.say(f"3 pairs on a 2-GPU node: {small['reason']}: {small['message']!r} after "
                f"{time.monotonic() - started:.1f} s")
    assert small["reason"] == "Unschedulable"
    assert "cannot allocate all claims" in small["message"], small

    # Eight GPUs, nine pairs: the backtracking search runs into the DRA filter's timeout.
    started = time.monotonic()
    start_pod(box, ns, "nine", cli_template("--pairs", "9", "--name", "nine"), SPARE)
    # kube-scheduler has one scheduling cycle: a pod without claims, made just after, waits.
    time.sleep(0.5)
    plain_at = time.monotonic()
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(pod(
        "plain", ["sleep", "3600"], nodeSelector={"kubernetes.io/hostname": SPARE},
        tolerations=[{"key": "kwok.x-k8s.io/node", "operator": "Exists",
                      "effect": "NoSchedule"}])))
    wait_for("the plain pod to be bound", lambda: get(box, "pod", "plain", "-n", ns)[
        "spec"].get("nodeName"), timeout=120)
    kubebox.say(f"a pod without claims made 0.5 s after it bound after "
                f"{time.monotonic() - plain_at:.1f} s")
    big = wait_for("kube-scheduler's reason", lambda: scheduled_condition(box, ns, "nine"))
    kubebox.say(f"9 pairs on an 8-GPU node: {big['reason']}: {big['message']!r} after "
                f"{time.monotonic() - started:.1f} s")
    assert "DynamicResources" in big["message"], big
    assert "timed out trying to allocate devices" in big["message"] or \
        "cannot allocate all claims" in big["message"], big
    for name in ("three", "nine"):
        assert not get(box, "pod", name, "-n", ns)["spec"].get("nodeName"), name

    # The same node gives eight pairs, every one under its GPU's switch.
    box.kubectl("delete", "pod", "nine", "-n", ns, "--wait=true")
    started = time.monotonic()
    start_pod(box, ns, "eight", cli_template("--pairs", "8", "--name", "eight"), SPARE)
    got = results(allocated_claim(box, ns, "eight"))
    kubebox.say(f"8 pairs on an empty 8-GPU node allocated after "
                f"{time.monotonic() - started:.1f} s")
    assert [r for r, _ in got[::2]] == [f"nic-{k}/switch" for k in range(8)]


def test_nic_first_order_finds_the_switch_pair_that_gpu_first_misses(box):
    ns = namespace(box)
    template = cli_template("--pairs", "1", "--name", "one")
    start_pod(box, ns, "nic-first", template, TRAP)
    assert results(allocated_claim(box, ns, "nic-first")) == [
        ("nic-0/switch", "vf-x"), ("gpu-0", "gpu-b")]
    box.kubectl("delete", "pod", "nic-first", "-n", ns, "--wait=true")
    wait_for("the first claim to be freed", lambda: not get(box, "resourceclaims", "-n",
                                                             ns)["items"], timeout=60)

    # The same requests with the GPU first: the allocator keeps the first GPU it took and
    # falls back a level for it before it tries the other GPU.
    gpu_first = json.loads(json.dumps(template))
    requests = gpu_first["spec"]["spec"]["devices"]["requests"]
    requests.reverse()
    start_pod(box, ns, "gpu-first", gpu_first, TRAP)
    assert results(allocated_claim(box, ns, "gpu-first")) == [
        ("gpu-0", "gpu-a"), ("nic-0/root", "vf-y")]


def test_nvidia_gpus_pair_with_our_vfs_by_pcie_root(box):
    ns = namespace(box)
    start_pod(box, ns, "nv", cli_template("--pairs", "2", "--name", "nv", "--gpus", "nvidia",
                                          "--level", "root"), NVIDIA)
    claim = allocated_claim(box, ns, "nv")
    got = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["request"], r["driver"]) for r in got] == [
        ("nic-0/root", DRIVER), ("gpu-0", NVIDIA_GPU_CLASS),
        ("nic-1/root", DRIVER), ("gpu-1", NVIDIA_GPU_CLASS)]
    topology = dgx_topology(NVIDIA)
    slices = [*node_slices(topology), nvidia_objects(topology)[1]]
    attrs_of = {(s["spec"]["driver"], d["name"]): d["attributes"]
                for s in slices for d in s["spec"].get("devices", [])}
    for k in range(2):
        nic, gpu = (attrs_of[(r["driver"], r["device"])] for r in got[2 * k:2 * k + 2])
        assert nic[PCIE_ROOT] == gpu[PCIE_ROOT], (k, nic, gpu)

    # The kubelet plugin's reading: NVIDIA's GPUs found by pciBusID, paired in order.
    wait_for("kwok to run the pod", lambda: get(box, "pod", "nv", "-n", ns)
             .get("status", {}).get("phase") == "Running", timeout=60)
    claim = get(box, "resourceclaim", claim["metadata"]["name"], "-n", ns)
    ref = ClaimRef(ns, claim["metadata"]["uid"], claim["metadata"]["name"])
    alloc = claim_to_allocation(read_claim(claim, ref, NVIDIA), DeviceNames(DeviceIndex(
        topology)), decided_at="t", other_gpu=slice_gpus(slices, topology))
    gpu_pci = {d["name"]: d["attributes"][PCI_BUS_ID]["string"]
               for d in nvidia_objects(topology)[1]["spec"]["devices"]}
    assert [p.gpu.pci_address for p in alloc.pairs] == [gpu_pci[got[1]["device"]],
                                                        gpu_pci[got[3]["device"]]]
    assert all(p.distance <= Distance.PHB for p in alloc.pairs), alloc.pairs
