"""The test box (hack/kubebox.py) and the few helpers its tests share: a throwaway namespace, a
busybox pod, waiting with a named timeout, and NodeTopology CRs for nodes without an agent."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from railyard.kube.client import Client
from railyard.kube.config import load_kubeconfig
from railyard.kube.nodetopology import CRD_NAME, publish
from railyard.topology.model import NodeTopology


def _load_kubebox() -> ModuleType:
    """hack/kubebox.py is the script behind hack/box, not a package: load it by path."""
    if "kubebox" in sys.modules:
        return sys.modules["kubebox"]
    path = Path(__file__).resolve().parents[2] / "hack" / "kubebox.py"
    spec = importlib.util.spec_from_file_location("kubebox", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kubebox"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


kubebox = _load_kubebox()
KWOK_NODES = 100  # the session box has these (tests/box/conftest.py)
TOPOLOGY_CRD = Path(__file__).resolve().parents[2] / "deploy" / "crds" / f"{CRD_NAME}.yaml"


@contextlib.contextmanager
def running_box(folder: Path, **options: Any) -> Iterator[Any]:
    """A box (kubebox.Box options) that is up inside the block and down after it; tests that
    need one skip without root."""
    if os.geteuid() != 0:
        pytest.skip("the box needs root: network namespaces, mounts and cgroups")
    box = kubebox.Box(folder, **options)
    box.up()
    try:
        yield box
    finally:
        box.down()


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120.0, every: float = 0.5):
    """Poll `check` until it returns something true; fail naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def namespace(box) -> str:
    """A fresh namespace for one test, ready for pods: the API refuses pods until the
    controller-manager has made the namespace's `default` ServiceAccount, which takes longer
    than usual right after an apiserver restart (its watches are reconnecting)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    box.kubectl("create", "namespace", name)
    wait_for(f"the default ServiceAccount of namespace {name}",
             lambda: box.kubectl("get", "serviceaccount", "default", "-n", name,
                                 "-o", "name", check=False).strip(), timeout=60)
    return name


def pod(name: str, command: list[str], **spec: Any) -> dict:
    """A busybox pod that runs `command` once."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": kubebox.BUSYBOX_IMAGE,
                            "imagePullPolicy": "Never", "command": command}],
            **spec,
        },
    }


def get(box, *args: str) -> dict:
    return json.loads(box.kubectl("get", *args, "-o", "json"))


def phase(box, ns: str, name: str) -> str:
    return get(box, "pod", name, "-n", ns).get("status", {}).get("phase", "")


def host_macs(box) -> dict[str, str]:
    """The box's links (the node's host namespace) by name, with their MACs."""
    out = kubebox.run(box.in_box(["ip", "-j", "link", "show"])).stdout
    return {link["ifname"]: link.get("address", "") for link in json.loads(out)}


def links_inside(log: str) -> dict[str, str]:
    """`ip -o link` lines (a pod's log) by interface name."""
    return {line.split(":")[1].strip().split("@")[0]: line for line in log.splitlines()
            if ": <" in line}


def run_to_success(box, ns: str, manifest: dict) -> str:
    """Create a pod, wait until it Succeeded, return its log."""
    name = manifest["metadata"]["name"]
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))
    wait_for(f"pod {name} to succeed", lambda: phase(box, ns, name) == "Succeeded")
    return box.kubectl("logs", "-n", ns, name)


def leftovers(box) -> dict[str, list[str]]:
    """What of a box is still on the machine: processes, namespace, veth, cgroups, mounts."""
    lay = box.layout
    marks = (str(lay.dir), str(lay.run_dir), str(lay.shm_dir))
    processes = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if any(mark in cmdline for mark in marks):
                processes.append(f"{proc.name}: {cmdline[:80]}")
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if line.split()[4].startswith(marks)]
    found = {
        "processes": processes,
        "netns": [n for n in kubebox.run(["ip", "netns", "list"]).stdout.split()
                  if n == lay.netns],
        "veth": [lay.host_veth] if Path(f"/sys/class/net/{lay.host_veth}").exists() else [],
        "cgroups": [str(p) for p in lay.cgroup_dirs()],
        "mounts": mounts,
        "folders": [str(p) for p in (lay.run_dir, lay.shm_dir) if p.exists()],
    }
    return {what: items for what, items in found.items() if items}


def install_topology_crd(box) -> None:
    """The NodeTopology CRD, applied and Established (the API serves it)."""
    box.kubectl("apply", "-f", str(TOPOLOGY_CRD))
    box.kubectl("wait", "--for", "condition=Established", "--timeout", "60s", f"crd/{CRD_NAME}")


def publish_topologies(box, topologies: Iterable[NodeTopology]) -> None:
    """Each node's NodeTopology CR as its agent would write it: for kwok nodes and Node
    objects no agent serves."""
    async def publish_all() -> None:
        async with Client(load_kubeconfig(box.layout.admin_kubeconfig)) as client:
            for topology in topologies:
                await publish(client, topology)
    asyncio.run(publish_all())
