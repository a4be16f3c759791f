"""One node and the services around it, as real as one machine allows.

- the node: a fixture sysfs tree (dgx-h100, 2 VFs per compute PF, written by the builder users
  get) whose VF netdevs are veth interfaces of the same names inside a throwaway "host"
  network namespace; nothing touches the machine's own interfaces;
- `railyard scheduler` as a subprocess over real HTTP, its cluster file holding the topology
  `railyard discover --format json` printed for that tree;
- `railyard agent --cni-socket` as a subprocess inside the host namespace (so its CNI service
  moves links out of that namespace), speaking real gRPC to the fake kubelet of tests/kubelet;
- the `railyard-cni` shim installed as users install it, executed as a runtime executes it.

Only kubelet and the API server are fakes: kubelet is `FakeKubelet` + `FakePodResources`, the
API server is the agent's pods file. Everything is torn down even when the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from railyard.allocation.types import Allocation
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import build_topology, profile
from railyard.records.allocation import allocation_from_json
from railyard.scheduler.state_file import read_state
from railyard.topology.model import NodeTopology
from support.agent import write_pods
from support.cni import Pod, installed_shim, netns_add, netns_del, run_shim
from support.fake_kubelet import FakeKubelet, FakePodResources

NODE = "gpu-e2e-0"
GPU, VF, PF = "nvidia.com/gpu", "railyard.dev/vf", "railyard.dev/pf"
SRC = str(Path(__file__).resolve().parents[2] / "src")
CNI_PATH = "/usr/lib/cni"
START_TIMEOUT_S = 15.0


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}


def railyard_argv(*argv: str) -> list[str]:
    return [sys.executable, "-m", "railyard.cli.main", *argv]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@dataclass
class Admitted:
    """What the fake kubelet saw while admitting one pod's container."""

    preferred: dict[str, list[str]]  # resource → GetPreferredAllocation's answer
    responses: dict[str, dict[str, str]]  # resource → Allocate's envs
    envs: dict[str, str]  # merged as kubelet merges them: the first plugin's value wins


@dataclass
class Cluster:
    root: Path  # short: unix socket paths are limited to 107 bytes
    tree: Path
    topology: NodeTopology
    host: str  # the host network namespace's name
    scheduler_url: str
    state_file: Path
    pods_file: Path
    agent_state: Path
    cni_socket: str
    shim: Path
    kubelet: FakeKubelet
    podres: FakePodResources
    namespaces: list[str] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)
    exit_codes: dict[str, int | None] = field(default_factory=dict)  # set at teardown
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    agent_log: Path | None = None
    start_agent: Callable[[], subprocess.Popen] | None = None

    # ------------------------------------------------------------------ scheduler

    def schedule(self, pod: dict) -> Allocation:
        """kube-scheduler's three calls (nodeCacheCapable), then the record read back twice:
        from GET /allocations and from the state file."""
        uid = pod["metadata"]["uid"]
        fits = http(f"{self.scheduler_url}/filter", {"Pod": pod, "Nodes": None,
                                                     "NodeNames": [NODE]})
        assert fits["NodeNames"] == [NODE], fits
        assert not fits.get("Error"), fits
        scores = http(f"{self.scheduler_url}/prioritize", {"Pod": pod, "Nodes": None,
                                                           "NodeNames": fits["NodeNames"]})
        assert [s["Host"] for s in scores] == [NODE] and 0 <= scores[0]["Score"] <= 10
        bound = http(f"{self.scheduler_url}/bind", {
            "PodName": pod["metadata"]["name"], "PodNamespace": pod["metadata"]["namespace"],
            "PodUID": uid, "Node": NODE})
        assert bound == {"Error": ""}, bound
        listed = [p for p in http(f"{self.scheduler_url}/allocations")["pods"]
                  if p["uid"] == uid]
        assert len(listed) == 1 and listed[0]["node"] == NODE
        decision = allocation_from_json(listed[0]["allocation"])
        journal = [p for p in read_state(self.state_file) if p.uid == uid]
        assert [p.allocation for p in journal] == [decision]  # one record, the same one
        return decision

    # ------------------------------------------------------------------ API server

    def publish(self, pod: dict) -> None:
        """Write the pods file as the API server would show the agent the node's pods."""
        self.pods = [p for p in self.pods if p["metadata"]["uid"] != pod["metadata"]["uid"]]
        self.pods.append(pod)
        write_pods(self.pods_file, self.pods)

    # ------------------------------------------------------------------ kubelet

    async def admit(self, pod: dict, order: tuple[str, ...], held: set[str]) -> Admitted:
        """Admit the pod's one container as kubelet does: per resource, the healthy devices
        not held by other pods are offered to GetPreferredAllocation, its answer is passed to
        Allocate (in another order: kubelet passes a set), and PodResources reports it."""
        meta = pod["metadata"]
        container = pod["spec"]["containers"][0]
        limits = container["resources"]["limits"]
        out = Admitted({}, {}, {})
        for resource in order:
            client = self.kubelet.client(resource)
            try:
                devices = await client.watch()
                available = sorted((d for d, h in devices.items()
                                    if h == "Healthy" and d not in held), reverse=True)
                size = int(limits[resource])
                ids = await client.preferred(available, size)
                out.preferred[resource] = ids
                self.podres.state.assign(meta["namespace"], meta["name"], container["name"],
                                         resource, ids)
                resp = await client.allocate(sorted(ids, reverse=True))
                out.responses[resource] = dict(resp.envs)
                for k, v in resp.envs.items():
                    out.envs.setdefault(k, v)
            finally:
                await client.close()
        return out

    # ------------------------------------------------------------------ agent

    async def restart_agent(self) -> int | None:
        """SIGTERM the agent and start it again over the same state folder; wait until kubelet
        and the CNI socket see the new one. Returns the old agent's exit status."""
        assert self.start_agent is not None and self.agent_log is not None
        code = await asyncio.to_thread(_stop, self.procs["agent"])
        count = sum(r.resource == VF for r in self.kubelet.registrations) + 1
        self.procs["agent"] = self.start_agent()
        await _agent_ready(self.kubelet, self.procs["agent"], self.cni_socket, self.agent_log,
                           count)
        return code

    # ------------------------------------------------------------------ CNI

    def pod_netns(self) -> str:
        ns = netns_add()
        self.namespaces.append(ns)
        return ns

    async def cni(self, command: str, pod: Pod, conf: dict, ifname: str = "net1"):
        """The shim, exec'd with CNI_* env and the config on stdin; in a thread, because the
        agent's CNI service asks the fake PodResources (on this event loop) during ADD."""
        conf = {"cniVersion": "1.1.0", "name": "rdma", "type": "railyard-cni",
                "agentSocket": self.cni_socket, **conf}
        return await asyncio.to_thread(
            run_shim, self.shim, command, conf, container_id=pod.container_id,
            netns=pod.netns_path, ifname=ifname, args=pod.args(), path=CNI_PATH)


def _make_host(tree_topology: NodeTopology) -> str:
    """A host namespace holding one veth per VF, named as the tree names the VF's netdev."""
    host = netns_add()
    lines = [f"link add {v.netdev} type veth peer name ryp{i}"
             for i, v in enumerate(v for n in tree_topology.nics for v in n.vfs)]
    subprocess.run(["ip", "-n", host, "-batch", "-"], input="\n".join(lines) + "\n",
                   text=True, check=True, capture_output=True)
    return host


def _wait_http(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"scheduler exited {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{url}/healthz", timeout=1).read()
            return
        time.sleep(0.05)
    raise AssertionError(f"scheduler did not answer within {START_TIMEOUT_S} s")


async def _agent_ready(kubelet: FakeKubelet, proc: subprocess.Popen, cni_socket: str,
                       log: Path, registrations: int = 1) -> None:
    """Every plugin registered with the fake kubelet, and the CNI socket served."""
    for resource in (GPU, VF, PF):
        try:
            await kubelet.wait_registered(resource, count=registrations,
                                          timeout_s=START_TIMEOUT_S)
        except TimeoutError:
            raise AssertionError(f"{resource} not registered: {log.read_text()}") from None
    deadline = time.monotonic() + START_TIMEOUT_S
    while not os.path.exists(cni_socket):
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the agent's CNI socket did not appear"
        await asyncio.sleep(0.02)


def _stop(proc: subprocess.Popen | None) -> int | None:
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.asynccontextmanager
async def cluster(profile_name: str = "dgx-h100") -> AsyncIterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="ry-e2e-"))
    namespaces: list[str] = []
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    kubelet: FakeKubelet | None = None
    podres: FakePodResources | None = None
    c: Cluster | None = None
    try:
        tree = write_fixture(profile(profile_name), root / "tree", vfs_per_pf=2, node=NODE)
        topology = build_topology(profile(profile_name), vfs_per_pf=2, node=NODE)
        host = _make_host(topology)
        namespaces.append(host)

        # The scheduler's view of the node is what discovery prints for the tree.
        doc = subprocess.run(railyard_argv("discover", "--sysfs-root", str(tree),
                                           "--format", "json"),
                             env=_env(), capture_output=True, text=True, check=True).stdout
        cluster_file = root / "cluster.json"
        cluster_file.write_text(json.dumps({"nodes": [{"name": NODE,
                                                       "topology": json.loads(doc)}]}))
        port = free_port()
        state_file = root / "scheduler.state"
        logs["scheduler"] = root / "scheduler.log"
        procs["scheduler"] = subprocess.Popen(
            railyard_argv("scheduler", "--listen", f"127.0.0.1:{port}", "--cluster-file",
                          str(cluster_file), "--state-file", str(state_file)),
            env=_env(), stdout=subprocess.DEVNULL, stderr=logs["scheduler"].open("w"))

        kubelet_dir = root / "k"
        kubelet, podres = FakeKubelet(str(kubelet_dir)), FakePodResources(str(kubelet_dir))
        await kubelet.start()
        await podres.start()
        pods_file = root / "pods.json"
        write_pods(pods_file, [])
        config = root / "agent.json"
        config.write_text(json.dumps({"devinfoDir": str(root / "devinfo" / "dp"),
                                      "cniDevinfoDir": str(root / "devinfo" / "cni"),
                                      "verifyDelayS": 0.05}))
        cni_socket = str(root / "cni.sock")
        logs["agent"] = root / "agent.log"

        def start_agent() -> subprocess.Popen:
            # Inside the host namespace: the in-process CNI service moves links out of the
            # namespace it runs in. Unix sockets are paths, so the fake kubelet still meets it.
            with logs["agent"].open("a") as log:
                return subprocess.Popen(
                    ["ip", "netns", "exec", host, *railyard_argv(
                        "agent", "--node-name", NODE, "--pods-file", str(pods_file),
                        "--sysfs-root", str(tree), "--kubelet-dir", str(kubelet_dir),
                        "--state-dir", str(root / "state"), "--config", str(config),
                        "--cni-socket", cni_socket, "--log-level", "info")],
                    env=_env(), stdout=subprocess.DEVNULL, stderr=log)

        procs["agent"] = start_agent()
        shim = installed_shim(root / "bin")

        url = f"http://127.0.0.1:{port}"
        await asyncio.to_thread(_wait_http, url, procs["scheduler"], logs["scheduler"])
        await _agent_ready(kubelet, procs["agent"], cni_socket, logs["agent"])
        c = Cluster(root, tree, topology, host, url, state_file, pods_file, root / "state",
                    cni_socket, shim, kubelet, podres, namespaces)
        c.procs, c.agent_log, c.start_agent = procs, logs["agent"], start_agent
        yield c
    finally:
        codes = {name: _stop(p) for name, p in procs.items()}
        if c is not None:
            c.exit_codes = codes
        if kubelet is not None:
            await kubelet.stop()
        if podres is not None:
            await podres.stop()
        for ns in reversed(namespaces):  # the pods' too: Cluster appends to this list
            netns_del(ns)
        for name, log in logs.items():  # shown by pytest when the test fails
            with contextlib.suppress(OSError):
                print(f"----- {name} (exit {codes.get(name)}) -----\n{log.read_text()[-6000:]}")
        shutil.rmtree(root, ignore_errors=True)
