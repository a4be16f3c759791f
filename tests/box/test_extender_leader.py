"""Two `railyard scheduler --kubeconfig` replicas against one real API server (decision 0074):
exactly one holds the `coordination.k8s.io` Lease and binds; a bind sent to the other is
refused and writes nothing; SIGKILL the leader and the other takes the Lease within the
lease duration, then binds.

The replicas run in the box's network namespace on 127.0.0.1 and the test posts filter and
bind to each directly, as kube-scheduler would; the pods name a scheduler that does not
exist, so nothing else binds them. The box is this module's own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.discovery.discover import discover
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import DGX_H100
from railyard.records.allocation import decode_allocation
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

NODE = "kwok-node-0"
LEASE = "railyard-leader-test"
LEASE_S, RENEW_S, RETRY_S = 6, 4, 1


class Replica:
    """One extender process, named by POD_NAME (its Lease identity), on its own port."""

    def __init__(self, box, name: str, port: int, log: Path) -> None:
        self.box, self.name, self.port, self.log = box, name, port, log
        with log.open("ab") as out:
            self.process = subprocess.Popen(box.in_box([
                *kubebox.railyard_command(), "scheduler",
                "--kubeconfig", str(box.layout.admin_kubeconfig),
                "--listen", f"127.0.0.1:{port}", "--leader-elect-namespace", "kube-system",
                "--leader-elect-name", LEASE,
                "--leader-elect-lease-duration", str(LEASE_S),
                "--leader-elect-renew-deadline", str(RENEW_S),
                "--leader-elect-retry-period", str(RETRY_S)]),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "POD_NAME": name})

    def listening(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        return b"extender listening" in self.log.read_bytes()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def post(self, path: str, body: dict) -> dict:
        script = ("import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
                  f"urllib.request.Request('http://127.0.0.1:{self.port}{path}', "
                  "data=sys.stdin.buffer.read(), headers={'Content-Type': "
                  "'application/json'})).read().decode())")
        out = subprocess.run(self.box.in_box([sys.executable, "-c", script]),
                             input=json.dumps(body), capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    def filter_and_bind(self, p: dict) -> str:
        fits = self.post("/filter", {"Pod": p, "NodeNames": [NODE]})
        assert fits["NodeNames"] == [NODE], fits
        m = p["metadata"]
        return self.post("/bind", {"PodName": m["name"], "PodNamespace": m["namespace"],
                                   "PodUID": m["uid"], "Node": NODE})["Error"]


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    if os.geteuid() != 0:
        pytest.skip("the box needs root: network namespaces, mounts and cgroups")
    folder = tmp_path_factory.mktemp("leader-box")
    b = kubebox.Box(folder / "box", kwok_nodes=1)
    b.up()
    try:
        install_topology_crd(b)
        tree = write_fixture(DGX_H100, folder / "tree", 2, node=NODE)
        publish_topologies(b, [discover(tree).topology])
        yield b
    finally:
        b.down()


def lease(box) -> dict:
    out = box.kubectl("get", "lease", "-n", "kube-system", LEASE, "-o", "json", check=False)
    return json.loads(out)["spec"] if out.strip() else {}


def devices(p: dict) -> set[str]:
    a = decode_allocation(p["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    return {g.pci_address for g in a.all_gpus} | {n.pci_address for n in a.all_nics}


def pending_pod(box, ns: str, name: str) -> dict:
    manifest = pod(name, ["sleep", "3600"], schedulerName="nobody", nodeSelector={
        "type": "kwok"}, tolerations=[
        {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}])
    manifest["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "2", "railyard.dev/vf": "2"}}
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))
    return get(box, "pod", name, "-n", ns)


def test_only_the_leader_binds_and_the_follower_takes_over_when_it_is_killed(box, tmp_path):
    a = Replica(box, "replica-a", 18891, tmp_path / "a.log")
    b = None
    try:
        wait_for("replica-a to list and listen", a.listening, timeout=60)
        wait_for("replica-a to hold the lease",
                 lambda: lease(box).get("holderIdentity") == "replica-a", timeout=30)
        b = Replica(box, "replica-b", 18892, tmp_path / "b.log")
        wait_for("replica-b to list and listen", b.listening, timeout=60)
        time.sleep(2 * RETRY_S)  # b has tried at least once
        assert lease(box)["holderIdentity"] == "replica-a"
        assert lease(box)["leaseTransitions"] == 0

        ns = namespace(box)
        first = pending_pod(box, ns, "first")
        assert a.filter_and_bind(first) == ""
        # The follower: filter answers (its watch cache sees a's bind), bind is refused.
        second = pending_pod(box, ns, "second")
        error = b.filter_and_bind(second)
        assert "not the leader" in error and "replica-a" in error, error
        now = get(box, "pod", "second", "-n", ns)
        assert not now["spec"].get("nodeName")
        assert ALLOCATION_ANNOTATION not in now["metadata"].get("annotations", {})

        a.kill()
        killed = time.monotonic()
        wait_for("replica-b to take the lease",
                 lambda: lease(box).get("holderIdentity") == "replica-b", timeout=30)
        took_s = time.monotonic() - killed
        assert took_s <= LEASE_S + 2 * RETRY_S + 1, took_s
        assert lease(box)["leaseTransitions"] == 1
        assert b.filter_and_bind(second) == ""
        now = get(box, "pod", "second", "-n", ns)
        assert now["spec"]["nodeName"] == NODE
        assert ALLOCATION_ANNOTATION in now["metadata"]["annotations"]
        # b held first's devices from its watch: no device is given twice.
        mine, theirs = (devices(p) for p in (now, get(box, "pod", "first", "-n", ns)))
        assert mine and theirs and mine.isdisjoint(theirs)
    finally:
        a.kill()
        if b is not None:
            b.kill()
