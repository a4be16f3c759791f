"""A pod whose claim comes from `railyard dra claim-template --pairs 2` runs on the box's real
kubelet v1.36.3 with the agent in DRA mode (`hack/box up --with-railyard --dra`): exactly its
two pairs' VFs inside, in pair order, each pair PIX as the pair file says, and deleting it
unprepares the claim; two such pods at once get disjoint pairs, each exactly its own. Issue
29's first box check, with the template users get.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from railyard.discovery.discover import discover
from railyard.kubelet.dra_cdi import CdiSpecs
from railyard.kubelet.dra_prepared import PreparedClaims
from railyard.records.dra_names import DRIVER, device_name
from railyard.topology.model import NodeTopology
from support.box import kubebox, namespace, phase, running_box, wait_for
from support.dra_box import allocated_claim, claim_pod

pytestmark = [pytest.mark.root, pytest.mark.box]

SHOW = ("env | sort; ip -o link; "
        "echo '<pairs>'; cat /run/railyard/pairs.json; echo '</pairs>'")


def cli_template() -> dict:
    """The template `railyard dra claim-template --pairs 2` prints."""
    return json.loads(kubebox.run([*kubebox.railyard_command(), "dra", "claim-template",
                                   "--pairs", "2", "--name", "pairs", "-o", "json"]).stdout)


def claim_devices(topology: NodeTopology, claim: dict) -> tuple[list, list]:
    """The claim's VFs and GPUs, in pair order, as the node's topology knows them."""
    results = claim["status"]["allocation"]["devices"]["results"]
    vf_of = {device_name(v.pci_address): v for n in topology.nics for v in n.vfs}
    gpu_of = {device_name(g.pci_address): g for g in topology.gpus}
    return ([vf_of[r["device"]] for r in results if r["request"].startswith("nic-")],
            [gpu_of[r["device"]] for r in results if r["request"].startswith("gpu-")])


@pytest.fixture(scope="module")
def dra_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, NodeTopology]]:
    folder = tmp_path_factory.mktemp("dra-template-pod")
    kubebox.run([*kubebox.railyard_command(), "fixture", "--profile", "dgx-h100",
                 "--vfs-per-pf", "2", str(folder / "node")])
    topology = replace(discover(folder / "node").topology, node=kubebox.NODE_NAME)
    with running_box(folder / "box", node_sysfs=folder / "node" / "sys", with_railyard=True,
                     dra=True) as box:
        log = Path(next(s.log for s in box.state.started if s.name == "railyard-agent"))
        wait_for("kubelet to register the DRA driver", lambda: f"{DRIVER}: registered through "
                 "the plugin watcher" in log.read_text(), timeout=60)
        yield box, topology


def test_a_pod_from_the_two_pair_template_runs_with_exactly_its_pairs_vfs(dra_box):
    box, topology = dra_box
    ns = namespace(box)
    claim_pod(box, ns, "run", cli_template(), command=SHOW)
    claimed = allocated_claim(box, ns, "run")
    results = claimed["status"]["allocation"]["devices"]["results"]
    assert [r["request"] for r in results] == ["nic-0/switch", "gpu-0", "nic-1/switch", "gpu-1"]
    vfs, gpus = claim_devices(topology, claimed)

    def finished() -> str:
        p = phase(box, ns, "run")
        return p if p in ("Succeeded", "Failed") else ""
    assert wait_for("pod run to finish", finished, timeout=90) == "Succeeded"
    log = box.kubectl("logs", "-n", ns, "run")
    env = dict(line.split("=", 1) for line in log.splitlines() if "=" in line.split(" ")[0])
    assert env["NCCL_IB_HCA"] == "=" + ",".join(f"{v.rdma_device}:1" for v in vfs)
    mounted = json.loads(log.split("<pairs>", 1)[1].split("</pairs>", 1)[0])
    assert [(p["gpu"]["pciAddress"], p["nic"]["pciAddress"], p["distance"])
            for p in mounted["pairs"]] == [(g.pci_address, v.pci_address, "PIX")
                                           for g, v in zip(gpus, vfs, strict=True)]
    inside = {line.split(":")[1].strip().split("@")[0] for line in log.splitlines()
              if ": <" in line}
    assert {p["nic"]["podNetdev"] for p in mounted["pairs"]} <= inside
    assert len([n for n in inside if n.startswith("net")]) == 2, inside

    uid = claimed["metadata"]["uid"]
    box.kubectl("delete", "pod", "run", "-n", ns, "--wait=true", "--timeout=120s")
    state_dir = str(box.layout.dir / "railyard-state")
    wait_for("the claim to be unprepared",
             lambda: not CdiSpecs(str(box.layout.dir / "cdi")).path(uid).exists()
             and PreparedClaims(state_dir).get(uid) is None, timeout=90)


def test_two_pods_from_the_template_at_once_get_disjoint_pairs_each_exactly_its_own(dra_box):
    box, topology = dra_box
    ns = namespace(box)
    names = ("first", "second")
    for name in names:
        claim_pod(box, ns, name, cli_template(), command=f"{SHOW}; echo '<ready>'; sleep 600")
    try:
        claims = {n: allocated_claim(box, ns, n) for n in names}
        devices = {n: claim_devices(topology, c) for n, c in claims.items()}
        vfs = {n: [v.pci_address for v in d[0]] for n, d in devices.items()}
        gpus = {n: [g.pci_address for g in d[1]] for n, d in devices.items()}
        assert all(len(vfs[n]) == len(gpus[n]) == 2 for n in names), devices
        assert not set(vfs["first"]) & set(vfs["second"]), vfs
        assert not set(gpus["first"]) & set(gpus["second"]), gpus

        def shown(name: str) -> str:
            if phase(box, ns, name) != "Running":
                return ""
            log = box.kubectl("logs", "-n", ns, name, check=False)
            return log if "<ready>" in log else ""
        for name in names:
            log = wait_for(f"pod {name} to run and show its pairs", lambda n=name: shown(n),
                           timeout=90)
            mounted = json.loads(log.split("<pairs>", 1)[1].split("</pairs>", 1)[0])
            assert [(p["gpu"]["pciAddress"], p["nic"]["pciAddress"]) for p in mounted["pairs"]] \
                == list(zip(gpus[name], vfs[name], strict=True)), (name, mounted)
            inside = {line.split(":")[1].strip().split("@")[0] for line in log.splitlines()
                      if ": <" in line}
            assert len([n for n in inside if n.startswith("net")]) == 2, (name, inside)
    finally:
        for name in names:
            box.kubectl("delete", "pod", name, "-n", ns, "--wait=false", check=False)
