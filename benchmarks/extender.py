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
import itertools
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
        from railyard.scheduler.service import Extender, settle_heap
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
        settle_heap()  # as `railyard scheduler` does after loading
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


class Cycler:
    """filter → prioritize → bind cycles against one extender, one after another, as
    kube-scheduler's single scheduling thread makes them.

    `per_call` names: like kube-scheduler, walk the nodes from a rotating start index and
    keep those its own filters pass (enough free `nvidia.com/gpu`, tracked from the binds)
    until `per_call` are found. None: every node of the cluster, unfiltered.
    """

    def __init__(self, url: str, session: aiohttp.ClientSession, free_gpus: dict[str, int],
                 per_call: int | None, seed: int) -> None:
        self.url, self.s, self.free, self.per_call = url, session, free_gpus, per_call
        self.names = list(free_gpus)
        self.rng = random.Random(seed)
        self.seed = seed
        self.start_index = 0
        self.enc = msgspec.json.Encoder()
        self.reset()

    def reset(self) -> None:
        self.cycle_s: list[float] = []
        self.filter_ms: list[float] = []
        self.prioritize_ms: list[float] = []
        self.bind_ms: list[float] = []
        self.sent = self.bound = self.unschedulable = 0

    def _names(self, gpus: int) -> list[str]:
        if self.per_call is None:
            return self.names
        names, k, n = [], 0, len(self.names)
        while len(names) < self.per_call and k < n:
            name = self.names[(self.start_index + k) % n]
            k += 1
            if self.free[name] >= gpus:
                names.append(name)
        self.start_index = (self.start_index + k) % n
        return names

    async def _post(self, verb: str, body: dict[str, Any]) -> Any:
        async with self.s.post(f"{self.url}/{verb}", data=self.enc.encode(body),
                               headers={"Content-Type": "application/json"}) as r:
            return msgspec.json.decode(await r.read())

    async def step(self) -> None:
        i = len(self.cycle_s)
        uid = f"{self.seed:04d}{i:06d}-{self.rng.getrandbits(32):08x}"
        gpus, vfs = pick_shape(self.rng)
        pod = make_pod(uid, gpus, vfs)
        names = self._names(gpus)  # kube-scheduler's own work: not timed
        self.sent += len(names)
        t0 = time.perf_counter()
        fr = await self._post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        self.filter_ms.append((time.perf_counter() - t0) * 1e3)
        fits = fr["NodeNames"] or []
        if fits:
            t1 = time.perf_counter()
            scores = await self._post("prioritize",
                                      {"Pod": pod, "Nodes": None, "NodeNames": fits})
            best = max(scores, key=lambda h: h["Score"])["Host"]
            t2 = time.perf_counter()
            br = await self._post("bind", {"PodName": pod["metadata"]["name"],
                                           "PodNamespace": "ml", "PodUID": uid, "Node": best})
            self.prioritize_ms.append((t2 - t1) * 1e3)
            self.bind_ms.append((time.perf_counter() - t2) * 1e3)
            if br["Error"] == "":
                self.bound += 1
                self.free[best] -= gpus
        else:
            self.unschedulable += 1
        self.cycle_s.append(time.perf_counter() - t0)

    def result(self) -> dict[str, Any]:
        q = statistics.quantiles(self.filter_ms, n=100)
        n = len(self.cycle_s)
        return {"cycles": n, "cycles_per_s": n / sum(self.cycle_s),
                "cycle_p50_ms": statistics.median(self.cycle_s) * 1e3,
                "filter_p50_ms": statistics.median(self.filter_ms), "filter_p99_ms": q[98],
                "prioritize_p50_ms": statistics.median(self.prioritize_ms or [0]),
                "bind_p50_ms": statistics.median(self.bind_ms or [0]),
                "names_per_call": self.sent / n, "bound": self.bound,
                "unschedulable": self.unschedulable}


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


async def server_seconds(url: str, session: aiohttp.ClientSession) -> dict[str, float]:
    """The extender's own time per verb so far (sum of its latency histogram)."""
    async with session.get(f"{url}/metrics") as r:
        if r.status != 200:
            return {}
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("railyard_extender_request_duration_seconds_sum{"):
            verb = line.split('verb="')[1].split('"')[0]
            out[verb] = float(line.rsplit(" ", 1)[1])
    return out


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
    """Both extenders run at once and the cycles alternate between them, so a machine
    shared with other work slows both alike; the ratio is what this measures best."""
    kinds = ("trivial", "railyard")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        state_file = None if opts.no_state_file else str(Path(tmp) / "state")
        procs = {k: start_server(k, opts.port + i, state_file if k == "railyard" else None,
                                 opts.full, opts.partial) for i, k in enumerate(kinds)}
        urls = {k: f"http://127.0.0.1:{opts.port + i}" for i, k in enumerate(kinds)}
        try:
            for k in kinds:
                await wait_healthy(urls[k], procs[k])
            loaded = {k: rss_mb(procs[k].pid) for k in kinds}
            free = {k: await gpus_free_now(urls[k], k) for k in kinds}
            conn = {k: aiohttp.TCPConnector(limit=1) for k in kinds}
            sessions = {k: aiohttp.ClientSession(connector=conn[k]) for k in kinds}
            try:
                for repeat, per_call in itertools.product(range(opts.repeats), (500, None)):
                    run = {k: Cycler(urls[k], sessions[k], free[k], per_call,
                                     seed=(per_call or 5000) + repeat) for k in kinds}
                    warm = opts.warmup if per_call and repeat == 0 else 20
                    for _ in range(warm):  # answers for the prefilled nodes: steady state
                        for k in kinds:
                            await run[k].step()
                    for k in kinds:
                        run[k].reset()
                    n = opts.cycles if per_call else max(opts.cycles // 4, 50)
                    before = await server_seconds(urls["railyard"], sessions["railyard"])
                    for _ in range(n):
                        for k in kinds:
                            await run[k].step()
                    after = await server_seconds(urls["railyard"], sessions["railyard"])
                    inside = {f"server_{v}_mean_ms": (after[v] - before.get(v, 0)) / n * 1e3
                              for v in ("filter", "prioritize", "bind") if v in after}
                    for k in kinds:
                        rows.append({"extender": k, "case": per_call or "all", "repeat": repeat,
                                     **run[k].result(),
                                     **(inside if k == "railyard" else {}),
                                     "rss_loaded_mb": loaded[k],
                                     "rss_after_mb": rss_mb(procs[k].pid)})
                        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            finally:
                for k in kinds:
                    await sessions[k].close()
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                p.wait(30)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Medians over the repeats; the ratio is taken within each repeat (same moment)."""
    trivial = {(r["case"], r["repeat"]): r for r in rows if r["extender"] == "trivial"}
    for r in rows:
        r["ratio"] = trivial[(r["case"], r["repeat"])]["cycles_per_s"] / r["cycles_per_s"]
    out = ["| extender | names per call (mean) | cycles/s | filter p50 ms | filter p99 ms | "
           "time per cycle vs trivial | bind p50 ms | RSS loaded → after MB |",
           "|---|---|---|---|---|---|---|---|"]
    for (kind, _case), group in itertools.groupby(
            sorted(rows, key=lambda r: (str(r["case"]), r["extender"] != "trivial")),
            key=lambda r: (r["extender"], r["case"])):
        g = list(group)

        def med(key: str, g: list[dict[str, Any]] = g) -> float:
            return statistics.median(r[key] for r in g)

        out.append(f"| {kind} | {med('names_per_call'):.0f} | {med('cycles_per_s'):.0f} | "
                   f"{med('filter_p50_ms'):.2f} | {med('filter_p99_ms'):.2f} | "
                   f"{med('ratio'):.2f} | {med('bind_p50_ms'):.2f} | "
                   f"{med('rss_loaded_mb'):.0f} → {max(r['rss_after_mb'] for r in g):.0f} |")
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
    p.add_argument("--repeats", type=int, default=3, help="medians over this many runs")
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
