"""Drills on Railyard in the box (`with_railyard=True`): its agent restarted under a pod being
created, its extender killed mid-run and mid-burst, a PF losing its link, kubelet and the agent
restarted under a running pod, the API server restarted, a pod deleted mid-admission, CNI DEL
after an agent restart, the node state folder lost, and pods of different shapes sharing a
node — each on the real kube-scheduler, kubelet and containerd. One box of their own: the drills
restart and break things the other box tests rely on."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

from railyard.allocation.types import Allocation
from railyard.kubelet.podresources import AssignedPod, PodResourcesClient
from railyard.node.state import PodRecord, StateStore
from railyard.records.allocation import decode_allocation
from support.box import (
    get,
    host_macs,
    kubebox,
    links_inside,
    namespace,
    phase,
    pod,
    running_box,
    wait_for,
)

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


def state_dir(box) -> Path:
    return box.layout.dir / "railyard-state"


def agent_records(box) -> dict[str, PodRecord]:
    """The agent's node state, read from its folder."""
    return {r.uid: r for r in StateStore(state_dir(box)).all()}


def kubelet_assigned(box, ns: str) -> dict[str, AssignedPod]:
    """Kubelet's PodResources `List`, by pod name, for the namespace."""
    socket = str(box.layout.kubelet_dir / "pod-resources/kubelet.sock")
    listed = asyncio.run(PodResourcesClient(socket).list())
    return {a.name: a for a in listed if a.namespace == ns}


def as_sets(assigned: AssignedPod) -> dict[str, dict[str, frozenset[str]]]:
    """A pod's PodResources devices without their order: kubelet lists each resource's IDs
    out of a Go map (devicemanager `getContainerDevices`), so two `List` calls may order the
    same devices differently. Pair order is the record's, never kubelet's."""
    return {c: {r: frozenset(ids) for r, ids in per.items()}
            for c, per in assigned.containers.items()}


def registrations(box) -> int:
    """How many times kubelet has registered one of the agent's plugins (its log says each;
    in the box kubelet finds them through its plugin watcher)."""
    log = box.layout.dir / "logs" / "railyard-agent.log"
    return log.read_text(errors="replace").count("registered through the plugin watcher")


def restart_agent(box) -> None:
    """Restart the agent and wait until kubelet has registered its three plugins again. A pod
    admitted before that meets kubelet holding the old endpoints' devices as unhealthy
    (UnexpectedAdmissionError: "no healthy devices present")."""
    registered = registrations(box)
    box.restart("railyard-agent")
    wait_for("kubelet to register the restarted agent's plugins", lambda: registrations(
        box) >= registered + 3 and agent_serving(box), timeout=90)
    time.sleep(2)  # the plugins' first ListAndWatch answers follow their registration


def uid_of(box, ns: str, name: str) -> str:
    return get(box, "pod", name, "-n", ns)["metadata"]["uid"]


def disjoint(box, ns: str, names: Collection[str]) -> None:
    """No device is in two of these pods' records."""
    everything = {name: devices(allocation_of(box, ns, name)) for name in names}
    for name, mine in everything.items():
        others = set().union(*(d for n, d in everything.items() if n != name))
        assert not mine & others, (name, mine & others)


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
        restart_agent(box)
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


def test_a_running_pod_survives_kubelet_and_agent_restarts_with_its_devices(railyard_box, ns):
    """kubelet is restarted with the device-plugin sockets wiped (as a node reboot of kubelet
    leaves them), then the agent: the running pod is not admitted again (no
    UnexpectedAdmissionError), its container is the same, and every account of its devices —
    its record, kubelet's PodResources, the agent's node state — is unchanged."""
    box = railyard_box
    apply(box, ns, sleeping("steady", gpus=2, vfs=2))
    running(box, ns, "steady")
    held = allocation_of(box, ns, "steady")
    uid = uid_of(box, ns, "steady")
    container = get(box, "pod", "steady", "-n", ns)["status"]["containerStatuses"][0]
    assigned = as_sets(kubelet_assigned(box, ns)["steady"])
    registered = registrations(box)
    assert registered >= 3, registered  # GPUs, VFs, PFs

    box.restart("kubelet")  # removes kubelet's device-plugin sockets before it starts again
    wait_for("the agent's plugins registered with the new kubelet",
             lambda: registrations(box) >= registered + 3, timeout=90)
    restart_agent(box)

    now = get(box, "pod", "steady", "-n", ns)["status"]
    assert now["phase"] == "Running"
    same = now["containerStatuses"][0]
    assert (same["containerID"], same["restartCount"]) == (container["containerID"], 0)
    assert not events(box, ns, "steady", "UnexpectedAdmissionError")
    assert allocation_of(box, ns, "steady") == held
    assert as_sets(kubelet_assigned(box, ns)["steady"]) == assigned
    record = wait_for("the agent's record", lambda: agent_records(box).get(uid), timeout=30)
    assert devices(record.allocation) == devices(held)
    moved = {v.netdev for v in held.vfs}
    assert not moved & set(host_macs(box)), "a VF of the running pod came back to the host"

    apply(box, ns, sleeping("next", gpus=2, vfs=2))
    running(box, ns, "next")
    disjoint(box, ns, ["steady", "next"])


def test_the_apiserver_restarted_under_running_pods_re_decides_nothing(railyard_box, ns):
    """kube-apiserver goes away and comes back: the extender's and the agent's watches resume,
    the running pod's record (and its `decidedAt`) is untouched, the extender still holds it,
    and the next pod is placed beside it."""
    box = railyard_box
    apply(box, ns, sleeping("before", gpus=2, vfs=2))
    running(box, ns, "before")
    held = allocation_of(box, ns, "before")
    uid = uid_of(box, ns, "before")

    box.restart("kube-apiserver")
    apply(box, ns, sleeping("after", gpus=2, vfs=2))
    running(box, ns, "after", timeout=180)

    assert allocation_of(box, ns, "before") == held
    holding = {p["uid"]: p for p in holdings(box)}
    assert decode_allocation(json.dumps(holding[uid]["allocation"])) == held
    disjoint(box, ns, ["before", "after"])
    assert phase(box, ns, "before") == "Running"


def test_a_pod_deleted_mid_admission_gives_every_device_back(railyard_box, ns):
    """Held between kubelet's Allocate and the CNI ADD (the agent's CNI socket moved aside, as
    in the agent-restart drill), the pod is deleted. Its devices go back everywhere: the
    extender's ledger, the agent's state, kubelet — a pod asking for the whole node (8 GPUs,
    16 VFs) then runs, and no VF was left outside the host."""
    box = railyard_box
    before = host_macs(box)
    aside = Path(f"{box.cni_socket}.aside")
    kubebox.run(box.on_node(["mv", str(box.cni_socket), str(aside)]))
    try:
        apply(box, ns, sleeping("doomed", gpus=2, vfs=2))
        message = wait_for("the sandbox's ADD to find no CNI service",
                           lambda: events(box, ns, "doomed", "FailedCreatePodSandBox"), timeout=90)
        assert "railyard CNI service unreachable" in message, message
        uid = uid_of(box, ns, "doomed")
        assert uid in {p["uid"] for p in holdings(box)}
        box.kubectl("delete", "pod", "doomed", "-n", ns, "--wait=false")
    finally:
        kubebox.run(box.on_node(["mv", str(aside), str(box.cni_socket)]))
    wait_for("the pod to be gone", lambda: not get(box, "pods", "-n", ns)["items"], timeout=120)
    wait_for("the extender to free it", lambda: uid not in {p["uid"] for p in holdings(box)},
             timeout=30)
    wait_for("the agent to forget it", lambda: uid not in agent_records(box), timeout=60)

    apply(box, ns, sleeping("everything", gpus=8, vfs=16))
    running(box, ns, "everything")
    box.kubectl("delete", "pod", "everything", "-n", ns, "--wait=true", "--timeout=120s")
    wait_for("every VF back in the host as it was",
             lambda: {n: host_macs(box).get(n) for n in before} == before, timeout=60)


def test_cni_del_after_an_agent_restart_puts_the_vfs_back(railyard_box, ns):
    """The CNI service lives in the agent: a DEL that reaches a restarted agent still puts the
    pod's VFs back under their names and MACs (the attachment records are on disk)."""
    box = railyard_box
    before = host_macs(box)
    apply(box, ns, sleeping("moved", vfs=2))
    running(box, ns, "moved")
    vfs = {v.netdev for v in allocation_of(box, ns, "moved").vfs}
    assert len(vfs) == 2 and not vfs & set(host_macs(box))

    restart_agent(box)
    box.kubectl("delete", "pod", "moved", "-n", ns, "--wait=true", "--timeout=120s")
    wait_for("the VFs back in the host", lambda: {n: host_macs(box).get(n) for n in vfs} == {
        n: before[n] for n in vfs}, timeout=60)


def test_the_node_state_folder_lost_is_rebuilt_and_says_what_it_could_not(railyard_box, ns):
    """The agent stops, its state folder goes (pod records and the CNI's attachment records),
    it starts again: the running pod's record comes back from kubelet's PodResources and the
    API, and a Warning Event on the Node names the pod and says its VFs have no attachment
    record. Kubelet, the record and the extender still agree; the next pod gets other
    devices. (The attachment records are put back before the pod goes: in the box a VF is a
    veth, which dies with the pod's namespace unless DEL brings it home.)"""
    box = railyard_box
    told_before = {e["metadata"]["name"] for e in node_events(box)}
    apply(box, ns, sleeping("survivor", gpus=2, vfs=2))
    running(box, ns, "survivor")
    held = allocation_of(box, ns, "survivor")
    uid = uid_of(box, ns, "survivor")
    lost = state_dir(box).with_name("railyard-state.lost")
    box.stop("railyard-agent")
    state_dir(box).rename(lost)
    try:
        restart_agent(box)
        record = wait_for("the rebuilt record", lambda: agent_records(box).get(uid), timeout=60)
        assert devices(record.allocation) == devices(held)
        told = wait_for("the Node's RailyardNodeStateRebuilt event", lambda: node_told(
            box, "RailyardNodeStateRebuilt", told_before), timeout=60)
        assert f"{ns}/survivor" in told and "no CNI attachment record of the NICs of" in told
        assert allocation_of(box, ns, "survivor") == held
        assigned = kubelet_assigned(box, ns)["survivor"]
        assert set(assigned.ids("railyard.dev/vf")) == {v.pci_address for v in held.vfs}

        apply(box, ns, sleeping("newcomer", gpus=2, vfs=2))
        running(box, ns, "newcomer")
        disjoint(box, ns, ["survivor", "newcomer"])
    finally:
        box.stop("railyard-agent")
        shutil.copytree(lost / "cni", state_dir(box) / "cni", dirs_exist_ok=True)
        shutil.rmtree(lost)
        restart_agent(box)


def test_extender_killed_mid_burst_of_binds_loses_no_bind_and_holds_nothing_twice(
        railyard_box, ns):
    """20 one-VF pods at once for 16 VFs; the extender is killed with SIGKILL as soon as the
    first of them is bound, and started again. kube-scheduler retries what failed: exactly 16
    run, 4 stay Pending, every bound pod's record is in the restarted extender's ledger, and
    no VF is in two records."""
    box = railyard_box
    names = [f"burst-{i:02d}" for i in range(20)]
    items = [sleeping(name, vfs=1) for name in names]
    box.kubectl("apply", "-n", ns, "-f", "-",
                input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    def bound() -> list[str]:
        return [p["metadata"]["name"] for p in get(box, "pods", "-n", ns)["items"]
                if p["spec"].get("nodeName")]

    wait_for("the first bind of the burst", bound, timeout=60, every=0.1)
    entry = next(s for s in box.state.started if s.name == "railyard-scheduler")
    os.kill(entry.pid, signal.SIGKILL)
    at_kill = len(bound())
    wait_for("the extender to die", lambda: not kubebox._alive(entry.pid), timeout=10)
    box.restart("railyard-scheduler")

    wait_for("16 pods to run", lambda: sum(
        phase(box, ns, n) == "Running" for n in names) == 16, timeout=240, every=2)
    time.sleep(5)  # nothing more is bound: there is no VF left
    placed = bound()
    assert len(placed) == 16, f"{len(placed)} bound ({at_kill} when the extender was killed)"
    disjoint(box, ns, placed)
    held = {p["name"]: p for p in holdings(box) if p["namespace"] == ns}
    assert set(held) == set(placed)
    for name in placed:
        record = decode_allocation(json.dumps(held[name]["allocation"]))
        assert record == allocation_of(box, ns, name)
    for name in set(names) - set(placed):
        assert phase(box, ns, name) == "Pending"


def test_the_extenders_port_frees_nothing_and_a_pod_without_devices_binds(railyard_box, ns):
    """With the API as the source of pods, `DELETE /pods/<uid>` does not exist: whoever
    reaches the extender's port cannot free a running pod's devices (issue 19, class 6). A pod
    asking for no Railyard device is bound like any other."""
    box = railyard_box
    apply(box, ns, sleeping("owner", gpus=1, vfs=1))
    apply(box, ns, sleeping("plain"))
    running(box, ns, "owner", "plain")
    uid = uid_of(box, ns, "owner")
    url = f"http://{box.layout.node_ip}:{kubebox.EXTENDER_PORT}/pods/{uid}"
    request = urllib.request.Request(url, method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 404
    assert uid in {p["uid"] for p in holdings(box)}
    assert phase(box, ns, "owner") == "Running"
