"""The `railyard` policy: the extender's own ClusterState and joint allocator, not a copy.

Each pod goes through what kube-scheduler asks the extender: filter every node, score the
ones that fit, bind to the best (ties at random, as kube-scheduler's selectHost breaks them),
and the bind re-allocates under the node lock and records the Allocation in the ledger.
A share of one GPU (`sim.sharing`; Railyard's allocator never shares, decision 0094) goes
best-fit onto a GPU already shared, else opens the GPU the allocator would give a one-GPU pod,
on the best-scored node whose fragmentation (FGD's measure) grows least (decision 0098).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible, NicRef
from railyard.scheduler.state import ClusterState
from railyard.sim.fgd import Shape, Workload, expected_fragmentation
from railyard.sim.sharing import MILLI_PER_GPU, GpuShares
from railyard.topology.model import NodeTopology

if TYPE_CHECKING:
    from railyard.allocation.allocator import Packing

SIM_NAMESPACE = "railyard-sim"
# A fixed stamp: the record's time is not part of any result, and a seed must reproduce all.
SIM_DECIDED_AT = "1970-01-01T00:00:00Z"


class RailyardPolicy:
    name = "railyard"

    def __init__(self, topologies: Sequence[NodeTopology], seed: int,
                 packing: Packing = "binpack", idle_reserve: int = 0,
                 workload: Iterable[Shape] = ()) -> None:
        from railyard.allocation.allocator import Allocator

        self.state = ClusterState(topologies, allocator=Allocator(packing=packing),
                                  idle_reserve=idle_reserve)
        self._names = self.state.node_names()
        self.rng = random.Random(f"railyard-sim/{seed}/policy/{self.name}")
        self.shares = GpuShares()
        self._gpu_count = {t.node: len(t.gpus) for t in topologies}
        # The target workload's GPU shapes, as FGD is given them, without CPUs: the extender
        # does not count CPU milli (kube-scheduler's NodeResourcesFit does, before it), and
        # they never bind on the default clusters (decision 0098). Empty: ties at random.
        self.workload = Workload((0, gpus, milli) for _, gpus, milli in workload)
        # (free milli per GPU sorted, share) -> growth of fragmentation: nodes in the same
        # state are measured once.
        self._growth: dict[tuple[tuple[int, ...], int], float] = {}

    def ledgers(self) -> Mapping[str, Ledger]:
        return {n: self.state.ledger(n) for n in self._names}

    def place(self, uid: str, request: Request, nodes: Sequence[str] | None = None, *,
              job: str | None = None, gpu_milli: int = MILLI_PER_GPU,
              cpu_milli: int = 0) -> Allocation | Infeasible:
        if request.gpus == 1 and 0 < gpu_milli < MILLI_PER_GPU and job is None:
            return self._place_share(uid, request, self._names if nodes is None else nodes,
                                     gpu_milli)
        # A gang's pod: its job's rail sequence, as the extender hands it (docs/rails.md).
        request = self.state.job_request(request, job)
        node = self._pick(request, self._names if nodes is None else nodes)
        if isinstance(node, Infeasible):
            return node
        return self.state.bind(uid, SIM_NAMESPACE, uid, node, request,
                               decided_at=SIM_DECIDED_AT, job=job)

    def _pick(self, request: Request, nodes: Sequence[str]) -> str | Infeasible:
        """The node kube-scheduler binds to: filter, score, the best (ties at random)."""
        best = self._best_scored(request, nodes)
        return best if isinstance(best, Infeasible) else self.rng.choice(best)

    def _best_scored(self, request: Request, nodes: Sequence[str]) -> list[str] | Infeasible:
        """The nodes that fit and share the extender's best score, in filter's order."""
        outcome = self.state.filter(request, nodes, ranked=True)
        if not outcome.fits:
            reasons = {**outcome.failed, **outcome.unresolvable}
            first = next(iter(reasons.values()), "no nodes")
            return Infeasible(f"no node fits ({len(reasons)} rejected; e.g. {first})")
        return outcome.fits

    def _pick_to_open(self, request: Request, nodes: Sequence[str],
                      milli: int) -> str | Infeasible:
        """The node on which a share of `milli` opens a GPU: among the nodes the extender
        scores best for a one-GPU pod, the one whose expected fragmentation (FGD's measure,
        `sim.fgd`) grows least when a whole GPU becomes a share of `milli`; then at random
        (decision 0098). The score, not fragmentation, comes first: it keeps idle nodes and
        GPUs near NICs for the multi-GPU pods that pair them."""
        tied = self._best_scored(request, nodes)
        if isinstance(tied, Infeasible):
            return tied
        if len(tied) > 1 and self.workload.counts:
            growth = {n: self._fragmentation_growth(n, milli) for n in tied}
            least = min(growth.values())
            tied = [n for n in tied if growth[n] == least]
        return self.rng.choice(tied)

    def _fragmentation_growth(self, node: str, milli: int) -> float:
        """How much `node`'s expected fragmentation grows when one of its whole free GPUs
        takes a share of `milli` (free milli: whole GPUs 1000 each, shared ones what they
        have left; stand-ins hold the shared ones in the ledger)."""
        whole = self._gpu_count[node] - len(self.state.ledger(node).used_gpus)
        free = sorted([MILLI_PER_GPU] * whole
                      + [MILLI_PER_GPU - u for u in self.shares.used_on(node).values()])
        key = (tuple(free), milli)
        hit = self._growth.get(key)
        if hit is None:
            after = [*free[:-1], MILLI_PER_GPU - milli]  # free[-1] is a whole GPU
            hit = (expected_fragmentation(0, after, self.workload)
                   - expected_fragmentation(0, free, self.workload))
            self._growth[key] = hit
        return hit

    def _place_share(self, uid: str, request: Request, nodes: Sequence[str],
                     milli: int) -> Allocation | Infeasible:
        """Railyard's rule for a share of one GPU (decision 0094), which keeps whole GPUs
        near NICs for the pods that pair them:

        1. best-fit onto a GPU already shared: the one with the least milli left that fits,
           on a node whose VFs the pod's VFs fit (ties at random);
        2. else open a GPU: on a node the extender scores best for a one-GPU pod (binpack: the
           fullest), the one whose fragmentation grows least (`_pick_to_open`), the GPU the
           allocator gives a one-GPU pod there (the one whose loss keeps the largest
           GPU↔NIC matching within PXB, its aligned-capacity key), held whole by a stand-in
           meanwhile.

        The pod's VFs, if any, are the allocator's for a request of VFs alone on that node."""
        vf_request = Request(vfs=request.vfs) if request.vfs else None
        room = [(MILLI_PER_GPU - used, node, gpu) for node in nodes
                for gpu, used in self.shares.used_on(node).items()
                if MILLI_PER_GPU - used >= milli]
        if room and vf_request is not None:
            with_vfs = set(self.state.filter(vf_request, sorted({n for _, n, _ in room})).fits)
            room = [r for r in room if r[1] in with_vfs]
        holder = None
        if room:
            least = min(left for left, _, _ in room)
            _, node, gpu = self.rng.choice(sorted(r for r in room if r[0] == least))
            whole = self.state.ledger(node).allocation(self.shares.holder(node, gpu) or "")
            assert whole is not None, "a shared GPU is held by its stand-in"
        else:
            picked = self._pick_to_open(Request(gpus=1, vfs=request.vfs), nodes, milli)
            if isinstance(picked, Infeasible):
                return picked
            node, holder = picked, f"shared-gpu/{uid}"
            opened = self.state.bind(holder, SIM_NAMESPACE, holder, node, Request(gpus=1),
                                     decided_at=SIM_DECIDED_AT)
            if isinstance(opened, Infeasible):
                return opened
            whole, gpu = opened, opened.gpus[0].pci_address
        vfs: tuple[NicRef, ...] = ()
        if vf_request is not None:
            got = self.state.bind(uid, SIM_NAMESPACE, uid, node, vf_request,
                                  decided_at=SIM_DECIDED_AT)
            if isinstance(got, Infeasible):
                if holder is not None:
                    self.state.release(holder)
                return got
            vfs = got.nics
        self.shares.hold(uid, node, gpu, milli, holder or "")
        return Allocation(node=node, numa_nodes=whole.numa_nodes, cpus=None, memory_bytes=(),
                          nics=vfs, gpus=whole.gpus)

    def release(self, uid: str) -> None:
        """The pod was deleted: the extender's release, as its pod watch calls it; a share
        frees its milli, and its GPU with the last one."""
        self.state.release(uid)
        freed = self.shares.release(uid)
        if freed is not None and freed[1] is not None:
            self.state.release(freed[1])
