"""The agent under test: fixture sysfs trees, pods for its pods file, and a running agent beside
a fake kubelet (`support.fake_kubelet`)."""

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

from railyard.agent.agent import Agent, AgentOptions
from railyard.agent.config import AgentConfig
from railyard.allocation.types import Allocation
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import build_topology, profile
from railyard.kubelet.pods import PodsFile
from railyard.topology.model import NodeTopology
from support import pods
from support.allocations import allocation
from support.fake_kubelet import FakeKubelet, FakePodResources

__all__ = ["GPU", "NODE", "PF", "VF", "Rig", "allocation", "async_test", "make_tree", "pod",
           "rig", "topology", "write_pods"]

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


def pod(uid: str, containers: dict[str, dict[str, int]], *, alloc: Allocation | None = None,
        annotation: str | None = None, node: str | None = NODE, phase: str = "Pending",
        name: str | None = None, namespace: str = "team",
        created: str = "2026-01-01T00:00:00Z") -> dict:
    """A pod as the agent's pods file lists it: bound to the test node, Pending, in "team"."""
    return pods.pod(uid, containers, alloc=alloc, annotation=annotation, node=node,
                    phase=phase, name=name, namespace=namespace, created=created)


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
                  PodsFile(pods_file, cfg.resources), cfg)
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
