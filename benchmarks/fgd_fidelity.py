"""Benchmark (not a CI test): the FGD paper's headline setting, as closely as the simulator
allows, next to its published numbers.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent" (USENIX ATC '23), figure 7 / table: GPU allocation ratio when the arrived
GPU requests reach 100% of the cluster's GPUs, on the openb cluster (1,523 nodes, 6,212 GPUs)
with the openb default trace: FGD 95.2%, best-fit 92.9%, random 86.3%.

Here: the openb node list (`openb_node_list_all_node.csv`) as nodes with that many GPUs, CPUs
and memory (no NICs; nodes without GPUs left out, as the simulator leaves CPU-only pods out);
pods drawn from `openb_pod_list_default.csv` with replacement until they ask 130% of the
cluster's GPUs (shares counted as milli/1000), arriving one after another and never leaving
(`--arrivals draw`), asking no VFs; each pod offered the nodes with room for its CPUs and
memory; GPU shares on one GPU summing to ≤ 1000 (decision 0094). Reported: each policy's
`gpuAllocationRatio` (when arrivals reach 100%), per seed and the mean.

`--cpu-pods` comes closer still: the trace's CPU-only pods are drawn too (as the paper's
simulator does; `railyard simulate` leaves them out) and the CPU-only nodes join the cluster,
so CPU-only pods can take the CPUs of GPU nodes.

    python benchmarks/fgd_fidelity.py --seeds 0 1 2 [--cpu-pods] [--traces DIR]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import platform
import random
import statistics
import time
from pathlib import Path

from railyard.allocation.request import Request
from railyard.discovery.profiles import GpuSpec, NumaSpec, ProfileSpec, RootSpec, build_topology
from railyard.sim.arrivals import Arrival, DemandRule, draw_arrivals
from railyard.sim.run import simulate
from railyard.sim.sharing import MILLI_PER_GPU, gpu_milli_of
from railyard.sim.trace import Trace, load_trace
from railyard.topology.model import NodeTopology

PUBLISHED = {"fgd": 0.952, "best-fit": 0.929, "random": 0.863}
POLICIES = ("fgd", "best-fit", "random")
TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "traces"
MiB = 1 << 20


def openb_nodes(path: Path, cpu_nodes: bool = False) -> list[NodeTopology]:
    """One topology per row with GPUs (and, with `cpu_nodes`, per row without): that many
    GPUs, each on its own root port, and the row's CPUs and memory on one NUMA node (the
    trace has no PCIe or NUMA layout)."""
    built: dict[tuple[int, int, int], NodeTopology] = {}
    out = []
    with path.open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            gpus, cpu, mem = int(row["gpu"]), int(row["cpu_milli"]), int(row["memory_mib"])
            if not gpus and not cpu_nodes:
                continue
            key = (gpus, cpu, mem)
            if key not in built:
                spec = ProfileSpec(
                    name=f"openb-{gpus}g-{cpu // 1000}c", hostname=row["sn"],
                    numa=(NumaSpec(f"0-{cpu // 1000 - 1}", mem * MiB),),
                    roots=tuple(RootSpec(0x10 * (i + 1), 0, (GpuSpec(0x10 * (i + 1) + 1),))
                                for i in range(gpus)))
                built[key] = build_topology(spec, node=row["sn"])
            base = built[key]
            out.append(base if base.node == row["sn"] else
                       dataclasses.replace(base, node=row["sn"]))
    return out


def draw_with_cpu_pods(trace: Trace, cluster_gpus: int, seed: int) -> list[Arrival]:
    """The FGD draw over every row, CPU-only pods included: with replacement until the GPU
    requests reach 130% of the cluster's (shares as milli/1000), in creation-time order."""
    pick = random.Random(f"railyard-bench/fgd/{seed}")
    drawn, requested = [], 0
    while requested < 1.3 * cluster_gpus * MILLI_PER_GPU:
        row = pick.randrange(len(trace.pods))
        drawn.append(row)
        requested += gpu_milli_of(trace.pods[row])
    drawn.sort(key=lambda r: (trace.pods[r].creation_time or 0, r))
    return [Arrival(i, f"b-{i:05d}-r{r}", trace.pods[r], "plain",
                    Request(gpus=trace.pods[r].num_gpu)) for i, r in enumerate(drawn)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--traces", type=Path, default=TRACES,
                        help="folder with the openb node and pod lists")
    parser.add_argument("--cpu-pods", action="store_true",
                        help="draw CPU-only pods too, and add the CPU-only nodes")
    opts = parser.parse_args()
    topologies = openb_nodes(opts.traces / "openb_node_list_all_node.csv", opts.cpu_pods)
    trace = load_trace(str(opts.traces / "openb_pod_list_default.csv"))
    gpus = sum(len(t.gpus) for t in topologies)
    print(f"# {platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()}")
    print(f"# openb cluster: {len(topologies)} nodes, {gpus} GPUs; openb default trace, "
          f"{len(trace.pods)} rows; CPU-only pods and nodes {'in' if opts.cpu_pods else 'out'}")
    ratios: dict[str, list[float]] = {p: [] for p in POLICIES}
    for seed in opts.seeds:
        if opts.cpu_pods:
            arrivals = draw_with_cpu_pods(trace, gpus, seed)
        else:
            drawn = draw_arrivals(trace, gpus, seed, DemandRule(vf_share=0.0))
            # The paper's setting has no NICs: every pod asks GPUs (and CPUs, memory) only.
            arrivals = [dataclasses.replace(a, request=Request(gpus=a.request.gpus),
                                            kind="plain") for a in drawn]
        for name in POLICIES:
            t0 = time.perf_counter()
            result = simulate(topologies, arrivals, [name], seed, bounds=False)
            m = result.results[name].metrics
            ratios[name].append(m.headline_allocation_ratio)
            print(f"seed {seed} {name:9} {100 * m.headline_allocation_ratio:5.1f}%  "
                  f"({len(arrivals)} pods, {m.placed} placed, "
                  f"{time.perf_counter() - t0:.0f} s)", flush=True)
    print("\npolicy     measured (mean)  published  difference")
    for name in POLICIES:
        mean = statistics.fmean(ratios[name])
        print(f"{name:9}  {100 * mean:14.1f}%  {100 * PUBLISHED[name]:8.1f}%  "
              f"{100 * (mean - PUBLISHED[name]):+9.1f} points")


if __name__ == "__main__":
    main()
