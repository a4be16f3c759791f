"""Shared test material for the extender: pods as kube-scheduler sends them and hand-written
allocations (both from `support`, in the extender's terms), and a served extender on a free
port."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from railyard.allocation.types import Allocation
from railyard.scheduler.service import Extender, bound_port, start
from railyard.topology.model import NodeTopology
from support.allocations import allocation, vf
from support.pods import asking as pod

__all__ = ["args", "calls", "hand_allocation", "node_list", "pod", "served"]


def args(p: dict, names: list[str]) -> dict[str, Any]:
    """ExtenderArgs in nodeCacheCapable form."""
    return {"Pod": p, "Nodes": None, "NodeNames": names}


def node_list(names: list[str]) -> dict[str, Any]:
    return {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": [
        {"metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}, "status": {}}
        for n in names]}


def hand_allocation(t: NodeTopology, pairs: list[tuple[int, int, int]]) -> Allocation:
    """An Allocation of (GPU index, NIC index, VF index) triples on `t`, written by hand."""
    return allocation(t, [(g, vf(t, n, v)) for g, n, v in pairs], decided_at=None)


@contextlib.asynccontextmanager
async def served(extender: Extender) -> AsyncIterator[str]:
    """The extender over real HTTP on 127.0.0.1; yields its base URL."""
    runner = await start(extender, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        await runner.cleanup()


def calls(extender: Extender, posts: list[tuple[str, dict]]) -> list[Any]:
    """Serve the extender and POST each (verb, body) in turn; the JSON answers, in order."""
    async def go() -> list[Any]:
        out = []
        async with served(extender) as url, aiohttp.ClientSession() as s:
            for verb, body in posts:
                async with s.post(f"{url}/{verb}", data=json.dumps(body).encode()) as r:
                    out.append(await r.json())
        return out
    return asyncio.run(go())
