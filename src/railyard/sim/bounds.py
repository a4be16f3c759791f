"""Offline upper bounds on what any policy could reach on the same arrivals and cluster.

`bounds.json` beside `metrics.json` says how far each policy is from the best possible. The
bounds come from a relaxation, solved exactly as a small 0/1 integer program
(`scipy.optimize.milp`, HiGHS): every placement any policy can make is a solution of it, so
its optimum is at least every policy's figure (docs/simulator.md, "The offline bound"). When
the program cannot be solved to optimality in time, the solver's proved dual bound stands in,
then the linear relaxation's optimum; failing all three the bound is None, and says why.

The relaxation, per group of identical nodes (same hardware shape, CPUs and memory; `count`
of them): pods placed on the group may together hold at most `count` × a node's GPUs, VFs,
CPUs and memory at every moment they are live together; at most `count` of them may each
hold more than half of one of those (two such pods never share a node); a pod goes on a group
only where it fits an empty node (and its DLRM role's kind of node). A GDR-capable multi-GPU
pod needs a node whose GPUs can each be paired with its own offered VF within PXB, and holds
that many such GPUs. What it leaves out only loosens it: which node of a group, NUMA,
`maxDistance`, `max_instance_per_node`, and the order of arrivals: an offline policy that
knows every pod in advance and may turn any pod away is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from railyard.sim.arrivals import Arrival, timeline
from railyard.sim.capacity import NodeCapacity
from railyard.sim.policies import offered_vfs
from railyard.sim.sharing import MILLI_PER_GPU, gpu_milli_of
from railyard.topology.model import GDR_LIMIT, NodeTopology

SOLVER_TIME_LIMIT_S = 20.0
# Programs larger than this (variables × moments) are not attempted: null, said so.
MAX_PROGRAM_SIZE = 2_000_000
# HiGHS stops within this relative gap and the bound is its proved dual bound (the looser
# side, so still a bound). With shares the GPU program weighs pods in milli-GPUs, a knapsack
# whose exact proof took past the 20 s limit on the default run (10⁻⁴ still did on seed 1;
# 10⁻³, at most 0.45 GPU of 448, takes 1-4 s; decision 0094).
MIP_REL_GAP = 1e-3
BOUND_CLASS = ("relaxation (pooled capacity per group of identical nodes, one pod of more "
               "than half a node per node), solved as a 0/1 integer program")
ASSUMPTIONS = (
    "the same arrivals and departures as every policy, known in advance; any pod may be "
    "turned away (the bound holds for every policy, online or not, work-conserving or not)",
    "a pod holds GPUs, VFs, CPUs and memory of one node, never more than the node has, "
    "disjoint from every other live pod's; a GDR-capable multi-GPU pod holds as many GPUs, "
    "each with its own offered VF on a PF within PXB",
    "relaxed (so the bound may be above what is reachable, never below): which node of a "
    "group of identical nodes a pod is on, NUMA, maxDistance, max_instance_per_node",
)


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """Identical nodes: what one of them offers, and how many there are."""

    count: int
    gpus: int
    vfs: int
    cpu_milli: int
    memory_mib: int
    gdr_gpus: int  # GPUs with an offered VF on a PF within PXB
    gdr_pairs: int  # the most GPUs that can each have their own such VF at once

    def capacity(self) -> tuple[int, int, int, int]:
        """GPUs in milli-GPUs (shares of one GPU pool with the rest: a relaxation)."""
        return MILLI_PER_GPU * self.gpus, self.vfs, self.cpu_milli, self.memory_mib


@dataclass(slots=True)
class Bound:
    """One metric's bound: its value (None when not computed) and how it was had."""

    value: float | None
    count: int | float | None  # the bound as a count (GPUs, pods) before dividing
    method: str  # "milp" (solved within MIP_REL_GAP), "milp-dual-bound", "lp", or "none"
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": None if self.value is None else round(self.value, 6),
                               "count": self.count, "method": self.method}
        if self.note:
            out["note"] = self.note
        out.update(self.details)
        return out


@dataclass(slots=True)
class Bounds:
    gpu_allocation_ratio: Bound
    gdr_capable_pod_share: Bound

    def as_json(self) -> dict[str, Any]:
        return {
            "gpuAllocationRatio": self.gpu_allocation_ratio.as_json(),
            "gdrCapablePodShare": self.gdr_capable_pod_share.as_json(),
            "class": BOUND_CLASS,
            "assumptions": list(ASSUMPTIONS),
        }


def node_groups(topologies: Sequence[NodeTopology]) -> list[NodeGroup]:
    groups: dict[tuple, list[NodeTopology]] = {}
    for t in topologies:
        groups.setdefault((t.shape_key, NodeCapacity.of(t)), []).append(t)
    out = []
    for (_, cap), members in groups.items():
        t = members[0]
        pfs = {n.pci_address: len(offered_vfs(n)) for n in t.nics}
        near = {g.pci_address: [pf for pf, k in pfs.items()
                                if k and t.distance[g.pci_address][pf] <= GDR_LIMIT]
                for g in t.gpus}
        out.append(NodeGroup(len(members), len(t.gpus), sum(pfs.values()), cap.cpu_milli,
                             cap.memory_mib, sum(1 for v in near.values() if v),
                             _max_matching(near, pfs)))
    return out


def _max_matching(near: dict[str, list[str]], capacity: dict[str, int]) -> int:
    """The most GPUs that can each have their own VF on a PF they are near (augmenting
    paths; PFs hold as many GPUs as they offer VFs)."""
    holders: dict[str, list[str]] = {pf: [] for pf in capacity}

    def place(g: str, seen: set[str]) -> bool:
        for pf in near[g]:
            if pf in seen:
                continue
            seen.add(pf)
            if len(holders[pf]) < capacity[pf]:
                holders[pf].append(g)
                return True
            for other in list(holders[pf]):
                if place(other, seen):
                    holders[pf].remove(other)
                    holders[pf].append(g)
                    return True
        return False

    return sum(place(g, set()) for g in near)


def _needs(a: Arrival) -> tuple[int, int, int, int]:
    return gpu_milli_of(a.pod), a.request.vfs, a.pod.cpu_milli, a.pod.memory_mib


def gpu_milli_of_arrival(a: Arrival) -> int:
    return gpu_milli_of(a.pod)


def _fits(a: Arrival, g: NodeGroup) -> bool:
    if a.pod.role is not None and (a.pod.role == "HN") != (g.gpus > 0):
        return False
    return all(n <= c for n, c in zip(_needs(a), g.capacity(), strict=True))


def _gdr_fits(a: Arrival, g: NodeGroup) -> bool:
    return _fits(a, g) and a.request.vfs >= a.request.gpus <= g.gdr_pairs


def full_demand_moment(arrivals: Sequence[Arrival], cluster_gpus: int) -> tuple[
        list[Arrival], bool]:
    """The pods live when the GPUs requested by live pods first reach the cluster's (the
    moment `gpuAllocationRatio` is taken), and True; else those live at the end, and False."""
    live: dict[str, Arrival] = {}
    requested = 0
    for departs, a in timeline(arrivals):
        if departs:
            live.pop(a.uid, None)
            requested -= gpu_milli_of(a.pod)
            continue
        live[a.uid] = a
        requested += gpu_milli_of(a.pod)
        if requested >= MILLI_PER_GPU * cluster_gpus:
            return list(live.values()), True
    return list(live.values()), False


def busiest_moments(arrivals: Sequence[Arrival]) -> list[list[Arrival]]:
    """The live sets no later live set contains: just before each departure that follows an
    arrival, and at the end. Capacity holding at these holds at every moment."""
    out: list[list[Arrival]] = []
    live: dict[str, Arrival] = {}
    grew = False
    for departs, a in timeline(arrivals):
        if departs:
            if grew:
                out.append(list(live.values()))
            grew = False
            live.pop(a.uid, None)
        else:
            live[a.uid] = a
            grew = True
    if grew:
        out.append(list(live.values()))
    return out


def offline_bounds(topologies: Sequence[NodeTopology], arrivals: Sequence[Arrival],
                   time_limit_s: float = SOLVER_TIME_LIMIT_S) -> Bounds:
    groups = node_groups(topologies)
    cluster_gpus = sum(g.count * g.gpus for g in groups)
    live, reached = full_demand_moment(arrivals, cluster_gpus)
    # In milli-GPUs (a share counts its milli), as gpuAllocationRatio counts them.
    gpu = _solve(live, [live], groups, weight=gpu_milli_of_arrival, gdr=False,
                 time_limit_s=time_limit_s)
    gpu.details["moment"] = ("when the GPUs requested by live pods first reach the "
                             "cluster's" if reached else "at the end")
    if gpu.count is not None and cluster_gpus:
        gpu.value = min(gpu.count, MILLI_PER_GPU * cluster_gpus) / (MILLI_PER_GPU * cluster_gpus)
        whole, rest = divmod(gpu.count, MILLI_PER_GPU)  # as GPUs, a share its milli/1000
        gpu.count = whole if not rest else gpu.count / MILLI_PER_GPU
    multi = [a for a in arrivals if a.is_multi_gpu]
    if multi:
        gdr = _solve(multi, busiest_moments(multi), groups, weight=lambda a: 1, gdr=True,
                     time_limit_s=time_limit_s)
        if gdr.count is not None:
            gdr.value = gdr.count / len(multi)
    else:
        gdr = Bound(0.0, 0, "none", "no multi-GPU pod arrived")
    return Bounds(gpu, gdr)


def _solve(items: Sequence[Arrival], moments: Sequence[Sequence[Arrival]],
           groups: Sequence[NodeGroup], weight: Any, gdr: bool, time_limit_s: float) -> Bound:
    """Maximise the summed weight of the pods placed (a variable per pod and group it may go
    on), subject to each group's pooled capacity at each moment."""
    import numpy as np
    from scipy.optimize import Bounds as VarBounds
    from scipy.optimize import LinearConstraint, linprog, milp
    from scipy.sparse import coo_array

    fits = _gdr_fits if gdr else _fits
    var: dict[tuple[str, int], int] = {}
    for a in items:
        for k, g in enumerate(groups):
            if weight(a) > 0 and fits(a, g):
                var[a.uid, k] = len(var)
    if not var:
        return Bound(None, 0, "milp", "no pod fits any node")
    size = len(var) * max(1, len(moments))
    if size > MAX_PROGRAM_SIZE:
        return Bound(None, None, "none", f"not computed: the program would have {size:,} "
                     f"entries (more than {MAX_PROGRAM_SIZE:,})")
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    upper: list[float] = []

    def row(entries: list[tuple[int, float]], cap: float) -> None:
        if entries:
            r = len(upper)
            for c, v in entries:
                rows.append(r)
                cols.append(c)
                vals.append(v)
            upper.append(cap)

    for a in items:  # each pod on one group at most
        row([(var[a.uid, k], 1.0) for k in range(len(groups)) if (a.uid, k) in var], 1.0)
    for live in moments:
        for k, g in enumerate(groups):
            here = [(a, var[a.uid, k]) for a in live if (a.uid, k) in var]
            if not here:
                continue
            for r, cap in enumerate(g.capacity()):
                row([(c, float(_needs(a)[r])) for a, c in here if _needs(a)[r]],
                    float(g.count * cap))
                row([(c, 1.0) for a, c in here if 2 * _needs(a)[r] > cap], float(g.count))
            if gdr:
                row([(c, float(a.request.gpus)) for a, c in here], float(g.count * g.gdr_gpus))
    n = len(var)
    by_uid = {a.uid: a for a in items}
    cost = np.zeros(n)
    for (uid, _), c in var.items():
        cost[c] = -float(weight(by_uid[uid]))
    matrix = coo_array((vals, (rows, cols)), shape=(len(upper), n)).tocsr()
    constraint = LinearConstraint(matrix, -np.inf, np.array(upper))
    details = {"variables": n, "constraints": len(upper)}
    res = milp(cost, constraints=constraint, integrality=np.ones(n),
               bounds=VarBounds(0, 1),
               options={"time_limit": time_limit_s, "mip_rel_gap": MIP_REL_GAP, "disp": False})
    raw_dual = getattr(res, "mip_dual_bound", None)
    dual = float(raw_dual) if raw_dual is not None and math.isfinite(raw_dual) else None
    if res.status == 0 and res.fun is not None:
        # The optimum; where the solver reports a dual bound too, the looser of the two (they
        # agree up to its tolerances).
        fun = float(res.fun)
        return Bound(None, _count(-(fun if dual is None else min(fun, dual))), "milp",
                     details=details)
    if dual is not None:
        return Bound(None, _count(-dual), "milp-dual-bound",
                     f"the integer program was not solved in {time_limit_s:g} s "
                     "(HiGHS status: " + str(res.message) + "); its proved dual bound is used",
                     details)
    lp = linprog(cost, A_ub=matrix, b_ub=np.array(upper), bounds=(0, 1), method="highs")
    if lp.status == 0:
        return Bound(None, _count(-lp.fun), "lp",
                     "the integer program gave no bound; its linear relaxation's optimum "
                     "is used", details)
    return Bound(None, None, "none", f"not computed: the solver failed ({lp.message})",
                 details)


def _count(x: float) -> int:
    """A whole-number bound from a solver's value: the optimum of a program with whole
    weights is whole, so anything a tolerance adds below the next one is dropped."""
    return math.floor(x + 1e-6)
