"""Benchmark (not a CI test): what limits the DLRM instances each policy places, and what
ranking the CPU nodes by CPUs would change (docs/simulator.md, "What limits pods placed on
the DLRM trace"; decision 0097).

Every failure on the DLRM trace is a CN instance (48–192 vCPUs) finding no CPU node with room:
the CPU nodes are over-subscribed for long stretches, and which instances get in depends on
how each policy ranks CPU nodes, which none of them does by CPUs. For each seed this replays
`railyard simulate --trace FILE --seed S`'s arrivals and departures (same draw, same default
cluster, same node filters) under every default policy and three rankings of the `railyard`
policy that the product does not have, and reports pods placed, the CN vCPUs placed and the
CN vCPU-seconds placed (each placed CN instance's vCPUs × its time on the replay clock, up to
the last event):

- `ry+k8s-least`: kube-scheduler's default scores as a real deployment adds them
  (NodeResourcesFit LeastAllocated and NodeResourcesBalancedAllocation on CPU and memory,
  0–100 each) to the extender's 0–10 × 10 × its weight 5 (deploy/kube-scheduler-config.yaml);
- `ry+k8s-most`: the same with NodeResourcesFit's MostAllocated strategy;
- `ry+cpu-frag`: for a pod without GPUs, the node whose free CPUs and memory the pod
  fragments least — FGD's measure (Weng et al., ATC '23) applied to CPUs: a node's fragment
  for one task shape is its free CPUs when the shape does not fit there, weighed by the
  shape's share of the run's CN arrivals — ties at random; the extender only filters;
- `ry+frag-levels`: what an extender could send instead, for a pod without GPUs: its top
  tier's four scores (7–10) by how much the pod grows that fragmentation (not at all, by up
  to a quarter of its CPUs, up to all of them, more), with kube-scheduler's default scores
  added as in `ry+k8s-least`;
- `ry+levels`: those four scores alone, as the simulator ranks every policy (kube-scheduler's
  own scores unmodelled).

The CPU-fragmentation rankings are given the run's CN shapes up front, as FGD is; with
`--learn-shapes` they learn them instead from the CN instances arrived so far, as an extender
would have to (it sees each pod only when asked about it).

    python benchmarks/dlrm_cpu_ranking.py --trace PATH [--seeds 0 1 2 3 4] [--learn-shapes]
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible
from railyard.cli.simulate import DEFAULT_DLRM_CLUSTER
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import Arrival, DemandRule, timeline, trace_arrivals
from railyard.sim.capacity import NodeResources
from railyard.sim.policies import Policy
from railyard.sim.railyard_policy import RailyardPolicy
from railyard.sim.run import DEFAULT_POLICIES, make_policy, run_policy
from railyard.sim.sharing import share_of
from railyard.sim.trace import TracePod, load_trace
from railyard.topology.model import NodeTopology

EXTENDER_WEIGHT = 5  # deploy/kube-scheduler-config.yaml
PROTOTYPES = ("ry+k8s-least", "ry+k8s-most", "ry+cpu-frag", "ry+frag-levels", "ry+levels")


class RankedRailyard(RailyardPolicy):
    """The `railyard` policy with one of the rankings above in place of its own."""

    def __init__(self, topologies: Sequence[NodeTopology], seed: int, ranking: str,
                 resources: NodeResources, shapes: dict[tuple[int, int], float],
                 learn: bool = False) -> None:
        super().__init__(topologies, seed)
        self.name = ranking
        self.ranking = ranking
        self.resources = resources
        self.shapes = shapes  # (CPU milli, memory MiB) -> share of the CN arrivals
        # With `learn`, `shapes` is rebuilt from the CN instances arrived so far instead.
        self.learn = learn
        self._seen: Counter[tuple[int, int]] = Counter()
        self.pod: TracePod | None = None  # the pod being placed (set by `replay`)
        self.pods: dict[str, TracePod] = {}  # uid -> pod, for `place` (with --streams)

    def place(self, uid: str, request: Request, nodes: Sequence[str] | None = None, *,
              job: str | None = None, gpu_milli: int = 1000,
              cpu_milli: int = 0) -> Allocation | Infeasible:
        if uid in self.pods:  # run by `sim.run_policy`, which hands no pod
            self.pod = self.pods[uid]
        return super().place(uid, request, nodes, job=job, gpu_milli=gpu_milli,
                             cpu_milli=cpu_milli)

    def _pick(self, request: Request, nodes: Sequence[str]) -> str | Infeasible:
        assert self.pod is not None
        fits = self.state.filter(request, nodes).fits
        if not fits:
            return Infeasible("no node fits")
        pod = self.pod
        if self.learn and pod.role == "CN":
            self._seen[(pod.cpu_milli, pod.memory_mib)] += 1
            seen = sum(self._seen.values())
            self.shapes = {s: k / seen for s, k in self._seen.items()}
        if self.ranking == "ry+cpu-frag":
            if request.gpus:
                return super()._pick(request, fits)
            rank = {n: -round(self._fragment(n, pod) - self._fragment(n, None), 9)
                    for n in fits}
        elif self.ranking in ("ry+frag-levels", "ry+levels"):
            if request.gpus:
                return super()._pick(request, fits)
            k8s = self.ranking == "ry+frag-levels"
            rank = {n: round(10 * EXTENDER_WEIGHT * (7 + self._level(n, pod))
                             + (self._k8s(n, pod) if k8s else 0), 9) for n in fits}
        else:
            extender = self.state.scores(request, fits)
            rank = {n: round(10 * EXTENDER_WEIGHT * extender[n] + self._k8s(n, pod), 9)
                    for n in fits}
        best = max(rank.values())
        return self.rng.choice([n for n in fits if rank[n] == best])

    def _shares(self, node: str, pod: TracePod) -> tuple[float, float]:
        """CPU and memory held on `node` once `pod` is placed, as shares of the node's."""
        r, cap = self.resources, self.resources.capacity[node]
        return ((r.cpu_milli[node] + pod.cpu_milli) / cap.cpu_milli,
                (r.memory_mib[node] + pod.memory_mib) / cap.memory_mib)

    def _k8s(self, node: str, pod: TracePod) -> float:
        cpu, mem = self._shares(node, pod)
        fit = 50 * (cpu + mem) if self.ranking == "ry+k8s-most" else 50 * (2 - cpu - mem)
        balanced = 100 * (1 - abs(cpu - mem) / 2)  # 1 − standard deviation of the two
        return fit + balanced

    def _level(self, node: str, pod: TracePod) -> int:
        grown = self._fragment(node, pod) - self._fragment(node, None)
        cpu = pod.cpu_milli
        return 3 if grown <= 0 else 2 if grown <= cpu / 4 else 1 if grown <= cpu else 0

    def _fragment(self, node: str, pod: TracePod | None) -> float:
        r, cap = self.resources, self.resources.capacity[node]
        cpu = cap.cpu_milli - r.cpu_milli[node] - (pod.cpu_milli if pod else 0)
        mem = cap.memory_mib - r.memory_mib[node] - (pod.memory_mib if pod else 0)
        return sum(share * cpu for (c, m), share in self.shapes.items() if c > cpu or m > mem)


@dataclass(slots=True)
class Outcome:
    placed: int = 0
    cn_vcpus: int = 0
    cn_vcpu_s: float = 0.0
    failed_by_vcpus: Counter[int] = field(default_factory=Counter)


def replay(policy: Policy, resources: NodeResources, arrivals: Sequence[Arrival]) -> Outcome:
    """`railyard.sim.run.simulate`'s loop for one policy (no gangs), counting CPU work."""
    events = timeline(arrivals)
    end = max((a.depart_s if d and a.depart_s is not None else a.arrive_s)
              for d, a in events)
    out = Outcome()
    for departs, a in events:
        if departs:
            policy.release(a.uid)
            resources.release(a.uid)
            continue
        fitting = resources.candidates(a.pod)
        if isinstance(policy, RankedRailyard):
            policy.pod = a.pod
        result = (policy.place(a.uid, a.request, fitting, gpu_milli=share_of(a.pod),
                               cpu_milli=a.pod.cpu_milli) if fitting else None)
        if not isinstance(result, Allocation):
            out.failed_by_vcpus[a.pod.cpu_milli // 1000] += 1
            continue
        resources.hold(a.uid, result.node, a.pod)
        out.placed += 1
        if a.pod.role == "CN":
            out.cn_vcpus += a.pod.cpu_milli // 1000
            left = end if a.depart_s is None else min(a.depart_s, end)
            out.cn_vcpu_s += a.pod.cpu_milli / 1000 * (left - a.arrive_s)
    return out


def over_streams(topologies: Sequence[NodeTopology], arrivals: Sequence[Arrival], seed: int,
                 shapes: dict[tuple[int, int], float], learn: bool, streams: int) -> None:
    """Per policy and prototype, the medians over `streams` tie-break streams of instances,
    `vcpuPlaced` and `vcpuHoursPlaced` (every pod, as `railyard simulate` counts them), run
    through `sim.run_policy`; stream 0 is the shipped draw."""
    print(f"  medians over {streams} streams: {'policy':<14} {'placed':>7} {'vCPUs':>8} "
          f"{'vCPU-h':>10}")
    for name in (*DEFAULT_POLICIES, *PROTOTYPES):
        got = []
        for stream in range(streams):
            resources = NodeResources(topologies)
            policy: Policy
            if name in PROTOTYPES:
                ranked = RankedRailyard(topologies, seed, name, resources, shapes, learn=learn)
                ranked.pods = {a.uid: a.pod for a in arrivals}
                policy = ranked
            else:
                policy = make_policy(name, topologies, seed, workload=arrivals)
            if stream:
                policy.rng = random.Random(  # type: ignore[attr-defined]
                    f"online-envelope/{stream}/{seed}/{name}")
            got.append(run_policy(policy, topologies, arrivals, resources).metrics)
        hours = [m.vcpu_hours_placed or 0.0 for m in got]
        print(f"  {'':<27}{name:<14} {statistics.median(m.placed for m in got):>7g} "
              f"{statistics.median(m.vcpu_placed for m in got):>8.0f} "
              f"{statistics.median(hours):>10.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True, help="the DLRM trace CSV")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--streams", type=int, default=1,
                        help="also the medians over this many tie-break streams (> 1)")
    parser.add_argument("--learn-shapes", action="store_true",
                        help="the CPU-fragmentation rankings learn the CN shapes as they arrive")
    args = parser.parse_args()
    trace = load_trace(args.trace)
    topologies = list(cluster_from_spec(DEFAULT_DLRM_CLUSTER))
    gpus = sum(len(t.gpus) for t in topologies)
    for seed in args.seeds:
        arrivals, _ = trace_arrivals(trace, gpus, seed, DemandRule())
        cn = Counter((a.pod.cpu_milli, a.pod.memory_mib) for a in arrivals
                     if a.pod.role == "CN")
        shapes = {s: k / sum(cn.values()) for s, k in cn.items()}
        print(f"seed {seed}: {len(arrivals)} instances, {sum(cn.values())} CN")
        print(f"  {'policy':<14} {'placed':>6} {'CN vCPUs':>9} {'CN vCPU-h':>10}  failed by vCPUs")
        for name in (*DEFAULT_POLICIES, *PROTOTYPES):
            resources = NodeResources(topologies)
            policy: Policy = (RankedRailyard(topologies, seed, name, resources, shapes,
                                             learn=args.learn_shapes)
                              if name in PROTOTYPES
                              else make_policy(name, topologies, seed, workload=arrivals))
            o = replay(policy, resources, arrivals)
            fails = " ".join(f"{v}:{k}" for v, k in sorted(o.failed_by_vcpus.items()))
            print(f"  {name:<14} {o.placed:>6} {o.cn_vcpus:>9} {o.cn_vcpu_s / 3600:>10.0f}  "
                  f"{fails}", flush=True)
        if args.streams > 1:
            over_streams(topologies, arrivals, seed, shapes, args.learn_shapes, args.streams)


if __name__ == "__main__":
    main()
