"""The request sequence every policy faces: pods drawn from a trace, with derived RDMA demand.

The openb traces have no NIC column, so RDMA demand comes from an explicit, configurable rule
(`DemandRule`). Drawing follows the FGD paper's method (Weng et al., ATC'23): sample pods with
replacement until the requested GPUs reach a multiple (130%) of the cluster's GPUs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from railyard.allocation.request import Request
from railyard.sim.trace import Trace, TracePod
from railyard.topology.model import Distance

PodKind = Literal["training", "rdma", "plain"]
DEFAULT_LOAD = 1.3  # requested GPUs / cluster GPUs, as in the FGD paper's experiments
DEFAULT_VF_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class DemandRule:
    """How a trace pod turns into a Railyard request.

    - pods with at least `training_min_gpus` GPUs are training pods: one VF per GPU (NCCL
      wants a NIC per rank);
    - a share `vf_share` of one-GPU pods want one VF (inference or data loading over RDMA),
      chosen by the seeded draw;
    - CPU-only pods ask for nothing Railyard manages and are left out (CPU and memory are not
      simulated: DGX-class nodes have 192–256 threads and 1–2 TiB, the trace's GPU pods run
      out of GPUs first);
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
        """The kind and request of one GPU pod; `draw` is a uniform [0, 1) number for it."""
        gpus = pod.gpus
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

    @property
    def is_multi_gpu(self) -> bool:
        return self.request.gpus >= 2


def draw_arrivals(trace: Trace, cluster_gpus: int, seed: int,
                  rule: DemandRule = DemandRule(), load: float = DEFAULT_LOAD) -> list[Arrival]:
    """Pods drawn with replacement until they request `load` × `cluster_gpus` GPUs.

    When the trace has creation times the drawn pods arrive in trace order (ties by row);
    otherwise in draw order. The VF draw for one-GPU pods uses its own stream, so changing
    `vf_share` does not change which pods arrive.
    """
    if cluster_gpus <= 0:
        raise ValueError("the cluster has no GPUs")
    if load <= 0:
        raise ValueError(f"load must be positive, got {load}")
    pool = [(i, p) for i, p in enumerate(trace.pods) if p.gpus > 0]
    pick = random.Random(f"railyard-sim/{seed}/draw")
    target = load * cluster_gpus
    drawn: list[tuple[int, TracePod]] = []
    requested = 0
    while requested < target:
        row, pod = pool[pick.randrange(len(pool))]
        drawn.append((row, pod))
        requested += pod.gpus
    if trace.has_times:
        drawn.sort(key=lambda rp: (rp[1].creation_time or 0, rp[0]))
    vf_draw = random.Random(f"railyard-sim/{seed}/vf")
    out = []
    for seq, (row, pod) in enumerate(drawn):
        kind, request = rule.request(pod, vf_draw.random())
        out.append(Arrival(seq, f"sim-{seq:05d}-r{row}", pod, kind, request))
    return out
