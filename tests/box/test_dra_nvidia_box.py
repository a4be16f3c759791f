"""`--gpus nvidia` on the box's real kubelet v1.36.3: Railyard's NICs paired with the GPUs of
NVIDIA's GPU DRA driver by `pcieRoot` (issue 29).

The agent runs in DRA mode without its GPUs (`dra.publishGpus: false`, `gpuPlugin: false`)
beside a stand-in of NVIDIA's GPU DRA kubelet plugin (tests/support/nvidia_dra_standin.py: the
real driver's ResourceSlice form, the same plugin-watcher registration and dra v1 service, its
CDI IDs; it never reads our record). A pod whose claim comes from `railyard dra claim-template
--pairs 2 --gpus nvidia --level root` is allocated by kube-scheduler two of NVIDIA's GPUs and
two of our VFs whose pcieRoot match pair by pair; both drivers prepare it; inside the pod are
exactly those VFs in pair order, NVIDIA_VISIBLE_DEVICES names the claim's GPUs (NVIDIA's
spec), and our pair file and RAILYARD_PAIRS pair GPU k with NIC k, the same GPUs; deleting the
pod unprepares the claim in both drivers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from railyard.discovery.discover import discover
from railyard.kubelet.dra_cdi import CdiSpecs
from railyard.kubelet.dra_prepared import PreparedClaims
from railyard.records.dra_names import DRIVER, PCI_BUS_ID, PCIE_ROOT
from railyard.records.topology import topology_to_json
from railyard.topology.model import Distance, NodeTopology
from support.box import get, kubebox, namespace, phase, pod, running_box, wait_for
from support.dra_box import SHOW, allocated_claim, env_of, registrations
from support.nvidia_dra_standin import DRIVER as NVIDIA
from support.nvidia_dra_standin import device_class, spec_path

pytestmark = [pytest.mark.root, pytest.mark.box]

STANDIN = Path(__file__).resolve().parents[1] / "support" / "nvidia_dra_standin.py"


@pytest.fixture(scope="module")
def nvidia_box(tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[kubebox.Box, NodeTopology]]:
    folder = tmp_path_factory.mktemp("dra-nvidia")
    kubebox.run([*kubebox.railyard_command(), "fixture", "--profile", "dgx-h100",
                 "--vfs-per-pf", "2", str(folder / "node")])
    topology = replace(discover(folder / "node").topology, node=kubebox.NODE_NAME)
    lay = kubebox.Layout.for_dir(folder / "box")
    cdi = str(lay.dir / "cdi")
    standin = [sys.executable, str(STANDIN), "--sysfs-root", "{sysfs_root}",
               "--node-name", kubebox.NODE_NAME, "--kubeconfig", str(lay.admin_kubeconfig),
               "--cdi-dir", cdi]
    with running_box(folder / "box", node_sysfs=folder / "node" / "sys", dra=True,
                     agent_config={"gpuPlugin": False,
                                   "dra": {"publishGpus": False, "cdiDir": cdi}},
                     node_helpers={"nvidia-dra-standin": standin}) as box:
        logs = box.layout.dir / "logs"
        wait_for("kubelet to register both DRA drivers", lambda: registrations(box) and
                 f"{NVIDIA}: registered with kubelet" in
                 (logs / "nvidia-dra-standin.log").read_text(), timeout=90)
        wait_for("the stand-in's ResourceSlice", lambda: nvidia_slices(box), timeout=60)
        box.kubectl("apply", "-f", "-", input=json.dumps(device_class()))
        yield box, topology


def nvidia_slices(box) -> list[dict]:
    return get(box, "resourceslices", "--field-selector",
               f"spec.nodeName={kubebox.NODE_NAME},spec.driver={NVIDIA}")["items"]


def test_our_slices_leave_the_gpus_to_nvidias_driver(nvidia_box):
    box, topology = nvidia_box
    ours = get(box, "resourceslices", "--field-selector",
               f"spec.nodeName={kubebox.NODE_NAME},spec.driver={DRIVER}")["items"]
    kinds = {d["attributes"]["kind"]["string"] for s in ours for d in s["spec"].get("devices", [])}
    assert kinds == {"vf", "pf"}
    (theirs,) = nvidia_slices(box)
    assert sorted(d["attributes"][PCI_BUS_ID]["string"] for d in theirs["spec"]["devices"]) \
        == sorted(g.pci_address for g in topology.gpus)


def test_an_nvidia_gpu_claim_pairs_our_vfs_by_pcie_root_and_both_drivers_prepare_it(
        nvidia_box):
    box, topology = nvidia_box
    ns = namespace(box)
    template = json.loads(kubebox.run([
        *kubebox.railyard_command(), "dra", "claim-template", "--pairs", "2", "--gpus",
        "nvidia", "--level", "root", "--name", "nv", "-o", "json"]).stdout)
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(template))
    manifest = pod("run", ["sh", "-c", SHOW],
                   resourceClaims=[{"name": "pairs", "resourceClaimTemplateName": "nv"}])
    manifest["spec"]["containers"][0]["resources"] = {"claims": [{"name": "pairs"}]}
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))
    claim = allocated_claim(box, ns)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["request"].split("/")[0], r["driver"]) for r in results] == [
        ("nic-0", DRIVER), ("gpu-0", NVIDIA), ("nic-1", DRIVER), ("gpu-1", NVIDIA)]
    attrs = {(s["spec"]["driver"], d["name"]): d["attributes"]
             for s in get(box, "resourceslices")["items"] for d in s["spec"].get("devices", [])}
    nic_attrs = [attrs[(r["driver"], r["device"])] for r in results[0::2]]
    gpu_attrs = [attrs[(r["driver"], r["device"])] for r in results[1::2]]
    for k, (nic, gpu) in enumerate(zip(nic_attrs, gpu_attrs, strict=True)):
        assert nic[PCIE_ROOT] == gpu[PCIE_ROOT], (k, nic, gpu)
    vf_of = {v.pci_address: v for n in topology.nics for v in n.vfs}
    gpu_of = {g.pci_address: g for g in topology.gpus}
    vfs = [vf_of[a[PCI_BUS_ID]["string"]] for a in nic_attrs]
    gpus = [gpu_of[a[PCI_BUS_ID]["string"]] for a in gpu_attrs]
    uuids = [a["uuid"]["string"] for a in gpu_attrs]
    assert uuids == [g.uuid for g in gpus]  # the fixture's GPUs have UUIDs, as NVML's do

    def finished() -> str:
        p = phase(box, ns, "run")
        return p if p in ("Succeeded", "Failed") else ""
    assert wait_for("pod run to finish", finished, timeout=90) == "Succeeded", \
        box.kubectl("describe", "pod", "-n", ns, "run")
    log = box.kubectl("logs", "-n", ns, "run")
    env = env_of(log)
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)  # NVIDIA's CDI spec
    assert env["NCCL_IB_HCA"] == "=" + ",".join(f"{v.rdma_device}:1" for v in vfs)
    want = [(g.uuid, g.pci_address, v.pci_address) for g, v in zip(gpus, vfs, strict=True)]
    assert [(p["gpu"]["uuid"], p["gpu"]["pciAddress"], p["nic"]["pciAddress"])
            for p in json.loads(env["RAILYARD_PAIRS"])] == want
    mounted = json.loads(log.split("<pairs>", 1)[1].split("</pairs>", 1)[0])
    assert [(p["gpu"]["uuid"], p["gpu"]["pciAddress"], p["nic"]["pciAddress"])
            for p in mounted["pairs"]] == want
    assert all(Distance[p["distance"]] <= Distance.PHB for p in mounted["pairs"]), mounted
    # Inside: exactly the claim's two VFs, pair k's under the name the pair file gives it
    # (each VF's stand-in netdev carries a MAC of its own, kubebox.netdev_stand_ins).
    inside = {line.split(":")[1].strip().split("@")[0]: line.split("link/ether ")[1].split()[0]
              for line in log.splitlines() if ": <" in line and "link/ether " in line}
    macs = kubebox.netdev_stand_ins(topology_to_json(topology))
    names = [p["nic"]["podNetdev"] for p in mounted["pairs"]]
    assert names == ["net1", "net1-1"], mounted
    assert [inside.get(n) for n in names] == [macs[v.netdev] for v in vfs], inside
    assert len([n for n in inside if n.startswith("net")]) == 2, inside

    uid = claim["metadata"]["uid"]
    standin_log = box.layout.dir / "logs" / "nvidia-dra-standin.log"
    assert f"prepared claim {ns}/{claim['metadata']['name']} ({uid})" in \
        standin_log.read_text()
    box.kubectl("delete", "pod", "run", "-n", ns, "--wait=true", "--timeout=120s")
    cdi = box.layout.dir / "cdi"
    state_dir = str(box.layout.dir / "railyard-state")
    wait_for("both drivers to unprepare the claim",
             lambda: not CdiSpecs(str(cdi)).path(uid).exists()
             and PreparedClaims(state_dir).get(uid) is None
             and not Path(spec_path(str(cdi), uid)).exists(), timeout=90)
    assert f"unprepared claim {ns}/{claim['metadata']['name']} ({uid})" in \
        standin_log.read_text()
