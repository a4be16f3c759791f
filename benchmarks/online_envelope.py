"""Benchmark (not a CI test): how close do online policies come to the offline bound?

Issue 18 asks Railyard's `gpuAllocationRatio` on openb-default to be within 1 point of the
bound in `bounds.json`. The bound is reached by an offline placement
(`benchmarks/bound_attained.py`), so what is left is the distance from online placement to
the best offline one. This replays the default `railyard simulate --seed S` run (the same
arrivals and departures, the default cluster) and reports, per seed:

- the bound;
- `railyard`, `fgd` and `best-fit` under `--streams` tie-break streams each (stream 0 is the
  one `railyard simulate` uses; the others re-seed only the policy's own random choices), the
  worst and best ratio of each: the envelope of what these rules reach by luck of the draw;
- `railyard` with a share admission reserve of K whole GPUs (`--share-reserve K …`): a share
  that finds no room on a GPU already shared is turned away while K or fewer GPUs of the
  cluster are wholly free, to keep them for whole-GPU pods. It is not work-conserving and not
  in the product (the extender's own reserve, `--idle-node-reserve`, keeps idle nodes): it
  tries the one lever the bound has and online placement lacks, turning pods away.

    python benchmarks/online_envelope.py --seeds 0 1 2 3 4 --streams 12 --share-reserve 5 20
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence

from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible
from railyard.cli.simulate import DEFAULT_CLUSTER
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim import run
from railyard.sim.arrivals import Arrival, DemandRule, trace_arrivals
from railyard.sim.bounds import offline_bounds
from railyard.sim.policies import Policy
from railyard.sim.railyard_policy import RailyardPolicy
from railyard.sim.sharing import MILLI_PER_GPU, share_of
from railyard.sim.trace import load_trace
from railyard.topology.model import NodeTopology

POLICIES = ("railyard", "fgd", "best-fit")


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


def ratio(topologies: Sequence[NodeTopology], arrivals: Sequence[Arrival],
          policy: Policy) -> float:
    """The policy's `gpuAllocationRatio` in percent, as `railyard simulate` reports it."""
    return 100 * run.run_policy(policy, topologies, arrivals).metrics.headline_allocation_ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--streams", type=int, default=12,
                        help="tie-break streams per policy and seed (stream 0: the shipped one)")
    parser.add_argument("--share-reserve", type=int, nargs="*", default=[5, 20], metavar="K",
                        help="whole GPUs a share may not open while left (none: skip)")
    args = parser.parse_args()
    if args.streams < 1:
        parser.error("--streams must be at least 1")

    trace = load_trace("openb-default")
    topologies = list(cluster_from_spec(DEFAULT_CLUSTER))
    cluster_gpus = sum(len(t.gpus) for t in topologies)
    started = time.perf_counter()
    print(f"openb-default on {DEFAULT_CLUSTER} ({cluster_gpus} GPUs), "
          f"{args.streams} tie-break streams; gpuAllocationRatio %, gap to the bound in points")
    for seed in args.seeds:
        arrivals, _ = trace_arrivals(trace, cluster_gpus, seed, DemandRule(), 1.3)
        bound = offline_bounds(topologies, arrivals).gpu_allocation_ratio.value
        assert bound is not None, "the default run's bound is always computed"
        print(f"seed {seed}: bound {100 * bound:.2f}")
        shapes = [(a.pod.cpu_milli, a.request.gpus, share_of(a.pod)) for a in arrivals]
        for name in POLICIES:
            got = []
            for stream in range(args.streams):
                policy = run.make_policy(name, topologies, seed, workload=arrivals)
                if stream:  # each of POLICIES draws its ties from `rng` (not in Policy)
                    policy.rng = random.Random(  # type: ignore[attr-defined]
                        f"online-envelope/{stream}/{seed}/{name}")
                got.append(ratio(topologies, arrivals, policy))
            print(f"  {name:<26} shipped {got[0]:.2f}  worst {min(got):.2f}  "
                  f"median {statistics.median(got):.2f}  best {max(got):.2f}  "
                  f"(gap {100 * bound - max(got):.2f})")
        for keep in args.share_reserve:
            policy = ShareReserve(topologies, seed, keep, shapes)
            got_k = ratio(topologies, arrivals, policy)
            print(f"  {policy.name:<26} {got_k:.2f}  (gap {100 * bound - got_k:.2f})")
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
