"""Shared test material for the extender: pods as kube-scheduler sends them, hand-written
allocations (fixture data, not an allocator), and a served extender on a free port."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.scheduler.service import Extender, bound_port, start
from railyard.topology.model import NodeTopology


def pod(uid: str, gpus: int = 0, vfs: int = 0, pfs: int = 0, *, name: str | None = None,
        namespace: str = "default", hints: dict | None = None) -> dict[str, Any]:
    """A v1 Pod with one container asking for the given devices (limits, as users write)."""
    limits: dict[str, str] = {"cpu": "4", "memory": "16Gi"}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if vfs:
        limits["railyard.dev/vf"] = str(vfs)
    if pfs:
        limits["railyard.dev/pf"] = str(pfs)
    meta: dict[str, Any] = {"name": name or f"pod-{uid}", "namespace": namespace, "uid": uid}
    if hints is not None:
        meta["annotations"] = {"railyard.dev/request": json.dumps(hints)}
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"schedulerName": "default-scheduler", "containers": [
            {"name": "main", "image": "nccl-tests", "resources": {"limits": limits}}]},
    }


def args(p: dict, names: list[str]) -> dict[str, Any]:
    """ExtenderArgs in nodeCacheCapable form."""
    return {"Pod": p, "Nodes": None, "NodeNames": names}


def node_list(names: list[str]) -> dict[str, Any]:
    return {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": [
        {"metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}, "status": {}}
        for n in names]}


def hand_allocation(t: NodeTopology, pairs: list[tuple[int, int, int]]) -> Allocation:
    """An Allocation of (GPU index, NIC index, VF index) triples on `t`, written by hand."""
    out = []
    for g, n, v in pairs:
        gpu, nic = t.gpus[g], t.nics[n]
        out.append(Pair(GpuRef.of(gpu), NicRef.of_vf(nic, nic.vfs[v]),
                        t.gpu_nic_distance(gpu.pci_address, nic.pci_address)))
    return Allocation(t.node, (0,), None, (), pairs=tuple(out))


@contextlib.asynccontextmanager
async def served(extender: Extender) -> AsyncIterator[str]:
    """The extender over real HTTP on 127.0.0.1; yields its base URL."""
    runner = await start(extender, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        await runner.cleanup()
