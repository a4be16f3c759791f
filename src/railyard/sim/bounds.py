"""Offline upper bounds on what any policy could reach on the same arrivals and cluster.

`bounds.json` beside `metrics.json` says how far each policy is from the best possible. The
bounds come from a relaxation, solved as a small integer program (0/1 per pod and group,
whole numbers of GPUs per configuration; `scipy.optimize.milp`, HiGHS): every placement any
policy can make is a solution of it, so its optimum is at least every policy's figure
(docs/simulator.md, "The offline bound"). When the program cannot be solved to optimality in
time, the solver's proved dual bound stands in, then the linear relaxation's optimum;
failing all three the bound is None, and says why.

The relaxation, per group of identical nodes (same hardware shape, CPUs and memory; `count`
of them): pods placed on the group may together hold at most `count` × a node's GPUs, VFs,
CPUs and memory at every moment they are live together; at most `count` of them may each
hold more than half of one of those (two such pods never share a node); a pod goes on a group
only where it fits an empty node (and its DLRM role's kind of node). The group's GPUs are
bins of 1000 milli-GPUs (decision 0099): a whole-GPU pod takes whole GPUs, a share sits on
one GPU with shares summing to at most 1000. The program keeps that exactly by counting the
GPUs filled in each way of filling one GPU with shares (a *configuration*), or, where a
group's share sizes fill one GPU in too many ways, through valid inequalities from dual
feasible functions (bounds.json says which). A GDR-capable multi-GPU pod needs a node whose
GPUs can each be paired with its own offered VF within PXB, and holds that many such GPUs.
What it leaves out only loosens it: which node of a group (so GPUs are pooled across the
group's nodes: any GPU of the group may take a share), NUMA, `maxDistance`,
`max_instance_per_node`, and the order of arrivals: an offline policy that knows every pod
in advance and may turn any pod away is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from railyard.sim.arrivals import Arrival, timeline
from railyard.sim.capacity import NodeCapacity
from railyard.sim.policies import offered_vfs
from railyard.sim.sharing import MILLI_PER_GPU, gpu_milli_of, shares_gpu
from railyard.topology.model import GDR_LIMIT, NodeTopology

SOLVER_TIME_LIMIT_S = 20.0
# Programs larger than this (variables × moments) are not attempted: null, said so.
MAX_PROGRAM_SIZE = 2_000_000
# HiGHS stops within this relative gap and the bound is its proved dual bound (the looser
# side, so still a bound). With shares the GPU program weighs pods in milli-GPUs, a knapsack
# whose exact proof took past the 20 s limit on the default run (10⁻⁴ still did on seed 1;
# 10⁻³, at most 0.45 GPU of 448, takes 1-4 s; decision 0094). With the GPUs as bins
# (decision 0099) the default run's program is solved exactly in 0.6-2.9 s and within 10⁻³
# in 0.3-1.7 s, 0.03-0.1 GPU above: the gap stays, for clusters larger than the default.
MIP_REL_GAP = 1e-3
# A group whose share sizes fill one GPU in more ways than this (maximal configurations) gets
# the dual-feasible-function rows instead (looser, still valid; said so in bounds.json).
MAX_CONFIGURATIONS = 2_000
# The dual feasible functions tried there: Fekete and Schepers' u^(k) for k up to this, and
# their U^(ε) at every ε ≤ 1/2 that a share size (or 1000 less it) gives.
DFF_MAX_K = 10
BOUND_CLASS = ("relaxation (pooled capacity per group of identical nodes, one pod of more "
               "than half a node per node, the group's GPUs as bins of 1000 milli-GPUs: a "
               "share on one GPU), solved as an integer program")
ASSUMPTIONS = (
    "the same arrivals and departures as every policy, known in advance; any pod may be "
    "turned away (the bound holds for every policy, online or not, work-conserving or not)",
    "a pod holds GPUs, VFs, CPUs and memory of one node, never more than the node has, "
    "disjoint from every other live pod's; a GDR-capable multi-GPU pod holds as many GPUs, "
    "each with its own offered VF on a PF within PXB",
    "a share of one GPU sits on one GPU with shares summing to at most 1000 milli-GPUs; a "
    "whole-GPU pod's GPUs hold no share",
    "relaxed (so the bound may be above what is reachable, never below): which node of a "
    "group of identical nodes a pod is on (so which GPU: any GPU of the group), NUMA, "
    "maxDistance, max_instance_per_node",
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


def share_configurations(sizes: Sequence[int], limit: int | None = None
                         ) -> list[dict[int, int]] | None:
    """The ways of filling one GPU with shares of these sizes (milli-GPUs, each 1..999) that
    no share of any of them could join: multisets, as {size: how many}, summing to at most
    1000 with less than the smallest size left over. The shares on any one GPU are part of
    one of them. None when there are more than `limit` (default `MAX_CONFIGURATIONS`)."""
    limit = MAX_CONFIGURATIONS if limit is None else limit
    distinct = sorted(set(sizes), reverse=True)
    if not distinct:
        return []
    smallest = distinct[-1]
    out: list[dict[int, int]] = []
    # Depth first over the sizes, largest first; the smallest size fills what is left, so
    # every path ends in a configuration (the work is bounded by `limit` × sizes).
    stack: list[tuple[int, int, tuple[tuple[int, int], ...]]] = [(0, MILLI_PER_GPU, ())]
    while stack:
        i, left, chosen = stack.pop()
        if i == len(distinct) - 1:
            config = dict(chosen)
            if left // smallest:
                config[smallest] = left // smallest
            out.append(config)
            if len(out) > limit:
                return None
            continue
        size = distinct[i]
        for k in range(left // size + 1):
            stack.append((i + 1, left - k * size, (*chosen, (size, k)) if k else chosen))
    return out


DualFeasible = Callable[[Fraction], Fraction]


def _dff_u(k: int) -> DualFeasible:
    """Fekete and Schepers' u^(k): x where (k+1)x is whole, else ⌊(k+1)x⌋/k."""
    def f(x: Fraction) -> Fraction:
        scaled = (k + 1) * x
        return x if scaled.denominator == 1 else Fraction(math.floor(scaled), k)
    return f


def _dff_big(eps: Fraction) -> DualFeasible:
    """Fekete and Schepers' U^(ε), 0 ≤ ε ≤ 1/2: 1 above 1 − ε, 0 below ε, x between."""
    def f(x: Fraction) -> Fraction:
        return Fraction(1) if x > 1 - eps else x if x >= eps else Fraction(0)
    return f


def dff_rows(sizes: Sequence[int]) -> list[dict[int, Fraction]]:
    """Valid inequalities for packing shares of these sizes and whole GPUs into N GPUs, from
    dual feasible functions f (shares on one GPU sum to at most 1 ⇒ their f-values do too):
    Σ f(share) + whole GPUs ≤ N, as {size: f(size / 1000)} (every f here has f(1) = 1).
    Those that the milli-GPU row implies (f(x) ≤ x on these sizes) are left out."""
    distinct = sorted(set(sizes))
    functions = [_dff_u(k) for k in range(1, DFF_MAX_K + 1)]
    eps = {Fraction(1, 2)}
    eps |= {Fraction(s, MILLI_PER_GPU) for s in distinct if 2 * s <= MILLI_PER_GPU}
    eps |= {Fraction(MILLI_PER_GPU + 1 - s, MILLI_PER_GPU) for s in distinct
            if 2 * (MILLI_PER_GPU + 1 - s) <= MILLI_PER_GPU}
    functions += [_dff_big(e) for e in sorted(eps)]
    out: list[dict[int, Fraction]] = []
    for f in functions:
        row = {s: f(Fraction(s, MILLI_PER_GPU)) for s in distinct}
        if row not in out and any(v > Fraction(s, MILLI_PER_GPU) for s, v in row.items()):
            out.append(row)
    return out


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


@dataclass(slots=True)
class Program:
    """`_solve`'s integer program: minimise cost·x subject to matrix·x ≤ upper and
    0 ≤ x ≤ x_upper, x whole. Columns: one per (pod uid, group index) in `pods`, then one per
    entry of `configurations` (group index, moment index, configuration)."""

    cost: Any  # numpy arrays and a scipy sparse matrix (imported lazily)
    matrix: Any
    upper: Any
    x_upper: Any
    pods: dict[tuple[str, int], int]
    configurations: list[tuple[int, int, dict[int, int]]]
    details: dict[str, Any]


def _solve(items: Sequence[Arrival], moments: Sequence[Sequence[Arrival]],
           groups: Sequence[NodeGroup], weight: Any, gdr: bool, time_limit_s: float) -> Bound:
    """Maximise the summed weight of the pods placed (`build_program`) with HiGHS."""
    import numpy as np
    from scipy.optimize import Bounds as VarBounds
    from scipy.optimize import LinearConstraint, linprog, milp

    program = build_program(items, moments, groups, weight, gdr)
    if isinstance(program, Bound):
        return program
    n = len(program.cost)
    cost, matrix, upper, details = program.cost, program.matrix, program.upper, program.details
    constraint = LinearConstraint(matrix, -np.inf, upper)
    res = milp(cost, constraints=constraint, integrality=np.ones(n),
               bounds=VarBounds(np.zeros(n), program.x_upper),
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
    lp = linprog(cost, A_ub=matrix, b_ub=upper,
                 bounds=[(0.0, float(u)) for u in program.x_upper], method="highs")
    if lp.status == 0:
        return Bound(None, _count(-lp.fun), "lp",
                     "the integer program gave no bound; its linear relaxation's optimum "
                     "is used", details)
    return Bound(None, None, "none", f"not computed: the solver failed ({lp.message})",
                 details)


def build_program(items: Sequence[Arrival], moments: Sequence[Sequence[Arrival]],
                  groups: Sequence[NodeGroup], weight: Any, gdr: bool) -> Program | Bound:
    """The relaxation as an integer program: a 0/1 variable per pod and group it may go on,
    maximising the summed weight of the pods placed (cost = −weight), subject to each group's
    pooled capacity at each moment, with the group's GPUs as bins: an integer variable per
    configuration, group and moment counts the GPUs filled that way
    (`share_configurations`), or else `dff_rows` bound the shares. A Bound (not computed, or
    nothing fits) where there is no program to solve."""
    import numpy as np
    from scipy.sparse import coo_array

    fits = _gdr_fits if gdr else _fits
    var: dict[tuple[str, int], int] = {}
    for a in items:
        for k, g in enumerate(groups):
            if weight(a) > 0 and fits(a, g):
                var[a.uid, k] = len(var)
    if not var:
        return Bound(None, 0, "milp", "no pod fits any node")
    # How each group's GPUs hold shares: the configurations of its share sizes, or (too
    # many of those) dual-feasible-function rows.
    packing: list[dict[str, Any]] = []
    configs: list[list[dict[int, int]] | None] = []
    cuts: list[list[dict[int, Fraction]]] = []
    for k, g in enumerate(groups):
        sizes = sorted({a.pod.gpu_milli for a in items
                        if shares_gpu(a.pod) and (a.uid, k) in var})
        found = share_configurations(sizes) if sizes else []
        configs.append(found)
        cuts.append(dff_rows(sizes) if found is None else [])
        entry: dict[str, Any] = {"nodes": g.count, "gpusPerNode": g.gpus,
                                 "shareSizes": len(sizes)}
        if not sizes:
            entry["method"] = "whole GPUs"  # no share may go here: the milli-GPU row is exact
        elif found is not None:
            entry.update(method="configurations", configurations=len(found))
        else:
            entry.update(method="dff", dffRows=len(cuts[k]),
                         note=f"more than {MAX_CONFIGURATIONS:,} configurations")
        packing.append(entry)
    size = len(var) * max(1, len(moments)) + len(moments) * sum(
        sum(len(c) + 1 for c in found) for found in configs if found)
    if size > MAX_PROGRAM_SIZE:
        return Bound(None, None, "none", f"not computed: the program would have {size:,} "
                     f"entries (more than {MAX_PROGRAM_SIZE:,})", {"gpuPacking": packing})
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    upper: list[float] = []
    y_count = 0  # configuration variables, numbered after the pods' own
    y_upper: list[float] = []
    y_columns: list[tuple[int, int, dict[int, int]]] = []

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
    for t, live in enumerate(moments):
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
            shares = [(a, c) for a, c in here if shares_gpu(a.pod)]
            if not shares:
                continue  # whole GPUs only: the milli-GPU row above says it all
            whole = [(c, float(a.pod.num_gpu)) for a, c in here if not shares_gpu(a.pod)]
            gpus = float(g.count * g.gpus)
            found = configs[k]
            if found is None:
                for cut in cuts[k]:
                    row([(c, float(cut[a.pod.gpu_milli])) for a, c in shares
                         if cut[a.pod.gpu_milli]] + whole, gpus)
                continue
            live_sizes = {a.pod.gpu_milli for a, _ in shares}
            used = [config for config in found if live_sizes & config.keys()]
            first = len(var) + y_count
            y_count += len(used)
            y_upper += [gpus] * len(used)
            y_columns += [(k, t, config) for config in used]
            # GPUs filled with shares, one configuration each, and the whole GPUs: ≤ the GPUs.
            row([(first + j, 1.0) for j in range(len(used))] + whole, gpus)
            for s in sorted(live_sizes):  # the shares of each size: ≤ the places for them
                row([(c, 1.0) for a, c in shares if a.pod.gpu_milli == s]
                    + [(first + j, -float(config[s])) for j, config in enumerate(used)
                       if s in config], 0.0)
    n = len(var) + y_count
    by_uid = {a.uid: a for a in items}
    cost = np.zeros(n)
    for (uid, _), c in var.items():
        cost[c] = -float(weight(by_uid[uid]))
    x_upper = np.concatenate([np.ones(len(var)), np.array(y_upper, dtype=float)])
    matrix = coo_array((vals, (rows, cols)), shape=(len(upper), n)).tocsr()
    details: dict[str, Any] = {"variables": n, "constraints": len(upper),
                               "gpuPacking": packing}
    return Program(cost, matrix, np.array(upper), x_upper, var, y_columns, details)


def _count(x: float) -> int:
    """A whole-number bound from a solver's value: the optimum of a program with whole
    weights is whole, so anything a tolerance adds below the next one is dropped."""
    return math.floor(x + 1e-6)
