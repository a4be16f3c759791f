"""The extender honours VF bandwidth shares (docs/decisions/0093): pods asking `vfBandwidth`
are filtered and bound so that no PF's VFs hold more than 100% between them; the record
names each VF's share; a pod whose share fits nowhere is refused with the reason."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import aiohttp
from scheduler_helpers import args, served

from railyard.discovery.profiles import build_topology, profile
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState
from support.pods import pod


def asking(uid: str, vfs: int, share: int | None) -> dict:
    return pod(uid, {"main": {"cpu": "1", "memory": "1Gi", "railyard.dev/vf": vfs}},
               hints=None if share is None else {"vfBandwidth": share},
               scheduler_name="default-scheduler")


async def schedule(ext: Extender, p: dict) -> tuple[dict, dict | None]:
    uid = p["metadata"]["uid"]
    async with served(ext) as url, aiohttp.ClientSession() as s:
        async with s.post(f"{url}/filter", data=json.dumps(args(p, ["n1"])).encode(),
                          headers={"Content-Type": "application/json"}) as r:
            f = await r.json()
        if not f["NodeNames"]:
            return f, None
        async with s.post(f"{url}/bind", data=json.dumps({
                "PodName": uid, "PodNamespace": "default", "PodUID": uid,
                "Node": "n1"}).encode(), headers={"Content-Type": "application/json"}) as r:
            return f, await r.json()


def test_shares_fill_each_pf_to_100_and_no_further():
    """hgx-h100-4nic (4 RDMA PFs), 8 VFs per PF: pods of 2 VFs at 51% each. A PF holds one
    51% VF, so 4 pods' 8 VFs cannot fit — 2 pods (4 VFs, one per PF) can; the third is
    refused by filter with the bandwidth reason, while a pod asking no share still fits."""
    t = build_topology(profile("hgx-h100-4nic"), vfs_per_pf=8, node="n1")
    ext = Extender(ClusterState([t]))
    bound = []
    for k in range(2):
        f, b = asyncio.run(schedule(ext, asking(f"u{k}", 2, 51)))
        assert f["NodeNames"] == ["n1"] and b is not None and b["Error"] == "", (f, b)
        bound.append(f"u{k}")
    f, b = asyncio.run(schedule(ext, asking("u2", 2, 51)))
    assert f["NodeNames"] == [] and b is None
    assert "bandwidth" in json.dumps(f["FailedNodes"] or f.get("FailedAndUnresolvableNodes"))
    f, b = asyncio.run(schedule(ext, asking("plain", 2, None)))
    assert f["NodeNames"] == ["n1"] and b is not None and b["Error"] == ""
    held = dict(ext.state.ledger("n1").holders())
    per_pf: Counter[str] = Counter()
    for uid in bound:
        assert [n.bandwidth for n in held[uid].vfs] == [51, 51]
        for n in held[uid].vfs:
            per_pf[n.pf_pci_address] += n.bandwidth or 0
    assert set(per_pf.values()) == {51} and len(per_pf) == 4
    assert all(n.bandwidth is None for n in held["plain"].vfs)
