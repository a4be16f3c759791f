"""The box runs real Kubernetes: pods through the real kube-scheduler, kubelet and containerd,
the scheduler's reasons, kwok nodes at scale, and a clean `down`."""

from __future__ import annotations

import json
import time

import pytest

from railyard.discovery.discover import discover
from railyard.records.topology import topology_to_json
from support.box import (
    KWOK_NODES,
    get,
    kubebox,
    namespace,
    phase,
    pod,
    run_to_success,
    wait_for,
)

pytestmark = [pytest.mark.root, pytest.mark.box]


def sandboxes(box) -> list[str]:
    """Pod sandbox containers containerd holds (the pause containers)."""
    out = kubebox.run(box._ctr("containers", "list", "-q")).stdout
    return [c for c in out.split() if c]


def box_links(box) -> list[str]:
    out = kubebox.run(box.in_box(["ip", "-o", "link", "show", "type", "veth"])).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def test_a_plain_pod_runs_to_succeeded_and_leaves_nothing(box):
    ns = namespace(box)
    links_before = set(box_links(box))
    log = run_to_success(box, ns, pod("echo", ["echo", "hello from the box"]))
    assert log.strip() == "hello from the box"
    assert get(box, "pod", "echo", "-n", ns)["spec"]["nodeName"] == kubebox.NODE_NAME
    box.kubectl("delete", "pod", "echo", "-n", ns, "--wait=true")
    wait_for("the sandbox to go", lambda: not sandboxes(box))
    netns_dir = box.layout.run_dir / "containerd"
    assert not [p for p in netns_dir.rglob("cni-*") if p.is_file()], "a pod netns was left"
    wait_for("the pod's veth to go", lambda: set(box_links(box)) == links_before)


def test_a_pod_asking_for_a_resource_no_node_offers_stays_pending(box):
    ns = namespace(box)
    wanting = pod("wanting", ["true"])
    wanting["spec"]["containers"][0]["resources"] = {"limits": {"example.com/nothing": "1"}}
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(wanting))

    def unschedulable():
        status = get(box, "pod", "wanting", "-n", ns).get("status", {})
        return next((c for c in status.get("conditions", [])
                     if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"), None)

    condition = wait_for("the scheduler's reason", unschedulable, timeout=60)
    assert "Insufficient example.com/nothing" in condition["message"]
    assert phase(box, ns, "wanting") == "Pending"


def test_kwok_nodes_are_ready_and_take_a_thousand_pods(box):
    nodes = get(box, "nodes", "-l", "type=kwok")["items"]
    assert len(nodes) == KWOK_NODES
    assert all(n["status"]["allocatable"]["nvidia.com/gpu"] == "8" for n in nodes)
    ns = namespace(box)
    template = pod("small", ["true"])["spec"]
    template["restartPolicy"] = "Always"
    template["nodeSelector"] = {"type": "kwok"}
    template["tolerations"] = [{"key": "kwok.x-k8s.io/node", "operator": "Exists",
                                "effect": "NoSchedule"}]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "small"},
        "spec": {
            "replicas": 1000,
            "selector": {"matchLabels": {"app": "small"}},
            "template": {"metadata": {"labels": {"app": "small"}}, "spec": template},
        },
    }
    started = time.monotonic()
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(deployment))

    def bound() -> int:
        pods = get(box, "pods", "-n", ns)["items"]
        return len([p for p in pods if p["spec"].get("nodeName", "").startswith("kwok-node-")])

    wait_for("1000 pods bound", lambda: bound() == 1000, timeout=300, every=2)
    kubebox.say(f"1000 pods bound to kwok nodes in {time.monotonic() - started:.1f} s")
    per_node = {}
    for p in get(box, "pods", "-n", ns)["items"]:
        per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + 1
    assert max(per_node.values()) <= 110  # the kwok nodes' pod capacity held
    box.kubectl("delete", "namespace", ns, "--wait=false")


def test_a_pod_reaches_the_apiserver_through_the_kubernetes_service(box):
    """kube-proxy routes the `kubernetes` Service's ClusterIP to the apiserver: busybox's wget
    speaks plain HTTP there and gets the TLS server's "400" back, proving the path."""
    ns = namespace(box)
    command = ["sh", "-c", f"wget -S -O- http://{kubebox.SERVICE_IP}:443/ 2>&1; true"]
    assert "HTTP/1.0 400 Bad Request" in run_to_success(box, ns, pod("svc", command))


def test_the_node_has_a_stand_in_for_each_netdev_discovery_finds_in_its_sysfs(box):
    topology = topology_to_json(discover(box.node_sysfs).topology)
    expected = kubebox.netdev_stand_ins(topology)
    assert len(expected) >= 16  # dgx-h100: 8 compute PFs with 2 VFs each, and more
    out = kubebox.run(box.in_box(["ip", "-o", "link", "show"])).stdout
    present = {}
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        present[name] = line.split("link/ether ")[1].split()[0] if "link/ether" in line else ""
    assert {name: present.get(name) for name in expected} == expected
