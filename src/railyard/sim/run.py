"""Run policies over one cluster and one arrival sequence, and collect their metrics.

Every policy gets fresh ledgers and exactly the same arrivals and departures (`timeline`):
a pod that leaves frees exactly what it held. Without departures (the FGD draw) the run
measures how well a growing load is packed, as the FGD paper does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from railyard.allocation.types import Allocation, Infeasible
from railyard.sim.arrivals import Arrival, timeline
from railyard.sim.bounds import Bounds, offline_bounds
from railyard.sim.capacity import NodeResources
from railyard.sim.metrics import PolicyMetrics, heatmap_rows
from railyard.sim.policies import BASELINES, Policy
from railyard.sim.sharing import share_of
from railyard.topology.model import NodeTopology

DEFAULT_POLICIES = ("railyard", "random", "numa", "koordinator", "best-fit", "fgd")
# Also accepted: the extender's allocator with spread packing, for comparison; and with its
# admission reserve (`--reserve K`, the extender's --idle-node-reserve).
EXTRA_POLICIES = ("railyard-spread", "railyard-reserve")
DEFAULT_RESERVE = 2  # idle whole nodes `railyard-reserve` keeps when --reserve is not given
HEATMAP_NODES = 12
# Snapshots taken when the GPUs requested by live pods first reach these shares of the
# cluster's GPUs (without departures: the GPUs requested so far).
SNAPSHOT_LOADS = {"atHalfLoad": 0.5, "atFullLoad": 1.0}
HEATMAP_SNAPSHOT = "atFullLoad"


class PolicyError(ValueError):
    """An unknown policy name."""


def parse_policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = (*DEFAULT_POLICIES, *EXTRA_POLICIES)
    for n in names:
        if n not in known:
            raise PolicyError(f"unknown policy {n!r}: expected some of {', '.join(known)}")
    if not names:
        raise PolicyError(f"no policy given: expected some of {', '.join(known)}")
    return list(dict.fromkeys(names))


def make_policy(name: str, topologies: Sequence[NodeTopology], seed: int,
                reserve: int = DEFAULT_RESERVE,
                workload: Sequence[Arrival] = ()) -> Policy:
    """A fresh policy; `workload`: the arrivals whose task shapes FGD targets (without
    them it learns shapes as pods arrive), and Railyard's share rule too (decision 0098)."""
    if name in BASELINES:
        return BASELINES[name](topologies, seed)
    shapes = [(a.pod.cpu_milli, a.request.gpus, share_of(a.pod)) for a in workload]
    if name == "fgd":
        from railyard.sim.fgd import FgdPolicy

        return FgdPolicy(topologies, seed, shapes)
    # Imported here: the baselines need nothing from the extender.
    from railyard.sim.railyard_policy import RailyardPolicy

    if name == "railyard":
        return RailyardPolicy(topologies, seed, workload=shapes)
    if name == "railyard-spread":
        policy = RailyardPolicy(topologies, seed, packing="spread", workload=shapes)
        policy.name = name
        return policy
    if name == "railyard-reserve":
        policy = RailyardPolicy(topologies, seed, idle_reserve=reserve, workload=shapes)
        policy.name = name
        return policy
    raise PolicyError(f"unknown policy {name!r}")


def sample_nodes(topologies: Sequence[NodeTopology], count: int = HEATMAP_NODES) -> list[str]:
    """Nodes for the heatmap: an even share per hardware shape, evenly spread within it, so
    a profile with few nodes still shows up."""
    if len(topologies) <= count:
        return [t.node for t in topologies]
    groups: dict[tuple, list[str]] = {}
    for t in topologies:
        groups.setdefault(t.shape_key, []).append(t.node)
    share = max(1, count // len(groups))
    out: list[str] = []
    for names in groups.values():
        k = min(share, len(names))
        out.extend(names[(i * len(names)) // k] for i in range(k))
    return out[:max(count, len(groups))]


@dataclass(slots=True)
class PolicyResult:
    metrics: PolicyMetrics
    heatmap: list[list[tuple[int, int]]]  # at 100% load: per sample node, per GPU
    # (cell code, GPU count of the pod holding it)


class BoundViolation(AssertionError):
    """A policy did better than the offline bound allows: a bug in the bound or the run."""


@dataclass(slots=True)
class SimResult:
    cluster_gpus: int
    nodes: list[str]  # the heatmap's sample
    results: dict[str, PolicyResult]
    bounds: Bounds | None = None  # offline upper bounds for the same arrivals and cluster

    def bound_violations(self) -> list[str]:
        """Every policy figure above its bound (none, unless something is wrong)."""
        if self.bounds is None:
            return []
        out = []
        gpu, gdr = self.bounds.gpu_allocation_ratio, self.bounds.gdr_capable_pod_share
        for name, r in self.results.items():
            m = r.metrics
            # Both as metrics.json and bounds.json round them (monotone: a ≤ b stays ≤).
            if (gpu.value is not None
                    and round(m.headline_allocation_ratio, 6) > round(gpu.value, 6)):
                out.append(f"{name}: gpuAllocationRatio {m.headline_allocation_ratio} > "
                           f"bound {gpu.value}")
            if gdr.count is not None and m.multi_gdr > gdr.count:
                out.append(f"{name}: {m.multi_gdr} GDR-capable multi-GPU pods > bound "
                           f"{gdr.count}")
        return out

    def metrics_json(self, with_latency: bool = True) -> dict[str, dict[str, object]]:
        return {name: r.metrics.as_json(with_latency) for name, r in self.results.items()}


# Called after every event with the policy and the CPU and memory it holds (for tests).
Observer = Callable[[Policy, NodeResources], None]
_NO_ROOM = "no node has "


def _place_gang(policy: Policy, resources: NodeResources,
                events: Sequence[tuple[bool, Arrival]], at: int
                ) -> dict[str, Allocation | Infeasible]:
    """Place the gang whose first pod is `events[at]`, all-or-nothing: its pods in turn (a
    job's pods are consecutive arrivals), and when one does not fit, release those placed
    and refuse every one of them, naming the pod that did not fit."""
    job = events[at][1].job
    pods = []
    for departs, a in events[at:]:
        if departs or a.job != job:
            break
        pods.append(a)
    placed: dict[str, Allocation | Infeasible] = {}
    for a in pods:
        fitting = resources.candidates(a.pod)
        result: Allocation | Infeasible = (
            policy.place(a.uid, a.request, fitting, job=job, gpu_milli=share_of(a.pod),
                         cpu_milli=a.pod.cpu_milli) if fitting
            else Infeasible(_NO_ROOM + f"room for pod {a.uid} of {job}"))
        if isinstance(result, Infeasible):
            for uid in placed:
                policy.release(uid)
                resources.release(uid)
            why = Infeasible(f"gang {job}: pod {a.uid} does not fit, so none is placed "
                             f"({result.reason})")
            return {p.uid: why for p in pods}
        resources.hold(a.uid, result.node, a.pod)
        placed[a.uid] = result
    return placed


def simulate(topologies: Sequence[NodeTopology], arrivals: Sequence[Arrival],
             policies: Sequence[str], seed: int,
             progress: Callable[[str], None] | None = None,
             observer: Observer | None = None, bounds: bool = True,
             reserve: int = DEFAULT_RESERVE) -> SimResult:
    """Place `arrivals` with each policy in turn (`_replay`); `progress(policy)` is called
    per arrival.

    With `bounds`, the offline bounds (`railyard.sim.bounds`) are computed too, and a policy
    above one raises BoundViolation: the bound is proved, so that is a bug (which is how
    every run in the tests checks it)."""
    cluster_gpus = sum(len(t.gpus) for t in topologies)
    if cluster_gpus == 0:
        raise ValueError("the cluster has no GPUs")
    sample = sample_nodes(topologies)
    events = timeline(arrivals)
    results: dict[str, PolicyResult] = {}
    for name in policies:
        policy = make_policy(name, topologies, seed, reserve, workload=arrivals)
        tick = None if progress is None else partial(progress, name)
        results[name] = _replay(policy, topologies, events, sample, tick, observer)
    out = SimResult(cluster_gpus, sample, results)
    if bounds:
        out.bounds = offline_bounds(topologies, arrivals)
        violations = out.bound_violations()
        if violations:
            raise BoundViolation("policy above the offline bound: " + "; ".join(violations))
    return out


def run_policy(policy: Policy, topologies: Sequence[NodeTopology],
               arrivals: Sequence[Arrival],
               resources: NodeResources | None = None) -> PolicyResult:
    """One policy, made by the caller (a benchmark's variant, say), through `arrivals` as
    `simulate` runs each of its own; `resources`: the (fresh) CPU and memory ledger the run
    keeps, for a variant that ranks nodes by it."""
    return _replay(policy, topologies, timeline(arrivals), sample_nodes(topologies), None,
                   None, resources)


def _replay(policy: Policy, topologies: Sequence[NodeTopology],
            events: Sequence[tuple[bool, Arrival]], sample: Sequence[str],
            progress: Callable[[], None] | None, observer: Observer | None,
            resources: NodeResources | None = None) -> PolicyResult:
    """Place each arrival with `policy` and release each pod at its `depart_s`.

    Each pod is offered only the nodes with room for its CPUs and memory (`NodeResources`,
    kube-scheduler's NodeResourcesFit), as the extender is; what it is placed on holds them
    until it leaves."""
    by_name = {t.node: t for t in topologies}
    cluster_gpus = sum(len(t.gpus) for t in topologies)
    m = PolicyMetrics(policy.name, cluster_gpus)
    resources = NodeResources(topologies) if resources is None else resources
    clock = time.perf_counter
    heat: list[list[tuple[int, int]]] = []
    gang_results: dict[str, Allocation | Infeasible] = {}
    for at, (departs, arrival) in enumerate(events):
        if departs:
            policy.release(arrival.uid)
            resources.release(arrival.uid)
            m.depart(arrival)
            if observer is not None:
                observer(policy, resources)
            continue
        t0 = clock()
        result: Allocation | Infeasible
        if arrival.job is not None:
            if arrival.uid not in gang_results:  # the gang's first pod: place them all
                gang_results.update(_place_gang(policy, resources, events, at))
            result = gang_results.pop(arrival.uid)
        else:
            fitting = resources.candidates(arrival.pod)
            if fitting:
                result = policy.place(arrival.uid, arrival.request, fitting,
                                      gpu_milli=share_of(arrival.pod),
                                      cpu_milli=arrival.pod.cpu_milli)
            else:
                result = Infeasible(_NO_ROOM + f"{arrival.pod.cpu_milli}m CPU and "
                                    f"{arrival.pod.memory_mib} MiB of memory free (or its "
                                    "role's nodes, or its application's per-node limit)")
                m.node_filter_failures += 1
            if isinstance(result, Allocation):
                resources.hold(arrival.uid, result.node, arrival.pod)
        dt = clock() - t0
        topo = by_name.get(getattr(result, "node", ""))
        m.record(arrival, result, topo, dt)
        for key, load in SNAPSHOT_LOADS.items():
            if key not in m.snapshots and m.live_load >= load:
                ledgers = policy.ledgers()
                m.snapshot(key, topologies, ledgers)
                if key == HEATMAP_SNAPSHOT:
                    heat = [heatmap_rows(by_name[n], ledgers[n], m.judged) for n in sample]
        if observer is not None:
            observer(policy, resources)
        if progress is not None:
            progress()
    ledgers = policy.ledgers()
    if HEATMAP_SNAPSHOT not in m.snapshots:  # a run with load < 100%: its end stands in
        heat = [heatmap_rows(by_name[n], ledgers[n], m.judged) for n in sample]
    m.finish(topologies, ledgers, run_end_s(events))
    return PolicyResult(m, heat)


def run_end_s(events: Sequence[tuple[bool, Arrival]]) -> float | None:
    """When a run ends on the replay clock: its last arrival or departure; None when no pod
    has a lifetime (a draw: pods stay, so run time means nothing)."""
    if not any(a.depart_s is not None for _, a in events):
        return None
    return max(a.depart_s if departs and a.depart_s is not None else a.arrive_s
               for departs, a in events)
