"""The extender reads VF pools by the names `--vf-pool` gives it (docs/decisions/0085): a pod
asking VFs of a pool gets them from that pool, paired or not as its request says, and the
record names each VF's pool."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import aiohttp
import pytest
from scheduler_helpers import args, served
from typer.testing import CliRunner

from railyard.allocation.names import DEFAULT_RESOURCES
from railyard.cli.main import app
from railyard.discovery.profiles import build_topology, profile
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState
from support.pods import pod

RAIL = "railyard.dev/vf-rail"
NAMES = replace(DEFAULT_RESOURCES, vf_pools=(RAIL,))


def pooled(name: str):
    """A DGX H100 whose VFs 2-3 of every PF are in RAIL."""
    t = build_topology(profile("dgx-h100"), vfs_per_pf=4, node=name)
    return replace(t, nics=tuple(replace(n, vfs=tuple(
        replace(v, pool=RAIL if v.vf_index >= 2 else None) for v in n.vfs)) for n in t.nics))


def asking(uid: str, **limits: int) -> dict:
    return pod(uid, {"main": {"cpu": "4", "memory": "16Gi", **{
        {"gpu": "nvidia.com/gpu", "vf": "railyard.dev/vf", "rail": RAIL}[k]: n
        for k, n in limits.items()}}}, scheduler_name="default-scheduler")


async def call(ext: Extender, path: str, body: dict) -> dict:
    async with served(ext) as url, aiohttp.ClientSession() as s, s.post(
            f"{url}{path}", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}) as r:
        return await r.json()


def test_a_pod_asking_a_pools_vfs_is_bound_with_that_pools_vfs_paired():
    ext = Extender(ClusterState([pooled("n1")]), names=NAMES)
    p = asking("u1", gpu=2, rail=2, vf=1)  # the default pool asked too: it pairs

    async def go():
        f = await call(ext, "/filter", args(p, ["n1"]))
        b = await call(ext, "/bind", {"PodName": "u1", "PodNamespace": "default",
                                     "PodUID": "u1", "Node": "n1"})
        return f, b

    f, b = asyncio.run(go())
    assert f["NodeNames"] == ["n1"] and b["Error"] == ""
    a = dict(ext.state.ledger("n1").holders())["u1"]
    assert sorted(str(n.pool) for n in a.vfs) == ["None", RAIL, RAIL]
    assert all(p.nic.pool is None for p in a.pairs) and len(a.pairs) == 2


def test_without_the_pool_name_the_extender_does_not_count_the_pools_vfs():
    ext = Extender(ClusterState([pooled("n1")]))
    f = asyncio.run(call(ext, "/filter", args(asking("u1", gpu=1, rail=1), ["n1"])))
    assert f["NodeNames"] == ["n1"]  # read as a GPU-only pod: kube-scheduler counts RAIL


def test_a_node_without_the_pool_fails_the_filter_naming_the_pool():
    ext = Extender(ClusterState([build_topology(profile("dgx-h100"), vfs_per_pf=4,
                                                node="plain")]), names=NAMES)
    f = asyncio.run(call(ext, "/filter", args(asking("u1", gpu=1, rail=1), ["plain"])))
    assert f["NodeNames"] == [] and RAIL in f["FailedAndUnresolvableNodes"]["plain"]


@pytest.mark.parametrize("flag,words", [("no-slash", "extended resource"),
                                        ("railyard.dev/pf", "already")])
def test_a_bad_vf_pool_flag_is_one_line(flag, words):
    out = CliRunner().invoke(app, ["scheduler", "--cluster-file", "/nonexistent",
                                   "--vf-pool", flag])
    assert out.exit_code != 0 and words in out.output
