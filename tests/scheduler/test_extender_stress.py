"""The issue's "done when": hundreds of concurrent binds over real HTTP at nodes with room for
fewer. Every GPU, VF and PF is held by at most one pod, the successes equal the capacity, and
the ledger rebuilt from the state file after a restart is identical."""

from __future__ import annotations

import asyncio
import itertools
import json
import random

import aiohttp
from scheduler_helpers import args, pod, served

from railyard.allocation.request import Request
from railyard.allocation.types import Allocation
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState
from railyard.scheduler.state_file import StateFile

SPEC = "dgx-h100:4,hgx-h100-4nic:2"
# Each node receives one request shape, so its capacity does not depend on arrival order.
SHAPES = {
    "dgx-h100-000": {"gpus": 1, "vfs": 1},
    "dgx-h100-001": {"gpus": 2, "vfs": 2},
    "dgx-h100-002": {"vfs": 2},  # VF-only pods
    "dgx-h100-003": {"pfs": 1},  # whole PFs
    "hgx-h100-4nic-000": {"gpus": 1, "vfs": 1},
    "hgx-h100-4nic-001": {"gpus": 4, "vfs": 4},
}
ATTEMPTS_PER_NODE = 60


def capacity(node: str) -> int:
    """How many pods of the node's shape fit, bound one by one on a fresh state."""
    s = ClusterState(cluster_from_spec(SPEC))
    for i in itertools.count():
        if not isinstance(s.bind(f"c{i}", "ns", f"c{i}", node, Request(**SHAPES[node])),
                          Allocation):
            return i
    raise AssertionError("unreachable")


def held_once(pods: list[dict]) -> None:
    seen: dict[tuple[str, str], str] = {}
    whole_pfs = set()
    vf_pfs = set()
    for p in pods:
        a = p["allocation"]
        devices = [x["gpu"]["pciAddress"] for x in a["pairs"]]
        devices += [g["pciAddress"] for g in a["gpus"]]
        nics = {n["pciAddress"]: n for n in [x["nic"] for x in a["pairs"]] + a["nics"]}
        devices += list(nics)
        for n in nics.values():
            (whole_pfs if n["kind"] == "pf" else vf_pfs).add((p["node"], n["pfPciAddress"]))
        for d in devices:
            key = (p["node"], d)
            assert key not in seen, f"{d} on {p['node']} held by {seen[key]} and {p['uid']}"
            seen[key] = p["uid"]
    assert not whole_pfs & vf_pfs, "a PF held whole also has VFs in use"


def test_concurrent_binds_never_double_allocate_and_survive_a_restart(tmp_path):
    path = tmp_path / "state"
    cluster = cluster_from_spec(SPEC)
    sf, _ = StateFile.open(path)
    sf.compact()
    ext = Extender(ClusterState(cluster), sf, state_file=sf)
    names = list(SHAPES)
    attempts = [(f"u{n}-{i}", node) for n, node in enumerate(names)
                for i in range(ATTEMPTS_PER_NODE)]
    random.Random(4).shuffle(attempts)

    async def go():
        conn = aiohttp.TCPConnector(limit=200)  # 2 x 200 sockets: well under 1,024 fds
        async with served(ext) as url, aiohttp.ClientSession(connector=conn) as s:
            async def filter_then_bind(uid: str, node: str) -> str:
                async with s.post(f"{url}/filter",
                                  data=json.dumps(args(pod(uid, **SHAPES[node]), names))) as r:
                    assert (await r.json())["Error"] == ""
                body = {"PodName": f"pod-{uid}", "PodNamespace": "default", "PodUID": uid,
                        "Node": node}
                async with s.post(f"{url}/bind", data=json.dumps(body)) as r:
                    return (await r.json())["Error"]

            errors = await asyncio.gather(*(filter_then_bind(u, n) for u, n in attempts))
            async with s.get(f"{url}/allocations") as r:
                return errors, (await r.json())["pods"]

    errors, pods = asyncio.run(go())
    sf.close()
    caps = {n: capacity(n) for n in names}
    assert all(0 < c < ATTEMPTS_PER_NODE for c in caps.values())  # room for fewer
    assert sum(e == "" for e in errors) == sum(caps.values()) == len(pods)
    for node in names:
        assert sum(p["node"] == node for p in pods) == caps[node]
    assert all("cannot bind" in e for e in errors if e)
    held_once(pods)

    # Restart: a fresh state rebuilt from the state file holds exactly the same.
    _, restored = StateFile.open(path)
    again = ClusterState(cluster)
    again.restore(restored)
    for node in names:
        before, after = ext.state.ledger(node), again.ledger(node)
        assert dict(after.holders()) == dict(before.holders())
        assert after.signature() == before.signature()
