"""What the simulator measures per policy, accumulated as arrivals are placed.

The keys of `PolicyMetrics.as_json()` are the `metrics.json` contract (camelCase, one dict
per policy); `docs/simulator.md` defines each of them.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from railyard.allocation.ledger import Ledger
from railyard.allocation.types import Allocation
from railyard.sim.arrivals import Arrival
from railyard.sim.judge import JudgedPair, collective_efficiency, gdr_capable, judge
from railyard.sim.policies import offered_vfs
from railyard.sim.sharing import MILLI_PER_GPU, gpu_milli_of
from railyard.topology.model import GDR_LIMIT, Distance, NodeTopology

# Cell codes of the node heatmap: free, held without a NIC, then paired by class.
CELL_FREE = 0
CELL_NO_NIC = 1
CELL_PAIRED = {d: 2 + int(d) for d in Distance}


@dataclass(slots=True)
class PolicyMetrics:
    policy: str
    cluster_gpus: int
    arrived: int = 0
    placed: int = 0
    # GPUs in milli-GPUs: a share of one GPU counts its milli (decision 0094).
    allocated_milli: int = 0
    arrived_milli: int = 0
    first_failure_ratio: float | None = None
    multi_arrived: int = 0
    multi_placed: int = 0
    multi_gdr: int = 0
    rdma_placed: int = 0
    limit_violations: int = 0  # placed pods whose pairs break their maxDistance
    pairs: Counter = field(default_factory=Counter)
    # Placed pods with pairs, by their worst pair's class: the level each achieved (0091).
    worst_pairs: Counter = field(default_factory=Counter)
    multi_efficiency: list[float] = field(default_factory=list)
    rdma_efficiency: list[float] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    # Per arrival: (requested GPUs / cluster GPUs, allocated GPUs / cluster GPUs,
    # GDR-capable multi-GPU pods so far)
    curve: list[tuple[float, float, int]] = field(default_factory=list)
    first_failure_at: int | None = None  # index into `curve`
    node_filter_failures: int = 0  # pods no node had room for (CPUs, memory, rules)
    # NIC bandwidth shares (percent of one PF's line rate) held per (node, PF), by the VFs of
    # pods whose trace states one; what each live pod adds; the over-commit now and at worst.
    pf_shares: Counter = field(default_factory=Counter)
    shares_held: dict[str, list[tuple[tuple[str, str], int]]] = field(default_factory=dict)
    overcommit_now: int = 0
    overcommit_worst: int = 0
    live_requested_milli: int = 0  # milli-GPUs requested by pods arrived, not yet left
    held_milli: dict[str, int] = field(default_factory=dict)  # placed, live pod -> milli
    judged: dict[str, list[JudgedPair]] = field(default_factory=dict)  # uid -> pairs
    failures: Counter = field(default_factory=Counter)  # kind -> count
    end: dict[str, int] = field(default_factory=dict)  # end-of-run NIC and GPU states
    # "atHalfLoad"/"atFullLoad" -> state when requested GPUs first reached 50%/100% of the
    # cluster's (the FGD paper reports allocation at 100% arrived load)
    snapshots: dict[str, dict[str, float]] = field(default_factory=dict)
    # Gangs (`sim.gangs`): per job, its pods' rail sequences as placed, and how many it has.
    job_rails: dict[str, list[tuple[int | None, ...]]] = field(default_factory=dict)
    job_sizes: Counter = field(default_factory=Counter)
    # CPU work placed: milli-CPUs of every pod placed at its arrival, and milli-CPU-seconds
    # of their run time (arrival to departure, or to the run's end: `finish`); the placed,
    # live pods' (milli-CPUs, arrival second) until they leave. None: no pod has a lifetime.
    cpu_milli_placed: int = 0
    cpu_milli_s_placed: float | None = 0.0
    running_cpu: dict[str, tuple[int, float]] = field(default_factory=dict)

    def record(self, arrival: Arrival, result: object, topology: NodeTopology | None,
               latency_s: float) -> None:
        req = arrival.request
        if arrival.job is not None:
            self.job_sizes[arrival.job] += 1
        milli = gpu_milli_of(arrival.pod)
        self.arrived += 1
        self.arrived_milli += milli
        self.live_requested_milli += milli
        self.latencies_s.append(latency_s)
        multi = arrival.is_multi_gpu
        self.multi_arrived += multi
        if isinstance(result, Allocation) and topology is not None:
            self.placed += 1
            self.allocated_milli += milli
            self.cpu_milli_placed += arrival.pod.cpu_milli
            self.running_cpu[arrival.uid] = (arrival.pod.cpu_milli, arrival.arrive_s)
            self.held_milli[arrival.uid] = milli
            share = arrival.pod.rdma_percent
            if share:
                held = [((result.node, v.pf_pci_address), share) for v in result.vfs]
                self.shares_held[arrival.uid] = held
                self._shares(held, +1)
            pairs = judge(topology, result) if req.vfs else []
            self.judged[arrival.uid] = pairs
            self.pairs.update(p.distance.name for p in pairs)
            if pairs:
                self.worst_pairs[max(p.distance for p in pairs).name] += 1
            if req.max_distance is not None and any(p.distance > req.max_distance
                                                    for p in pairs):
                self.limit_violations += 1
            if req.vfs:
                self.rdma_placed += 1
                self.rdma_efficiency.append(collective_efficiency(pairs))
            if multi:
                self.multi_placed += 1
                self.multi_efficiency.append(collective_efficiency(pairs))
                self.multi_gdr += gdr_capable(pairs, req.gpus)
            if arrival.job is not None:
                self.job_rails.setdefault(arrival.job, []).append(rail_sequence(topology, pairs))
        else:
            self.failures[arrival.kind] += 1
            if self.first_failure_ratio is None:
                self.first_failure_ratio = self.allocated_gpus / self.cluster_gpus
                self.first_failure_at = len(self.curve)
        self._point()

    def depart(self, arrival: Arrival) -> None:
        """`arrival` left (placed or not): its GPUs are requested no more, and free again."""
        self.live_requested_milli -= gpu_milli_of(arrival.pod)
        self.allocated_milli -= self.held_milli.pop(arrival.uid, 0)
        self._shares(self.shares_held.pop(arrival.uid, []), -1)
        if arrival.uid in self.running_cpu and arrival.depart_s is not None:
            self._ran(arrival.uid, arrival.depart_s)
        self._point()

    def _shares(self, held: list[tuple[tuple[str, str], int]], sign: int) -> None:
        """Add (or take back) a pod's NIC shares, keeping the over-commit (the sum over PFs
        of what exceeds 100%) now and at its worst."""
        for pf, share in held:
            before = max(0, self.pf_shares[pf] - 100)
            self.pf_shares[pf] += sign * share
            self.overcommit_now += max(0, self.pf_shares[pf] - 100) - before
        self.overcommit_worst = max(self.overcommit_worst, self.overcommit_now)

    def _point(self) -> None:
        self.curve.append((self.arrived_gpus / self.cluster_gpus,
                           self.allocated_gpus / self.cluster_gpus, self.multi_gdr))

    @property
    def allocated_gpus(self) -> float:
        """GPUs held by live placed pods, a share counting its milli/1000."""
        return self.allocated_milli / MILLI_PER_GPU

    @property
    def arrived_gpus(self) -> float:
        """GPUs requested so far, a share counting its milli/1000."""
        return self.arrived_milli / MILLI_PER_GPU

    @property
    def arrived_load(self) -> float:
        """GPUs requested so far (cumulatively) / cluster GPUs."""
        return self.arrived_gpus / self.cluster_gpus

    @property
    def live_load(self) -> float:
        """GPUs requested by the pods live now (placed or not) / cluster GPUs; equal to
        `arrived_load` while no pod has left."""
        return self.live_requested_milli / (MILLI_PER_GPU * self.cluster_gpus)

    def snapshot(self, key: str, topologies: Sequence[NodeTopology],
                 ledgers: Mapping[str, Ledger]) -> None:
        """Allocation and NIC states now, under `key`: at equal arrived load the policies
        still differ in what they stranded (at the end of a 130% run the cluster is full)."""
        states = nic_states(topologies, ledgers)
        self.snapshots[key] = {
            "gpuAllocationRatio": round(self.gpu_allocation_ratio, 6),
            "strandedVfs": states["strandedVfs"],
            "strandedNics": states["strandedNics"],
            "freeGpusWithoutGdrNic": states["freeGpusWithoutGdrNic"],
        }

    def _ran(self, uid: str, until_s: float) -> None:
        """A placed pod stopped running at `until_s`: its CPUs × its run time count."""
        cpu_milli, since_s = self.running_cpu.pop(uid)
        if self.cpu_milli_s_placed is not None:
            self.cpu_milli_s_placed += cpu_milli * max(0.0, until_s - since_s)

    def finish(self, topologies: Sequence[NodeTopology], ledgers: Mapping[str, Ledger],
               end_s: float | None = None) -> None:
        """The run ended at `end_s` (its last event on the replay clock): the pods still
        running count up to it. `end_s` None: the run had no lifetimes (pods drawn to stay,
        or a trace without deletion times), so vCPU-hours mean nothing there."""
        self.end = nic_states(topologies, ledgers)
        if end_s is None:
            self.cpu_milli_s_placed = None
            self.running_cpu.clear()
        for uid in list(self.running_cpu):
            self._ran(uid, end_s if end_s is not None else 0.0)

    @property
    def vcpu_placed(self) -> float:
        """`vcpuPlaced`: vCPUs of the pods placed (at their arrival), however long they ran."""
        return self.cpu_milli_placed / 1000

    @property
    def vcpu_hours_placed(self) -> float | None:
        """`vcpuHoursPlaced`: per placed pod, its vCPUs × the hours it ran (arrival to its
        departure, or to the run's last event); None for a run without lifetimes."""
        if self.cpu_milli_s_placed is None:
            return None
        return self.cpu_milli_s_placed / 1000 / 3600

    # ------------------------------------------------------------------ summary

    @property
    def gpu_allocation_ratio(self) -> float:
        """Allocated GPUs / cluster GPUs now (shares count their milli/1000)."""
        return self.allocated_milli / (MILLI_PER_GPU * self.cluster_gpus)

    @property
    def headline_allocation_ratio(self) -> float:
        """`gpuAllocationRatio`: the ratio when the live pods' requested GPUs first reached
        the cluster's GPUs (`atFullLoad`; without departures, when arrivals reached 100%, the
        FGD paper's measure); at the end of a run whose demand never got there."""
        full = self.snapshots.get("atFullLoad")
        return full["gpuAllocationRatio"] if full else self.gpu_allocation_ratio

    @property
    def gdr_pod_share(self) -> float:
        return self.multi_gdr / self.multi_arrived if self.multi_arrived else 0.0

    @property
    def gdr_placed_share(self) -> float:
        """GDR-capable multi-GPU pods / multi-GPU pods placed (not arrived)."""
        return self.multi_gdr / self.multi_placed if self.multi_placed else 0.0

    @property
    def gangs_placed(self) -> int:
        """Gangs whose every pod was placed (all-or-nothing: `sim.gangs`)."""
        return sum(1 for job, rails in self.job_rails.items()
                   if len(rails) == self.job_sizes[job])

    @property
    def rail_consistent_job_share(self) -> float | None:
        """Of the gangs fully placed, the share whose pods all hold one rail sequence (pair
        i of every pod on one rail; docs/rails.md); None when no gang was placed."""
        placed = [rails for job, rails in self.job_rails.items()
                  if len(rails) == self.job_sizes[job]]
        if not placed:
            return None
        same = sum(1 for rails in placed if None not in rails[0] and len(set(rails)) == 1)
        return same / len(placed)

    def as_json(self, with_latency: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "podsArrived": self.arrived,
            "podsPlaced": self.placed,
            "podsFailed": self.arrived - self.placed,
            "failuresByKind": dict(sorted(self.failures.items())),
            "podsFailedOnNodeFilters": self.node_filter_failures,
            "gpusRequested": _gpus(self.arrived_milli),
            "gpusAllocated": _gpus(self.allocated_milli),
            "clusterGpus": self.cluster_gpus,
            "gpuAllocationRatio": round(self.headline_allocation_ratio, 6),
            "gpuAllocationRatioAtEnd": round(self.gpu_allocation_ratio, 6),
            "gpuAllocationRatioAtFirstFailure": (
                None if self.first_failure_ratio is None else round(self.first_failure_ratio, 6)),
            "pairsByDistance": {d.name: self.pairs.get(d.name, 0) for d in Distance},
            "podsByWorstPair": {d.name: self.worst_pairs.get(d.name, 0) for d in Distance},
            "multiGpuPodsArrived": self.multi_arrived,
            "multiGpuPodsPlaced": self.multi_placed,
            "gdrCapableMultiGpuPods": self.multi_gdr,
            "gdrCapablePodShare": round(self.gdr_pod_share, 6),
            "gdrCapablePlacedShare": round(self.gdr_placed_share, 6),
            "railConsistentJobShare": (None if (r := self.rail_consistent_job_share) is None
                                       else round(r, 6)),
            "gangsArrived": len(self.job_sizes),
            "gangsPlaced": self.gangs_placed,
            "rdmaPodsPlaced": self.rdma_placed,
            "vcpuPlaced": round(self.vcpu_placed, 3),
            "vcpuHoursPlaced": (None if (h := self.vcpu_hours_placed) is None
                                else round(h, 6)),
            "collectiveEfficiencyMultiGpu": _mean(self.multi_efficiency),
            "networkEfficiencyRdmaPods": _mean(self.rdma_efficiency),
            "maxDistanceViolations": self.limit_violations,
            "nicBandwidthOvercommit": self.overcommit_worst,
            **self.end,
            **{k: dict(v) for k, v in self.snapshots.items()},
        }
        if with_latency:
            timed = self.timed_latencies_s
            out["decisionLatencyP50Ms"] = round(1000 * _quantile(timed, 0.50), 4)
            out["decisionLatencyP99Ms"] = round(1000 * _quantile(timed, 0.99), 4)
        return out

    @property
    def timed_latencies_s(self) -> list[float]:
        """Every decision but the policy's first, for every policy alike (decision 0055).

        The first pays one-time costs (cold caches, the interpreter specialising the code
        paths), usually the slowest of a policy's run; on a run under 100 pods the
        nearest-rank p99 is the maximum, so it would be that one warm-up."""
        return self.latencies_s[1:] or self.latencies_s


def rail_sequence(topology: NodeTopology, pairs: Sequence[JudgedPair]
                  ) -> tuple[int | None, ...]:
    """A placed pod's rail sequence: the rail of each pair's NIC, pairs in GPU address order
    (Railyard's pair order; the baselines' pairs are the best matching `judge` finds)."""
    rail = {n.pci_address: n.rail for n in topology.nics}
    return tuple(rail.get(p.pf) for p in sorted(pairs, key=lambda p: p.gpu))


def nic_states(topologies: Sequence[NodeTopology],
               ledgers: Mapping[str, Ledger]) -> dict[str, int]:
    """Stranded VFs and NICs, and free GPUs without a GDR-capable NIC left.

    A NIC (PF) is stranded when it has free VFs, its node still has free GPUs, and none of
    them is within PXB of it: the node's remaining GPUs cannot use it with GPUDirect RDMA.
    On a full node nothing is stranded (no GPU is left to pair), so a well-packed cluster is
    not penalised for being full. Free VFs are those any policy may still be handed
    (`policies.offered_vfs`, the allocator's rule) and no pod holds.
    """
    stranded_vfs = stranded_nics = free_vfs = unaligned_gpus = free_gpus = 0
    for t in topologies:
        led = ledgers[t.node]
        free_g = [g.pci_address for g in t.gpus if g.pci_address not in led.used_gpus]
        free_gpus += len(free_g)
        pf_free = {}
        for n in t.nics:
            offered = offered_vfs(n)
            if offered and n.pci_address not in led.used_pfs:
                pf_free[n.pci_address] = sum(v.pci_address not in led.used_vfs for v in offered)
        for pf, free in pf_free.items():
            free_vfs += free
            if free and free_g and not any(t.distance[g][pf] <= GDR_LIMIT for g in free_g):
                stranded_vfs += free
                stranded_nics += 1
        for g in free_g:
            if not any(free and t.distance[g][pf] <= GDR_LIMIT for pf, free in pf_free.items()):
                unaligned_gpus += 1
    return {"freeVfs": free_vfs, "strandedVfs": stranded_vfs, "strandedNics": stranded_nics,
            "freeGpus": free_gpus, "freeGpusWithoutGdrNic": unaligned_gpus}


def _gpus(milli: int) -> int | float:
    """Milli-GPUs as GPUs: whole when they are, else to the milli."""
    whole, rest = divmod(milli, MILLI_PER_GPU)
    return whole if not rest else milli / MILLI_PER_GPU


def _mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 6) if xs else None


def _quantile(xs: list[float], q: float) -> float:
    """Nearest-rank quantile: a value that really occurred, the ⌈q·n⌉-th smallest.

    (`round(q·n + 0.5)` rounds halves to even, so it took the next rank when q·n was an odd
    whole number: the median of two values was the larger.)"""
    if not xs:
        return 0.0
    ordered = sorted(xs)
    k = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered) - 1e-9) - 1))
    return ordered[k]


def heatmap_rows(topology: NodeTopology, ledger: Ledger,
                 judged: Mapping[str, list[JudgedPair]]) -> list[tuple[int, int]]:
    """One row of the node heatmap: per GPU in index order, its cell code and the GPU count
    of the pod holding it (0 when free)."""
    cls_of: dict[str, Distance] = {}
    size_of: dict[str, int] = {}
    for uid, alloc in ledger.holders():
        gpus = alloc.all_gpus
        for ref in gpus:
            size_of[ref.pci_address] = len(gpus)
        for p in judged.get(uid, ()):
            cls_of[p.gpu] = p.distance
    row = []
    for g in sorted(topology.gpus, key=lambda g: g.index):
        a = g.pci_address
        if a in cls_of:
            row.append((CELL_PAIRED[cls_of[a]], size_of[a]))
        elif a in size_of:
            row.append((CELL_NO_NIC, size_of[a]))
        else:
            row.append((CELL_FREE, 0))
    return row
