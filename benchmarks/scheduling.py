"""Benchmark: pods bound per second by the real kube-scheduler on kwok nodes that carry
NodeTopology CRs, with Railyard's extender and without it, in the same run.

The method of Kubernetes' scheduler_perf: the pods exist before the scheduler runs (here
kube-scheduler is stopped while they are created), then the pods bound in each 1 s window
are counted, from a watch, until every pod is bound; the figures are the windows' median
and the average over the whole drain. Per mode, the CPU-seconds each process spent (read
from /proc before and after) divided by the pods bound — on a 2-core machine that measures
contention as well as work. It includes the background (kwok's node leases above all:
1,000 nodes renew 25 a second), so the rate of each process with the scheduler stopped is
measured first and reported beside it; it is not subtracted, because a saturated machine
delays the background rather than adding it. With the extender, the bind latency
(one Binding carrying the Allocation) is read from its own
`railyard_extender_request_duration_seconds{verb="bind"}` histogram (a Prometheus
histogram_quantile estimate), and its RSS at the end, when it
watches every node's CR and every pod.

Each node is a `dgx-h100` with 8 VFs per PF (kwok's capacity: 8 GPUs, 64 VFs); the pods are
the extender benchmark's mix (1, 2, 4 or 8 GPUs with as many VFs, and VF-only pods),
tolerating the kwok taint. The modes alternate (plain, extender, plain, ...) `--reps`
times; a namespace per round, deleted after it.

Needs root and the box's components (`hack/box build`); brings up its own box:

    python benchmarks/scheduling.py --nodes 1000 --pods 1000
    python benchmarks/scheduling.py --nodes 5000 --pods 2000 --keep /tmp/sched-box
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import yaml

from railyard.discovery.profiles import build_topology, profile
from railyard.kube.client import ApiError, Client
from railyard.kube.config import load_kubeconfig
from railyard.kube.nodetopology import publish
from railyard.kube.objects import Object, Pod

ROOT = Path(__file__).resolve().parents[1]
# (weight, GPUs, VFs), as benchmarks/extender.py: 1/2/4/8 GPUs with as many VFs, VF-only pods.
MIX = [(40, 1, 1), (20, 2, 2), (12, 4, 4), (13, 8, 8), (10, 0, 1), (5, 0, 2)]
VFS_PER_PF = 8  # dgx-h100 has 8 RDMA PFs: 64 VFs, kwok's railyard.dev/vf capacity
IDLE_SAMPLE_S = 10.0  # the background CPU rate is measured over this, scheduler stopped
PROCESSES = ("kube-scheduler", "railyard-scheduler", "kube-apiserver", "etcd", "kwok")
TICK = os.sysconf("SC_CLK_TCK")


def load_kubebox() -> ModuleType:
    """hack/kubebox.py is a script, not a package: load it by path."""
    spec = importlib.util.spec_from_file_location("kubebox", ROOT / "hack" / "kubebox.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kubebox"] = module
    spec.loader.exec_module(module)
    return module


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process, from /proc (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's estimate: linear interpolation inside the bucket holding quantile q.
    `buckets`: (upper bound, cumulative count), sorted, ending with +Inf."""
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = bound, count
    return lower


def bind_buckets(metrics: str) -> list[tuple[float, float]]:
    found = []
    for line in metrics.splitlines():
        if line.startswith("railyard_extender_request_duration_seconds_bucket") \
                and 'verb="bind"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            found.append((float(le), float(line.rsplit(" ", 1)[1])))
    return sorted(found)


async def api_requests(client: Client) -> dict[str, float]:
    """The API server's own request counters (`apiserver_request_total`), summed by verb and
    resource (watches counted as started, not per event)."""
    text = (await client.request("GET", "/metrics")).decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(part.split("=", 1) for part in
                      line[line.index("{") + 1:line.rindex("}")].split(",") if "=" in part)
        key = " ".join(labels.get(k, "").strip('"') for k in ("verb", "resource", "subresource"))
        totals[key.strip()] = totals.get(key.strip(), 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def failures(metrics: str) -> dict[str, float]:
    """`railyard_extender_failures_total` by verb and reason."""
    found = {}
    for line in metrics.splitlines():
        if line.startswith("railyard_extender_failures_total{"):
            labels = line[line.index("{") + 1:line.rindex("}")]
            found[labels.replace('"', "")] = float(line.rsplit(" ", 1)[1])
    return found


def pod_shapes(count: int, seed: int) -> list[tuple[int, int, int]]:
    """The round's pods as (weight, GPUs, VFs) draws from MIX; the same in every round."""
    rng = random.Random(seed)
    return rng.choices(MIX, weights=[w for w, *_ in MIX], k=count)


def pod_body(name: str, gpus: int, vfs: int) -> dict[str, Any]:
    limits = {"cpu": "1", "memory": "1Gi", "railyard.dev/vf": str(vfs)}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "railyard.test/none:bench",
                            "resources": {"limits": limits, "requests": limits}}],
        },
    }


class Round(msgspec.Struct):
    mode: str
    pods: int
    bound: int
    seconds: float  # first bind to last
    window_median: float  # pods bound per 1 s window
    window_p10: float
    average: float  # bound / seconds
    cpu: dict[str, float]  # CPU-milliseconds per bound pod, by process
    api_requests: dict[str, float] = {}  # API server requests per bound pod, by verb
    idle_cpu: dict[str, float] = {}  # CPU-s per s, scheduler stopped (kwok's leases...)
    idle_share: float = 0.0  # of the round's CPU, what the idle rate would have spent
    extender_failures: dict[str, float] = {}  # the extender's failure counters' growth
    bind_p50_ms: float | None = None
    bind_p99_ms: float | None = None


class Bench:
    def __init__(self, box: Any, extender_port: int, args: argparse.Namespace) -> None:
        self.box, self.args = box, args
        self.config = load_kubeconfig(box.layout.admin_kubeconfig)
        self.scheduler_yaml = box.layout.dir / "config" / "kube-scheduler.yaml"
        self.plain = yaml.safe_load(self.scheduler_yaml.read_text())
        self.with_extender = dict(self.plain)
        shipped = yaml.safe_load((ROOT / "deploy/kube-scheduler-config.yaml").read_text())
        self.extender_url = f"http://{box.layout.node_ip}:{extender_port}"
        self.with_extender["extenders"] = [
            {**e, "urlPrefix": f"{self.extender_url}/"} for e in shipped["extenders"]]

    def pid(self, name: str) -> int | None:
        return next((s.pid for s in self.box.state.started if s.name == name), None)

    def cpu(self) -> dict[str, float]:
        return {n: cpu_seconds(p) for n in PROCESSES if (p := self.pid(n)) is not None}

    async def publish_topologies(self, names: list[str]) -> None:
        base = build_topology(profile("dgx-h100"), vfs_per_pf=VFS_PER_PF, node="x")
        gate = asyncio.Semaphore(16)
        async with Client(self.config, qps=1000, burst=1000) as client:
            async def one(name: str) -> None:
                async with gate:
                    await publish(client, dataclasses.replace(base, node=name))
            started = time.monotonic()
            await asyncio.gather(*(one(n) for n in names))
        say(f"{len(names)} NodeTopology CRs in {time.monotonic() - started:.1f} s")

    def scheduler(self, config: dict[str, Any]) -> None:
        self.scheduler_yaml.write_text(yaml.safe_dump(config))
        self.box.restart("kube-scheduler")

    async def round(self, mode: str) -> Round:
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        shapes = pod_shapes(self.args.pods, self.args.seed)
        self.box.stop("kube-scheduler")
        async with Client(self.config, qps=1000, burst=1000) as client:
            await client.create("/api/v1/namespaces", {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, Object)
            await self.wait_service_account(client, ns)
            gate = asyncio.Semaphore(16)

            async def create(i: int) -> None:
                _, gpus, vfs = shapes[i]
                body = pod_body(f"p-{i}", gpus, vfs)
                async with gate:
                    await client.create(f"/api/v1/namespaces/{ns}/pods", body, Pod)
            await asyncio.gather(*(create(i) for i in range(self.args.pods)))
            pods, version = await client.list(f"/api/v1/namespaces/{ns}/pods", Pod)
            assert not any(p.spec.node_name for p in pods)
            idle = self.cpu()
            await asyncio.sleep(IDLE_SAMPLE_S)  # kwok's node leases, the watches: background
            before_api = await api_requests(client)
            before_cpu = self.cpu()
            background = {n: (before_cpu[n] - idle.get(n, 0.0)) / IDLE_SAMPLE_S
                          for n in before_cpu}
            t0 = time.monotonic()
            before_metrics = self.extender_metrics() if mode == "extender" else ""
            config = self.with_extender if mode == "extender" else self.plain
            watcher = asyncio.ensure_future(self.bound_times(client, ns, version))
            self.scheduler(config)
            try:
                times = await asyncio.wait_for(watcher, self.args.timeout)
            except TimeoutError:
                times = []
                say(f"{mode}: not every pod bound within {self.args.timeout:.0f} s")
            after_cpu = self.cpu()
            wall = time.monotonic() - t0
            after_api = await api_requests(client)
            after_metrics = self.extender_metrics() if mode == "extender" else ""
            # Each pod without grace (kwok would end them one by one; a deletecollection of
            # 2,000 pods outlasts the API server's 60 s request timeout), then the rest.
            async def remove(i: int) -> None:
                async with gate:
                    with contextlib.suppress(ApiError):
                        await client.request("DELETE", f"/api/v1/namespaces/{ns}/pods/p-{i}",
                                             params={"gracePeriodSeconds": "0"})
            await asyncio.gather(*(remove(i) for i in range(self.args.pods)))
            await client.delete(f"/api/v1/namespaces/{ns}")
            await self.wait_gone(client, ns)
        result = self.summarise(mode, times, before_cpu, after_cpu, before_metrics,
                                after_metrics)
        result.idle_cpu = {n: round(v, 3) for n, v in background.items()}
        result.idle_share = round(sum(background.values()) * wall / max(
            sum(after_cpu[n] - before_cpu.get(n, 0.0) for n in after_cpu), 1e-9), 2)
        result.api_requests = {k: round((after_api[k] - before_api.get(k, 0)) / max(
            result.bound, 1), 2) for k in sorted(after_api)
            if after_api[k] - before_api.get(k, 0) >= result.bound / 20}
        say(f"{mode}: API requests per bound pod {result.api_requests}")
        return result

    async def wait_service_account(self, client: Client, ns: str) -> None:
        for _ in range(600):
            with contextlib.suppress(ApiError):
                await client.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default", Object)
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"namespace {ns}: no default ServiceAccount after 60 s")

    async def wait_gone(self, client: Client, ns: str) -> None:
        """Until the namespace (and so every pod of the round) is gone: the next round
        starts on free nodes, in the extender's ledger too."""
        for _ in range(1200):
            try:
                await client.get(f"/api/v1/namespaces/{ns}", Object)
            except ApiError as e:
                if e.not_found:
                    return
                raise
            await asyncio.sleep(0.5)
        raise RuntimeError(f"namespace {ns} still there after 600 s")

    async def bound_times(self, client: Client, ns: str, version: str) -> list[float]:
        """When each pod got its node (watch from the list), until all have one or none
        was bound for `--idle` seconds (the rest did not fit)."""
        seen: dict[str, float] = {}

        async def watch() -> None:
            nonlocal version
            while len(seen) < self.args.pods:
                params = {"resourceVersion": version, "allowWatchBookmarks": "true",
                          "timeoutSeconds": "60"}
                async for line in client.watch_lines(f"/api/v1/namespaces/{ns}/pods", params):
                    obj = msgspec.json.decode(line).get("object", {})
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    name = obj.get("metadata", {}).get("name")
                    if obj.get("spec", {}).get("nodeName") and name not in seen:
                        seen[name] = time.monotonic()
                        if len(seen) == self.args.pods:
                            return

        task = asyncio.ensure_future(watch())
        try:
            while not task.done():
                await asyncio.wait([task], timeout=1.0)
                last = max(seen.values(), default=None)
                if last is not None and time.monotonic() - last > self.args.idle:
                    break
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return sorted(seen.values())

    def extender_metrics(self) -> str:
        with urllib.request.urlopen(f"{self.extender_url}/metrics", timeout=10) as response:
            return response.read().decode()

    def summarise(self, mode: str, times: list[float], before: dict[str, float],
                  after: dict[str, float], m0: str, m1: str) -> Round:
        bound = len(times)
        seconds = times[-1] - times[0] if bound > 1 else float("nan")
        windows = [0] * (int(seconds) + 1 if bound > 1 else 1)
        for t in times:
            windows[int(t - times[0])] += 1
        if len(windows) > 1:
            windows = windows[:-1]  # the last window is partial
        cpu = {n: round((after[n] - before.get(n, 0.0)) / max(bound, 1) * 1000, 2)
               for n in after if mode == "extender" or n != "railyard-scheduler"}
        result = Round(mode=mode, pods=self.args.pods, bound=bound, seconds=round(seconds, 2),
                       window_median=statistics.median(windows),
                       window_p10=sorted(windows)[len(windows) // 10],
                       average=round(bound / seconds, 1) if bound > 1 else 0.0, cpu=cpu)
        if m1:
            b0 = dict(bind_buckets(m0))
            delta = [(le, c - b0.get(le, 0.0)) for le, c in bind_buckets(m1)]
            result.bind_p50_ms = round(histogram_quantile(0.5, delta) * 1000, 2)
            result.bind_p99_ms = round(histogram_quantile(0.99, delta) * 1000, 2)
            f0 = failures(m0)
            result.extender_failures = {k: v - f0.get(k, 0.0) for k, v in failures(m1).items()
                                        if v > f0.get(k, 0.0)}
        say(f"{mode}: {bound} pods in {result.seconds} s, median {result.window_median}/s")
        return result


def say(message: str) -> None:
    print(f"[scheduling] {message}", file=sys.stderr, flush=True)


def table(rounds: list[Round], args: argparse.Namespace, extender_rss: tuple[float, float],
          shapes: str) -> str:
    lines = [
        f"- Machine: `{platform.platform()}`, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        f"- Command: `python benchmarks/scheduling.py --nodes {args.nodes} --pods {args.pods} "
        f"--reps {args.reps}`; {shapes}",
        "",
        "| mode | pods bound | drain (s) | pods/s median (1 s windows) | p10 window | average "
        "| CPU-ms per pod: kube-scheduler / extender / apiserver / etcd | bind p50 / p99 (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        cpu = " / ".join(str(r.cpu.get(n, "–")) for n in
                         ("kube-scheduler", "railyard-scheduler", "kube-apiserver", "etcd"))
        bind = f"{r.bind_p50_ms} / {r.bind_p99_ms}" if r.bind_p50_ms is not None else "–"
        lines.append(f"| {r.mode} | {r.bound}/{r.pods} | {r.seconds} | {r.window_median} | "
                     f"{r.window_p10} | {r.average} | {cpu} | {bind} |")
    lines.append("")
    for r in rounds:
        calls = ", ".join(f"{k} {v}" for k, v in r.api_requests.items())
        idle = ", ".join(f"{k} {v}" for k, v in r.idle_cpu.items())
        lines.append(f"- {r.mode}: idle CPU-s per s before the round: {idle} (at that rate, "
                     f"{r.idle_share:.0%} of the round's CPU)")
        lines.append(f"- API server requests per bound pod, {r.mode}: {calls}")
        if r.extender_failures:
            lines.append(f"  - extender failures: {r.extender_failures}")
    plain = [r.window_median for r in rounds if r.mode == "plain"]
    ext = [r.window_median for r in rounds if r.mode == "extender"]
    if plain and ext:
        lines.append("")
        lines.append(f"Extender ÷ plain (median of the rounds' median windows): "
                     f"**{statistics.median(ext) / statistics.median(plain):.2f}×**. "
                     f"Extender RSS at the end: {extender_rss[0]:.0f} MB "
                     f"(peak {extender_rss[1]:.0f} MB).")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    kubebox = load_kubebox()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="railyard-sched-"))
    box = kubebox.Box(folder, kwok_nodes=args.nodes)
    started = time.monotonic()
    box.up()
    say(f"box with {args.nodes} kwok nodes up in {time.monotonic() - started:.0f} s")
    try:
        bench = Bench(box, kubebox.EXTENDER_PORT, args)
        names = [f"kwok-node-{i}" for i in range(args.nodes)]
        box.start_railyard_extender("--kube-qps", str(args.extender_qps),
                                    "--kube-burst", str(args.extender_qps * 2))
        await bench.publish_topologies(names)
        rounds = []
        for _ in range(args.reps):
            for mode in ("plain", "extender"):
                rounds.append(await bench.round(mode))
        pid = bench.pid("railyard-scheduler")
        rss = rss_mb(pid) if pid else (float("nan"), float("nan"))
        shapes = (f"{args.nodes} kwok nodes, each a dgx-h100 NodeTopology with {VFS_PER_PF} "
                  f"VFs per PF; extender client {args.extender_qps} QPS (kube-scheduler's: "
                  "200)")
        print(table(rounds, args, rss, shapes))
        if args.json:
            args.json.write_text(json.dumps([msgspec.to_builtins(r) for r in rounds], indent=1))
        return 0
    finally:
        if args.keep is None:
            box.down()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000, help="kwok nodes (default 1000)")
    p.add_argument("--pods", type=int, default=1000, help="pods per round (default 1000)")
    p.add_argument("--reps", type=int, default=1, help="rounds per mode (default 1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for a round's pods to bind (default 600)")
    p.add_argument("--idle", type=float, default=15.0,
                   help="end a round when no pod was bound for this long (default 15 s)")
    p.add_argument("--extender-qps", type=int, default=200,
                   help="the extender's API client QPS; burst is twice it (default 200, as the "
                   "box's kube-scheduler)")
    p.add_argument("--keep", type=Path, help="use this folder for the box and leave it up")
    p.add_argument("--json", type=Path, help="also write the rounds as JSON here")
    args = p.parse_args()
    if os.geteuid() != 0:
        p.error("the box needs root (network namespaces, mounts, cgroups)")
    if args.nodes < 1 or args.pods < 1 or args.reps < 1:
        p.error("--nodes, --pods and --reps must be at least 1")
    demand = sum(gpus for _, gpus, _ in pod_shapes(args.pods, args.seed))
    if demand > 8 * args.nodes // 2:
        p.error(f"{args.pods} pods ask {demand} GPUs, over half of {args.nodes} nodes' "
                f"{8 * args.nodes}: the drain would measure a full cluster; use more nodes")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
