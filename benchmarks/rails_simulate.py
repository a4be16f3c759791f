"""Benchmark: issue 17's own measure, `railyard simulate --jobs 8`, with and without the rails.

The railyard policy's per-pod decision latency in the simulator (what `railyard simulate`
reports as `decisionLatencyP99Ms`, each run's first decision left out) on the default
cluster and trace, the arrivals `railyard simulate --seed S --jobs N` makes, in two forms
per seed and run, interleaved:

- `required`: the gangs as the simulator draws them, `rails: required` (one rail sequence
  per job);
- `no-rails`: the very same arrivals with the gangs' rail policy set to `none`, the decision
  as it was before rails (today's, in the issue's words).

Per form: the median over the runs of the p99 over every pod, and of the slowest gang
decision (a gang is placed all at once, at its first pod, whose latency is the whole gang's;
the others record none of their own). Times are wall clock, as the simulator measures them.

    python benchmarks/rails_simulate.py                     # seeds 0-4, --jobs 8, 3 runs
    python benchmarks/rails_simulate.py --jobs 40 --seeds 0 1 --runs 5
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from dataclasses import replace

from railyard.cli.simulate import DEFAULT_CLUSTER
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import Arrival, trace_arrivals
from railyard.sim.gangs import add_gangs
from railyard.sim.run import simulate, timeline
from railyard.sim.trace import load_trace

CLUSTER = DEFAULT_CLUSTER  # `railyard simulate`'s
TRACE = "openb-default"
FORMS = ("no-rails", "required")


def arrivals_for(seed: int, jobs: int, gpus: int) -> list[Arrival]:
    """What `railyard simulate --seed SEED --jobs JOBS` places (trace times, departures)."""
    arrivals, _ = trace_arrivals(load_trace(TRACE), gpus, seed)
    return add_gangs(arrivals, jobs, seed)


def without_rails(arrivals: list[Arrival]) -> list[Arrival]:
    return [replace(a, request=replace(a.request, rail_policy="none")) if a.job else a
            for a in arrivals]


def run(topologies: list, arrivals: list[Arrival], seed: int) -> tuple[float, float]:
    """(p99 over every pod as reported, slowest gang decision), in ms."""
    result = simulate(topologies, arrivals, ["railyard"], seed, bounds=False)
    metrics = result.results["railyard"].metrics
    p99 = float(metrics.as_json()["decisionLatencyP99Ms"])  # type: ignore[arg-type]
    placed = [a for departs, a in timeline(arrivals) if not departs]
    seen: set[str] = set()
    gangs = []
    for a, seconds in zip(placed, metrics.latencies_s, strict=True):
        if a.job is not None and a.job not in seen:  # the gang's first pod: the whole gang
            seen.add(a.job)
            gangs.append(seconds)
    return p99, 1000 * max(gangs, default=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3, help="repeats per seed, forms interleaved")
    a = ap.parse_args()
    topologies = list(cluster_from_spec(CLUSTER))
    gpus = sum(len(t.gpus) for t in topologies)
    print(f"{CLUSTER}, {TRACE}, --jobs {a.jobs}, {a.runs} run(s) per seed; Python "
          f"{sys.version.split()[0]}, {platform.machine()}, {os.cpu_count()} CPUs, load "
          f"average {os.getloadavg()[0]:.2f}\n")
    print("| seed | p99 ms no-rails | p99 ms required | ratio | slowest gang ms no-rails | "
          "slowest gang ms required | ratio |")
    print("|---|---|---|---|---|---|---|")
    for seed in a.seeds:
        required = arrivals_for(seed, a.jobs, gpus)
        forms = {"no-rails": without_rails(required), "required": required}
        got: dict[str, list[tuple[float, float]]] = {f: [] for f in FORMS}
        for _ in range(a.runs):
            for form in FORMS:
                got[form].append(run(topologies, forms[form], seed))
        med = {f: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
               for f, v in got.items()}
        base, rails = med["no-rails"], med["required"]
        print(f"| {seed} | {base[0]:.2f} | {rails[0]:.2f} | {rails[0] / base[0]:.2f}× | "
              f"{base[1]:.2f} | {rails[1]:.2f} | {rails[1] / base[1]:.2f}× |")


if __name__ == "__main__":
    main()
