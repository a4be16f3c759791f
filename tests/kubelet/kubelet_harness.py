"""Test harness: fixture sysfs trees, pod objects, and a running agent beside a fake kubelet."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from fake_kubelet import FakeKubelet, FakePodResources

from railyard.agent.agent import Agent, AgentOptions
from railyard.agent.config import AgentConfig
from railyard.agent.pods import PodsFile
from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import build_topology, profile
from railyard.records.allocation import encode_allocation
from railyard.topology.model import NodeTopology

NODE = "node-a"
GPU, VF, PF = "nvidia.com/gpu", "railyard.dev/vf", "railyard.dev/pf"


def async_test(fn):
    """Run an async test body on a fresh event loop, with a hard time limit."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 30))
    return wrapper


def make_tree(folder: Path, name: str = "generic", vfs_per_pf: int = 4) -> Path:
    return write_fixture(profile(name), folder, vfs_per_pf=vfs_per_pf, node=NODE)


def topology(name: str = "generic", vfs_per_pf: int = 4) -> NodeTopology:
    return build_topology(profile(name), vfs_per_pf=vfs_per_pf, node=NODE)


def allocation(topo: NodeTopology, pairs: list[tuple[int, str]], *, nics: tuple[str, ...] = (),
               decided_at: str = "2026-01-01T00:00:00Z", node: str = NODE) -> Allocation:
    """GPU index → NIC PCI address (a VF, or a PF for a whole PF) pairs."""
    def nic_ref(pci: str) -> NicRef:
        for n in topo.nics:
            if n.pci_address == pci:
                return NicRef.of_pf(n)
            for v in n.vfs:
                if v.pci_address == pci:
                    return NicRef.of_vf(n, v)
        raise KeyError(pci)

    out = []
    for gi, pci in pairs:
        g = topo.gpus[gi]
        ref = nic_ref(pci)
        out.append(Pair(GpuRef.of(g), ref, topo.distance[g.pci_address][ref.pf_pci_address]))
    return Allocation(node=node, numa_nodes=(0,), cpus=None, memory_bytes=(),
                      pairs=tuple(out), nics=tuple(nic_ref(p) for p in nics),
                      decided_at=decided_at)


def pod(uid: str, containers: dict[str, dict[str, int]], *, alloc: Allocation | None = None,
        annotation: str | None = None, node: str | None = NODE, phase: str = "Pending",
        name: str | None = None, namespace: str = "team",
        created: str = "2026-01-01T00:00:00Z") -> dict:
    annotations = {}
    if alloc is not None:
        annotations[ALLOCATION_ANNOTATION] = encode_allocation(alloc)
    if annotation is not None:
        annotations[ALLOCATION_ANNOTATION] = annotation
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"uid": uid, "name": name or uid, "namespace": namespace,
                     "annotations": annotations, "creationTimestamp": created},
        "spec": {"nodeName": node, "containers": [
            {"name": c, "resources": {"limits": {r: str(n) for r, n in res.items()}}}
            for c, res in containers.items()]},
        "status": {"phase": phase},
    }


def write_pods(path: Path, pods: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"kind": "PodList", "items": pods}))
    os.replace(tmp, path)


@dataclass
class Rig:
    agent: Agent
    kubelet_dir: Path
    kubelet: FakeKubelet
    podres: FakePodResources
    pods_file: Path
    root: Path
    tmp: Path


@contextlib.asynccontextmanager
async def rig(tmp: Path, tree: Path, pods: list[dict] | None = None,
              config: AgentConfig | None = None, start_kubelet: bool = True,
              state_dir: Path | None = None, kubelet_dir: Path | None = None,
              assigned: dict[tuple[str, str, str, str], list[str]] | None = None
              ) -> AsyncIterator[Rig]:
    """`assigned`: (namespace, pod, container, resource) → IDs PodResources reports from the
    start, as after a kubelet that admitted pods before the agent came up."""
    kubelet_dir = kubelet_dir or tmp / "kubelet"
    if len(str(kubelet_dir)) > 60:  # unix socket paths are limited to 107 bytes
        kubelet_dir = Path(tempfile.mkdtemp(prefix="ry-kubelet-"))
    kubelet = FakeKubelet(str(kubelet_dir))
    podres = FakePodResources(str(kubelet_dir))
    if start_kubelet:
        await kubelet.start()
    for (ns, name, container, resource), ids in (assigned or {}).items():
        podres.state.assign(ns, name, container, resource, ids)
    await podres.start()
    tmp.mkdir(parents=True, exist_ok=True)
    pods_file = tmp / "pods.json"
    write_pods(pods_file, pods or [])
    cfg = config or AgentConfig(devinfo_dir=str(tmp / "devinfo"), health_interval_s=0.1,
                                verify_delay_s=0.05)
    agent = Agent(AgentOptions(node_name=NODE, sysfs_root=str(tree),
                               kubelet_dir=str(kubelet_dir),
                               state_dir=str(state_dir or tmp / "state")),
                  PodsFile(pods_file), cfg)
    await agent.start()
    if start_kubelet and not agent.paths.watcher_mode:
        for ep in agent.endpoints.values():  # kubelet knows every plugin before the test
            await kubelet.wait_registered(ep.resource)
    try:
        yield Rig(agent, kubelet_dir, kubelet, podres, pods_file, tree, tmp)
    finally:
        await agent.stop()
        await kubelet.stop()
        await podres.stop()
        if not str(kubelet_dir).startswith(str(tmp)):
            shutil.rmtree(kubelet_dir, ignore_errors=True)
