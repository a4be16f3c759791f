"""Benchmark: the per-pod decision latency with a job's rail sequence against without it.

One pod's decision is what the extender does for it: filter over every node name, prioritize
over the nodes that fit, bind to the best-scored one, through `ClusterState` in process (no
HTTP; docs/benchmarks.md "Scheduler extender" measures that layer). The cluster is built
from a spec (default 1,000 nodes of dgx-h100, dgx-a100 and hgx-h100-4nic), filled to about
half its GPUs by pods without a job, then gangs arrive: jobs of 2–8 pods of 1, 2, 4 or 8 GPUs
with as many VFs, one pod after another. The same pods, in the same order, on a fresh cluster
per mode, in the same run:

- `no-rails`: the pods carry no job label (today's decision);
- `preferred`: one label per job; the extender hands each later pod its job's sequence;
- `required`: the same, with the `rails: required` hint.

Per mode: the p50, p99 and max of the per-pod decision time, and the share of jobs whose bound
pods all hold one rail sequence. `--clock cpu` times with the process's CPU time instead of
the wall clock (a shared machine's other work then counts less); `--runs N` repeats the
three modes N times, interleaved (no-rails, preferred, required, no-rails, ...), and reports
per mode the median over the runs of each figure, with each run's p99 beside it.

    python benchmarks/rails.py                  # markdown table on stdout
    python benchmarks/rails.py --jobs 100 --spec dgx-h100:200
    python benchmarks/rails.py --clock cpu --runs 3
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import replace

from railyard.allocation.request import Request
from railyard.allocation.types import Allocation
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.scheduler.state import ClusterState

SPEC = "dgx-h100:400,dgx-a100:300,hgx-h100-4nic:300"
SIZES = [1, 2, 4, 8]  # GPUs per pod of a job (with as many VFs)


def fill(state: ClusterState, rng: random.Random, share: float) -> None:
    """Pods without a job until about `share` of the GPUs are held."""
    names = state.node_names()
    total = sum(len(state.topology(n).gpus) for n in names)
    held = 0
    i = 0
    while held < share * total:
        gpus = rng.choice([1, 1, 2, 4])
        node = rng.choice(names)
        got = state.bind(f"fill-{i}", "bench", f"fill-{i}", node, Request(gpus=gpus, vfs=gpus))
        i += 1
        if isinstance(got, Allocation):
            held += gpus


def gangs(rng: random.Random, jobs: int) -> list[tuple[str, Request]]:
    """(job, request) per pod, jobs one after another."""
    out = []
    for j in range(jobs):
        gpus = rng.choice(SIZES)
        out += [(f"bench/job:j{j}", Request(gpus=gpus, vfs=gpus))
                for _ in range(rng.randint(2, 8))]
    return out


MODES = ("no-rails", "preferred", "required")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def decide(state: ClusterState, names: list[str], uid: str, job: str | None,
           request: Request, clock=time.perf_counter) -> tuple[float, Allocation | None]:
    """filter → prioritize → bind for one pod, as the extender does; (seconds, the record)."""
    t0 = clock()
    asked = state.job_request(request, job)
    fits = state.filter(asked, names, uid=uid).fits
    result: Allocation | None = None
    if fits:
        scores = state.scores(asked, fits, uid=uid)
        best = max(fits, key=lambda n: scores.get(n, 0))
        got = state.bind(uid, "bench", uid, best, state.job_request(request, job), job=job)
        result = got if isinstance(got, Allocation) else None
    return clock() - t0, result


def run_mode(mode: str, spec: str, seed: int, jobs: int,
             clock=time.perf_counter) -> dict[str, float]:
    rng = random.Random(seed)
    state = ClusterState(cluster_from_spec(spec).topologies)
    fill(state, rng, 0.5)
    names = state.node_names()
    pods = gangs(rng, jobs)
    times: list[float] = []
    held: dict[str, list[tuple[int | None, ...]]] = {}
    for k, (job, request) in enumerate(pods):
        if mode == "required":
            request = replace(request, rail_policy="required")
        seconds, alloc = decide(state, names, f"pod-{k}", None if mode == "no-rails" else job,
                                request, clock)
        times.append(seconds)
        if alloc is not None:
            held.setdefault(job, []).append(alloc.rails)
    times.sort()
    consistent = sum(1 for r in held.values() if len(set(r)) == 1) / max(1, len(held))
    return {"pods": len(times), "p50": statistics.median(times),
            "p99": times[min(len(times) - 1, int(0.99 * len(times)))], "max": times[-1],
            "consistent": consistent}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default=SPEC)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall: time.perf_counter; cpu: time.process_time")
    ap.add_argument("--runs", type=int, default=1, help="repeat the modes, interleaved")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        ap.error(f"unknown modes {sorted(unknown)}")
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(a.runs):
        for m in modes:
            runs[m].append(run_mode(m, a.spec, a.seed, a.jobs, CLOCKS[a.clock]))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    base = med["no-rails"]["p99"] if "no-rails" in med else None
    print(f"{a.spec}, {a.jobs} jobs (seed {a.seed}), clock {a.clock}, {a.runs} run(s); "
          f"Python {sys.version.split()[0]}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}\n")
    print("| mode | pods | p50 ms | p99 ms (median) | p99 ms per run | max ms | "
          "p99 / no-rails | jobs on one sequence |")
    print("|---|---|---|---|---|---|---|---|")
    for m, r in med.items():
        each = ", ".join(f"{1e3 * x['p99']:.2f}" for x in runs[m])
        ratio = f"{r['p99'] / base:.2f}×" if base else "–"
        print(f"| {m} | {r['pods']:.0f} | {1e3 * r['p50']:.2f} | {1e3 * r['p99']:.2f} | "
              f"{each} | {1e3 * r['max']:.2f} | {ratio} | {r['consistent']:.2f} |")


if __name__ == "__main__":
    main()
