"""GPUs owned by another plugin (decision 0090), on the real kubelet: the agent runs with
`gpuPlugin: false` beside a stand-in for NVIDIA's device plugin (tests/support/
nvidia_standin.py: the real v1beta1 protocol, `nvidia.com/gpu` by the node's GPU UUIDs, our
record never read). The stand-in prefers the highest IDs kubelet offers, so kubelet gives a
2 GPU + 2 VF pod other GPUs than the scheduler recorded: the node's truth is corrected and
said in an Event on the pod, and the pair file in the container names the GPUs kubelet
really gave it (PodResources, compared as sets: kubelet lists IDs out of a Go map).
A ResourceSlice of a GPU DRA driver on the node makes the agent warn on the Node."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from railyard.kubelet.podresources import AssignedPod, PodResourcesClient
from railyard.records.allocation import decode_allocation
from support.box import get, kubebox, namespace, phase, pod, running_box, wait_for

pytestmark = [pytest.mark.root, pytest.mark.box, pytest.mark.slow]

GPU, VF = "nvidia.com/gpu", "railyard.dev/vf"
ALLOCATION = "railyard.dev/allocation"
STANDIN = Path(__file__).resolve().parents[1] / "support" / "nvidia_standin.py"
SHOW = ("cat /run/railyard/pairs.json; echo '--- env'; env | sort; echo '--- links'; "
        "ip -o link; echo '--- end'; sleep 3600")


@pytest.fixture(scope="module")
def nvidia_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubebox.Box]:
    """The box's dgx-h100 node (8 GPUs, 16 VFs); nvidia.com/gpu is the stand-in's."""
    standin = [sys.executable, str(STANDIN), "--sysfs-root", "{sysfs_root}", "--prefer", "last"]
    with running_box(tmp_path_factory.mktemp("nvidia-ownership"), with_railyard=True,
                     agent_config={"gpuPlugin": False},
                     node_helpers={"nvidia-standin": standin}) as running:
        yield running


@pytest.fixture
def ns(nvidia_box) -> Iterator[str]:
    name = namespace(nvidia_box)
    yield name
    nvidia_box.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s")


def kubelet_assigned(box, ns: str, name: str) -> AssignedPod | None:
    socket = str(box.layout.kubelet_dir / "pod-resources/kubelet.sock")
    listed = asyncio.run(PodResourcesClient(socket).list())
    return next((a for a in listed if a.namespace == ns and a.name == name), None)


def events(box, ns: str, name: str, reason: str) -> list[str]:
    listed = get(box, "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")
    return [e["message"] for e in listed["items"] if e["reason"] == reason]


def shown(log: str) -> tuple[dict, dict[str, str], dict[str, str]]:
    """The container's pair file, its environment and its links (`ip -o link` lines by
    interface name), as the pod printed them."""
    text, _, rest = log.partition("--- env\n")
    env_text, _, rest = rest.partition("--- links\n")
    env = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
    links = {line.split(":")[1].strip().split("@")[0]: line
             for line in rest.partition("--- end")[0].splitlines() if ": <" in line}
    return json.loads(text), env, links


def host_macs(box) -> dict[str, str]:
    out = kubebox.run(box.in_box(["ip", "-j", "link", "show"])).stdout
    return {link["ifname"]: link.get("address", "") for link in json.loads(out)}


def test_the_standin_serves_nvidia_gpus_and_the_agent_only_nics(nvidia_box):
    logs = nvidia_box.layout.dir / "logs"
    standin = (logs / "nvidia-standin.log").read_text(errors="replace")
    assert "registered nvidia.com/gpu with kubelet" in standin, standin[-2000:]
    agent = (logs / "railyard-agent.log").read_text(errors="replace")
    assert re.search(r"railyard.dev/vf: \d+ devices offered", agent), agent[-2000:]
    assert not re.search(r"nvidia.com/gpu: \d+ devices offered", agent)  # gpuPlugin: false
    allocatable = get(nvidia_box, "node", kubebox.NODE_NAME)["status"]["allocatable"]
    assert allocatable[GPU] == "8", allocatable


def test_kubelet_giving_other_gpus_than_the_record_gets_a_pair_map_of_the_gpus_received(
        nvidia_box, ns):
    box = nvidia_box
    macs = host_macs(box)  # each VF's MAC under its host name, before the CNI moves it
    manifest = pod("pairs", ["sh", "-c", SHOW])
    manifest["spec"]["containers"][0]["resources"] = {"limits": {GPU: "2", VF: "2"}}
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))
    wait_for("pod pairs to run", lambda: phase(box, ns, "pairs") == "Running", timeout=180)
    log = wait_for("the pod's pair file and env in its log",
                   lambda: (lambda t: t if "--- end" in t else "")(
                       box.kubectl("logs", "-n", ns, "pairs", check=False)), timeout=60)
    pairs_file, env, links = shown(log)

    assigned = wait_for("kubelet's PodResources to list the pod",
                        lambda: kubelet_assigned(box, ns, "pairs"), timeout=30)
    given = assigned.containers["main"]
    gpus, vfs = frozenset(given[GPU]), frozenset(given[VF])
    assert len(gpus) == 2 and len(vfs) == 2, given

    # What the stand-in handed the container is what kubelet says it gave.
    assert frozenset(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == gpus
    # The pair file names exactly those GPUs and VFs, one pair each, decided by the node.
    assert {p["gpu"]["uuid"] for p in pairs_file["pairs"]} == gpus, pairs_file
    assert {p["nic"]["pciAddress"] for p in pairs_file["pairs"]} == vfs, pairs_file
    assert len(pairs_file["pairs"]) == 2 and not pairs_file["gpus"] and not pairs_file["nics"]
    assert pairs_file["decidedBy"] == "node", pairs_file
    # Variables fixed at Allocate name no GPUs; they point at the file instead.
    assert env["RAILYARD_PAIRS_FILE"] == "/run/railyard/pairs.json"
    assert "RAILYARD_PAIRS" not in env and "VLLM_GPU_NIC_PCIE_MAPPING" not in env
    assert env["NCCL_IB_HCA"].startswith("=")

    # Kubelet's choice differed from the record: said on the pod, naming both.
    said = wait_for("the RailyardRecordCorrected Event on the pod",
                    lambda: events(box, ns, "pairs", "RailyardRecordCorrected"), timeout=60)
    message = said[0]
    assert "not the recorded" in message, message
    recorded = message.split("not the recorded ", 1)[1].split("]", 1)[0]
    assert {g for g in gpus if g not in recorded}, (
        f"kubelet's GPUs {sorted(gpus)} are all in the record ({recorded}): the stand-in's "
        "preference did not make kubelet choose other GPUs")
    for g in gpus:
        assert g in message, (g, message)

    # The node's truth, written back on the pod: the GPUs and VFs kubelet gave, re-paired.
    def written_back():
        annotations = get(box, "pod", "pairs", "-n", ns)["metadata"].get("annotations", {})
        alloc = decode_allocation(annotations[ALLOCATION])
        return alloc if {g.device_id for g in alloc.all_gpus} == gpus else None

    alloc = wait_for("the node's truth on the pod's annotation", written_back, timeout=60)
    assert alloc.decided_by == "node"
    assert {(p.gpu.device_id, p.nic.pci_address) for p in alloc.pairs} == {
        (p["gpu"]["uuid"], p["nic"]["pciAddress"]) for p in pairs_file["pairs"]}
    agent_log = (box.layout.dir / "logs" / "railyard-agent.log").read_text(errors="replace")
    assert "PreStartContainer for" not in agent_log  # no check failed
    started = [line for line in agent_log.splitlines()
               if "PodResources checked before the start of a container" in line]
    assert any(all(v in line for v in vfs) for line in started), started  # kubelet asked
    # The CNI moved the VFs in the corrected pairs: each pair's podNetdev in the file is the
    # pod's interface with that VF's MAC.
    host_name = {p.nic.pci_address: p.nic.netdev for p in alloc.pairs}
    for p in pairs_file["pairs"]:
        name = p["nic"]["podNetdev"]
        assert name in links, (name, sorted(links))
        assert macs[host_name[p["nic"]["pciAddress"]]] in links[name], (p, links[name])


def test_a_gpu_dra_driver_on_the_node_is_warned_about_on_the_node(nvidia_box):
    box = nvidia_box
    versions = box.kubectl("api-versions")
    version = next((v for v in ("resource.k8s.io/v1", "resource.k8s.io/v1beta2",
                                "resource.k8s.io/v1beta1") if v in versions.split()), None)
    if version is None:
        pytest.skip("this box's API server serves no resource.k8s.io")
    slice_ = {
        "apiVersion": version, "kind": "ResourceSlice",
        "metadata": {"name": f"{kubebox.NODE_NAME}-gpu-nvidia-com"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": kubebox.NODE_NAME,
                 "pool": {"name": kubebox.NODE_NAME, "generation": 1,
                          "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}]},
    }
    box.kubectl("apply", "-f", "-", input=json.dumps(slice_))
    try:
        log = box.layout.dir / "logs" / "railyard-agent.log"
        registered = log.read_text(errors="replace").count("registered through the plugin "
                                                           "watcher")
        box.restart("railyard-agent")  # the agent looks for DRA drivers when it starts
        wait_for("the restarted agent's warning",
                 lambda: "also served by DRA (gpu.nvidia.com)" in log.read_text(
                     errors="replace"), timeout=60)
        wait_for("the Node Event", lambda: [
            e for e in get(box, "events", "-n", "default", "--field-selector",
                           f"involvedObject.name={kubebox.NODE_NAME}")["items"]
            if e["reason"] == "RailyardGpusAlsoServedByDra"], timeout=30)
        wait_for("kubelet to register the restarted agent's plugins", lambda: log.read_text(
            errors="replace").count("registered through the plugin watcher") > registered,
            timeout=90)
        time.sleep(2)
    finally:
        box.kubectl("delete", "resourceslice", slice_["metadata"]["name"], check=False)
