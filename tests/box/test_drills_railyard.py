"""Drills on Railyard in the box (`with_railyard=True`): its agent restarted under a pod being
created, its extender killed mid-run, a PF losing its link, and pods of different shapes sharing a
node — each on the real kube-scheduler, kubelet and containerd. One box of their own: the drills
restart and break things the other box tests rely on."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

from railyard.allocation.types import Allocation
from railyard.records.allocation import decode_allocation
from support.box import get, kubebox, namespace, phase, pod, running_box, wait_for

pytestmark = [pytest.mark.root, pytest.mark.box]

ALLOCATION = "railyard.dev/allocation"
LINKS = "ip -o link"


@pytest.fixture(scope="module")
def railyard_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubebox.Box]:
    """The box's own dgx-h100 node (a PF per GPU, 2 VFs per PF: 8 GPUs, 16 VFs)."""
    with running_box(tmp_path_factory.mktemp("railyard-drills"), with_railyard=True) as running:
        yield running


@pytest.fixture
def ns(railyard_box) -> Iterator[str]:
    """A namespace whose pods are gone (their devices back) before the next drill starts."""
    name = namespace(railyard_box)
    yield name
    railyard_box.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s")


def asking(name: str, command: list[str], *, gpus: int = 0, vfs: int = 0) -> dict:
    manifest = pod(name, command)
    limits = {"nvidia.com/gpu": gpus, "railyard.dev/vf": vfs}
    manifest["spec"]["containers"][0]["resources"] = {
        "limits": {k: str(v) for k, v in limits.items() if v}}
    return manifest


def sleeping(name: str, **limits: int) -> dict:
    return asking(name, ["sleep", "3600"], **limits)


def apply(box, ns: str, manifest: dict) -> None:
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))


def running(box, ns: str, *names: str, timeout: float = 120.0) -> None:
    for name in names:
        try:
            wait_for(f"pod {name} to run", lambda n=name: phase(box, ns, n) == "Running",
                     timeout=timeout)
        except pytest.fail.Exception:
            listed = get(box, "events", "-n", ns, "--field-selector",
                         f"involvedObject.name={name}")["items"]
            said = [f"{e['reason']}: {e['message']}" for e in listed]
            pytest.fail(f"pod {name} is not running; its events: {said}")


def allocation_of(box, ns: str, name: str) -> Allocation:
    return decode_allocation(get(box, "pod", name, "-n", ns)["metadata"]["annotations"][ALLOCATION])


def devices(allocation: Allocation) -> set[str]:
    """Every device the allocation holds, by PCI address."""
    return {g.pci_address for g in allocation.all_gpus} | {
        n.pci_address for n in allocation.all_nics}


def host_macs(box) -> dict[str, str]:
    out = kubebox.run(box.in_box(["ip", "-j", "link", "show"])).stdout
    return {link["ifname"]: link.get("address", "") for link in json.loads(out)}


def links_inside(log: str) -> dict[str, str]:
    """`ip -o link` lines by interface name."""
    return {line.split(":")[1].strip().split("@")[0]: line for line in log.splitlines()
            if ": <" in line}


def extender(box, path: str) -> dict:
    url = f"http://{box.layout.node_ip}:{kubebox.EXTENDER_PORT}{path}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def holdings(box) -> list[dict]:
    return sorted(extender(box, "/allocations")["pods"], key=lambda p: p["uid"])


def listening(box) -> list[dict]:
    """The holdings, or none while the extender is not listening yet."""
    try:
        return holdings(box)
    except OSError:  # URLError: connection refused while it starts
        return []


def events(box, ns: str, name: str, reason: str) -> str:
    listed = get(box, "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")
    return " ".join(e["message"] for e in listed["items"] if e["reason"] == reason)


def node_events(box) -> list[dict]:
    """The Node's Events: the agent writes them in `default`, as kubelet does."""
    return get(box, "events", "-n", "default", "--field-selector",
               f"involvedObject.kind=Node,involvedObject.name={kubebox.NODE_NAME}")["items"]


def node_told(box, reason: str, before: Collection[str]) -> str:
    """The messages of the Node's Events with `reason`, but those named in `before`."""
    return " ".join(e["message"] for e in node_events(box)
                    if e["reason"] == reason and e["metadata"]["name"] not in before)


def agent_serving(box) -> bool:
    """The agent's CNI socket is back and kubelet sees its devices again."""
    allocatable = get(box, "node", kubebox.NODE_NAME)["status"].get("allocatable", {})
    return box.cni_socket.exists() and int(allocatable.get("railyard.dev/vf", "0")) > 0


def test_agent_restarted_between_allocate_and_the_cni_add_gives_the_pod_exactly_its_vfs(
        railyard_box, ns):
    """The CNI ADD is held back deterministically, with kubelet's Allocate already answered:
    the agent's CNI socket is moved aside (the agent keeps serving kubelet's device plugins on
    their own sockets), so the pod is scheduled, kubelet calls Allocate at admission, and the
    sandbox's ADD finds no service ("railyard CNI service unreachable", a try-again error kubelet
    reports as FailedCreatePodSandBox and retries). That event proves the pod sits between
    Allocate and a successful ADD. Then the agent restarts (a new process: socket recreated,
    plugins registered again) and kubelet's retry reaches it: the pod runs with exactly the VFs
    of its Allocation, named net1, net1-1 in pair order."""
    box = railyard_box
    before = host_macs(box)
    aside = Path(f"{box.cni_socket}.aside")
    kubebox.run(box.on_node(["mv", str(box.cni_socket), str(aside)]))
    try:
        apply(box, ns, asking("held", ["sh", "-c", LINKS], gpus=2, vfs=2))
        message = wait_for("the sandbox's ADD to find no CNI service",
                           lambda: events(box, ns, "held", "FailedCreatePodSandBox"), timeout=90)
        assert "railyard CNI service unreachable" in message, message
        assert phase(box, ns, "held") == "Pending"
        box.restart("railyard-agent")
        wait_for("the restarted agent to serve", lambda: agent_serving(box), timeout=90)
    finally:
        kubebox.run(box.on_node(["rm", "-f", str(aside)]))
    wait_for("the pod to succeed", lambda: phase(box, ns, "held") == "Succeeded", timeout=180)

    allocation = allocation_of(box, ns, "held")
    vfs = [pair.nic for pair in allocation.pairs]
    assert len(vfs) == 2
    inside = links_inside(box.kubectl("logs", "-n", ns, "held"))
    for name, vf in zip(("net1", "net1-1"), vfs, strict=True):
        assert before[vf.netdev] in inside[name], (name, vf.netdev, inside)
    assert not {n for n in inside if n.startswith("net1")} - {"net1", "net1-1"}, inside


def test_extender_killed_and_restarted_keeps_holdings_and_never_holds_a_device_twice(
        railyard_box, ns):
    box = railyard_box
    for name in ("a", "b"):
        apply(box, ns, sleeping(name, gpus=2, vfs=2))
    running(box, ns, "a", "b")
    earlier = {name: allocation_of(box, ns, name) for name in ("a", "b")}
    held = holdings(box)
    assert {p["name"] for p in held} == {"a", "b"}

    entry = next(s for s in box.state.started if s.name == "railyard-scheduler")
    os.kill(entry.pid, signal.SIGKILL)
    wait_for("the extender to die", lambda: not kubebox._alive(entry.pid), timeout=10)
    box.restart("railyard-scheduler")  # its pid is gone: this starts it with the same argv
    wait_for("the restarted extender's ledger", lambda: len(listening(box)) == len(held),
             timeout=60)
    assert holdings(box) == held

    for name in ("c", "d"):
        apply(box, ns, sleeping(name, gpus=2, vfs=2))
    running(box, ns, "c", "d")
    for name, allocation in earlier.items():
        assert allocation_of(box, ns, name) == allocation
        assert phase(box, ns, name) == "Running"
    everything = {name: devices(allocation_of(box, ns, name)) for name in "abcd"}
    for name, mine in everything.items():
        others = set().union(*(d for n, d in everything.items() if n != name))
        assert not mine & others, (name, mine & others)
    assert {p["name"] for p in holdings(box)} == set("abcd")


def test_a_pf_link_down_marks_its_vfs_unhealthy_and_new_pods_go_elsewhere(railyard_box, ns):
    """Both halves of a link-down: the tree's `operstate` the agent reads, and the stand-in
    link itself. One PF carries the running pod's first VF, another is free. The agent tells
    it on the Node: a RailyardDeviceUnhealthy Event naming the PFs and their VFs, and
    RailyardDeviceHealthy once the links are back."""
    box = railyard_box
    before = {e["metadata"]["name"] for e in node_events(box)}
    apply(box, ns, sleeping("first", gpus=2, vfs=2))
    running(box, ns, "first")
    held = allocation_of(box, ns, "first")
    tree = box.node_sysfs.parent
    topology = get(box, "nodetopologies", kubebox.NODE_NAME)
    nics = {n["pciAddress"]: n for n in topology["spec"]["nics"]}
    used = {v.pf_pci_address for v in held.vfs}
    down = [held.vfs[0].pf_pci_address, next(
        p for p in sorted(nics) if p not in used and nics[p].get("vfs"))]  # not a storage NIC
    lost = {v["pciAddress"] for p in down for v in nics[p]["vfs"]} - {
        v.pci_address for v in held.vfs}

    def link(pf: str, state: str) -> None:
        netdev = nics[pf]["netdev"]
        oper = tree / "sys/bus/pci/devices" / pf / "net" / netdev / "operstate"
        oper.write_text(f"{state}\n")
        kubebox.run(box.in_box(["ip", "link", "set", netdev, state]))

    try:
        for pf in down:
            link(pf, "down")
        status = wait_for("the link-down in the NodeTopology", lambda: (
            s := get(box, "nodetopologies", kubebox.NODE_NAME).get("status") or {}
        ).get("health") == "Degraded" and s, timeout=60)
        unhealthy = {d["pciAddress"] for d in status["unhealthyDevices"]}
        assert unhealthy >= lost | set(down), unhealthy
        # The Node's Events name both PFs and all their VFs, the pod's among them.
        named = [f"PF {pf}" for pf in down] + [f"VF {v['pciAddress']}" for pf in down
                                               for v in nics[pf]["vfs"]]
        told = wait_for("the link-down in the Node's events", lambda: (
            m := node_told(box, "RailyardDeviceUnhealthy", before)) and all(
                n in m for n in named) and m, timeout=60)
        assert "link is down" in told, told
        node_uid = get(box, "node", kubebox.NODE_NAME)["metadata"]["uid"]
        for e in node_events(box):
            if e["reason"] == "RailyardDeviceUnhealthy" and e["metadata"]["name"] not in before:
                assert e["type"] == "Warning" and e["involvedObject"]["uid"] == node_uid, e
        # kubelet counts healthy VFs, held or not: the two PFs' four VFs are out.
        wait_for("kubelet to count the VFs out", lambda: int(get(
            box, "node", kubebox.NODE_NAME)["status"]["allocatable"]["railyard.dev/vf"]) == 16 - 4,
            timeout=60)

        # Railyard keeps a VF-only pod on one NUMA node: 3 VFs fit beside the link-down.
        apply(box, ns, sleeping("fits", vfs=3))
        running(box, ns, "fits", timeout=60)
        placed = {n.pci_address for n in allocation_of(box, ns, "fits").vfs}
        assert len(placed) == 3 and not placed & lost and not placed & devices(held)
        # 16 VFs: 5 held, 3 free ones lost to the link-down, 8 healthy and free: a pod asking
        # 11 can only be placed on the lost ones, and must stay Pending.
        apply(box, ns, sleeping("greedy", vfs=11))
        time.sleep(20)
        bound = events(box, ns, "greedy", "Allocated")
        assert not any(pci in bound for pci in lost), f"placed on a down PF's VFs: {bound}"
        assert phase(box, ns, "greedy") == "Pending"
        assert phase(box, ns, "first") == "Running"
        assert allocation_of(box, ns, "first") == held
    finally:
        for pf in down:
            link(pf, "up")
    wait_for("the links back up in the NodeTopology", lambda: (get(
        box, "nodetopologies", kubebox.NODE_NAME).get("status") or {}).get("health") == "Healthy",
        timeout=60)
    # A device's Event is at most one per 30 s (kubelet.health_events): the recovery may wait
    # out what is left of the link-down's quiet time.
    wait_for("the links back up in the Node's events", lambda: (
        m := node_told(box, "RailyardDeviceHealthy", before)) and all(
            n in m for n in named), timeout=90)


def test_a_four_by_four_pod_and_a_vf_only_pod_share_the_node(railyard_box, ns):
    box = railyard_box
    apply(box, ns, sleeping("four", gpus=4, vfs=4))
    apply(box, ns, sleeping("vfs", vfs=2))
    running(box, ns, "four", "vfs")
    four, vfs = allocation_of(box, ns, "four"), allocation_of(box, ns, "vfs")
    assert len(four.all_gpus) == 4 and len(four.vfs) == 4
    assert not vfs.all_gpus and len(vfs.vfs) == 2
    assert not devices(four) & devices(vfs)
