"""`railyard explain` against the box's real kube-apiserver, with Railyard running on it: a
paired pod's record, its node's NodeTopology and kube-scheduler's Scheduled event; a pod that
cannot fit, Pending with the extender's reason as kube-scheduler passed it on."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from support.box import kubebox, namespace, phase, pod, run_to_success, running_box, wait_for

pytestmark = [pytest.mark.root, pytest.mark.box]


@pytest.fixture(scope="module")
def explained_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubebox.Box]:
    folder = tmp_path_factory.mktemp("railyard-explain")
    kubebox.run([*kubebox.railyard_command(), "fixture", "--profile", "dgx-h100",
                 "--vfs-per-pf", "2", str(folder / "node")])
    with running_box(folder / "box", node_sysfs=folder / "node" / "sys",
                     with_railyard=True) as running:
        yield running


def _asking(name: str, command: list[str], gpus: int, vfs: int) -> dict:
    manifest = pod(name, command)
    manifest["spec"]["containers"][0]["resources"] = {"limits": {
        "nvidia.com/gpu": gpus, "railyard.dev/vf": vfs}}
    return manifest


def _explain(box, target: str) -> str:
    r = subprocess.run([sys.executable, "-m", "railyard.cli.main", "explain", target,
                        "--kubeconfig", str(box.layout.admin_kubeconfig)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_explain_says_who_decided_the_pairs_and_the_nodes_state(explained_box):
    box = explained_box
    ns = namespace(box)
    run_to_success(box, ns, _asking("train", ["true"], gpus=2, vfs=2))
    out = _explain(box, f"{ns}/train")
    assert f"pod {ns}/train (uid " in out and f"on node {kubebox.NODE_NAME}" in out
    assert "asks for nvidia.com/gpu=2, railyard.dev/vf=2" in out
    assert "record: decided by the extender (decidedBy: scheduler)" in out
    assert out.count("  pair ") == 2 and "worst pair distance" in out
    assert f"node {kubebox.NODE_NAME}: GPUs " in out
    assert f"kube-scheduler: Successfully assigned {ns}/train to {kubebox.NODE_NAME}" in out


def test_explain_says_why_a_pod_is_pending(explained_box):
    box = explained_box
    ns = namespace(box)
    box.kubectl("apply", "-n", ns, "-f", "-",
                input=json.dumps(_asking("greedy", ["true"], gpus=1, vfs=40)))

    def failed() -> str:
        out = _explain(box, f"{ns}/greedy")
        return out if "FailedScheduling" in out else ""

    out = wait_for("kube-scheduler's FailedScheduling event in explain", failed, timeout=60)
    assert phase(box, ns, "greedy") == "Pending"
    assert "on no node yet" in out and "record: none" in out
    assert "VFs" in out.split("kube-scheduler (the extender's reasons", 1)[1]
    assert "1 node(s) publish a NodeTopology:" in out
