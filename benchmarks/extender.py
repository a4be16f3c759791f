"""Benchmark: the scheduler extender over real HTTP on localhost, against a trivial extender.

A 5,000-node cluster (dgx-h100, dgx-a100, hgx-h100-4nic) already partly full, then
filter → prioritize → bind cycles as kube-scheduler makes them in cache mode
(`nodeCacheCapable`), with a realistic pod mix, and ~500 names per call (what kube-scheduler
sends at 5,000 nodes) or all 5,000. In the same run, the same cycles against a trivial
extender on the same HTTP stack that accepts every node. The server runs in its own process;
the client is included in the cycle time.

    python benchmarks/extender.py                 # full run, markdown table on stdout
    python benchmarks/extender.py --cycles 300    # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

SPEC = "dgx-h100:2000,dgx-a100:1500,hgx-h100-4nic:1500"
# (weight, GPUs, VFs): 1/2/4/8 GPUs with as many VFs, and some VF-only pods.
MIX = [(40, 1, 1), (20, 2, 2), (12, 4, 4), (13, 8, 8), (10, 0, 1), (5, 0, 2)]


def pick_shape(rng: random.Random) -> tuple[int, int]:
    _, gpus, vfs = rng.choices(MIX, weights=[w for w, *_ in MIX])[0]
    return gpus, vfs


def make_pod(uid: str, gpus: int, vfs: int) -> dict[str, Any]:
    """A Pod about as large as a real training pod's JSON (labels, env, status)."""
    limits = {"cpu": "16", "memory": "64Gi"}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    limits["railyard.dev/vf"] = str(vfs)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"train-{uid}", "namespace": "ml", "uid": uid, "resourceVersion": "12345",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "labels": {"app": "llm-train", "job": f"job-{uid[:6]}", "team": "research",
                       "batch.kubernetes.io/job-completion-index": "0"},
            "annotations": {"k8s.v1.cni.cncf.io/networks": "railyard-rdma",
                            "railyard.dev/request": '{"numa": "preferred"}'},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "job",
                                 "uid": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
                                 "controller": True}],
        },
        "spec": {
            "schedulerName": "default-scheduler", "restartPolicy": "Never",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "containers": [{
                "name": "trainer", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "command": ["torchrun", "--nproc-per-node", str(max(gpus, 1)), "train.py"],
                "env": [{"name": f"VAR_{i}", "value": f"value-{i}"} for i in range(12)],
                "resources": {"limits": limits, "requests": limits},
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
            }],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
        },
        "status": {"phase": "Pending", "qosClass": "Guaranteed"},
    }


# ------------------------------------------------------------------------ servers


def prefill(state: Any, rng: random.Random, full: float, partial: float) -> int:
    """Leave the cluster as binpacking does: some nodes full, a few partly used, most empty."""
    from railyard.allocation.request import Request
    from railyard.allocation.types import Allocation

    names = state.node_names()
    rng.shuffle(names)
    n_full, n_partial = int(len(names) * full), int(len(names) * partial)
    bound = 0
    for i, node in enumerate(names[:n_full + n_partial]):
        misses, pods = 0, 0
        while misses < 3 and (i < n_full or pods < rng.randint(1, 3)):
            gpus, vfs = pick_shape(rng)
            r = state.bind(f"pre-{node}-{pods}-{misses}", "ml", "pre", node,
                           Request(gpus=gpus, vfs=vfs))
            if isinstance(r, Allocation):
                pods += 1
                bound += 1
            else:
                misses += 1
    return bound


def serve(kind: str, port: int, state_file: str | None, full: float, partial: float,
          profile: str | None = None) -> None:
    from aiohttp import web

    if kind == "trivial":
        from railyard.scheduler.wire import ExtenderArgs, decode

        async def accept(request: web.Request) -> web.Response:
            a = decode(await request.read(), ExtenderArgs)
            return web.Response(body=msgspec.json.encode({
                "Nodes": None, "NodeNames": a.NodeNames, "FailedNodes": {},
                "FailedAndUnresolvableNodes": {}, "Error": ""}), content_type="application/json")

        async def zero(request: web.Request) -> web.Response:
            a = decode(await request.read(), ExtenderArgs)
            return web.Response(body=msgspec.json.encode(
                [{"Host": n, "Score": 0} for n in a.NodeNames or []]),
                content_type="application/json")

        async def bind(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=b'{"Error":""}', content_type="application/json")

        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/filter", accept)
        app.router.add_post("/prioritize", zero)
        app.router.add_post("/bind", bind)
        app.router.add_get("/healthz", health)
    else:
        from railyard.scheduler.cluster_file import cluster_from_spec
        from railyard.scheduler.service import Extender
        from railyard.scheduler.state import ClusterState
        from railyard.scheduler.state_file import StateFile

        t0 = time.perf_counter()
        state = ClusterState(cluster_from_spec(SPEC))
        bound = prefill(state, random.Random(7), full, partial)
        sf = None
        if state_file:
            sf, _ = StateFile.open(state_file, seed=state.pods())
            sf.compact()
        print(f"railyard extender: {len(state)} nodes, {bound} pods prefilled in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        app = Extender(state, sf, state_file=sf).app()
    profiler = None
    if profile:  # the serving phase only, not the prefill
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None,
                    handle_signals=True)
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)


# ------------------------------------------------------------------------ client


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError("benchmark server exited")
            try:
                async with s.get(f"{url}/healthz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("benchmark server did not start")


async def cycles(url: str, free_gpus: dict[str, int], per_call: int | None, n: int,
                 seed: int) -> dict[str, Any]:
    """n filter → prioritize → bind cycles, one after another, as kube-scheduler's one
    scheduling thread makes them.

    `per_call` names: like kube-scheduler, walk the nodes from a rotating start index and
    keep those its own filters pass (enough free `nvidia.com/gpu`, tracked from the binds)
    until `per_call` are found. None: every node of the cluster, unfiltered.
    """
    rng = random.Random(seed)
    enc = msgspec.json.Encoder()
    all_names = list(free_gpus)
    filter_ms: list[float] = []
    prio_ms: list[float] = []
    bind_ms: list[float] = []
    sent = bound = unschedulable = 0
    start_index = 0
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as s:
        t0 = time.perf_counter()
        for i in range(n):
            uid = f"{seed:04d}{i:06d}-bench"
            gpus, vfs = pick_shape(rng)
            pod = make_pod(uid, gpus, vfs)
            if per_call is None:
                names = all_names
            else:
                names, k = [], 0
                while len(names) < per_call and k < len(all_names):
                    name = all_names[(start_index + k) % len(all_names)]
                    k += 1
                    if free_gpus[name] >= gpus:
                        names.append(name)
                start_index = (start_index + k) % len(all_names)
            sent += len(names)
            f0 = time.perf_counter()
            async with s.post(f"{url}/filter", headers=headers,
                              data=enc.encode({"Pod": pod, "Nodes": None, "NodeNames": names})
                              ) as r:
                fr = msgspec.json.decode(await r.read())
            filter_ms.append((time.perf_counter() - f0) * 1e3)
            fits = fr["NodeNames"] or []
            if not fits:
                unschedulable += 1
                continue
            p0 = time.perf_counter()
            async with s.post(f"{url}/prioritize", headers=headers,
                              data=enc.encode({"Pod": pod, "Nodes": None, "NodeNames": fits})
                              ) as r:
                scores = msgspec.json.decode(await r.read())
            prio_ms.append((time.perf_counter() - p0) * 1e3)
            best = max(scores, key=lambda h: h["Score"])["Host"]
            b0 = time.perf_counter()
            async with s.post(f"{url}/bind", headers=headers, data=enc.encode({
                    "PodName": pod["metadata"]["name"], "PodNamespace": "ml", "PodUID": uid,
                    "Node": best})) as r:
                if msgspec.json.decode(await r.read())["Error"] == "":
                    bound += 1
                    free_gpus[best] -= gpus
            bind_ms.append((time.perf_counter() - b0) * 1e3)
        wall = time.perf_counter() - t0
    q = statistics.quantiles(filter_ms, n=100)
    return {"cycles": n, "cycles_per_s": n / wall, "filter_p50_ms": statistics.median(filter_ms),
            "filter_p99_ms": q[98], "prioritize_p50_ms": statistics.median(prio_ms),
            "bind_p50_ms": statistics.median(bind_ms), "names_per_call": sent / n, "bound": bound,
            "unschedulable": unschedulable}


async def gpus_free_now(url: str, kind: str) -> dict[str, int]:
    """Free GPUs per node as kube-scheduler would count them (prefilled pods included)."""
    from railyard.scheduler.cluster_file import cluster_from_spec

    free = {t.node: len(t.gpus) for t in cluster_from_spec(SPEC)}
    if kind == "railyard":
        async with aiohttp.ClientSession() as s, s.get(f"{url}/allocations") as r:
            for p in (await r.json())["pods"]:
                a = p["allocation"]
                free[p["node"]] -= len(a["pairs"]) + len(a["gpus"])
    return free


def start_server(kind: str, port: int, state_file: str | None, full: float,
                 partial: float) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "serve", "--kind", kind, "--port", str(port),
           "--full", str(full), "--partial", str(partial)]
    if state_file:
        cmd += ["--state-file", state_file]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(cmd, env=env)


async def bench(opts: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("trivial", "railyard"):
            state_file = (str(Path(tmp) / "state") if kind == "railyard"
                          and not opts.no_state_file else None)
            proc = start_server(kind, opts.port, state_file, opts.full, opts.partial)
            url = f"http://127.0.0.1:{opts.port}"
            try:
                await wait_healthy(url, proc)
                loaded = rss_mb(proc.pid)
                free = await gpus_free_now(url, kind)
                if opts.warmup:  # reach the steady state: answers for the prefilled nodes
                    await cycles(url, free, 500, opts.warmup, seed=99)
                for per_call in (500, None):
                    n = opts.cycles if per_call else max(opts.cycles // 3, 50)
                    r = await cycles(url, free, per_call, n, seed=per_call or 5000)
                    rows.append({"extender": kind, "names": per_call or len(free), **r,
                                 "rss_loaded_mb": loaded, "rss_after_mb": rss_mb(proc.pid)})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            finally:
                proc.terminate()
                proc.wait(30)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    trivial = {r["names"]: r for r in rows if r["extender"] == "trivial"}
    out = ["| extender | names per call (mean) | cycles/s | filter p50 ms | filter p99 ms | "
           "ratio to trivial (time per cycle) | bound / unschedulable | RSS loaded → after MB |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = trivial[r["names"]]["cycles_per_s"] / r["cycles_per_s"]
        out.append(f"| {r['extender']} | {r['names_per_call']:.0f} | {r['cycles_per_s']:.0f} | "
                   f"{r['filter_p50_ms']:.2f} | {r['filter_p99_ms']:.2f} | {ratio:.2f} | "
                   f"{r['bound']} / {r['unschedulable']} | "
                   f"{r['rss_loaded_mb']:.0f} → {r['rss_after_mb']:.0f} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("serve")
    s.add_argument("--kind", choices=["railyard", "trivial"], required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--state-file")
    s.add_argument("--full", type=float, default=0.3)
    s.add_argument("--partial", type=float, default=0.1)
    s.add_argument("--profile", help="write a cProfile of the serving phase here")
    p.add_argument("--cycles", type=int, default=2000, help="cycles with ~500 names")
    p.add_argument("--warmup", type=int, default=600, help="cycles before measuring")
    p.add_argument("--port", type=int, default=18888)
    p.add_argument("--full", type=float, default=0.3, help="fraction of nodes prefilled full")
    p.add_argument("--partial", type=float, default=0.1, help="fraction with 1-3 pods")
    p.add_argument("--no-state-file", action="store_true", help="bind without fsync")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    opts = p.parse_args()
    if opts.cmd == "serve":
        serve(opts.kind, opts.port, opts.state_file, opts.full, opts.partial, opts.profile)
        return
    rows = asyncio.run(bench(opts))
    print(json.dumps(rows, indent=2) if opts.json else table(rows))


if __name__ == "__main__":
    main()
