"""Benchmark: the simulation itself, in process, per policy (no start-up, no charts).

`simulate()` for one policy at a time over the same arrivals on `railyard simulate`'s
default cluster, seed 0, both shipped traces, arrivals as it makes them (openb-default
replayed on its trace times, with departures);
median of `--repeats` runs, without the offline bound (timed on its own line). The baselines
are each other's reference: same arrivals, same cluster.

    python benchmarks/simulator.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from railyard.cli.simulate import DEFAULT_CLUSTER
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import Arrival, draw_arrivals, trace_arrivals
from railyard.sim.bounds import offline_bounds
from railyard.sim.run import DEFAULT_POLICIES, simulate
from railyard.sim.trace import load_trace

CLUSTER = DEFAULT_CLUSTER  # `railyard simulate`'s
TRACES = ("openb-default", "openb-multigpu20")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    topologies = list(cluster_from_spec(CLUSTER))
    gpus = sum(len(t.gpus) for t in topologies)
    arrivals: dict[str, list[Arrival]] = {}
    for t in TRACES:
        trace = load_trace(t)
        arrivals[t] = (trace_arrivals(trace, gpus, 0)[0] if trace.has_lifetimes
                       else draw_arrivals(trace, gpus, 0))
    print(f"Machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    print(f"Command: python benchmarks/simulator.py --repeats {opts.repeats}\n")
    print("| policy | " + " | ".join(f"{t} ({len(arrivals[t])} pods)" for t in TRACES) + " |")
    print("|---|" + "---|" * len(TRACES))
    for policy in DEFAULT_POLICIES:
        cells = []
        for trace in TRACES:
            times = []
            for _ in range(opts.repeats):
                start = time.perf_counter()
                simulate(topologies, arrivals[trace], [policy], 0, bounds=False)
                times.append((time.perf_counter() - start) * 1000)
            cells.append(f"{statistics.median(times):.0f} ms")
        print(f"| {policy} | " + " | ".join(cells) + " |")
    cells = []
    for trace in TRACES:
        times = []
        for _ in range(opts.repeats):
            start = time.perf_counter()
            offline_bounds(topologies, arrivals[trace])
            times.append((time.perf_counter() - start) * 1000)
        cells.append(f"{statistics.median(times):.0f} ms")
    print("| offline bound (bounds.json) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
