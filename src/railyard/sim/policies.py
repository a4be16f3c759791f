"""Baseline placement policies, each a real implementation on Railyard's own `Ledger`.

They decide what today's stacks decide (docs/simulator.md, "The policies"):
a node, then GPUs and VFs, without pairing them. Every decision goes through `Ledger.add`, so
double allocation is as impossible for them as for Railyard. Random choices come from a
seeded generator and sorted candidate lists, so a seed reproduces every decision.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.shape import port_usable, vf_allocatable
from railyard.allocation.types import Allocation, GpuRef, Infeasible, NicRef
from railyard.sim.sharing import MILLI_PER_GPU, GpuShares
from railyard.topology.model import Gpu, Nic, NodeTopology, Vf

# A baseline's decision: the node, its GPUs and its VFs (each with its PF).
Choice = tuple[str, list[Gpu], list[tuple[Nic, Vf]]]
# A baseline's decision for a share of one GPU: the node, the GPU and its VFs.
ShareChoice = tuple[str, Gpu, list[tuple[Nic, Vf]]]
# The ledger stand-in holding a shared GPU whole while it holds shares (`sim.sharing`).
SHARED_HOLDER = "shared-gpu/"
# Koordinator's trial on one node: the GPUs, then a VF (with its PF) for each.
_Plan = tuple[tuple[Gpu, ...], tuple[tuple[Nic, Vf], ...]]


class Policy(Protocol):
    """One way of placing pods; the simulator feeds every policy the same arrivals."""

    name: str

    def place(self, uid: str, request: Request, nodes: Sequence[str] | None = None, *,
              job: str | None = None, gpu_milli: int = MILLI_PER_GPU,
              cpu_milli: int = 0) -> Allocation | Infeasible:
        """Decide and record a placement for pod `uid` on one of `nodes` (default: every
        node; the simulator passes those kube-scheduler's own filters let through), or say
        why none exists. `job`: the pod's job, when it is a gang's (the baselines, like
        today's stacks, ignore it). `gpu_milli` under 1000 with one GPU asked: a share of
        one GPU (`sim.sharing`), which the returned Allocation names as its GPU.
        `cpu_milli`: the pod's CPUs (the simulator has checked they fit; FGD reads them)."""
        ...

    def release(self, uid: str) -> None:
        """Pod `uid` left: free exactly what it holds (nothing when it holds nothing)."""
        ...

    def ledgers(self) -> Mapping[str, Ledger]:
        """The per-node ledgers holding what this policy placed, by node name."""
        ...


@dataclass(frozen=True, slots=True)
class ShapeIndex:
    """Device lists of one hardware shape, sorted by PCI address (shared by identical nodes)."""

    gpus: tuple[Gpu, ...]
    vfs: tuple[tuple[Nic, Vf], ...]  # the VFs Railyard's allocator may hand out

    @classmethod
    def of(cls, t: NodeTopology) -> ShapeIndex:
        """Every policy is offered the same VFs: the allocator's own rule (`offered_vfs`)."""
        vfs = tuple((n, v) for n in sorted(t.nics, key=lambda n: n.pci_address)
                    for v in offered_vfs(n))
        return cls(tuple(sorted(t.gpus, key=lambda g: g.pci_address)), vfs)


def offered_vfs(nic: Nic) -> list[Vf]:
    """The VFs of `nic` Railyard's allocator may hand out (`allocation.shape`): none on a port
    known to be down; RDMA VFs still in the host view (not already inside some pod),
    lowest VF index first. A PF carrying the default route offers its VFs like any other."""
    if not port_usable(nic):
        return []
    return sorted((v for v in nic.vfs if vf_allocatable(v)), key=lambda v: v.vf_index)


def index_shapes(topologies: Iterable[NodeTopology]) -> dict[str, ShapeIndex]:
    """A ShapeIndex per node name, computed once per distinct shape."""
    by_shape: dict[tuple, ShapeIndex] = {}
    out = {}
    for t in topologies:
        key = t.shape_key
        if key not in by_shape:
            by_shape[key] = ShapeIndex.of(t)
        out[t.node] = by_shape[key]
    return out


def make_allocation(node: str, gpus: Sequence[Gpu],
                    vfs: Sequence[tuple[Nic, Vf]]) -> Allocation:
    """An unpaired allocation: what kubelet and the SR-IOV device plugin hand a pod."""
    numa = {g.numa_node for g in gpus} | {n.numa_node for n, _ in vfs}
    return Allocation(
        node=node,
        numa_nodes=tuple(sorted(n for n in numa if n is not None)),
        cpus=None,
        memory_bytes=(),
        nics=tuple(NicRef.of_vf(n, v) for n, v in vfs),
        gpus=tuple(GpuRef.of(g) for g in gpus),
    )


class DevicePolicy:
    """What the baselines share: ledgers, free-device views, a seeded generator."""

    name = "base"

    def __init__(self, topologies: Sequence[NodeTopology], seed: int) -> None:
        self.topologies = list(topologies)
        self._ledgers = {t.node: Ledger(t) for t in self.topologies}
        self._index = index_shapes(self.topologies)
        self._node_of: dict[str, str] = {}  # pod uid -> the node it holds devices on
        # Per node: how many times its ledger changed (a cache key that departures cannot
        # fool, as the sizes of the used sets could).
        self.changes: dict[str, int] = dict.fromkeys(self._ledgers, 0)
        self.rng = random.Random(f"railyard-sim/{seed}/policy/{self.name}")
        self.shares = GpuShares()
        self._gpu_at = {t.node: {g.pci_address: g for g in t.gpus} for t in self.topologies}

    def ledgers(self) -> Mapping[str, Ledger]:
        return self._ledgers

    # -- views

    def free_gpus(self, node: str) -> list[Gpu]:
        used = self._ledgers[node].used_gpus
        return [g for g in self._index[node].gpus if g.pci_address not in used]

    def free_vfs(self, node: str) -> list[tuple[Nic, Vf]]:
        used = self._ledgers[node].used_vfs
        return [(n, v) for n, v in self._index[node].vfs if v.pci_address not in used]

    def free_counts(self, node: str) -> tuple[int, int]:
        led, idx = self._ledgers[node], self._index[node]
        return len(idx.gpus) - len(led.used_gpus), len(idx.vfs) - len(led.used_vfs)

    def capacity(self, node: str) -> tuple[int, int]:
        idx = self._index[node]
        return len(idx.gpus), len(idx.vfs)

    def fits_counts(self, node: str, request: Request) -> bool:
        gpus, vfs = self.free_counts(node)
        return gpus >= request.gpus and vfs >= request.vfs

    def share_options(self, node: str, milli: int) -> list[tuple[Gpu, int]]:
        """The GPUs of `node` a share of `milli` fits on, with the milli each has free:
        shared GPUs with room (by address), then whole free GPUs (1000)."""
        at = self._gpu_at[node]
        shared = [(at[a], MILLI_PER_GPU - used) for a, used in self.shares.used_on(node).items()
                  if MILLI_PER_GPU - used >= milli]
        shared.sort(key=lambda o: o[0].pci_address)
        return [*shared, *((g, MILLI_PER_GPU) for g in self.free_gpus(node))]

    def free_milli(self, node: str) -> int:
        """The milli-GPUs `node` has free: whole free GPUs, and what shared GPUs have left."""
        whole, _ = self.free_counts(node)
        return (MILLI_PER_GPU * whole
                + sum(MILLI_PER_GPU - u for u in self.shares.used_on(node).values()))

    # -- the decision

    def place(self, uid: str, request: Request, nodes: Sequence[str] | None = None, *,
              job: str | None = None, gpu_milli: int = MILLI_PER_GPU,
              cpu_milli: int = 0) -> Allocation | Infeasible:
        if request.pfs or request.exclusive_cpus or request.memory_bytes:
            return Infeasible("the simulator's baselines place GPUs and VFs only")
        offered = [t.node for t in self.topologies] if nodes is None else nodes
        if request.gpus == 1 and 0 < gpu_milli < MILLI_PER_GPU:
            return self._place_share(uid, request, offered, gpu_milli)
        fitting = [n for n in offered if self.fits_counts(n, request)]
        if not fitting:
            return Infeasible(f"no node has {request.gpus} free GPU(s) and "
                              f"{request.vfs} free VF(s)")
        chosen = self.choose(fitting, request)
        if isinstance(chosen, Infeasible):
            return chosen
        node, gpus, vfs = chosen
        alloc = make_allocation(node, gpus, vfs)
        self._ledgers[node].add(uid, alloc)
        self._node_of[uid] = node
        self.changes[node] += 1
        return alloc

    def _place_share(self, uid: str, request: Request, offered: Sequence[str],
                     milli: int) -> Allocation | Infeasible:
        fitting = [n for n in offered
                   if self.free_counts(n)[1] >= request.vfs and self.share_options(n, milli)]
        if not fitting:
            return Infeasible(f"no node has {milli} milli of one GPU and {request.vfs} "
                              "free VF(s)")
        chosen = self.choose_share(fitting, request, milli)
        if isinstance(chosen, Infeasible):
            return chosen
        node, gpu, vfs = chosen
        led = self._ledgers[node]
        if vfs:
            led.add(uid, make_allocation(node, [], vfs))
        if self.shares.used(node, gpu.pci_address) == 0:  # opened: held whole meanwhile
            led.add(SHARED_HOLDER + gpu.pci_address, make_allocation(node, [gpu], []))
        self.shares.hold(uid, node, gpu.pci_address, milli, SHARED_HOLDER + gpu.pci_address)
        self._node_of[uid] = node
        self.changes[node] += 1
        return make_allocation(node, [gpu], vfs)

    def release(self, uid: str) -> None:
        node = self._node_of.pop(uid, None)
        if node is None:
            return
        changed = self._ledgers[node].remove(uid) is not None
        freed = self.shares.release(uid)
        if freed is not None:
            changed = True
            if freed[1] is not None:  # the GPU's last share left: free it whole
                self._ledgers[node].remove(freed[1])
        if changed:
            self.changes[node] += 1

    def choose(self, nodes: list[str], request: Request) -> Choice | Infeasible:
        raise NotImplementedError

    def choose_share(self, nodes: list[str], request: Request,
                     milli: int) -> ShareChoice | Infeasible:
        """A share of one GPU (`nodes` each have a GPU it fits and the VFs): by default a
        random node, a random GPU it fits, random VFs (kubelet with a sharing device plugin,
        which hands out any replica)."""
        node = self.rng.choice(nodes)
        gpu, _ = self.rng.choice(self.share_options(node, milli))
        return node, gpu, self.rng.sample(self.free_vfs(node), request.vfs)

    def pick_tied(self, scored: list[tuple[float, str]]) -> str:
        """The best-scored node; ties broken at random, as kube-scheduler's selectHost does."""
        best = max(s for s, _ in scored)
        return self.rng.choice([n for s, n in scored if s == best])


class RandomPolicy(DevicePolicy):
    """kubelet without Topology Manager: any feasible node, devices at random."""

    name = "random"

    def choose(self, nodes: list[str], request: Request) -> Choice | Infeasible:
        node = self.rng.choice(nodes)
        gpus = self.rng.sample(self.free_gpus(node), request.gpus)
        vfs = self.rng.sample(self.free_vfs(node), request.vfs)
        return node, gpus, vfs


class NumaPolicy(DevicePolicy):
    """Topology Manager (best-effort): a NUMA-blind node choice, then one NUMA node for the
    GPUs and VFs when one can hold them all (the lowest such, as the narrowest hint with the
    lowest mask wins), devices at random within it; otherwise devices at random."""

    name = "numa"

    def choose(self, nodes: list[str], request: Request) -> Choice | Infeasible:
        node = self.rng.choice(nodes)
        gpus, vfs = self.free_gpus(node), self.free_vfs(node)
        numas = sorted({g.numa_node for g in gpus if g.numa_node is not None}
                       | {n.numa_node for n, _ in vfs if n.numa_node is not None})
        for numa in numas:
            g_here = [g for g in gpus if g.numa_node == numa]
            v_here = [(n, v) for n, v in vfs if n.numa_node == numa]
            if len(g_here) >= request.gpus and len(v_here) >= request.vfs:
                gpus, vfs = g_here, v_here
                break
        return node, self.rng.sample(gpus, request.gpus), self.rng.sample(vfs, request.vfs)

    def choose_share(self, nodes: list[str], request: Request,
                     milli: int) -> ShareChoice | Infeasible:
        """The same for a share: the lowest NUMA node with a GPU the share fits and the VFs,
        the GPU and VFs at random within it; otherwise at random."""
        node = self.rng.choice(nodes)
        options, vfs = self.share_options(node, milli), self.free_vfs(node)
        gpus = [g for g, _ in options]
        for numa in sorted({g.numa_node for g in gpus if g.numa_node is not None}):
            g_here = [g for g in gpus if g.numa_node == numa]
            v_here = [(n, v) for n, v in vfs if n.numa_node == numa]
            if g_here and len(v_here) >= request.vfs:
                gpus, vfs = g_here, v_here
                break
        return node, self.rng.choice(gpus), self.rng.sample(vfs, request.vfs)


class BestFitPolicy(DevicePolicy):
    """GPU bin-packing (the FGD paper's best-fit): the feasible node left with the least free
    GPU capacity (milli-GPUs: whole free GPUs and what shared ones have left), then VFs;
    whole GPUs as kubelet picks them, at random; a share on the GPU it leaves the least
    milli free on (ties at random); no pairing."""

    name = "best-fit"

    def _scored(self, nodes: list[str], request: Request, milli: int) -> list[tuple[float, str]]:
        scored = []
        for node in nodes:
            left = (self.free_milli(node) - milli) / MILLI_PER_GPU
            scored.append((-left - (self.free_counts(node)[1] - request.vfs) / 1e4, node))
        return scored

    def choose(self, nodes: list[str], request: Request) -> Choice | Infeasible:
        node = self.pick_tied(self._scored(nodes, request, MILLI_PER_GPU * request.gpus))
        gpus = self.rng.sample(self.free_gpus(node), request.gpus)
        vfs = self.rng.sample(self.free_vfs(node), request.vfs)
        return node, gpus, vfs

    def choose_share(self, nodes: list[str], request: Request,
                     milli: int) -> ShareChoice | Infeasible:
        node = self.pick_tied(self._scored(nodes, request, milli))
        options = self.share_options(node, milli)
        least = min(free for _, free in options)
        gpu = self.rng.choice([g for g, free in options if free == least])
        return node, gpu, self.rng.sample(self.free_vfs(node), request.vfs)


class KoordinatorPolicy(DevicePolicy):
    """Koordinator's deviceshare joint allocation as published (docs/simulator.md, "The policies").

    GPUs first (whole free GPUs score alike, so the lowest minors), then for each GPU a VF of a
    NIC on the GPU's root bus (`pcieID`), round-robin over those NICs; LeastAllocated node
    score. Without a hard limit a GPU whose root bus has no free VF takes one from any NIC,
    round-robin; with `maxDistance` (koordinator's `requiredScope: SamePCIe`) such a node is
    filtered out. Koordinator's one-VF-per-PF restriction is not modelled (it would only make
    this baseline place fewer training pods).

    A node's trial plan depends only on its free devices and the request's shape, so it is
    kept until the node's ledger changes (`_plan`): each pod changes one node, and re-planning
    every node for every pod made this baseline O(nodes²) with a large constant (600
    DGX H100 nodes, openb-default: 42 s before, 3.6 s after; best-fit: 2.2 s).
    """

    name = "koordinator"

    def __init__(self, topologies: Sequence[NodeTopology], seed: int) -> None:
        super().__init__(topologies, seed)
        # (node, GPUs, VFs, strict) -> (ledger token, (plan or None, score))
        self._plans: dict[tuple[str, int, int, bool],
                          tuple[tuple[int, int, int], tuple[_Plan | None, int]]] = {}

    def choose(self, nodes: list[str], request: Request) -> Choice | Infeasible:
        strict = request.max_distance is not None and request.vfs > 0
        scored: list[tuple[float, str]] = []
        plans: dict[str, _Plan] = {}
        for node in nodes:
            plan, score = self._plan(node, request, strict)
            if plan is None:
                continue
            plans[node] = plan
            scored.append((score, node))
        if not scored:
            return Infeasible("no node has NICs on the GPUs' PCIe roots (SamePCIe)")
        node = self.pick_tied(scored)
        gpus, vfs = plans[node]
        return node, list(gpus), list(vfs)

    def choose_share(self, nodes: list[str], request: Request,
                     milli: int) -> ShareChoice | Infeasible:
        """A share (Koordinator's `koordinator.sh/gpu-core` and memory ratio): its
        LeastAllocated scorer on the node (free milli-GPUs after placement) and on the GPUs
        (the one with the most free, lowest minor on ties, so shares spread over fresh GPUs
        first), then VFs for that GPU as for whole GPUs."""
        strict = request.max_distance is not None and request.vfs > 0
        scored: list[tuple[float, str]] = []
        plans: dict[str, _Plan] = {}
        for node in nodes:
            options = self.share_options(node, milli)
            gpu = min(options, key=lambda o: (-o[1], o[0].pci_address))[0]
            plan = self._trial(node, request, strict, (gpu,))
            if plan is None:
                continue
            plans[node] = plan
            cap_g, cap_v = self.capacity(node)
            parts = [(self.free_milli(node) - milli) / (MILLI_PER_GPU * cap_g)]
            if request.vfs and cap_v:
                parts.append((self.free_counts(node)[1] - request.vfs) / cap_v)
            scored.append((round(100 * sum(parts) / len(parts)), node))
        if not scored:
            return Infeasible("no node has NICs on the GPUs' PCIe roots (SamePCIe)")
        node = self.pick_tied(scored)
        gpus, vfs = plans[node]
        return node, gpus[0], list(vfs)

    def _plan(self, node: str, request: Request, strict: bool) -> tuple[_Plan | None, int]:
        """`_trial` and the node's score, remembered while the node's ledger (all they read)
        is unchanged: the policy's own change count tells (with departures, equal sizes of
        the used sets could hide a change), the sizes tell a pod added from outside."""
        led = self._ledgers[node]
        token = (self.changes[node], len(led.used_gpus), len(led.used_vfs))
        key = (node, request.gpus, request.vfs, strict)
        hit = self._plans.get(key)
        if hit is not None and hit[0] == token:
            return hit[1]
        plan = self._trial(node, request, strict)
        _, vfs = self.free_counts(node)
        cap_g, cap_v = self.capacity(node)
        # LeastAllocated: the mean over resources of the free share after placement (GPUs
        # in milli: shared GPUs count what they have left).
        left = self.free_milli(node) - MILLI_PER_GPU * request.gpus
        parts = [left / (MILLI_PER_GPU * cap_g)] if cap_g else []
        if request.vfs and cap_v:
            parts.append((vfs - request.vfs) / cap_v)
        score = round(100 * sum(parts) / max(len(parts), 1))
        self._plans[key] = (token, (plan, score))
        return plan, score

    def _trial(self, node: str, request: Request, strict: bool,
               gpus: Sequence[Gpu] | None = None) -> _Plan | None:
        if gpus is None:
            gpus = self.free_gpus(node)[:request.gpus]
        free = self.free_vfs(node)
        by_pf: dict[str, list[tuple[Nic, Vf]]] = {}
        for n, v in free:
            by_pf.setdefault(n.pci_address, []).append((n, v))
        chosen: list[tuple[Nic, Vf]] = []
        cursor: dict[str | None, int] = {}  # round-robin position per root bus
        for i in range(request.vfs):
            root = gpus[i % len(gpus)].pcie_root if gpus else None
            local = [pf for pf, vs in by_pf.items() if vs and vs[0][0].pcie_root == root]
            if not local:
                if strict:
                    return None
                local = [pf for pf, vs in by_pf.items() if vs]
                root = "*"
            k = cursor.get(root, 0)
            pf = sorted(local)[k % len(local)]
            cursor[root] = k + 1
            chosen.append(by_pf[pf].pop(0))
        return tuple(gpus), tuple(chosen)  # kept by `_plan`: immutable


BASELINES: dict[str, type[DevicePolicy]] = {
    p.name: p for p in (RandomPolicy, NumaPolicy, KoordinatorPolicy, BestFitPolicy)
}
