"""Benchmark (not a CI test): the figures issue 30's goals use, over tie-break streams.

Each policy's own random choices (its ties) are re-seeded `--streams` times (stream 0 is the
one `railyard simulate` uses); the arrivals, departures and cluster stay those of the default
`railyard simulate --seed S` run. Per seed it reports:

- openb-default: the offline bound, and per policy (`railyard` and every baseline) the
  worst, median and best `gpuAllocationRatio` over the streams, and the share of the
  best-fit -> bound gap the median closes: (median - best-fit's median) / (bound - best-fit's
  median), 0 for best-fit itself, 1 at the bound (goal 1: railyard's median >= every
  baseline's, and the largest share);
- with `--dlrm-trace FILE` (the DLRM schema; default cluster `dgx-h100:16,cpu-rdma:64`):
  per policy the medians over the streams of instances placed, `vcpuPlaced` and
  `vcpuHoursPlaced`, and the worst `nicBandwidthOvercommit` of any stream (goal 2: railyard's
  medians >= every baseline's, at over-commit 0);
- `railyard` with a share admission reserve of K whole GPUs (`--share-reserve K …`; none by
  default): a share that finds no room on a GPU already shared is turned away while K or fewer
  GPUs of the cluster are wholly free, to keep them for whole-GPU pods. It is not
  work-conserving and not in the product (the extender's own reserve,
  `--idle-node-reserve`, keeps idle nodes): it tries the one lever the bound has and online
  placement lacks, turning pods away.

    python benchmarks/online_envelope.py --seeds 0 1 2 3 4 --streams 12 --dlrm-trace FILE
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence

from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible
from railyard.cli.simulate import DEFAULT_CLUSTER, DEFAULT_DLRM_CLUSTER
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim import run
from railyard.sim.arrivals import Arrival, DemandRule, trace_arrivals
from railyard.sim.bounds import offline_bounds
from railyard.sim.metrics import PolicyMetrics
from railyard.sim.policies import Policy, offered_vfs
from railyard.sim.railyard_policy import RailyardPolicy
from railyard.sim.sharing import MILLI_PER_GPU, share_of
from railyard.sim.trace import Trace, load_trace
from railyard.topology.model import NodeTopology

POLICIES = run.DEFAULT_POLICIES  # railyard and every baseline
GAP_FROM = "best-fit"  # the share of the gap closed is measured from this policy's median


class ShareReserve(RailyardPolicy):
    """`railyard`, except that a share which would open a GPU is turned away while at most
    `keep` GPUs of the cluster are wholly free."""

    def __init__(self, topologies: Sequence[NodeTopology], seed: int, keep: int,
                 workload: Sequence[tuple[int, int, int]]) -> None:
        super().__init__(topologies, seed, workload=workload)
        self.name = f"railyard+share-reserve-{keep}"
        self.keep = keep

    def _place_share(self, uid: str, request: Request, nodes: Sequence[str],
                     milli: int) -> Allocation | Infeasible:
        has_room = any(MILLI_PER_GPU - used >= milli for node in nodes
                       for used in self.shares.used_on(node).values())
        if not has_room:
            whole = sum(self._gpu_count[n] - len(self.state.ledger(n).used_gpus)
                        for n in self._names)
            if whole <= self.keep:
                return Infeasible(f"share reserve: {whole} whole GPUs left")
        return super()._place_share(uid, request, nodes, milli)


class VfSpread(RailyardPolicy):
    """`railyard`, except that a pod without GPUs goes to the fitting node with the largest
    share of its VFs free after placement (Koordinator's LeastAllocated on VFs, read from
    the extender's own ledger), ties at random; pods with GPUs are ranked as the product
    ranks them. Not in the product: the question is whether it is what wins DLRM."""

    def __init__(self, topologies: Sequence[NodeTopology], seed: int,
                 workload: Sequence[Arrival] = ()) -> None:
        shapes = [(a.pod.cpu_milli, a.request.gpus, share_of(a.pod)) for a in workload]
        super().__init__(topologies, seed, workload=shapes)
        self.name = "ry+vf-spread"
        self._vfs = {t.node: {v.pci_address for n in t.nics for v in offered_vfs(n)}
                     for t in topologies}

    def _pick(self, request: Request, nodes: Sequence[str]) -> str | Infeasible:
        if request.gpus or not request.vfs:
            return super()._pick(request, nodes)
        fits = self.state.filter(request, nodes).fits
        if not fits:
            return Infeasible("no node fits")
        free = {n: len(self._vfs[n] - self.state.ledger(n).used_vfs) / len(self._vfs[n])
                for n in fits}
        best = max(free.values())
        return self.rng.choice([n for n in fits if free[n] == best])


VARIANTS = {"ry+vf-spread": VfSpread}


def over_streams(name: str, topologies: Sequence[NodeTopology], arrivals: Sequence[Arrival],
                 seed: int, streams: int) -> list[PolicyMetrics]:
    """The policy's metrics under each tie-break stream (stream 0: `railyard simulate`'s)."""
    out = []
    for stream in range(streams):
        policy = (VARIANTS[name](topologies, seed, arrivals) if name in VARIANTS
                  else run.make_policy(name, topologies, seed, workload=arrivals))
        if stream:  # every policy draws its ties from `rng` (not in the Policy protocol)
            policy.rng = random.Random(  # type: ignore[attr-defined]
                f"online-envelope/{stream}/{seed}/{name}")
        out.append(run.run_policy(policy, topologies, arrivals).metrics)
    return out


def gap_closed(median: float, floor: float, bound: float) -> float | None:
    """The share of the `floor` -> `bound` gap that `median` closes (None: no gap)."""
    return None if bound <= floor else (median - floor) / (bound - floor)


def openb(seeds: Sequence[int], streams: int, share_reserve: Sequence[int]) -> None:
    trace = load_trace("openb-default")
    topologies = list(cluster_from_spec(DEFAULT_CLUSTER))
    cluster_gpus = sum(len(t.gpus) for t in topologies)
    print(f"openb-default on {DEFAULT_CLUSTER} ({cluster_gpus} GPUs), {streams} tie-break "
          f"streams; gpuAllocationRatio %; closed: share of the {GAP_FROM} -> bound gap the "
          "median closes")
    for seed in seeds:
        arrivals, _ = trace_arrivals(trace, cluster_gpus, seed, DemandRule(), 1.3)
        bound_value = offline_bounds(topologies, arrivals).gpu_allocation_ratio.value
        assert bound_value is not None, "the default run's bound is always computed"
        bound = 100 * bound_value
        got = {name: [100 * m.headline_allocation_ratio
                      for m in over_streams(name, topologies, arrivals, seed, streams)]
               for name in POLICIES}
        medians = {name: statistics.median(v) for name, v in got.items()}
        floor = medians[GAP_FROM]
        best_base = max((n for n in POLICIES if n != "railyard"), key=lambda n: medians[n])
        print(f"seed {seed}: bound {bound:.2f}")
        for name, v in got.items():
            closed = gap_closed(medians[name], floor, bound)
            print(f"  {name:<26} worst {min(v):.2f}  median {medians[name]:.2f}  best "
                  f"{max(v):.2f}  closed {'–' if closed is None else f'{100 * closed:.0f}%'}")
        verdict = "met" if medians["railyard"] >= medians[best_base] else "not met"
        print(f"  goal 1, railyard median >= best baseline ({best_base} "
              f"{medians[best_base]:.2f}): {verdict}", flush=True)
        shapes = [(a.pod.cpu_milli, a.request.gpus, share_of(a.pod)) for a in arrivals]
        for keep in share_reserve:
            policy = ShareReserve(topologies, seed, keep, shapes)
            got_k = ratio(topologies, arrivals, policy)
            print(f"  {policy.name:<26} {got_k:.2f}  (gap {bound - got_k:.2f})")


def dlrm(trace: Trace, seeds: Sequence[int], streams: int, extra: Sequence[str]) -> None:
    topologies = list(cluster_from_spec(DEFAULT_DLRM_CLUSTER))
    cluster_gpus = sum(len(t.gpus) for t in topologies)
    print(f"{trace.name} on {DEFAULT_DLRM_CLUSTER}, {streams} tie-break streams; medians of "
          "instances placed, vcpuPlaced, vcpuHoursPlaced; worst nicBandwidthOvercommit")
    for seed in seeds:
        arrivals, _ = trace_arrivals(trace, cluster_gpus, seed, DemandRule())
        print(f"seed {seed}: {len(arrivals)} instances")
        medians: dict[str, tuple[float, float, float]] = {}
        overcommit: dict[str, int] = {}
        for name in (*POLICIES, *extra):
            ms = over_streams(name, topologies, arrivals, seed, streams)
            hours = [m.vcpu_hours_placed for m in ms]
            medians[name] = (statistics.median(m.placed for m in ms),
                             statistics.median(m.vcpu_placed for m in ms),
                             statistics.median(h for h in hours if h is not None))
            overcommit[name] = max(m.overcommit_worst for m in ms)
            placed, vcpus, vcpu_h = medians[name]
            print(f"  {name:<12} placed {placed:>6g}  vCPUs {vcpus:>9.0f}  vCPU-h "
                  f"{vcpu_h:>9.0f}  over-commit {overcommit[name]}%")
        for name in extra:
            vs = medians[name]
            print(f"  {name}: instances {vs[0] - medians['railyard'][0]:+g}, vCPUs "
                  f"{vs[1] - medians['railyard'][1]:+.0f}, vCPU-h "
                  f"{vs[2] - medians['railyard'][2]:+.0f} against railyard")
        ours = medians["railyard"]
        # Against every baseline, and against those that never over-committed a NIC.
        for among, names in (("best baseline", [n for n in POLICIES if n != "railyard"]),
                             ("best at over-commit 0", [n for n in POLICIES if n != "railyard"
                                                        and not overcommit[n]])):
            if not names:
                print(f"  goal 2 ({among}): no baseline kept over-commit 0 on every stream")
                continue
            for k, what in enumerate(("instances", "vCPUs", "vCPU-hours")):
                best = max(names, key=lambda n: medians[n][k])
                verdict = ("met" if ours[k] >= medians[best][k] and not overcommit["railyard"]
                           else "not met")
                print(f"  goal 2 ({among}), {what}: railyard {ours[k]:.1f} vs {best} "
                      f"{medians[best][k]:.1f}: {verdict}", flush=True)


def ratio(topologies: Sequence[NodeTopology], arrivals: Sequence[Arrival],
          policy: Policy) -> float:
    """The policy's `gpuAllocationRatio` in percent, as `railyard simulate` reports it."""
    return 100 * run.run_policy(policy, topologies, arrivals).metrics.headline_allocation_ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--streams", type=int, default=12,
                        help="tie-break streams per policy and seed (stream 0: the shipped one)")
    parser.add_argument("--share-reserve", type=int, nargs="*", default=[], metavar="K",
                        help="whole GPUs a share may not open while left (none: skip)")
    parser.add_argument("--dlrm-trace", metavar="FILE",
                        help="a trace in the DLRM schema: its figures too")
    parser.add_argument("--variant", nargs="*", default=[], choices=sorted(VARIANTS),
                        help="railyard variants not in the product, also run on DLRM")
    parser.add_argument("--no-openb", action="store_true", help="only the DLRM figures")
    args = parser.parse_args()
    if args.streams < 1:
        parser.error("--streams must be at least 1")
    started = time.perf_counter()
    if not args.no_openb:
        openb(args.seeds, args.streams, args.share_reserve)
    if args.dlrm_trace:
        dlrm(load_trace(args.dlrm_trace), args.seeds, args.streams, args.variant)
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
