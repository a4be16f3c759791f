"""The request sequence every policy faces: pods drawn from a trace, with derived RDMA demand.

The openb traces have no NIC column, so RDMA demand comes from an explicit, configurable rule
(`DemandRule`). Drawing follows the FGD paper's method (Weng et al., ATC'23): sample pods with
replacement until the requested GPUs reach a multiple (130%) of the cluster's GPUs. Where the
trace has creation and deletion times, `trace_arrivals` replays the drawn pods on the trace's
clock, each leaving after its trace lifetime (`timeline` puts both in order).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from railyard.allocation.request import Request
from railyard.sim.sharing import MILLI_PER_GPU, gpu_milli_of
from railyard.sim.trace import Trace, TracePod
from railyard.topology.model import Distance

PodKind = Literal["training", "rdma", "plain"]
ArrivalMode = Literal["trace", "draw"]
ARRIVAL_MODES: tuple[ArrivalMode, ...] = ("trace", "draw")
DEFAULT_LOAD = 1.3  # requested GPUs / cluster GPUs, as in the FGD paper's experiments
DEFAULT_VF_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class DemandRule:
    """How a trace pod turns into a Railyard request.

    - pods with at least `training_min_gpus` GPUs are training pods: one VF per GPU (NCCL
      wants a NIC per rank);
    - a share `vf_share` of one-GPU pods want one VF (inference or data loading over RDMA),
      chosen by the seeded draw;
    - CPU-only pods ask for nothing Railyard manages and are left out (their CPUs and memory
      would be kube-scheduler's business alone);
    - `strict` adds the hard limit `maxDistance: PXB` to training pods. Off by default, so
      every policy faces requests it can express.
    """

    training_min_gpus: int = 2
    vf_share: float = DEFAULT_VF_SHARE
    strict: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.vf_share <= 1.0:
            raise ValueError(f"vf share must be within 0..1, got {self.vf_share}")
        if self.training_min_gpus < 2:
            raise ValueError(f"training pods have at least 2 GPUs, got {self.training_min_gpus}")

    def request(self, pod: TracePod, draw: float) -> tuple[PodKind, Request]:
        """The kind and request of one pod; `draw` is a uniform [0, 1) number for it.

        A pod whose trace states its NIC share (the DLRM schema's `rdma_request`) wants one
        VF when the share is above 0, whatever the rule says; the share is the VF's."""
        gpus = pod.gpus
        if pod.rdma_percent is not None:
            if pod.rdma_percent:
                # The share is asked as the VF's bandwidth: Railyard's allocator keeps each
                # PF's sum ≤ 100 (docs/decisions/0093); baselines place as they would.
                return "rdma", Request(gpus=gpus, vfs=1, vf_bandwidth=pod.rdma_percent)
            return "plain", Request(gpus=gpus)
        if gpus >= self.training_min_gpus:
            limit = Distance.PXB if self.strict else None
            return "training", Request(gpus=gpus, vfs=gpus, max_distance=limit)
        if draw < self.vf_share:
            return "rdma", Request(gpus=gpus, vfs=1)
        return "plain", Request(gpus=gpus)


@dataclass(frozen=True, slots=True)
class Arrival:
    seq: int  # position in the sequence, 0-based
    uid: str  # a stable pod UID for ledgers
    pod: TracePod
    kind: PodKind
    request: Request
    arrive_s: float = 0.0  # on the replay's clock (`trace_arrivals`); draws all arrive at 0
    depart_s: float | None = None  # None: stays to the end of the run
    job: str | None = None  # a gang's job (`sim.gangs`): placed all-or-nothing, one rail sequence

    @property
    def is_multi_gpu(self) -> bool:
        return self.request.gpus >= 2


def draw_arrivals(trace: Trace, cluster_gpus: int, seed: int,
                  rule: DemandRule = DemandRule(), load: float = DEFAULT_LOAD) -> list[Arrival]:
    """Pods drawn with replacement until they request `load` × `cluster_gpus` GPUs (a share
    of one GPU counts its milli/1000, as the FGD paper counts GPU requests).

    When the trace has creation times the drawn pods arrive in trace order (ties by row);
    otherwise in draw order. The VF draw for one-GPU pods uses its own stream, so changing
    `vf_share` does not change which pods arrive.
    """
    if cluster_gpus <= 0:
        raise ValueError("the cluster has no GPUs")
    if load <= 0:
        raise ValueError(f"load must be positive, got {load}")
    pool = [(i, p) for i, p in enumerate(trace.pods) if p.wants_devices]
    pick = random.Random(f"railyard-sim/{seed}/draw")
    target = load * cluster_gpus * MILLI_PER_GPU
    drawn: list[tuple[int, TracePod]] = []
    requested = 0
    while requested < target:
        row, pod = pool[pick.randrange(len(pool))]
        drawn.append((row, pod))
        requested += gpu_milli_of(pod)
    if trace.has_times:
        drawn.sort(key=lambda rp: (rp[1].creation_time or 0, rp[0]))
    vf_draw = random.Random(f"railyard-sim/{seed}/vf")
    out = []
    for seq, (row, pod) in enumerate(drawn):
        kind, request = rule.request(pod, vf_draw.random())
        out.append(Arrival(seq, f"sim-{seq:05d}-r{row}", pod, kind, request))
    return out


# How far arrivals may be compressed at most (a factor of 10^12 is "all at once" for any
# trace measured in seconds); the search stops within this ratio of the least factor.
_MAX_COMPRESSION = 1e12
_COMPRESSION_STEPS = 60


def trace_arrivals(trace: Trace, cluster_gpus: int, seed: int,
                   rule: DemandRule = DemandRule(), load: float = DEFAULT_LOAD,
                   peak: float = 1.0) -> tuple[list[Arrival], float]:
    """`draw_arrivals`' pods (the same ones, in creation-time order), replayed on the trace's
    clock: each arrives at its creation time and leaves after its trace lifetime
    (deletion − creation; never, without a deletion time). Returns them with the factor by
    which the creation times were compressed.

    openb's pods are short-lived (median lifetime ~10 min over a 150-day trace): at most
    71 GPUs of them were ever live at once, in a cluster of 6,200. Replayed as they are on
    any cluster a draw can fill, the cluster would stay nearly empty. So the creation times
    (not the lifetimes) are divided by the least factor ≥ 1 at which the live pods'
    requested GPUs reach `peak` × the cluster's GPUs at some moment (found by bisection;
    the live peak only grows with the factor). When even arriving all at once they would
    not, every pod arrives at 0 in creation order, and leaves after its lifetime.
    """
    if not trace.has_lifetimes:
        raise ValueError(f"trace {trace.name} has no creation and deletion times to replay")
    drawn = draw_arrivals(trace, cluster_gpus, seed, rule, load)
    t0 = min((a.pod.creation_time or 0 for a in drawn), default=0)
    starts = [float((a.pod.creation_time or 0) - t0) for a in drawn]
    lives = [None if a.pod.deletion_time is None
             else float(a.pod.deletion_time - (a.pod.creation_time or 0)) for a in drawn]
    gpus = [gpu_milli_of(a.pod) for a in drawn]  # milli-GPUs, shares as asked
    target = peak * cluster_gpus * MILLI_PER_GPU

    def peak_at(factor: float) -> int:
        arrive = [s / factor for s in starts]
        return live_peak(arrive, [a + life if life is not None else None
                                  for a, life in zip(arrive, lives, strict=True)], gpus)

    factor = 1.0
    if peak_at(1.0) < target:
        if peak_at(_MAX_COMPRESSION) < target:
            factor = math.inf
        else:  # peak_at(lo) < target <= peak_at(hi), on a log scale
            lo, hi = 0.0, math.log(_MAX_COMPRESSION)
            for _ in range(_COMPRESSION_STEPS):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if peak_at(math.exp(mid)) >= target else (mid, hi)
            factor = math.exp(hi)
    out = []
    for a, start, life in zip(drawn, starts, lives, strict=True):
        arrive = 0.0 if math.isinf(factor) else start / factor
        out.append(replace(a, arrive_s=arrive,
                           depart_s=None if life is None else arrive + life))
    return out, factor


def live_peak(arrive_s: Sequence[float], depart_s: Sequence[float | None],
              gpus: Sequence[int]) -> int:
    """The most GPUs requested by pods live at one moment (leaving before arriving, at
    equal times, as `timeline` orders them)."""
    events = sorted([(a, 1, g) for a, g in zip(arrive_s, gpus, strict=True)]
                    + [(d, 0 if d > a else 2, -g)
                       for a, d, g in zip(arrive_s, depart_s, gpus, strict=True)
                       if d is not None])
    live = best = 0
    for _, _, g in events:
        live += g
        best = max(best, live)
    return best


def timeline(arrivals: Sequence[Arrival]) -> list[tuple[bool, Arrival]]:
    """Arrivals and departures in time order, as (departs, arrival).

    At one moment, pods that arrived earlier leave first (what they free is free for the
    newcomers, as a deleted pod's devices are by the time the next one is scheduled), then
    pods arrive in sequence order, then pods with no lifetime leave again.
    """
    keyed: list[tuple[float, int, int, bool, Arrival]] = []
    for a in arrivals:
        keyed.append((a.arrive_s, 1, a.seq, False, a))
        if a.depart_s is not None:
            keyed.append((a.depart_s, 0 if a.depart_s > a.arrive_s else 2, a.seq, True, a))
    keyed.sort(key=lambda k: k[:3])
    return [(departs, a) for _, _, _, departs, a in keyed]
