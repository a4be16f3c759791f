"""Benchmark: is the offline bound of `gpuAllocationRatio` reached by an offline placement?

For the default `railyard simulate` run (openb-default replayed on its trace times, the
default cluster) this solves the bound's GPU program exactly (no relative gap, HiGHS), takes
the pods it chose and the GPUs it filled with each configuration of shares, and packs them
onto the real nodes of each group: shared GPUs and whole-GPU pods, largest first, each on
the first node with the GPUs, CPUs, memory and VFs left. Where every one finds a node, a
policy that knew the arrivals in advance could hold exactly those pods at the moment the
ratio is taken (placing each on arrival and turning the rest away), so the bound is the
best any policy can do there, up to what the simulator checks (not NUMA or `maxDistance`,
which the default run does not ask). Where some do not, the answer is unknown (the packing
is first-fit). Decision 0099.

    python benchmarks/bound_attained.py --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from railyard.cli.simulate import DEFAULT_CLUSTER
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import Arrival, trace_arrivals
from railyard.sim.bounds import (
    Program,
    build_program,
    full_demand_moment,
    gpu_milli_of_arrival,
    node_groups,
)
from railyard.sim.sharing import MILLI_PER_GPU, shares_gpu
from railyard.sim.trace import load_trace

CLUSTER = DEFAULT_CLUSTER  # `railyard simulate`'s


def first_fit(program: Program, x: np.ndarray, live: list[Arrival], k: int,
              nodes: list[list[int]]) -> int:
    """Pack group `k`'s chosen pods onto `nodes` ([GPUs, CPU milli, MiB, VFs] left each);
    the number of units (a shared GPU or a whole-GPU pod) that found no node."""
    by_size: dict[int, list[Arrival]] = defaultdict(list)
    units: list[tuple[int, int, int, int]] = []
    for a in live:
        col = program.pods.get((a.uid, k))
        if col is None or not x[col]:
            continue
        if shares_gpu(a.pod):
            by_size[a.pod.gpu_milli].append(a)
        else:
            units.append((a.pod.num_gpu, a.pod.cpu_milli, a.pod.memory_mib, a.request.vfs))
    first = len(program.pods)
    for j, (group, _, config) in enumerate(program.configurations):
        for _ in range(x[first + j] if group == k else 0):
            pods = [by_size[s].pop() for s, m in config.items() for _ in range(m) if by_size[s]]
            if pods:
                units.append((1, sum(p.pod.cpu_milli for p in pods),
                              sum(p.pod.memory_mib for p in pods),
                              sum(p.request.vfs for p in pods)))
    assert not any(by_size.values()), "a chosen share on no configured GPU"
    unplaced = 0
    for unit in sorted(units, reverse=True):
        for node in nodes:
            if all(left >= need for left, need in zip(node, unit, strict=True)):
                node[:] = [left - need for left, need in zip(node, unit, strict=True)]
                break
        else:
            unplaced += 1
    return unplaced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    opts = parser.parse_args()
    topologies = list(cluster_from_spec(CLUSTER))
    groups = node_groups(topologies)
    gpus = sum(g.count * g.gpus for g in groups)
    trace = load_trace("openb-default")
    for seed in opts.seeds:
        arrivals, _ = trace_arrivals(trace, gpus, seed)
        live, _ = full_demand_moment(arrivals, gpus)
        program = build_program(live, [live], groups, gpu_milli_of_arrival, gdr=False)
        assert isinstance(program, Program)
        t0 = time.perf_counter()
        res = milp(program.cost, constraints=LinearConstraint(program.matrix, -np.inf,
                                                              program.upper),
                   integrality=np.ones(len(program.cost)),
                   bounds=Bounds(np.zeros(len(program.cost)), program.x_upper),
                   options={"time_limit": 120.0, "mip_rel_gap": 0.0, "disp": False})
        solve_s = time.perf_counter() - t0
        if res.status != 0:
            print(f"seed {seed}: not solved exactly ({res.message})")
            continue
        x = np.round(res.x).astype(int)
        optimum = round(-res.fun)
        unplaced = sum(first_fit(program, x, live, k,
                                 [[g.gpus, g.cpu_milli, g.memory_mib, g.vfs]
                                  for _ in range(g.count)])
                       for k, g in enumerate(groups))
        print(f"seed {seed}: exact optimum {optimum / MILLI_PER_GPU:.2f} GPUs "
              f"({100 * optimum / (MILLI_PER_GPU * gpus):.4f}%, solved in {solve_s:.2f} s); "
              + ("every chosen pod packs onto the real nodes: reached offline" if not unplaced
                 else f"{unplaced} shared GPUs or pods found no node by first fit: unknown"))


if __name__ == "__main__":
    main()
