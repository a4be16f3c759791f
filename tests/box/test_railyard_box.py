"""Railyard on the real components (`hack/box up --with-railyard`): the real kube-scheduler calls
Railyard's extender, which records the Allocation on the pod and binds it; the real kubelet asks
Railyard's device plugins; containerd runs the sandbox and calls railyard-cni chained after the
bridge. One decision, honoured at every hop."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from railyard.records.allocation import decode_allocation
from support.box import (
    get,
    kubebox,
    namespace,
    phase,
    pod,
    run_to_success,
    running_box,
    wait_for,
)

pytestmark = [pytest.mark.root, pytest.mark.box]

SHOW = ("env | sort; ip -o link; ls /dev/infiniband; "
        "echo '<pairs>'; cat /run/railyard/pairs.json; echo '</pairs>'")


@pytest.fixture(scope="module", params=[("dgx-h100", "chained"), ("hgx-h100-4nic", "chained"),
                                        ("dgx-h100", "multus")], ids="-".join)
def railyard_box(request, tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubebox.Box]:
    """A box running Railyard on a node of this hardware profile (a PF per GPU on dgx-h100; two
    GPUs per PF on hgx-h100-4nic), 2 VFs per PF; railyard-cni chained after the bridge, or
    reached through Multus and a NetworkAttachmentDefinition."""
    profile, network = request.param
    folder = tmp_path_factory.mktemp(f"railyard-{profile}-{network}")
    kubebox.run([*kubebox.railyard_command(), "fixture", "--profile", profile, "--vfs-per-pf", "2",
                 str(folder / "node")])
    with running_box(folder / "box", node_sysfs=folder / "node" / "sys", with_railyard=True,
                     multus=network == "multus") as running:
        yield running


def asking(box, ns: str, name: str, command: list[str], **limits: int) -> dict:
    """A pod asking GPUs and VFs by limits only; through Multus, it also names the attachment."""
    manifest = pod(name, command)
    manifest["spec"]["containers"][0]["resources"] = {"limits": {
        {"gpus": "nvidia.com/gpu", "vfs": "railyard.dev/vf"}[k]: v for k, v in limits.items()}}
    if box.multus:
        manifest["metadata"]["annotations"] = {
            "k8s.v1.cni.cncf.io/networks": box.network_attachment(ns)}
    return manifest


def host_links(box) -> dict[str, tuple[str, str, str]]:
    """The node's links by name: (MAC, MTU, state), as `ip -j link` reports them."""
    out = kubebox.run(box.in_box(["ip", "-j", "link", "show"])).stdout
    return {link["ifname"]: (link.get("address", ""), str(link["mtu"]), link["operstate"])
            for link in json.loads(out)}


def env_of(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line.split(" ")[0])


def test_one_decision_honoured_at_every_hop(railyard_box):
    box = railyard_box
    before = host_links(box)
    ns = namespace(box)
    log = run_to_success(box, ns, asking(box, ns, "train", ["sh", "-c", SHOW], gpus=2, vfs=2))

    record = get(box, "pod", "train", "-n", ns)
    allocation = decode_allocation(record["metadata"]["annotations"]["railyard.dev/allocation"])
    assert record["spec"]["nodeName"] == allocation.node == kubebox.NODE_NAME
    assert allocation.decided_by == "scheduler"
    assert len(allocation.pairs) == 2
    vfs = [pair.nic for pair in allocation.pairs]

    env = env_of(log)
    assert env["NCCL_IB_HCA"] == "=" + ",".join(f"{v.rdma_device}:1" for v in vfs)
    assert env["PCIDEVICE_RAILYARD_DEV_VF"] == ",".join(v.pci_address for v in vfs)
    pairs = json.loads(env["RAILYARD_PAIRS"])
    assert [p["gpu"]["pciAddress"] for p in pairs] == [
        pair.gpu.pci_address for pair in allocation.pairs]
    assert [p["nic"]["pciAddress"] for p in pairs] == [v.pci_address for v in vfs]

    assert env["UCX_NET_DEVICES"] == ",".join(f"{v.rdma_device}:1" for v in vfs)
    # The pair file the agent mounted: the same pairs, and the names the CNI gave the VFs.
    mounted = json.loads(log.split("<pairs>", 1)[1].split("</pairs>", 1)[0])
    assert mounted["pod"]["name"] == "train" and mounted["container"] == "main"
    assert [(p["gpu"]["pciAddress"], p["nic"]["pciAddress"], p["nic"]["podNetdev"])
            for p in mounted["pairs"]] == [
        (pair.gpu.pci_address, pair.nic.pci_address, name)
        for pair, name in zip(allocation.pairs, ("net1", "net1-1"), strict=True)]

    # Inside the pod: the VFs, named by pair order, each with its own host MAC.
    inside = {line.split(":")[1].strip().split("@")[0]: line for line in log.splitlines()
              if ": <" in line}
    for name, vf in zip(("net1", "net1-1"), vfs, strict=True):
        assert before[vf.netdev][0] in inside[name], (name, vf.netdev)
    # The verbs nodes Allocate named exist in the container (the box's stand-ins for them).
    info = json.loads(env["PCIDEVICE_RAILYARD_DEV_VF_INFO"])
    listed = set(log.split())
    for vf in vfs:
        assert info[vf.pci_address]["rdma"]["uverbs"].rsplit("/", 1)[1] in listed
    assert "rdma_cm" in listed

    # While the pod has run, its VFs are not on the node; once it is deleted they all come back.
    box.kubectl("delete", "pod", "train", "-n", ns, "--wait=true")
    wait_for("the pod to be gone", lambda: not get(box, "pods", "-n", ns)["items"])
    after = host_links(box)
    changed = {name: (before.get(name), after.get(name)) for name in {*before, *after}
               if before.get(name) != after.get(name) and name != "cni0"}  # the pod network's
    assert not changed, changed


def test_a_pod_that_cannot_fit_stays_pending_with_railyards_reason(railyard_box):
    box = railyard_box
    ns = namespace(box)
    box.kubectl("apply", "-n", ns, "-f", "-",
                input=json.dumps(asking(box, ns, "greedy", ["true"], gpus=1, vfs=40)))

    def reason() -> str:
        events = get(box, "events", "-n", ns, "--field-selector", "involvedObject.name=greedy")
        return " ".join(e["message"] for e in events["items"] if e["reason"] == "FailedScheduling")

    message = wait_for("kube-scheduler's FailedScheduling event", reason, timeout=60)
    assert "VFs" in message  # Railyard's own words, passed on by kube-scheduler
    assert phase(box, ns, "greedy") == "Pending"


def test_a_completed_pod_gives_its_devices_to_the_next(railyard_box):
    box = railyard_box
    ns = namespace(box)
    run_to_success(box, ns, asking(box, ns, "first", ["true"], gpus=8, vfs=8))
    run_to_success(box, ns, asking(box, ns, "second", ["true"], gpus=8, vfs=8))
    first, second = (decode_allocation(get(box, "pod", name, "-n", ns)["metadata"][
        "annotations"]["railyard.dev/allocation"]) for name in ("first", "second"))
    assert {p.gpu.pci_address for p in first.pairs} == {p.gpu.pci_address for p in second.pairs}
