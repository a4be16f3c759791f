"""How good a placement is for NCCL: its GPU↔NIC pairs and an estimated collective bandwidth.

A policy that records pairs (Railyard) is judged by them. A policy that hands out GPUs and VFs
without pairing is judged by the best matching of what it chose — the best NCCL could do with
those devices: minimum bottleneck class first, then minimum sum of classes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from railyard.allocation.types import Allocation
from railyard.topology.model import GDR_LIMIT, Distance, NodeTopology

# Bus-bandwidth factor of one rank by its GPU↔NIC class, relative to an aligned pair.
# Sources (docs/simulator.md, "The metrics"; decision 0052): GPUDirect RDMA is used up to
# PXB (NCCL_NET_GDR_LEVEL), so PIX and PXB run at full rate; a CPU-attached NIC gave ~16 GB/s
# instead of ~24 GB/s (PHB ≈ 0.67); without GDR NCCL maintainers expect "~half the
# performance" (NODE = 0.5); a cross-NUMA setup halved bus bandwidth and also crosses the
# socket link, so SYS is taken as a little worse than half (0.4 is this model's assumption).
CLASS_FACTOR: dict[Distance, float] = {
    Distance.PIX: 1.0,
    Distance.PXB: 1.0,
    Distance.PHB: 0.67,
    Distance.NODE: 0.5,
    Distance.SYS: 0.4,
}


@dataclass(frozen=True, slots=True)
class JudgedPair:
    gpu: str  # PCI address
    pf: str  # the PF whose port carries the rank's traffic
    distance: Distance


def best_matching(topology: NodeTopology, gpus: list[str],
                  nic_pfs: list[str]) -> list[JudgedPair]:
    """Pair GPUs with NICs (given by their PFs, one entry per VF) as well as possible.

    Lexicographic: the smallest bottleneck class, then the smallest sum of classes. With
    fewer NICs than GPUs, the extra GPUs stay unpaired.
    """
    if not gpus or not nic_pfs:
        return []
    d = np.array([[int(topology.distance[g][p]) for p in nic_pfs] for g in gpus])
    if len(gpus) == 1 or len(nic_pfs) == 1:  # a single row or column: the best cell(s)
        if len(gpus) == 1:
            j = int(np.argmin(d[0]))
            return [JudgedPair(gpus[0], nic_pfs[j], Distance(int(d[0, j])))]
        i = int(np.argmin(d[:, 0]))
        return [JudgedPair(gpus[i], nic_pfs[0], Distance(int(d[i, 0])))]
    big = 10 * (len(gpus) + len(nic_pfs)) * int(Distance.SYS)
    for bottleneck in sorted(set(d.flat)):
        cost = np.where(d <= bottleneck, d, big)
        rows, cols = linear_sum_assignment(cost)
        if cost[rows, cols].max() < big:
            return [JudgedPair(gpus[r], nic_pfs[c], Distance(int(d[r, c])))
                    for r, c in zip(rows, cols, strict=True)]
    raise AssertionError("unreachable: the largest class admits every matching")


def judge(topology: NodeTopology, alloc: Allocation) -> list[JudgedPair]:
    """The pairs a placement gives NCCL: recorded ones, else the best matching."""
    if alloc.pairs:
        return [JudgedPair(p.gpu.pci_address, p.nic.pf_pci_address, p.distance)
                for p in alloc.pairs]
    return best_matching(topology, [g.pci_address for g in alloc.all_gpus],
                         [n.pf_pci_address for n in alloc.all_nics])


def collective_efficiency(pairs: list[JudgedPair]) -> float:
    """Estimated bus bandwidth of the pod's collectives relative to a fully aligned placement.

    A collective runs at the pace of its slowest rank; a rank's rate is its class factor,
    divided among the pod's ranks that share its PF (NCCL_IB_MERGE_VFS folds VFs of one port
    together, so two VFs of one PF add no bandwidth). Other pods' traffic is not modelled.
    """
    if not pairs:
        return 0.0
    per_pf = Counter(p.pf for p in pairs)
    return min(CLASS_FACTOR[p.distance] / per_pf[p.pf] for p in pairs)


def gdr_capable(pairs: list[JudgedPair], gpus: int) -> bool:
    """Every GPU has its own pair within PXB, so NCCL uses GPUDirect RDMA for every rank."""
    return len(pairs) == gpus and all(p.distance <= GDR_LIMIT for p in pairs)
