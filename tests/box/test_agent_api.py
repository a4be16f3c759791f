"""`railyard agent --kubeconfig` against the box's real kube-apiserver: it sees the pods bound
to its node and answers kubelet for them, reads directly a pod its watch has not delivered,
refuses to start on a pods source it cannot read, publishes its node's NodeTopology, and
writes the node's decision back to the pod when kubelet chose other devices.

Kubelet here is the fake one (tests/support/fake_kubelet.py: the real v1beta1 gRPC over unix
sockets) serving a Node object no real kubelet runs, so its pods stay Pending and the test
says which devices kubelet "chose". The last test registers with the box's real kubelet.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import yaml

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.discovery.discover import discover
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import DGX_H100
from railyard.kube.client import Client
from railyard.kube.config import load_kubeconfig
from railyard.kubelet.apipods import ApiPods
from railyard.records.allocation import decode_allocation, encode_allocation
from railyard.topology.model import NodeTopology
from support.allocations import allocation, nearest_vf
from support.box import get, install_topology_crd, kubebox, namespace, wait_for
from support.fake_kubelet import FakeKubelet

pytestmark = [pytest.mark.root, pytest.mark.box]

CMD = [sys.executable, "-m", "railyard.cli.main", "agent"]
GPU, VF, PF = "nvidia.com/gpu", "railyard.dev/vf", "railyard.dev/pf"


@pytest.fixture(scope="module")
def crd(box):
    install_topology_crd(box)
    return box


@pytest.fixture
def node(crd) -> Iterator[str]:
    """A Node object no kubelet serves: pods bound to it stay Pending for the fake kubelet."""
    name = f"agent-{uuid.uuid4().hex[:8]}"
    crd.kubectl("create", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
    yield name
    crd.kubectl("delete", "node", name, "--wait=false")


@pytest.fixture
def ns(box) -> Iterator[str]:
    name = namespace(box)
    yield name
    box.kubectl("delete", "namespace", name, "--wait=false")


def tree_for(tmp: Path, node: str) -> tuple[Path, NodeTopology]:
    root = write_fixture(DGX_H100, tmp / "root", 2, node=node)
    return root, discover(root).topology


def create_pod(box, ns: str, name: str, node: str, limits: dict[str, int],
               annotation: str | None = None) -> str:
    """A pod bound to `node` by its spec (no scheduler); its uid."""
    meta: dict = {"name": name, "namespace": ns}
    if annotation is not None:
        meta["annotations"] = {ALLOCATION_ANNOTATION: annotation}
    box.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "containers": [{
            "name": "main", "image": "railyard.test/busybox:box",
            "resources": {"limits": {r: str(n) for r, n in limits.items()}}}]}}))
    return box.kubectl("get", "pod", name, "-n", ns, "-o", "jsonpath={.metadata.uid}")


@asynccontextmanager
async def running_agent(box, tmp: Path, node: str, tree: Path,
                        kubeconfig: Path | None = None) -> AsyncIterator[FakeKubelet]:
    """`railyard agent --kubeconfig` as a process, beside a fake kubelet it registers with."""
    kdir = Path(tempfile.mkdtemp(prefix="ry-"))
    kubelet = FakeKubelet(str(kdir))
    await kubelet.start()
    config = tmp / "agent.json"
    config.write_text(json.dumps({"devinfoDir": str(tmp / "devinfo"),
                                  "cniDevinfoDir": str(tmp / "cni-devinfo"),
                                  "verifyDelayS": 0.2, "healthIntervalS": 0.5}))
    log = open(tmp / "agent.log", "wb")  # noqa: SIM115 - closed below
    proc = await asyncio.create_subprocess_exec(
        *CMD, "--node-name", node,
        "--kubeconfig", str(kubeconfig or box.layout.admin_kubeconfig),
        "--sysfs-root", str(tree), "--kubelet-dir", str(kdir),
        "--state-dir", str(tmp / "state"), "--config", str(config),
        stdout=log, stderr=log)
    try:
        for resource in (GPU, VF, PF):
            await kubelet.wait_registered(resource, timeout_s=30)
        yield kubelet
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
        log.close()
        await kubelet.stop()
        shutil.rmtree(kdir, ignore_errors=True)
    assert proc.returncode == 0, (tmp / "agent.log").read_text()


def agent_log(tmp: Path) -> str:
    return (tmp / "agent.log").read_text(errors="replace")


async def until(what: str, check, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(check)
        if last:
            return last
        await asyncio.sleep(0.2)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


def record_of(tmp: Path, uid: str) -> dict | None:
    path = tmp / "state" / "pods" / f"{uid}.json"
    return json.loads(path.read_text()) if path.exists() else None


# ---------------------------------------------------------------------------- tests


def test_agent_on_the_api_answers_kubelet_for_a_pod_bound_to_its_node(box, node, ns, tmp_path):
    tree, topo = tree_for(tmp_path, node)
    vf = nearest_vf(topo, 0)
    recorded = allocation(topo, [(0, vf)])

    async def go() -> None:
        async with running_agent(box, tmp_path, node, tree) as kubelet:
            uid = await asyncio.to_thread(create_pod, box, ns, "two", node, {GPU: 1, VF: 1},
                                          encode_allocation(recorded))
            gpu_id = topo.gpus[0].device_id
            gpu_client, vf_client = kubelet.client(GPU), kubelet.client(VF)
            try:
                await gpu_client.allocate([gpu_id])
                answer = await vf_client.allocate([vf])
            finally:
                await gpu_client.close()
                await vf_client.close()
            pairs = json.loads(answer.envs["RAILYARD_PAIRS"])
            assert [(p["gpu"]["uuid"], p["nic"]["pciAddress"]) for p in pairs] == [(gpu_id, vf)]
            record = record_of(tmp_path, uid)
            assert record is not None and record["pod"]["name"] == "two", agent_log(tmp_path)
            assert "matches no pending pod" not in agent_log(tmp_path)

    asyncio.run(asyncio.wait_for(go(), 90))


def test_a_pod_the_watch_has_not_delivered_is_read_directly(box, node, ns):
    async def go() -> None:
        async with Client(load_kubeconfig(box.layout.admin_kubeconfig)) as client:
            pods = ApiPods(client, node)
            await pods.start()
            await pods.stop()  # the watch stops: only a direct read can see the next pod
            await asyncio.to_thread(create_pod, box, ns, "late", node, {GPU: 1})
            assert "late" not in {p.name for p in pods.pods()}
            assert await pods.look_up()
            assert "late" in {p.name for p in pods.pods()}
            assert pods.look_ups == 1
            assert not await pods.look_up()  # nothing new the second time

    asyncio.run(asyncio.wait_for(go(), 60))


@pytest.mark.parametrize("server", ["unreachable", "unauthenticated"])
def test_an_unreadable_pods_source_stops_the_agent_at_start(box, node, tmp_path, server):
    tree, _ = tree_for(tmp_path, node)
    document = yaml.safe_load(box.layout.admin_kubeconfig.read_text())
    if server == "unreachable":
        document["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    else:  # no client certificate: anonymous, which the box does not allow to list pods
        for user in document["users"]:
            user["user"] = {}
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(document))
    r = subprocess.run([*CMD, "--node-name", node, "--kubeconfig", str(kubeconfig),
                        "--sysfs-root", str(tree), "--kubelet-dir", str(tmp_path / "k"),
                        "--state-dir", str(tmp_path / "state")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("railyard: error: cannot read this node's pods"), r.stderr
    assert node in last
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "k" / "device-plugins" / "railyard.dev_vf.sock").exists()


def test_a_kubeconfig_that_does_not_parse_is_a_config_error(tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [")
    r = subprocess.run([*CMD, "--node-name", "n", "--kubeconfig", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert str(bad) in r.stderr and "Traceback" not in r.stderr


def test_agent_publishes_its_node_topology_and_counts_what_it_holds(box, node, ns, tmp_path):
    tree, topo = tree_for(tmp_path, node)
    vfs = sum(len(n.vfs) for n in topo.nics)

    def published(held_vfs: int):
        def check():
            try:
                obj = get(box, "nodetopologies", node)
            except kubebox.BoxError:  # not published yet
                return None
            status = obj.get("status") or {}
            return obj if status.get("vfs", {}).get("held") == held_vfs else None
        return check

    async def go() -> None:
        async with running_agent(box, tmp_path, node, tree) as kubelet:
            obj = await until("the NodeTopology", published(0))
            owner = obj["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"]) == ("Node", node)
            assert obj["status"]["gpus"] == {"total": 8, "free": 8, "held": 0}
            assert obj["status"]["vfs"] == {"total": vfs, "free": vfs, "held": 0}
            assert obj["status"]["health"] == "Healthy"
            shown = await asyncio.to_thread(box.kubectl, "get", "nodetopologies", node)
            assert node in shown and "8/8" in shown and f"{vfs}/{vfs}" in shown, shown
            # A pod admitted: its VF is held, and the status says so.
            await asyncio.to_thread(create_pod, box, ns, "one", node, {VF: 1})
            vf_client = kubelet.client(VF)
            try:
                await vf_client.allocate([nearest_vf(topo, 0)])
            finally:
                await vf_client.close()
            obj = await until("the NodeTopology to count the held VF", published(1))
            assert obj["status"]["vfs"]["free"] == vfs - 1
        # Restarted, with nothing changed on the node: the agent writes nothing.
        version = obj["metadata"]["resourceVersion"]
        async with running_agent(box, tmp_path, node, tree):
            await until("the restarted agent to find its NodeTopology as it was",
                        lambda: f"NodeTopology {node} unchanged" in agent_log(tmp_path))
        assert get(box, "nodetopologies", node)["metadata"]["resourceVersion"] == version

    asyncio.run(asyncio.wait_for(go(), 120))


def test_the_nodes_decision_is_written_back_when_kubelet_chose_other_devices(
        box, node, ns, tmp_path):
    tree, topo = tree_for(tmp_path, node)
    vf = nearest_vf(topo, 0)
    recorded = allocation(topo, [(0, vf)])
    other_gpu = topo.gpus[1].device_id

    def annotation_of(uid_name: str):
        def check():
            pod = get(box, "pod", uid_name, "-n", ns)
            text = pod["metadata"].get("annotations", {}).get(ALLOCATION_ANNOTATION)
            alloc = decode_allocation(text) if text else None
            return alloc if alloc is not None and alloc.decided_by == "node" else None
        return check

    async def go() -> None:
        async with running_agent(box, tmp_path, node, tree) as kubelet:
            await asyncio.to_thread(create_pod, box, ns, "moved", node, {GPU: 1, VF: 1},
                                    encode_allocation(recorded))
            gpu_client, vf_client = kubelet.client(GPU), kubelet.client(VF)
            try:
                await gpu_client.allocate([other_gpu])  # kubelet ignored the preference
                await vf_client.allocate([vf])
            finally:
                await gpu_client.close()
                await vf_client.close()
            alloc = await until("the node's allocation on the pod", annotation_of("moved"))
            assert [g.device_id for g in alloc.all_gpus] == [other_gpu]
            assert [n.pci_address for n in alloc.all_nics] == [vf]
            assert "written back to the pod" in agent_log(tmp_path)

    asyncio.run(asyncio.wait_for(go(), 90))


def test_agent_serves_the_boxs_real_kubelet_from_the_nodes_sysfs(box, crd, tmp_path):
    """GPUs and VFs of the node's fixture tree registered with the real kubelet of box-node;
    a GPU pod with no recorded allocation runs there: kubelet calls the agent, the node
    decides, and its decision is written back to the pod."""
    node = "box-node"
    topo = discover(box.node_sysfs.parent).topology
    vfs = sum(len(n.vfs) for n in topo.nics)
    log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*CMD, "--node-name", node, "--kubeconfig", str(box.layout.admin_kubeconfig),
         "--sysfs-root", str(box.node_sysfs.parent), "--kubelet-dir", str(box.layout.kubelet_dir),
         "--state-dir", str(tmp_path / "state")], stdout=log, stderr=log)
    ns = namespace(box)
    try:
        def allocatable():
            got = get(box, "node", node)["status"].get("allocatable", {})
            return got if (got.get(GPU), got.get(VF)) == (str(len(topo.gpus)), str(vfs)) else None
        wait_for("box-node to offer Railyard's GPUs and VFs", allocatable, timeout=60)
        box.kubectl("create", "-n", ns, "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpus"},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": 1, "containers": [{
                         "name": "main", "image": "railyard.test/busybox:box",
                         "imagePullPolicy": "Never",
                         "command": ["sh", "-c", "env | grep -E '^(NVIDIA|RAILYARD)_'"],
                         "resources": {"limits": {GPU: "2"}}}]}}))
        wait_for("the GPU pod to succeed", lambda: get(box, "pod", "gpus", "-n", ns)
                 .get("status", {}).get("phase") == "Succeeded", timeout=90)
        env = dict(line.split("=", 1) for line in
                   box.kubectl("logs", "-n", ns, "gpus").splitlines() if "=" in line)
        given = env["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert len(given) == 2 and set(given) <= {g.device_id for g in topo.gpus}

        def written_back():
            text = get(box, "pod", "gpus", "-n", ns)["metadata"].get(
                "annotations", {}).get(ALLOCATION_ANNOTATION)
            return decode_allocation(text) if text else None
        alloc = wait_for("the node's decision on the pod", written_back, timeout=30)
        assert alloc.decided_by == "node"
        assert [g.device_id for g in alloc.all_gpus] == given
        assert node in box.kubectl("get", "nodetopologies")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        box.kubectl("delete", "namespace", ns, "--wait=false")
    assert proc.returncode == 0, (tmp_path / "agent.log").read_text()


def test_a_pf_link_down_shows_in_the_node_topology_and_clears_when_it_is_up(box, node, tmp_path):
    """The agent reads the tree's link state; the apiserver's copy of its status follows."""
    tree, topo = tree_for(tmp_path, node)
    nic = next(n for n in topo.nics if n.vfs and n.netdev)
    oper = tree / "sys" / "bus" / "pci" / "devices" / nic.pci_address / "net" / nic.netdev \
        / "operstate"
    vfs = sum(len(n.vfs) for n in topo.nics)

    def status_is(health: str):
        def check():
            try:
                status = get(box, "nodetopologies", node).get("status") or {}
            except kubebox.BoxError:  # not published yet
                return None
            return status if status.get("health") == health else None
        return check

    async def go() -> None:
        async with running_agent(box, tmp_path, node, tree):
            await until("a healthy NodeTopology", status_is("Healthy"))
            oper.write_text("down\n")
            status = await until("the link-down in the NodeTopology", status_is("Degraded"))
            bad = {d["pciAddress"] for d in status["unhealthyDevices"]}
            assert bad == {nic.pci_address, *(v.pci_address for v in nic.vfs)}
            assert status["vfs"]["free"] == vfs - len(nic.vfs)
            assert status["nics"]["free"] == len(topo.nics) - 1
            (cond,) = status["conditions"]
            assert (cond["type"], cond["status"]) == ("DevicesHealthy", "False")
            shown = await asyncio.to_thread(box.kubectl, "get", "nodetopologies", node)
            assert "Degraded" in shown, shown
            oper.write_text("up\n")
            status = await until("the link back up in the NodeTopology", status_is("Healthy"))
            assert status["vfs"]["free"] == vfs and not status.get("unhealthyDevices")

    asyncio.run(asyncio.wait_for(go(), 90))
