"""Gangs for `railyard simulate --jobs N`: multi-pod training jobs beside the trace's pods.

A gang is a job of several pods that train together: all of its pods arrive at one moment,
each asks for the same GPUs (with a VF per GPU, NCCL's one NIC per rank), and it is placed
all-or-nothing (`railyard.sim.run`). Drawn from the seed's own stream, so adding gangs never
changes which trace pods arrive (docs/simulator.md, "Gangs"):

- pods per gang: 2, 3 or 4, uniformly;
- GPUs per pod: 2, 4 or 8, uniformly (VFs as many), with `rails: required`: a training job
  on a rail-optimised fabric asks its pods to keep one rail sequence (docs/rails.md); the
  baselines, like today's stacks, cannot express it and ignore it;
- arrival: a trace arrival drawn uniformly, the gang arriving right after it (so at its
  moment on a replayed trace); departure: with a replayed trace, after the median lifetime
  of the trace pods that leave; never without.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import replace

from railyard.allocation.request import Request
from railyard.sim.arrivals import Arrival
from railyard.sim.trace import TracePod

GANG_PODS = (2, 3, 4)
GANG_GPUS = (2, 4, 8)
MAX_JOBS = 10_000


def add_gangs(arrivals: Sequence[Arrival], jobs: int, seed: int) -> list[Arrival]:
    """`arrivals` with `jobs` gangs inserted, renumbered in order (`seq`); a gang's pods are
    consecutive and share `job` (`sim/job-<n>`)."""
    if not 0 <= jobs <= MAX_JOBS:
        raise ValueError(f"--jobs must be within 0..{MAX_JOBS}, got {jobs}")
    if not jobs:
        return list(arrivals)
    if not arrivals:
        raise ValueError("--jobs needs trace pods to place the gangs among")
    rng = random.Random(f"railyard-sim/{seed}/jobs")
    lives = [a.depart_s - a.arrive_s for a in arrivals if a.depart_s is not None]
    life = statistics.median(lives) if lives else None
    after: dict[int, list[list[Arrival]]] = {}
    for j in range(jobs):
        pods, gpus = rng.choice(GANG_PODS), rng.choice(GANG_GPUS)
        at = rng.randrange(len(arrivals))
        start = arrivals[at].arrive_s
        pod = TracePod(name=f"job-{j}", cpu_milli=0, memory_mib=0, num_gpu=gpus,
                       gpu_milli=1000)
        gang = [Arrival(0, f"sim-job{j:04d}-p{k}", pod, "training",
                        Request(gpus=gpus, vfs=gpus, rail_policy="required"), start,
                        None if life is None else start + life, job=f"sim/job-{j}")
                for k in range(pods)]
        after.setdefault(at, []).append(gang)
    out: list[Arrival] = []
    for i, a in enumerate(arrivals):
        out.append(a)
        for gang in after.get(i, ()):
            out.extend(gang)
    return [replace(a, seq=s) for s, a in enumerate(out)]


def gangs_of(arrivals: Sequence[Arrival]) -> dict[str, int]:
    """Each job's pod count."""
    sizes: dict[str, int] = {}
    for a in arrivals:
        if a.job is not None:
            sizes[a.job] = sizes.get(a.job, 0) + 1
    return sizes
