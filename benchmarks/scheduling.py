"""Benchmark: pods bound per second by the real kube-scheduler on kwok nodes that carry
NodeTopology CRs: without an extender (`plain`), with a trivial extender on Railyard's own
HTTP stack (`trivial`: the protocol's own price), and with Railyard's (`railyard`), the
modes interleaved in the same run (issue 28).

The method of Kubernetes' scheduler_perf: the pods exist before the scheduler runs (here
every scheduler is stopped while they are created), then the pods bound in each 1 s window
are counted, from a watch, until every pod is bound; the figures are the windows' median
and the average over the whole drain. Per mode, the CPU-seconds each process spent (read
from /proc before and after) divided by the pods bound — on a 2-core machine that measures
contention as well as work. It includes the background (kwok's node leases above all:
1,000 nodes renew 25 a second), so the rate of each process with the scheduler stopped is
measured first and reported beside it; it is not subtracted, because a saturated machine
delays the background rather than adding it. With an extender, the bind latency is read
from its own `railyard_extender_request_duration_seconds{verb="bind"}` histogram (a
Prometheus histogram_quantile estimate; its top bucket is kube-scheduler's 5 s
`httpTimeout`, so the binds above it are the binds kube-scheduler timed out), and its RSS
when the round has drained, when it watches every node's CR and every pod. Retries are
kube-scheduler's own: from its `/metrics`, the pods that needed more than one attempt
(`scheduler_pod_scheduling_attempts`) and the attempts by result
(`scheduler_schedule_attempts_total`).

Only the mode's own extender runs during its round (the others are stopped: a cluster
without Railyard runs no Railyard). The modes:

- `plain`: kube-scheduler as the box configures it, no extender.
- `trivial`: `--serve-trivial` below, in its own process as the box runs Railyard's: aiohttp
  behind Railyard's connection guard, msgspec for the messages, Railyard's API client for
  the Binding. Filter keeps every node, prioritize scores 0, bind posts a plain Binding.
- `railyard`: `railyard scheduler` as `hack/box up --with-railyard` runs it.
- `trivial+prioritize`, `railyard+prioritize`: the same with
  `deploy/kube-scheduler-config-prioritize.yaml` (filter, prioritize, bind; Railyard's with
  --no-filter-ranks, as before decision 0104); without `+prioritize`, the shipped
  `deploy/kube-scheduler-config.yaml` (filter and bind: Railyard's filter returns only the
  nodes it ranks best).
- `railyard+events`: Railyard's with `--allocated-events` (an `Allocated` Event per bind; off
  in the shipped default, decision 0116). Every `railyard` mode names its Events flag, so
  the box's own extender (started with them, for its tests) never serves a round as is.
- `koordinator`: from `benchmarks/koordinator_mode.py` when it is there: its
  `mode(bench: Bench) -> Mode` (see `Mode`).
- `dra`: from `benchmarks/dra_mode.py` (issue 29), the same way: kube-scheduler's own DRA
  allocator, no extender, on the nodes' Railyard ResourceSlices, each pod one claim.

Each node is a `dgx-h100` with 8 VFs per PF (kwok's capacity: 8 GPUs, 64 VFs); the pods are
the extender benchmark's mix (1, 2, 4 or 8 GPUs with as many VFs, and VF-only pods),
tolerating the kwok taint. The modes alternate `--reps` times; a namespace per round,
deleted after it.

Needs root and the box's components (`hack/box build`); brings up its own box:

    python benchmarks/scheduling.py --nodes 1000 --pods 1000 --modes plain,trivial,railyard --reps 3
    python benchmarks/scheduling.py --nodes 5000 --pods 2000 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import os
import platform
import random
import ssl
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import yaml

from railyard.cli.scheduler import BIND_CONNECTIONS
from railyard.discovery.profiles import build_topology, profile
from railyard.kube.client import ApiError, Client, RequestTiming
from railyard.kube.config import load_kubeconfig
from railyard.kube.nodetopology import publish
from railyard.kube.objects import Object, Pod
from railyard.scheduler.metrics import BIND_PHASES

ROOT = Path(__file__).resolve().parents[1]
# (weight, GPUs, VFs), as benchmarks/extender.py: 1/2/4/8 GPUs with as many VFs, VF-only pods.
MIX = [(40, 1, 1), (20, 2, 2), (12, 4, 4), (13, 8, 8), (10, 0, 1), (5, 0, 2)]
VFS_PER_PF = 8  # dgx-h100 has 8 RDMA PFs: 64 VFs, kwok's railyard.dev/vf capacity
IDLE_SAMPLE_S = 10.0  # the background CPU rate is measured over this, scheduler stopped
PROCESSES = ("kube-scheduler", "railyard-scheduler", "trivial-extender", "kube-apiserver",
             "etcd", "kwok")
TICK = os.sysconf("SC_CLK_TCK")
TRIVIAL_PORT_OFFSET = 1  # the trivial extender listens on the box's extender port + 1
HTTP_TIMEOUT_S = 5.0  # kube-scheduler's httpTimeout in both configurations
SHIPPED = ROOT / "deploy/kube-scheduler-config.yaml"  # filter (ranked) and bind
WITH_PRIORITIZE = ROOT / "deploy/kube-scheduler-config-prioritize.yaml"


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


def cpu_wait_seconds(pid: int) -> float:
    """Time one process's threads were ready to run but waited for a CPU (the run queue's
    delay, /proc/PID/task/*/schedstat's second field; 0 when it is gone): on two shared
    cores, the part of a slow answer that no code of the process spent."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int(stat.read_text().split()[1])
    return total / 1e9


def per_pod_ms(before: dict[str, float], after: dict[str, float], pods: int
               ) -> dict[str, float]:
    """Each process's seconds over the round (`after` less `before`) as ms per bound pod."""
    return {n: round((after[n] - before.get(n, 0.0)) / max(pods, 1) * 1000, 2) for n in after}


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


def samples(metrics: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric `name` (exactly: `name{...} value` or `name value`), with its
    labels."""
    found = []
    for line in metrics.splitlines():
        if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " "):
            continue
        labels: dict[str, str] = {}
        if line[len(name)] == "{":
            inner = line[len(name) + 1:line.rindex("}")]
            for part in inner.split(","):
                key, sep, value = part.partition("=")
                if sep:
                    labels[key.strip()] = value.strip().strip('"')
        found.append((labels, float(line.rsplit(" ", 1)[1])))
    return found


def summed_buckets(metrics: str, name: str, **match: str) -> dict[float, float]:
    """A histogram's cumulative count by `le`, summed over the samples whose labels match
    (the API server splits one request kind over scope, version, component...)."""
    summed: dict[float, float] = {}
    for labels, value in samples(metrics, f"{name}_bucket"):
        if all(labels.get(k) == v for k, v in match.items()):
            le = float(labels["le"])
            summed[le] = summed.get(le, 0.0) + value
    return summed


def grown(before: dict[float, float], after: dict[float, float]) -> list[tuple[float, float]]:
    return sorted((le, count - before.get(le, 0.0)) for le, count in after.items())


def buckets_of(metrics: str, name: str, **match: str) -> list[tuple[float, float]]:
    """A histogram's (le, cumulative count) for the samples whose labels match, sorted."""
    return sorted(summed_buckets(metrics, name, **match).items())


def bind_buckets(metrics: str) -> list[tuple[float, float]]:
    return buckets_of(metrics, "railyard_extender_request_duration_seconds", verb="bind")


def quantiles_ms(m0: str, m1: str, name: str, key: str, **match: str) -> dict[str, float]:
    """p50 and p99 (ms) of a histogram's observations over the round, as `{key}P50Ms`..."""
    delta = grown(summed_buckets(m0, name, **match), summed_buckets(m1, name, **match))
    if not delta or delta[-1][1] <= 0:
        return {}
    return {f"{key}P{round(q * 100)}Ms": round(histogram_quantile(q, delta) * 1000, 1)
            for q in (0.5, 0.99)}


def bind_phases(m0: str, m1: str) -> dict[str, float]:
    """Where an extender's binds spent their time over the round, p50 and p99 in ms: Railyard's
    decide and write phases; for both extenders the Binding create's parts on their side of
    the wire (limit, connection, wire) and how late their loop ran a timer (loopLag); and how
    many of Railyard's allocations were decided from filter's memo or in the worker."""
    out: dict[str, float] = {}
    for phase in BIND_PHASES:
        out |= quantiles_ms(m0, m1, "railyard_extender_bind_phase_seconds", phase,
                            phase=phase)
    out |= quantiles_ms(m0, m1, "railyard_extender_loop_lag_seconds", "loopLag")
    before = {labels.get("where"): v
              for labels, v in samples(m0, "railyard_extender_bind_decisions_total")}
    for labels, value in samples(m1, "railyard_extender_bind_decisions_total"):
        where = labels.get("where")
        out[f"decided_{where}"] = value - before.get(where, 0.0)
    return out


def failures(metrics: str) -> dict[str, float]:
    """`railyard_extender_failures_total` by verb and reason."""
    return {f"verb={labels.get('verb')},reason={labels.get('reason')}": value
            for labels, value in samples(metrics, "railyard_extender_failures_total")}


def retried_pods(metrics: str) -> int:
    """Pods kube-scheduler bound only after more than one attempt: its
    `scheduler_pod_scheduling_attempts` histogram (attempts per pod scheduled) less the
    pods of its first bucket (le=1)."""
    buckets = buckets_of(metrics, "scheduler_pod_scheduling_attempts")
    if not buckets:
        return 0
    first = next((count for le, count in buckets if le == 1.0), 0.0)
    return int(buckets[-1][1] - first)


def attempts_by_result(metrics: str) -> dict[str, int]:
    """`scheduler_schedule_attempts_total` by result (scheduled, unschedulable, error)."""
    out: dict[str, int] = {}
    for labels, value in samples(metrics, "scheduler_schedule_attempts_total"):
        result = labels.get("result", "?")
        out[result] = out.get(result, 0) + int(value)
    return out


async def api_server_metrics(client: Client) -> str:
    return (await client.request("GET", "/metrics")).decode()


def api_requests(text: str) -> dict[str, float]:
    """The API server's own request counters (`apiserver_request_total`), summed by verb and
    resource (watches counted as started, not per event)."""
    totals: dict[str, float] = {}
    for labels, value in samples(text, "apiserver_request_total"):
        key = " ".join(labels.get(k, "") for k in ("verb", "resource", "subresource")).strip()
        totals[key] = totals.get(key, 0.0) + value
    return totals


def binding_in_api_server(m0: str, m1: str) -> dict[str, float]:
    """Where a Binding's time goes inside the API server over the round: its handling
    (`apiserver_request_duration_seconds` of POST pods/binding, p50/p99 ms), and for each
    priority level of API Priority and Fairness the requests it let through and their
    p99 wait in its queues (ms): a bind that queues behind kwok's node heartbeats in the
    same level shows here, not in the extender."""
    out = quantiles_ms(m0, m1, "apiserver_request_duration_seconds", "binding",
                       verb="POST", resource="pods", subresource="binding")
    wait = "apiserver_flowcontrol_request_wait_duration_seconds"
    levels = {labels["priority_level"] for labels, _ in samples(m1, f"{wait}_count")
              if "priority_level" in labels}
    for level in sorted(levels):
        match = {"priority_level": level, "execute": "true"}
        delta = grown(summed_buckets(m0, wait, **match), summed_buckets(m1, wait, **match))
        if delta and delta[-1][1] > 0:
            out[f"{level}Requests"] = delta[-1][1]
            out[f"{level}WaitP99Ms"] = round(histogram_quantile(0.99, delta) * 1000, 1)
    return out


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


def switch_aligned(pods: list[dict[str, Any]]) -> dict[str, float]:
    """From Railyard's record on each bound pod: the share of pods with 2 GPUs or more whose
    every GPU sits under one PCIe switch with its NIC (worst pair PIX), and their count."""
    from railyard.allocation.names import ALLOCATION_ANNOTATION
    from railyard.records.allocation import decode_allocation
    from railyard.topology.model import Distance

    multi = aligned = 0
    for p in pods:
        raw = (p.get("metadata", {}).get("annotations") or {}).get(ALLOCATION_ANNOTATION)
        if raw is None:
            continue
        alloc = decode_allocation(raw)
        if len(alloc.all_gpus) < 2:
            continue
        multi += 1
        aligned += alloc.worst_distance == Distance.PIX
    return {"switchAlignedShare": round(aligned / multi, 3) if multi else float("nan"),
            "switchAlignedPods": aligned}


@dataclasses.dataclass
class Mode:
    """One way of scheduling a round's pods; what `koordinator_mode.mode(bench)` returns.

    A round: every scheduler is stopped, the pods are created from `pod_body`, the
    background is sampled, `start()`; the pods bound are counted until all are (or none was
    for `--idle` s); then `scheduler_metrics()` and the extender's metrics are read, the
    round's pods are listed and handed to `report` (their JSON objects), and `stop()`."""

    name: str
    start: Callable[[], None]  # start scheduling: the pods exist, no scheduler runs
    stop: Callable[[], None]  # stop what `start` started
    pod_body: Callable[[str, int, int], dict[str, Any]] = pod_body  # (name, GPUs, VFs)
    processes: tuple[str, ...] = ()  # more box processes (Box.state.started names) to count
    scheduler_metrics: Callable[[], str] | None = None  # its scheduler's /metrics text
    extender_url: str | None = None  # an extender whose railyard_extender_* metrics count
    extender_process: str | None = None  # its process name, for its RSS
    extender_args: tuple[str, ...] = ()  # more options of that process, for this mode
    # Once, after the NodeTopology CRs, with the node names: what the mode's nodes need more.
    setup: Callable[[list[str]], Awaitable[None]] | None = None
    # Each round, with the admin client and the round's namespace: once it exists, before
    # the pods (DRA's claim templates); once the pods exist, before the background sample
    # (until their claims are made).
    in_namespace: Callable[[Client, str], Awaitable[None]] | None = None
    pods_created: Callable[[Client, str], Awaitable[None]] | None = None
    # What `report` reads: the round's objects listed from this path (`{ns}`: the round's).
    report_list: str = "/api/v1/namespaces/{ns}/pods"
    report: Callable[[list[dict[str, Any]]], dict[str, float]] | None = None


class Round(msgspec.Struct):
    mode: str
    pods: int
    bound: int
    seconds: float  # first bind to last
    window_median: float  # pods bound per 1 s window
    window_p10: float
    average: float  # bound / seconds
    cpu: dict[str, float]  # CPU-milliseconds per bound pod, by process
    cpu_wait: dict[str, float] = {}  # ms per bound pod each process waited for a CPU
    api_requests: dict[str, float] = {}  # API server requests per bound pod, by verb
    idle_cpu: dict[str, float] = {}  # CPU-s per s, scheduler stopped (kwok's leases...)
    idle_share: float = 0.0  # of the round's CPU, what the idle rate would have spent
    extender_failures: dict[str, float] = {}  # the extender's failure counters' growth
    bind_p50_ms: float | None = None
    bind_p99_ms: float | None = None
    bind_timeouts: int = 0  # extender binds that took longer than kube-scheduler waits
    retried_pods: int = 0  # pods kube-scheduler bound only on a later attempt
    attempts: dict[str, int] = {}  # kube-scheduler's attempts by result
    already_bound: int = 0  # the extender's already_bound answers (filter's per node, bind's)
    extender_rss_mb: float | None = None  # when the round had drained
    extra: dict[str, float] = {}  # the mode's report
    bind_phases: dict[str, float] = {}  # the extender's (bind_phases)
    api_server: dict[str, float] = {}  # the Bindings inside the API server, APF's queues


class Bench:
    """The box, its admin client configuration and what the modes share."""

    def __init__(self, box: Any, kubebox: ModuleType, args: argparse.Namespace) -> None:
        self.box, self.kubebox, self.args = box, kubebox, args
        self.config = load_kubeconfig(box.layout.admin_kubeconfig)
        self.scheduler_yaml = box.layout.dir / "config" / "kube-scheduler.yaml"
        self.plain = yaml.safe_load(self.scheduler_yaml.read_text())
        self.railyard_url = f"http://{box.layout.node_ip}:{kubebox.EXTENDER_PORT}"
        self.trivial_port = kubebox.EXTENDER_PORT + TRIVIAL_PORT_OFFSET
        self.extender_options: tuple[str, ...] = ()  # what the running extender was given
        self.trivial_url = f"http://{box.layout.node_ip}:{self.trivial_port}"

    def pid(self, name: str) -> int | None:
        return next((s.pid for s in self.box.state.started if s.name == name), None)

    def running(self, name: str) -> bool:
        pid = self.pid(name)
        if pid is None or not Path(f"/proc/{pid}").exists():
            return False
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"  # a zombie has exited

    def cpu(self, names: tuple[str, ...], of: Callable[[int], float] = cpu_seconds
            ) -> dict[str, float]:
        """`of(pid)` (CPU seconds unless told) of each of `names` that runs."""
        return {n: of(p) for n in names if (p := self.pid(n)) is not None and self.running(n)}

    def with_extender(self, url: str, shipped: Path) -> dict[str, Any]:
        """The box's kube-scheduler configuration with the extenders of `shipped`, at
        `url`."""
        document = dict(self.plain)
        extenders = yaml.safe_load(shipped.read_text())["extenders"]
        document["extenders"] = [{**e, "urlPrefix": f"{url}/"} for e in extenders]
        return document

    def start_kube_scheduler(self, config: dict[str, Any]) -> None:
        self.scheduler_yaml.write_text(yaml.safe_dump(config))
        self.box.restart("kube-scheduler")

    def stop_kube_scheduler(self) -> None:
        if self.running("kube-scheduler"):
            self.box.stop("kube-scheduler")

    def kube_scheduler_metrics(self) -> str:
        """kube-scheduler's /metrics, as the box's admin (its client certificate)."""
        pki = self.kubebox.Pki(self.box.layout.dir / "pki")
        context = ssl.create_default_context(cafile=str(pki.path("ca", "crt")))
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # its serving certificate is self-signed
        context.load_cert_chain(pki.path("admin", "crt"), pki.path("admin", "key"))
        url = f"https://{self.box.layout.node_ip}:10259/metrics"
        with urllib.request.urlopen(url, context=context, timeout=10) as response:
            return response.read().decode()

    def extender_metrics(self, url: str) -> str:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            return response.read().decode()

    # ------------------------------------------------------------------ extenders

    def only_extender(self, name: str | None, options: tuple[str, ...] = ()) -> None:
        """Leave only extender `name` running (None: neither), with `options`: started if it
        is not, restarted if it runs with others."""
        for other in ("railyard-scheduler", "trivial-extender"):
            if self.running(other) and (other != name or self.extender_options != options):
                self.box.stop(other)
        self.extender_options = options
        if name == "railyard-scheduler" and not self.running(name):
            self.box.start_railyard_extender(
                "--kube-qps", str(self.args.extender_qps),
                "--kube-burst", str(self.args.extender_qps * 2),
                "--kube-connections", str(self.args.extender_connections),
                *options, *self.args.railyard_option)
        elif name == "trivial-extender" and not self.running(name):
            listen = f"{self.box.layout.node_ip}:{self.trivial_port}"
            self.box.start(name, [
                sys.executable, str(Path(__file__).resolve()), "--serve-trivial", listen,
                "--kubeconfig", str(self.box.layout.dir / "config/railyard-extender.kubeconfig"),
                "--extender-qps", str(self.args.extender_qps),
                "--extender-connections", str(self.args.extender_connections)])
            self.box.wait(name, lambda: urllib.request.urlopen(
                f"http://{listen}/healthz", timeout=3).status == 200, timeout=60)

    def modes(self, names: list[str]) -> dict[str, Mode]:
        made: dict[str, Mode] = {}
        for name in names:
            made[name] = self.mode(name)
        return made

    def mode(self, name: str) -> Mode:
        if name == "plain":
            return Mode(name, start=lambda: self.start_kube_scheduler(self.plain),
                        stop=self.stop_kube_scheduler,
                        scheduler_metrics=self.kube_scheduler_metrics)
        if name in ("koordinator", "dra"):
            # It imports this module by name: let that be this one, not a second copy.
            sys.modules.setdefault("scheduling", sys.modules[__name__])
            try:
                module = importlib.import_module(f"{name}_mode")
            except ImportError as e:
                raise SystemExit(f"mode {name} needs benchmarks/{name}_mode.py: {e}") from None
            made = module.mode(self)
            assert isinstance(made, Mode), f"{name}_mode.mode(bench) returns a Mode"
            return made
        kind, _, variant = name.partition("+")
        if (kind not in ("trivial", "railyard") or variant not in ("", "prioritize", "events")
                or (variant == "events" and kind != "railyard")):
            raise SystemExit(f"unknown mode {name!r}: plain, trivial, railyard, "
                             "trivial+prioritize, railyard+prioritize, railyard+events, "
                             "koordinator, dra")
        shipped = WITH_PRIORITIZE if variant == "prioritize" else SHIPPED
        process = "railyard-scheduler" if kind == "railyard" else "trivial-extender"
        url = self.railyard_url if kind == "railyard" else self.trivial_url
        config = self.with_extender(url, shipped)
        # With prioritize, Railyard's filter keeps every node that fits, as before decision
        # 0104: the two calls per pod that ranking in filter replaces. Events: an `Allocated`
        # Event per bind, their cost measured in the same run (decision 0116).
        options: tuple[str, ...] = ()
        if kind == "railyard":
            options = (("--no-filter-ranks",) if variant == "prioritize" else ()) + (
                ("--allocated-events",) if variant == "events" else ("--no-allocated-events",))
        return Mode(name, start=lambda: self.start_kube_scheduler(config),
                    stop=self.stop_kube_scheduler, scheduler_metrics=self.kube_scheduler_metrics,
                    extender_url=url, extender_process=process, extender_args=options,
                    report=switch_aligned if kind == "railyard" else None)

    def prepare(self, mode: Mode) -> None:
        """Before the round's pods are created: only this mode's extender runs (and, with
        --no-flow-schema, without the FlowSchema its start applied)."""
        self.only_extender(mode.extender_process if mode.extender_process in (
            "railyard-scheduler", "trivial-extender") else None, mode.extender_args)
        if self.args.no_flow_schema:
            self.box.kubectl("delete", "flowschema", "railyard-extender", "--ignore-not-found")

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

    # ------------------------------------------------------------------ a round

    async def round(self, mode: Mode) -> Round:
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        shapes = pod_shapes(self.args.pods, self.args.seed)
        processes = (*PROCESSES, *mode.processes)
        self.stop_kube_scheduler()
        self.prepare(mode)
        async with Client(self.config, qps=1000, burst=1000) as client:
            await client.create("/api/v1/namespaces", {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, Object)
            await self.wait_service_account(client, ns)
            if mode.in_namespace is not None:
                await mode.in_namespace(client, ns)
            gate = asyncio.Semaphore(16)

            async def create(i: int) -> None:
                _, gpus, vfs = shapes[i]
                body = mode.pod_body(f"p-{i}", gpus, vfs)
                async with gate:
                    await client.create(f"/api/v1/namespaces/{ns}/pods", body, Pod)
            await asyncio.gather(*(create(i) for i in range(self.args.pods)))
            pods, version = await client.list(f"/api/v1/namespaces/{ns}/pods", Pod)
            assert not any(p.spec.node_name for p in pods)
            if mode.pods_created is not None:
                await mode.pods_created(client, ns)
            idle = self.cpu(processes)
            await asyncio.sleep(IDLE_SAMPLE_S)  # kwok's node leases, the watches: background
            api0 = await api_server_metrics(client)
            before_cpu = self.cpu(processes)
            before_wait = self.cpu(processes, cpu_wait_seconds)
            background = {n: (before_cpu[n] - idle.get(n, 0.0)) / IDLE_SAMPLE_S
                          for n in before_cpu}
            t0 = time.monotonic()
            m0 = self.extender_metrics(mode.extender_url) if mode.extender_url else ""
            watcher = asyncio.ensure_future(self.bound_times(client, ns, version))
            mode.start()
            times = await watcher
            after_cpu = self.cpu(processes)
            after_wait = self.cpu(processes, cpu_wait_seconds)
            wall = time.monotonic() - t0
            api1 = await api_server_metrics(client)
            before_api, after_api = api_requests(api0), api_requests(api1)
            m1 = self.extender_metrics(mode.extender_url) if mode.extender_url else ""
            scheduler = mode.scheduler_metrics() if mode.scheduler_metrics else ""
            rss = None
            if mode.extender_process and (pid := self.pid(mode.extender_process)):
                rss = rss_mb(pid)[0]
            extra: dict[str, float] = {}
            if mode.report is not None:
                raw = msgspec.json.decode(await client.request(
                    "GET", mode.report_list.format(ns=ns)))
                extra = mode.report(raw.get("items") or [])
                # Of every multi-GPU pod the round asked, bound or not: on a cluster filling
                # up, a scheduler that leaves the pods it cannot align Pending keeps its share
                # of the bound ones at 1.0.
                asked = sum(1 for _, gpus, _ in pod_shapes(self.args.pods, self.args.seed)
                            if gpus >= 2)
                if asked and "switchAlignedPods" in extra:
                    extra["switchAlignedOfAsked"] = round(extra["switchAlignedPods"] / asked, 3)
            mode.stop()
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
        result = self.summarise(mode, times, before_cpu, after_cpu, m0, m1)
        result.api_server = binding_in_api_server(api0, api1)
        result.cpu_wait = per_pod_ms(before_wait, after_wait, result.bound)
        result.retried_pods = retried_pods(scheduler)
        result.attempts = attempts_by_result(scheduler)
        result.extender_rss_mb = None if rss is None else round(rss, 1)
        result.extra = extra
        result.idle_cpu = {n: round(v, 3) for n, v in background.items()}
        result.idle_share = round(sum(background.values()) * wall / max(
            sum(after_cpu[n] - before_cpu.get(n, 0.0) for n in after_cpu), 1e-9), 2)
        result.api_requests = {k: round((after_api[k] - before_api.get(k, 0)) / max(
            result.bound, 1), 2) for k in sorted(after_api)
            if after_api[k] - before_api.get(k, 0) >= result.bound / 20}
        say(f"{mode.name}: API requests per bound pod {result.api_requests}; retried pods "
            f"{result.retried_pods}, attempts {result.attempts}, bind timeouts "
            f"{result.bind_timeouts}, already_bound {result.already_bound} {extra}")
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
        """When each pod got its node (watch from the list), until all have one, none
        was bound for `--idle` seconds (the rest did not fit) or `--timeout` has passed
        (the pods bound by then are the round's)."""
        seen: dict[str, float] = {}
        deadline = time.monotonic() + self.args.timeout

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
                if time.monotonic() > deadline:
                    say(f"{len(seen)} of {self.args.pods} pods bound within "
                        f"{self.args.timeout:.0f} s (--timeout)")
                    break
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return sorted(seen.values())

    def summarise(self, mode: Mode, times: list[float], before: dict[str, float],
                  after: dict[str, float], m0: str, m1: str) -> Round:
        bound = len(times)
        seconds = times[-1] - times[0] if bound > 1 else float("nan")
        windows = [0] * (int(seconds) + 1 if bound > 1 else 1)
        for t in times:
            windows[int(t - times[0])] += 1
        if len(windows) > 1:
            windows = windows[:-1]  # the last window is partial
        cpu = per_pod_ms(before, after, bound)
        result = Round(mode=mode.name, pods=self.args.pods, bound=bound,
                       seconds=round(seconds, 2), window_median=statistics.median(windows),
                       window_p10=sorted(windows)[len(windows) // 10],
                       average=round(bound / seconds, 1) if bound > 1 else 0.0, cpu=cpu)
        if m1:
            delta = grown(dict(bind_buckets(m0)), dict(bind_buckets(m1)))
            if delta and delta[-1][1] > 0:
                result.bind_p50_ms = round(histogram_quantile(0.5, delta) * 1000, 2)
                result.bind_p99_ms = round(histogram_quantile(0.99, delta) * 1000, 2)
                within = next((c for le, c in delta if le == HTTP_TIMEOUT_S), delta[-1][1])
                result.bind_timeouts = int(delta[-1][1] - within)
            f0 = failures(m0)
            result.extender_failures = {k: v - f0.get(k, 0.0) for k, v in failures(m1).items()
                                        if v > f0.get(k, 0.0)}
            result.already_bound = int(sum(v for k, v in result.extender_failures.items()
                                           if k.endswith("reason=already_bound")))
            result.bind_phases = bind_phases(m0, m1)
        say(f"{mode.name}: {bound} pods in {result.seconds} s, median "
            f"{result.window_median}/s")
        return result


def say(message: str) -> None:
    print(f"[scheduling] {message}", file=sys.stderr, flush=True)


def median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def contract(rounds: list[Round], nodes: int) -> dict[str, Any]:
    """The JSON issue 28's check reads: per mode, the median over rounds of each round's
    median 1 s window; the bound pods, timeouts and retries of the worst round."""
    modes: dict[str, Any] = {}
    for name in dict.fromkeys(r.mode for r in rounds):
        mine = [r for r in rounds if r.mode == name]
        modes[name] = {
            "podsPerSecond": statistics.median(r.window_median for r in mine),
            "bound": min(r.bound for r in mine),
            "bindP99Ms": median_or_none([r.bind_p99_ms for r in mine]),
            "bindTimeouts": max(r.bind_timeouts for r in mine),
            "retriedPods": max(r.retried_pods for r in mine),
            "alreadyBound": max(r.already_bound for r in mine),
            "rounds": [msgspec.to_builtins(r) for r in mine],
        }
    return {"nodes": nodes, "modes": modes}


def table(rounds: list[Round], args: argparse.Namespace, shapes: str) -> str:
    lines = [
        f"- Machine: `{platform.platform()}`, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        f"- Command: `python benchmarks/scheduling.py --nodes {args.nodes} --pods {args.pods} "
        f"--modes {','.join(args.modes)} --reps {args.reps}"
        + f" --extender-connections {args.extender_connections}"
        + "".join(f" --railyard-option={o}" for o in args.railyard_option) + f"`; {shapes}",
        "",
        "| mode | pods bound | drain (s) | pods/s median (1 s windows) | p10 window | average "
        "| CPU-ms per pod: scheduler / extender / apiserver / etcd | bind p50 / p99 (ms) "
        "| bind timeouts / retried pods / already_bound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        ext = r.cpu.get("railyard-scheduler", r.cpu.get("trivial-extender", "–"))
        # The scheduler: kube-scheduler, or the one a mode runs instead (koord-scheduler).
        scheduler = r.cpu.get("kube-scheduler", r.cpu.get("koord-scheduler", "–"))
        cpu = " / ".join(str(v) for v in (scheduler, ext,
                                          r.cpu.get("kube-apiserver", "–"),
                                          r.cpu.get("etcd", "–")))
        bind = f"{r.bind_p50_ms} / {r.bind_p99_ms}" if r.bind_p50_ms is not None else "–"
        lines.append(f"| {r.mode} | {r.bound}/{r.pods} | {r.seconds} | {r.window_median} | "
                     f"{r.window_p10} | {r.average} | {cpu} | {bind} | {r.bind_timeouts} / "
                     f"{r.retried_pods} / {r.already_bound} |")
    lines.append("")
    for r in rounds:
        calls = ", ".join(f"{k} {v}" for k, v in r.api_requests.items())
        idle = ", ".join(f"{k} {v}" for k, v in r.idle_cpu.items())
        lines.append(f"- {r.mode}: idle CPU-s per s before the round: {idle} (at that rate, "
                     f"{r.idle_share:.0%} of the round's CPU); API server requests per bound "
                     f"pod: {calls}; kube-scheduler attempts {r.attempts}"
                     + (f"; extender RSS {r.extender_rss_mb} MB" if r.extender_rss_mb else "")
                     + (f"; {r.extra}" if r.extra else ""))
        if r.cpu_wait:
            lines.append(f"  - ms per pod waiting for a CPU (run queue): {r.cpu_wait}")
        if r.bind_phases:
            lines.append(f"  - bind phases (ms) and where decided: {r.bind_phases}")
        if r.api_server:
            lines.append(f"  - in the API server (Binding ms, APF level requests and p99 "
                         f"wait ms): {r.api_server}")
        if r.extender_failures:
            lines.append(f"  - extender failures: {r.extender_failures}")
    medians = {name: statistics.median(r.window_median for r in rounds if r.mode == name)
               for name in dict.fromkeys(r.mode for r in rounds)}
    lines.append("")
    lines.append("Median of the rounds' median windows: " + ", ".join(
        f"{name} {value}" for name, value in medians.items()) + ".")
    for a, b in (("railyard", "trivial"), ("railyard", "plain"), ("trivial", "plain"),
                 ("railyard+prioritize", "trivial+prioritize"),
                 ("railyard+prioritize", "plain"), ("koordinator", "plain"),
                 ("dra", "plain"), ("dra", "railyard")):
        if a in medians and b in medians and medians[b]:
            lines.append(f"- {a} ÷ {b}: **{medians[a] / medians[b]:.2f}×**")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    kubebox = load_kubebox()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="railyard-sched-"))
    box = kubebox.Box(folder, kwok_nodes=args.nodes)
    started = time.monotonic()
    box.up()
    say(f"box with {args.nodes} kwok nodes up in {time.monotonic() - started:.0f} s")
    try:
        bench = Bench(box, kubebox, args)
        modes = bench.modes(args.modes)
        names = [f"kwok-node-{i}" for i in range(args.nodes)]
        # The CRD and RBAC come with the extender; it is stopped again by the first round
        # that does not use it.
        bench.only_extender("railyard-scheduler")
        await bench.publish_topologies(names)
        for mode in modes.values():
            if mode.setup is not None:
                await mode.setup(names)
        rounds = []
        for _ in range(args.reps):
            for mode in modes.values():
                rounds.append(await bench.round(mode))
        shapes = (f"{args.nodes} kwok nodes, each a dgx-h100 NodeTopology with {VFS_PER_PF} "
                  f"VFs per PF; extender clients {args.extender_qps} QPS (kube-scheduler's: "
                  f"200) over {args.extender_connections} connections")
        print(table(rounds, args, shapes))
        if args.json:
            args.json.write_text(json.dumps(contract(rounds, args.nodes), indent=1))
        return 0
    finally:
        if args.keep is None:
            box.down()


# ---------------------------------------------------------------------- the trivial extender


def serve_trivial(listen: str, kubeconfig: Path, qps: int, connections: int) -> None:
    """The `trivial` mode's extender: Railyard's HTTP stack (aiohttp behind its connection
    guard and body limits, msgspec for the messages, its metrics) and its API client, with
    none of its decisions: filter keeps every node, prioritize scores every node 0, bind
    posts a Binding without an annotation. What is left is the protocol's own price."""
    from aiohttp import web

    from railyard.kube.objects import Status
    from railyard.scheduler.connections import GuardedSite, HttpLimits, read_body, refusals
    from railyard.scheduler.metrics import Metrics
    from railyard.scheduler.wire import ExtenderArgs, ExtenderBindingArgs, decode, encode

    host, _, port = listen.rpartition(":")
    limits = HttpLimits()
    metrics = Metrics()

    def answer(body: Any) -> web.Response:
        return web.Response(body=encode(body), content_type="application/json")

    async def serve() -> None:
        async with Client(load_kubeconfig(kubeconfig), qps=qps, burst=2 * qps,
                          connections=connections, user_agent="trivial-extender",
                          timed=True) as client:
            async def filter_(request: web.Request) -> web.Response:
                t0 = time.perf_counter()
                args = decode(await read_body(request, limits), ExtenderArgs)
                metrics.latency["filter"].observe(time.perf_counter() - t0)
                return answer({"Nodes": args.Nodes, "NodeNames": args.NodeNames,
                               "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                               "Error": ""})

            async def prioritize(request: web.Request) -> web.Response:
                t0 = time.perf_counter()
                args = decode(await read_body(request, limits), ExtenderArgs)
                names = args.NodeNames or [i["metadata"]["name"] for i in
                                           (args.Nodes or {}).get("items") or []]
                metrics.latency["prioritize"].observe(time.perf_counter() - t0)
                return answer([{"Host": n, "Score": 0} for n in names])

            async def bind(request: web.Request) -> web.Response:
                t0 = time.perf_counter()
                try:
                    args = decode(await read_body(request, limits), ExtenderBindingArgs)
                    timing = RequestTiming()
                    await client.create(
                        f"/api/v1/namespaces/{args.PodNamespace}/pods/{args.PodName}/binding",
                        {"apiVersion": "v1", "kind": "Binding",
                         "metadata": {"name": args.PodName, "namespace": args.PodNamespace,
                                      "uid": args.PodUID},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": args.Node}},
                        Status, timing=timing)
                    metrics.write_timing(timing)
                    error = ""
                except Exception as e:  # kube-scheduler hears it and retries
                    error = str(e)
                    metrics.failure("bind", "write_failed")
                metrics.latency["bind"].observe(time.perf_counter() - t0)
                return answer({"Error": error})

            async def healthz(request: web.Request) -> web.Response:
                return web.Response(text="ok")

            async def get_metrics(request: web.Request) -> web.Response:
                return web.Response(body=metrics.render(),
                                    headers={"Content-Type": Metrics.content_type})

            app = web.Application(client_max_size=limits.max_body_bytes,
                                  middlewares=[refusals(metrics.shed)])
            app.cleanup_ctx.append(metrics.probe_loop_lag)
            app.router.add_post("/filter", filter_)
            app.router.add_post("/prioritize", prioritize)
            app.router.add_post("/bind", bind)
            app.router.add_get("/healthz", healthz)
            app.router.add_get("/metrics", get_metrics)
            runner = web.AppRunner(app, access_log=None,
                                   keepalive_timeout=limits.idle_timeout_s)
            await runner.setup()
            await GuardedSite(runner, host, int(port), limits, metrics.shed).start()
            print(f"trivial extender listening on {listen}", flush=True)
            try:
                await asyncio.Event().wait()
            finally:
                await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000, help="kwok nodes (default 1000)")
    p.add_argument("--pods", type=int, default=1000, help="pods per round (default 1000)")
    p.add_argument("--modes", type=lambda s: [m for m in s.split(",") if m],
                   default=["plain", "trivial", "railyard"],
                   help="comma-separated, run interleaved in this order (default "
                   "plain,trivial,railyard; also trivial+prioritize, railyard+prioritize, "
                   "koordinator, dra)")
    p.add_argument("--reps", type=int, default=1, help="rounds per mode (default 1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for a round's pods to bind (default 600)")
    p.add_argument("--idle", type=float, default=15.0,
                   help="end a round when no pod was bound for this long (default 15 s)")
    p.add_argument("--extender-qps", type=int, default=200,
                   help="the extenders' API client QPS; burst is twice it (default 200, as "
                   "the box's kube-scheduler)")
    p.add_argument("--extender-connections", type=int, default=BIND_CONNECTIONS,
                   help="the extenders' binds' client's connections to the API server "
                   f"(default {BIND_CONNECTIONS}, `railyard scheduler --kube-connections`'s)")
    p.add_argument("--railyard-option", action="append", default=[], metavar="OPTION",
                   help="one more `railyard scheduler` option, e.g. "
                   "--railyard-option=--idle-node-reserve=2 (repeatable; the Event has "
                   "its own modes, railyard and railyard+events)")
    p.add_argument("--no-flow-schema", action="store_true",
                   help="remove the extenders' FlowSchema (the chart's, decision 0114), so "
                   "their requests fall to APF's global-default level beside kwok's, as "
                   "before it")
    p.add_argument("--keep", type=Path, help="use this folder for the box and leave it up")
    p.add_argument("--fill", type=float, default=0.5,
                   help="the most of the cluster's GPUs a round's pods may ask, 0-1 (default "
                        "0.5: a drain rate, not a full cluster; more measures placement on a "
                        "cluster filling up, e.g. the switch-aligned share, and its pods/s "
                        "then counts pods that fit nowhere as waiting)")
    p.add_argument("--json", type=Path, help="write issue 28's JSON contract here")
    p.add_argument("--serve-trivial", metavar="HOST:PORT",
                   help="(internal) run the trivial extender here, not the benchmark")
    p.add_argument("--kubeconfig", type=Path, help="(with --serve-trivial) its identity")
    args = p.parse_args()
    if args.serve_trivial:
        if args.kubeconfig is None:
            p.error("--serve-trivial needs --kubeconfig")
        serve_trivial(args.serve_trivial, args.kubeconfig, args.extender_qps,
                      args.extender_connections)
        return 0
    if os.geteuid() != 0:
        p.error("the box needs root (network namespaces, mounts, cgroups)")
    if args.nodes < 1 or args.pods < 1 or args.reps < 1:
        p.error("--nodes, --pods and --reps must be at least 1")
    if not 0 < args.fill <= 1:
        p.error(f"--fill must be in (0, 1], not {args.fill}")
    demand = sum(gpus for _, gpus, _ in pod_shapes(args.pods, args.seed))
    if demand > 8 * args.nodes * args.fill:
        p.error(f"{args.pods} pods ask {demand} GPUs, over {args.fill:.0%} of {args.nodes} "
                f"nodes' {8 * args.nodes}: use more nodes, or --fill to measure a cluster "
                "filling up")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
