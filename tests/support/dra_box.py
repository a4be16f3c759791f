"""The DRA box of the kubelet-plugin tests and drills: a dgx-h100 node (2 VFs per PF, compute
NIC i on rail i) with the agent in DRA mode (`hack/box up --with-railyard --dra`), and what
those tests read of it: kubelet's registrations of our plugin, a two-pair claim's pod, the
claim kube-scheduler allocated and its VFs in result order.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from railyard.discovery.discover import discover
from railyard.records.dra_names import DRIVER, PCI_BUS_ID, device_name
from railyard.topology.model import NodeTopology
from railyard.topology.rails import assign_rails
from support.box import get, kubebox, pod, running_box, wait_for

AGENT = "railyard-agent"
SHOW = ("env | sort; ip -o link; ls /dev/infiniband; "
        "echo '<pairs>'; cat /run/railyard/pairs.json; echo '</pairs>'")


@dataclass(frozen=True)
class Node:
    """What the tests read of the node: its topology and the agent's folders."""

    topology: NodeTopology
    state_dir: str
    cdi_dir: str
    sysfs: Path  # the fixture tree the agent discovers and health-scans


@contextlib.contextmanager
def running_dra_box(folder: Path) -> Iterator[tuple[object, Node]]:
    """The box up in `folder` (the node's fixture tree beside it) with kubelet's registration
    of our DRA plugin made, and down after the block; skips without root."""
    kubebox.run([*kubebox.railyard_command(), "fixture", "--profile", "dgx-h100",
                 "--vfs-per-pf", "2", str(folder / "node")])
    topology = replace(discover(folder / "node").topology, node=kubebox.NODE_NAME)
    # Discovery cannot see cabling: compute NIC i (PCI order) is on rail i, under GPU i.
    rails = {n.pci_address: i for i, n in enumerate(n for n in topology.nics if n.total_vfs)}
    topology = assign_rails(topology, rails)[0]
    with running_box(folder / "box", node_sysfs=folder / "node" / "sys", with_railyard=True,
                     dra=True, agent_config={"rails": rails}) as box:
        wait_for("kubelet to register the DRA driver", lambda: registrations(box), timeout=60)
        yield box, Node(topology, str(box.layout.dir / "railyard-state"),
                        str(box.layout.dir / "cdi"), folder / "node")


def registrations(box) -> int:
    """How often kubelet has registered the agent's DRA plugin (the agent's log says each)."""
    log = Path(next(s.log for s in box.state.started if s.name == AGENT)).read_text()
    return log.count(f"{DRIVER}: registered through the plugin watcher")


def two_pairs_template(rails: tuple[int, ...]) -> dict:
    """Per pair gpu-i and nic-i (a VF on rail `rails[i]`) under one PCIe switch."""
    requests, constraints = [], []
    for i, rail in enumerate(rails):
        requests.append({"name": f"gpu-{i}", "exactly": {"deviceClassName": "railyard-gpu"}})
        requests.append({"name": f"nic-{i}", "exactly": {
            "deviceClassName": "railyard-vf",
            "selectors": [{"cel": {"expression":
                f'device.attributes["{DRIVER}"].rail == {rail}'}}]}})
        constraints.append({"requests": [f"gpu-{i}", f"nic-{i}"],
                            "matchAttribute": f"{DRIVER}/pcieSwitch"})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "two-pairs"},
            "spec": {"spec": {"devices": {"requests": requests, "constraints": constraints}}}}


def env_of(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line.split(" ")[0])


def start_pod(box, ns: str, name: str, rails: tuple[int, int], *,
              command: str = SHOW) -> None:
    """A pod whose one claim comes from a two-pair template on `rails`."""
    claim_pod(box, ns, name, two_pairs_template(rails), command=command)


def pinned_template(node: Node, claim: dict) -> dict:
    """A template asking, request by request, for exactly the devices `claim` was given (by
    their standard `pciBusID`: CEL sees no device name)."""
    pci = {device_name(d.pci_address): d.pci_address
           for d in (*node.topology.gpus, *(v for n in node.topology.nics for v in n.vfs))}
    domain, attribute = PCI_BUS_ID.split("/")
    requests = [{"name": r["request"], "exactly": {
        "deviceClassName": "railyard-gpu" if r["request"].startswith("gpu") else "railyard-vf",
        "selectors": [{"cel": {"expression":
            f'device.attributes["{domain}"].{attribute} == "{pci[r["device"]]}"'}}]}}
        for r in claim["status"]["allocation"]["devices"]["results"]]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "pinned"},
            "spec": {"spec": {"devices": {"requests": requests}}}}


def claim_pod(box, ns: str, name: str, template: dict, *, command: str = SHOW,
              **spec: Any) -> None:
    """A pod running `command` whose one claim comes from `template` (named `<name>-pairs`);
    `spec`: more of the pod's spec (a serviceAccountName)."""
    template = {**template, "metadata": {"name": f"{name}-pairs"}}
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(template))
    manifest = pod(name, ["sh", "-c", command], **spec)
    manifest["spec"]["resourceClaims"] = [{"name": "pairs",
                                           "resourceClaimTemplateName": f"{name}-pairs"}]
    manifest["spec"]["containers"][0]["resources"] = {"claims": [{"name": "pairs"}]}
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))


def allocated_claim(box, ns: str, pod_name: str | None = None) -> dict:
    """The namespace's one claim (or pod `pod_name`'s) once kube-scheduler allocated it."""
    def claim() -> dict | None:
        items = [c for c in get(box, "resourceclaims", "-n", ns)["items"] if pod_name is None
                 or any(o["name"] == pod_name for o in c["metadata"].get("ownerReferences", []))]
        return items[0] if items and "allocation" in items[0].get("status", {}) else None
    return wait_for("kube-scheduler to allocate the claim", claim, timeout=60)


def claim_vfs(node: Node, claim: dict) -> list[tuple[int, object]]:
    """The claim's VFs in result order, each with its rail (compute NIC index)."""
    by_name = {device_name(v.pci_address): (n.rail, v) for n in node.topology.nics
               for v in n.vfs}
    return [by_name[r["device"]] for r in claim["status"]["allocation"]["devices"]["results"]
            if r["request"].startswith("nic")]
