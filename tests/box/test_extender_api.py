"""The extender on the API, against the box's real kube-scheduler and kube-apiserver: kwok
nodes carry NodeTopology CRs from `dgx-h100` fixture trees, the real kube-scheduler calls
`railyard scheduler --kubeconfig` for filter and bind (the shipped configuration: filter
ranks, decision 0104), and the pods come out
with the Allocation annotation and a node.

The extender runs as a subprocess inside the box's network namespace, listening on
127.0.0.1: kube-scheduler runs there too, so nothing is opened on the host veth, and it is
where `hack/box up --with-railyard` will run it. The box is this module's own, since its
kube-scheduler needs an `extenders:` entry the session box does not have.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.allocation.request import Request
from railyard.allocation.types import Infeasible
from railyard.discovery.discover import discover
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import DGX_H100, build_topology, profile
from railyard.kube.client import ApiError, ApiUnavailable, Client
from railyard.kube.config import load_kubeconfig
from railyard.records.allocation import decode_allocation
from railyard.scheduler.cluster_api import ClusterSync, PodBinder
from railyard.scheduler.cluster_file import BoundPod
from railyard.scheduler.state import ClusterState
from railyard.topology.model import NodeTopology
from support.box import (
    get,
    install_topology_crd,
    kubebox,
    namespace,
    pod,
    publish_topologies,
    wait_for,
)

pytestmark = [pytest.mark.root, pytest.mark.box, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PORT = 18888
KWOK_NODES = 3
VFS_PER_PF = 2  # dgx-h100: 8 RDMA PFs, so 16 VFs per node


class Extender:
    """`railyard scheduler --kubeconfig` as a process in the box's network namespace."""

    def __init__(self, box, log: Path, options: tuple[str, ...] = ()) -> None:
        self.box, self.log, self.options = box, log, options
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.box.in_box([
                sys.executable, "-m", "railyard", "scheduler",
                "--kubeconfig", str(self.box.layout.admin_kubeconfig),
                "--listen", f"127.0.0.1:{PORT}", *self.options]),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def listening() -> bool:
            assert self.process is not None and self.process.poll() is None, self.log.read_text()
            return b"extender listening" in self.log.read_bytes()[offset:]
        wait_for("the extender to list and listen", listening, timeout=60)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def get(self, path: str) -> dict:
        return json.loads(self.get_text(path))

    def calls(self, verb: str) -> float:
        """How many `verb` requests it has answered, from its /metrics."""
        found = re.search(rf'^railyard_extender_request_duration_seconds_count\{{verb="{verb}"\}} '
                          r"(\S+)$", self.get_text("/metrics"), re.M)
        return float(found.group(1)) if found else 0.0

    def get_text(self, path: str) -> str:
        out = subprocess.run(self.box.in_box([
            sys.executable, "-c", "import sys, urllib.request; sys.stdout.write(urllib.request"
            f".urlopen('http://127.0.0.1:{PORT}{path}').read().decode())"]),
            capture_output=True, text=True, check=True)
        return out.stdout


@contextmanager
def extender_box(folder: Path, nodes: int, topology_of: Callable[[str], NodeTopology],
                 config_file: str = "kube-scheduler-config.yaml",
                 options: tuple[str, ...] = ()) -> Iterator[tuple[object, Extender]]:
    """A box of `nodes` kwok nodes whose kube-scheduler calls the extender as
    deploy/`config_file` says, each node's NodeTopology CR published as `topology_of(node)`
    gives it, and the extender running with `options`."""
    import os

    if os.geteuid() != 0:
        pytest.skip("the box needs root: network namespaces, mounts and cgroups")
    config = yaml.safe_load((ROOT / "deploy" / config_file).read_text())
    config.pop("clientConnection")
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{PORT}/"
    (folder / "scheduler.yaml").write_text(yaml.safe_dump(config))
    box = kubebox.Box(folder / "box", kwok_nodes=nodes,
                      scheduler_config=folder / "scheduler.yaml")
    box.up()
    extender = Extender(box, folder / "extender.log", options)
    try:
        install_topology_crd(box)
        publish_topologies(box, (topology_of(f"kwok-node-{i}") for i in range(nodes)))
        extender.start()
        yield box, extender
    finally:
        extender.kill()
        box.down()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Extender]]:
    folder = tmp_path_factory.mktemp("extender-box")

    def discovered(node: str) -> NodeTopology:
        tree = write_fixture(DGX_H100, folder / "trees" / node, VFS_PER_PF, node=node)
        return discover(tree).topology
    # With the `Allocated` Events (off by default, decision 0116): a test reads them.
    with extender_box(folder, KWOK_NODES, discovered,
                      options=("--allocated-events",)) as running:
        yield running


def gpu_pod(name: str, gpus: int, vfs: int, node: str | None = None) -> dict:
    """A pod asking GPUs and VFs by limits only, for the kwok nodes."""
    manifest = pod(name, ["sleep", "3600"], tolerations=[
        {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
        nodeSelector={"type": "kwok", **({"kubernetes.io/hostname": node} if node else {})})
    manifest["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": str(gpus), "railyard.dev/vf": str(vfs)}}
    return manifest


def create(box, ns: str, manifest: dict) -> None:
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))


def bound(box, ns: str, name: str, timeout: float = 60) -> dict:
    def check() -> dict | None:
        p = get(box, "pod", name, "-n", ns)
        return p if p["spec"].get("nodeName") else None
    return wait_for(f"pod {ns}/{name} to be bound", check, timeout=timeout)


def allocation_of(p: dict):
    return decode_allocation(p["metadata"]["annotations"][ALLOCATION_ANNOTATION])


def devices(p: dict) -> set[str]:
    a = allocation_of(p)
    return {g.pci_address for g in a.all_gpus} | {n.pci_address for n in a.all_nics}


def events(box, ns: str, name: str) -> list[dict]:
    return get(box, "events", "-n", ns, "--field-selector",
               f"involvedObject.name={name}")["items"]


def test_a_gpu_vf_pod_is_bound_through_the_extender_with_its_allocation(cluster):
    box, running = cluster
    ns = namespace(box)
    create(box, ns, gpu_pod("train-0", 2, 2, node="kwok-node-0"))
    p = bound(box, ns, "train-0")
    alloc = allocation_of(p)
    assert p["spec"]["nodeName"] == "kwok-node-0" == alloc.node
    assert len(alloc.pairs) == 2 and alloc.decided_by == "scheduler"
    assert len({pair.gpu.pci_address for pair in alloc.pairs}) == 2
    # The shipped configuration: one call before the bind, filter's answer already ranked.
    assert running.calls("filter") >= 1
    assert running.calls("prioritize") == 0
    told = wait_for("the Allocated event", lambda: [
        e for e in events(box, ns, "train-0") if e["reason"] == "Allocated"])
    assert told[0]["source"]["component"] == "railyard-scheduler"
    assert alloc.pairs[0].gpu.pci_address in told[0]["message"]

    create(box, ns, gpu_pod("train-1", 2, 2, node="kwok-node-0"))
    second = bound(box, ns, "train-1")
    assert second["spec"]["nodeName"] == "kwok-node-0"
    assert devices(p).isdisjoint(devices(second))


def test_a_pod_that_cannot_fit_stays_pending_with_railyards_reason(cluster):
    box, _ = cluster
    ns = namespace(box)
    create(box, ns, gpu_pod("too-many-vfs", 1, 8 * VFS_PER_PF + 4))

    def failed() -> list[str]:
        return [e["message"] for e in events(box, ns, "too-many-vfs")
                if e["reason"] == "FailedScheduling"]
    messages = wait_for("a FailedScheduling event", failed)
    # The allocator's own words, as kube-scheduler passes them on from the extender.
    topology = build_topology(profile("dgx-h100"), vfs_per_pf=VFS_PER_PF, node="kwok-node-0")
    reason = ClusterState([topology]).filter(Request(gpus=1, vfs=8 * VFS_PER_PF + 4),
                                             ["kwok-node-0"]).unresolvable["kwok-node-0"]
    assert reason.split(":")[0] in messages[-1], messages
    assert not get(box, "pod", "too-many-vfs", "-n", ns)["spec"].get("nodeName")


def test_a_pod_that_succeeds_frees_its_devices_for_the_next(cluster):
    box, extender = cluster
    ns = namespace(box)
    create(box, ns, gpu_pod("job-0", 8, 8, node="kwok-node-1"))
    first = bound(box, ns, "job-0")
    create(box, ns, gpu_pod("job-1", 8, 8, node="kwok-node-1"))
    time.sleep(3)
    assert not get(box, "pod", "job-1", "-n", ns)["spec"].get("nodeName")
    box.kubectl("patch", "pod", "job-0", "-n", ns, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"phase": "Succeeded"}}))
    second = bound(box, ns, "job-1", timeout=90)
    assert {g.pci_address for g in allocation_of(second).all_gpus} == {
        g.pci_address for g in allocation_of(first).all_gpus}
    held = {p["uid"] for p in extender.get("/allocations")["pods"]}
    assert first["metadata"]["uid"] not in held and second["metadata"]["uid"] in held


def test_a_restarted_extender_rebuilds_identical_holdings_from_the_annotations(cluster):
    box, extender = cluster
    ns = namespace(box)
    create(box, ns, gpu_pod("before", 2, 2, node="kwok-node-2"))
    before_pod = bound(box, ns, "before")
    before = sorted(extender.get("/allocations")["pods"], key=lambda p: p["uid"])
    assert before_pod["metadata"]["uid"] in {p["uid"] for p in before}
    extender.kill()
    extender.start()
    after = sorted(extender.get("/allocations")["pods"], key=lambda p: p["uid"])
    assert after == before
    create(box, ns, gpu_pod("after", 2, 2, node="kwok-node-2"))
    new = bound(box, ns, "after")
    assert devices(new).isdisjoint(devices(before_pod))


def test_a_binding_the_api_refuses_leaves_no_record_on_the_pod(cluster):
    box, _ = cluster
    ns = namespace(box)
    # Already on a node (nodeName set at creation): the Binding is refused with a conflict.
    create(box, ns, gpu_pod("placed", 1, 1) | {"spec": {
        **gpu_pod("placed", 1, 1)["spec"], "nodeName": "kwok-node-2"}})
    uid = get(box, "pod", "placed", "-n", ns)["metadata"]["uid"]
    topology = build_topology(profile("dgx-h100"), vfs_per_pf=VFS_PER_PF, node="kwok-node-0")
    state = ClusterState([topology])
    alloc = state.bind(uid, ns, "placed", "kwok-node-0", Request(gpus=1, vfs=1))
    assert not isinstance(alloc, Infeasible)

    async def try_bind(pod_uid: str) -> str:
        async with Client(load_kubeconfig(box.layout.admin_kubeconfig)) as client:
            binder = PodBinder(client, ClusterSync(state))
            try:
                await binder.bind(BoundPod(ns, "placed", pod_uid, "kwok-node-0", alloc))
            except ApiError as e:
                return f"{e.status} {e}"
            return ""

    error = asyncio.run(try_bind(uid))
    assert error.startswith("409"), error
    p = get(box, "pod", "placed", "-n", ns)
    assert ALLOCATION_ANNOTATION not in p["metadata"].get("annotations", {})
    assert p["spec"]["nodeName"] == "kwok-node-2"
    # Another pod's uid: the Binding's uid precondition refuses it; nothing is written.
    error = asyncio.run(try_bind("00000000-0000-0000-0000-000000000000"))
    assert error, error
    assert ALLOCATION_ANNOTATION not in get(box, "pod", "placed", "-n", ns)["metadata"].get(
        "annotations", {})


class _CreateAppliedLate(Client):
    """The real API server's client, except that a Binding create fails at once as a reset
    connection would, and is applied to the API server `late_s` later (`applies=False`: never):
    the window in which a create still inside the server lands after the binder read the pod
    back unbound. The late apply is the real create."""

    def __init__(self, *args: Any, late_s: float, applies: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.late_s, self.applies = late_s, applies
        self.late: asyncio.Task[Any] | None = None

    async def create(self, path: str, body: Any, type_: Any, **kwargs: Any) -> Any:
        if body.get("kind") != "Binding":
            return await super().create(path, body, type_, **kwargs)
        if self.applies:
            self.late = asyncio.ensure_future(self._apply_late(path, body, type_))
        raise ApiUnavailable(f"POST {path}: connection reset (injected by the test)")

    async def _apply_late(self, path: str, body: Any, type_: Any) -> Any:
        await asyncio.sleep(self.late_s)
        return await Client.create(self, path, body, type_)


@pytest.mark.parametrize("applies", [True, False], ids=["lands-late", "never-lands"])
def test_a_binding_applied_after_its_create_failed_never_double_grants(
        cluster, monkeypatch: pytest.MonkeyPatch, applies: bool):
    """Decision 0101, on the real API server: the Binding create fails, the pod read back has
    no node, then the server applies the create (`lands-late`) or never does. The devices stay
    held meanwhile (the next pod cannot have them); once the create can no longer land they
    stay held if it landed (the pod is on our node with our record) and are freed if not."""
    from railyard.kube.objects import Pod
    from railyard.kube.reflector import Change
    from railyard.scheduler import cluster_api

    box, _ = cluster
    ns = namespace(box)
    manifest = gpu_pod("late", 1, 1)
    manifest["spec"]["schedulerName"] = "railyard-test-nobody"  # kube-scheduler leaves it
    create(box, ns, manifest)
    uid = get(box, "pod", "late", "-n", ns)["metadata"]["uid"]
    node = "kwok-node-0"
    topology = build_topology(profile("dgx-h100"), vfs_per_pf=VFS_PER_PF, node=node)
    state = ClusterState([topology])
    alloc = state.bind(uid, ns, "late", node, Request(gpus=8, vfs=16))  # the whole node
    assert not isinstance(alloc, Infeasible)
    monkeypatch.setattr(cluster_api, "READ_BACK_DELAYS_S", (0.0,))
    monkeypatch.setattr(cluster_api, "LATE_LANDING_S", 4.0)

    def next_pod_fits() -> bool:
        return not isinstance(state.bind("next", ns, "next", node, Request(gpus=1, vfs=1)),
                              Infeasible)

    async def main() -> dict[str, Any]:
        config = load_kubeconfig(box.layout.admin_kubeconfig)
        async with _CreateAppliedLate(config, late_s=1.0, applies=applies) as client:
            sync = ClusterSync(state)
            binder = PodBinder(client, sync)
            with pytest.raises(cluster_api.WriteOutcomeUnknown, match="may still land"):
                await binder.bind(BoundPod(ns, "late", uid, node, alloc))
            assert state.pod(uid) is not None and not next_pod_fits()
            if client.late is not None:
                await client.late  # the real API server applies the Binding now
                now = await client.get(f"/api/v1/namespaces/{ns}/pods/late", Pod)
                assert now.spec.node_name == node
                sync.on_pod(Change("MODIFIED", f"{ns}/late", now))  # as the watch would
                assert not next_pod_fits(), "the late Binding's devices were given again"
            await asyncio.sleep(5.0)  # past LATE_LANDING_S: the binder's check has run
            assert not binder._settling
            return {"held": state.pod(uid) is not None, "next_fits": next_pod_fits()}

    seen = asyncio.run(main())
    p = get(box, "pod", "late", "-n", ns)
    if applies:
        assert p["spec"]["nodeName"] == node and allocation_of(p) == alloc
        assert seen == {"held": True, "next_fits": False}
    else:
        assert not p["spec"].get("nodeName")
        assert seen == {"held": False, "next_fits": True}
