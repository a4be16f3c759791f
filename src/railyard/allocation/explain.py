"""Why a request does not fit a node, in words a user can act on.

Called only when the search found nothing. Checks the plain counts first, then relaxes one
hard limit at a time (`maxDistance`, `numa: single`) to name the one that failed, and where.
Those relaxed searches share the decision's budget; one that spends it names nothing, and
the reason falls back to a plainer one (still true: the search proved that nothing fits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from railyard.allocation.request import Request
from railyard.allocation.search import (
    Budget,
    SearchBudgetSpent,
    Spec,
    feasible,
    vfs_beside_whole,
)
from railyard.allocation.shape import FreeState, NodeShape, free_rails
from railyard.allocation.types import Refusal
from railyard.topology.model import Distance

_MAX_LISTED = 4


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _listed(items: list[str]) -> str:
    if len(items) > _MAX_LISTED:
        return "; ".join(items[:_MAX_LISTED]) + f"; and {len(items) - _MAX_LISTED} more"
    return "; ".join(items)


def _numa_name(shape: NodeShape, bit: int) -> str:
    return f"NUMA {shape.numa_ids[bit]}" if bit < len(shape.numa_ids) else "unknown NUMA"


def _why_no_vfs(shape: NodeShape, free: FreeState, ledger_pfs: list[int]) -> list[str]:
    out = []
    for j in ledger_pfs:
        pf = shape.pfs[j]
        if not shape.port_ok[j]:
            out.append(f"PF {pf.pci_address} port {pf.port_state}")
        elif not shape.vfs[j]:
            out.append(f"PF {pf.pci_address} has no allocatable VFs")
        elif free.vfs[j] == 0:
            out.append(f"PF {pf.pci_address} exhausted")
    return out


def _why_not_whole(shape: NodeShape, free: FreeState) -> list[str]:
    out = []
    for j, pf in enumerate(shape.pfs):
        if free.whole_ok[j]:
            continue
        a = pf.pci_address
        if pf.default_route:
            out.append(f"PF {a} carries the default route")
        elif not shape.port_ok[j]:
            out.append(f"PF {a} port {pf.port_state}")
        elif shape.has_held_vfs[j]:
            out.append(f"PF {a} has VFs inside pods")
        elif (free.any_vfs or free.vfs)[j] < len(shape.vfs[j]):  # VFs of any pool
            out.append(f"PF {a} has VFs in use")
        else:
            out.append(f"PF {a} is held whole")
    return out


def _free_gpus_by_numa(shape: NodeShape, free: FreeState) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i in range(len(shape.gpus)):
        if (free.gpus >> i) & 1:
            groups.setdefault(shape.gpu_numa[i], []).append(i)
    return groups


def _distance_reason(shape: NodeShape, free: FreeState, spec: Spec) -> str:
    limit = Distance(spec.max_distance).name
    nics = "VFs" if spec.vfs else "whole PFs"
    groups = _free_gpus_by_numa(shape, free)
    npf = len(shape.pfs)
    near_any = [j for j in range(npf) for i in range(len(shape.gpus))
                if (free.gpus >> i) & 1 and shape.dist[i][j] <= spec.max_distance]
    if not near_any:
        pairs = [shape.dist[i][j] for i in range(len(shape.gpus)) if (free.gpus >> i) & 1
                 for j in range(npf)]
        tail = f" (the nearest is {Distance(min(pairs)).name})" if pairs else ""
        return f"maxDistance {limit}: no NIC is within {limit} of any free GPU{tail}"
    best: tuple | None = None
    for bit, gpus in sorted(groups.items()):
        near = [j for j in range(npf) if any(shape.dist[i][j] <= spec.max_distance
                                             for i in gpus)]
        cap = sum((free.vfs[j] if spec.vfs else 0) + (free.whole_ok[j] if spec.pfs else 0)
                  for j in near)
        cand = (-len(gpus), bit, gpus, near, cap)
        if best is None or cand < best:
            best = cand
    # GPUs with no NIC at all within the limit can never pair; name them first.
    free_gpus = [i for i in range(len(shape.gpus)) if (free.gpus >> i) & 1]
    serving = [j for j in range(npf) if (spec.vfs and shape.vfs[j])
               or (spec.pfs and shape.whole_static[j])]
    lacking = [i for i in free_gpus
               if all(shape.dist[i][j] > spec.max_distance for j in serving)]
    if len(free_gpus) - len(lacking) < spec.pairs:
        named = [f"GPU {shape.gpus[i].pci_address}"
                 + (f" (nearest {Distance(min(shape.dist[i][j] for j in serving)).name})"
                    if serving else "") for i in lacking]
        return (f"maxDistance {limit}: {_plural(spec.pairs, 'GPU')} need a NIC within {limit} "
                f"but only {len(free_gpus) - len(lacking)} of the {len(free_gpus)} free GPUs "
                f"have one: {_listed(named)}")
    assert best is not None
    _, bit, gpus, near, cap = best
    if cap >= min(spec.pairs, spec.vfs + spec.pfs):
        # Enough free NICs near the GPUs in total, but some GPUs have none of their own:
        # name those GPUs and why their near PFs give nothing.
        def offers(j: int) -> bool:
            return bool((spec.vfs and free.vfs[j]) or (spec.pfs and free.whole_ok[j]))

        cut = [i for i in free_gpus if i not in lacking
               and not any(offers(j) for j in serving if shape.dist[i][j] <= spec.max_distance)]
        if len(free_gpus) - len(lacking) - len(cut) < spec.pairs:
            named = [f"GPU {shape.gpus[i].pci_address} ("
                     + "; ".join(_why_no_vfs(shape, free, [
                         j for j in serving if shape.dist[i][j] <= spec.max_distance])
                                 or ["its near PFs are held"]) + ")" for i in cut]
            have = len(free_gpus) - len(lacking) - len(cut)
            return (f"maxDistance {limit}: {_plural(spec.pairs, 'GPU')} need a free NIC within "
                    f"{limit} but only {have} of the {len(free_gpus)} free GPUs have one: "
                    f"{_listed(named)}")
    why = _why_no_vfs(shape, free, near)
    return (f"maxDistance {limit}: {_plural(spec.pairs, 'GPU')} need a NIC within {limit}; "
            f"{_plural(len(gpus), 'GPU')} free on {_numa_name(shape, bit)} but only {cap} free "
            f"{nics} within {limit} of them" + (f": {_listed(why)}" if why else ""))


def _rails_reason(shape: NodeShape, free: FreeState, spec: Spec) -> str:
    """`rails: required` (docs/rails.md): the sequence wanted, and the rails free here."""
    return rails_reason(spec.rails, free_rails(shape, free), spec.max_distance)


def rails_reason(wanted: Sequence[int], rails_free: Sequence[int],
                 max_distance: int = Distance.SYS) -> str:
    """The reason a required sequence (`wanted`, −1 for any) does not fit where the free
    NICs are on `rails_free` (ascending)."""
    want = ", ".join("any" if r < 0 else str(r) for r in wanted)
    return (f"rails required: the job's pairs want rails {want} in pair order but the free "
            f"NICs here are on " + (f"rails {', '.join(map(str, rails_free))}" if rails_free
                                   else "no known rail")
            + (f" within {Distance(max_distance).name}"
               if max_distance < Distance.SYS else ""))


def _single_reason(shape: NodeShape, free: FreeState, spec: Spec) -> str:
    want = [_plural(spec.gpus, "GPU")] if spec.gpus else []
    if spec.vfs:
        want.append(_plural(spec.vfs, "VF"))
    if spec.pfs:
        want.append(_plural(spec.pfs, "whole PF"))
    if spec.cpus:
        want.append(_plural(spec.cpus, "CPU"))
    if spec.memory:
        want.append(f"{spec.memory} bytes")
    have = []
    for b, nid in enumerate(shape.numa_ids):
        g = sum(1 for i in range(len(shape.gpus))
                if (free.gpus >> i) & 1 and shape.gpu_numa[i] == b)
        v = sum(free.vfs[j] for j in range(len(shape.pfs)) if shape.pf_numa[j] == b)
        have.append(f"NUMA {nid} has {g} GPUs, {v} VFs, {free.cpus[b]} CPUs free")
    return (f"numa: single: no single NUMA node holds {', '.join(want)}"
            + (f" ({_listed(have)})" if have else ""))


def explain(shape: NodeShape, free: FreeState, request: Request,
            unresolvable: bool = False, budget: Budget | None = None) -> Refusal:
    """The first constraint that fails on this node, and where. Names no node: one answer
    serves every node of the shape (`Refusal.at` adds the name)."""
    if request.gpus > len(shape.gpus):
        return Refusal(_plural(request.gpus, "GPU") + " requested", unresolvable,
                       node_has=str(len(shape.gpus)))
    return Refusal(_reason(shape, free, request, budget), unresolvable)


def _fits(shape: NodeShape, free: FreeState, request: Request, budget: Budget | None) -> bool:
    """Whether the relaxed request fits; False when the budget runs out before saying."""
    try:
        return feasible(shape, free, request, budget)
    except SearchBudgetSpent:
        return False


def _reason(shape: NodeShape, free: FreeState, request: Request,
            budget: Budget | None) -> str:
    spec = Spec.of(request)
    nfree = free.gpus.bit_count()
    if spec.gpus > nfree:
        return f"{_plural(spec.gpus, 'GPU')} requested but only {nfree} of {len(shape.gpus)} free"
    if len(shape.pool_names) > 1 or spec.others or spec.pool is not None:
        # VF pools (docs/decisions/0085): each pool's count first, then the rest as one
        # pool's request (the paired pool's VFs are the ones the reasons below weigh).
        index = {p: q for q, p in enumerate(shape.pool_names)}
        for pool, n in ((spec.pool, spec.vfs), *spec.others):
            have = sum(free.for_pool(index.get(pool)).vfs)
            if n > have:
                return (f"{_plural(n, 'VF')} of {_pool_name(pool)} requested but only {have} "
                        "free")
        free = free.for_pool(index.get(spec.pool))
    vf_free = sum(free.vfs)
    if spec.vfs > vf_free:
        why = _why_no_vfs(shape, free, list(range(len(shape.pfs))))
        return (f"{_plural(spec.vfs, 'VF')} requested but only {vf_free} free"
                + (f": {_listed(why)}" if why else ""))
    if spec.share:
        capped = free.capped(spec.share)
        room = sum(capped.vfs)
        if spec.vfs > room:
            left = free.bandwidth or (100,) * len(shape.pfs)
            short = [f"PF {shape.pfs[j].pci_address} has {left[j]}% left" for j in range(
                len(shape.pfs)) if free.vfs[j] > capped.vfs[j]]
            return (f"{_plural(spec.vfs, 'VF')} of {spec.share}% bandwidth each requested but "
                    f"the PFs' bandwidth left holds only {room}"
                    + (f": {_listed(short)}" if short else ""))
        free = capped
    whole_free = sum(free.whole_ok)
    if spec.pfs > whole_free:
        why = _why_not_whole(shape, free)
        return (f"{_plural(spec.pfs, 'whole PF')} requested but only {whole_free} free"
                + (f": {_listed(why)}" if why else ""))
    if spec.vfs and spec.pfs and vfs_beside_whole(free, spec.pfs) < spec.vfs:
        return (f"{_plural(spec.vfs, 'VF')} and {_plural(spec.pfs, 'whole PF')} requested but "
                f"a PF held whole gives no VFs: with {_plural(spec.pfs, 'PF')} taken whole at "
                f"most {vfs_beside_whole(free, spec.pfs)} of the {vf_free} free VFs are left")
    if spec.cpus > sum(free.cpus):
        return f"{spec.cpus} exclusive CPUs requested but only {sum(free.cpus)} free"
    if spec.memory > sum(free.memory):
        return f"{spec.memory} bytes of memory requested but only {sum(free.memory)} free"
    if spec.rails_required and _fits(shape, free, replace(request, rail_policy="preferred"),
                                     budget):
        return _rails_reason(shape, free, spec)
    if spec.pairs and spec.max_distance < Distance.SYS and _fits(
            shape, free, replace(request, max_distance=None), budget):
        return _distance_reason(shape, free, spec)
    if spec.numa == "single" and _fits(shape, free, replace(request, numa="preferred"), budget):
        return _single_reason(shape, free, spec)
    if spec.pairs and spec.lo:
        return (f"no placement gives {_plural(spec.gpus, 'GPU')} {_plural(request.nics, 'NIC')}"
                f" serving {spec.lo}–{spec.hi} GPUs each ({request.pairing} pairing)")
    return (f"no placement of {_plural(spec.gpus, 'GPU')}, {_plural(spec.vfs, 'VF')} and "
            f"{_plural(spec.pfs, 'whole PF')} satisfies every limit at once")


def _pool_name(pool: str | None) -> str:
    return "the default pool" if pool is None else pool


def budget_refusal(request: Request, limit: int) -> Refusal:
    """What a decision says when its search spent the budget: the request, the count, and
    what the pod's author can change. Unresolvable: evicting pods would not make the search
    smaller (usually larger), so kube-scheduler should not preempt for it."""
    want = [_plural(request.gpus, "GPU")] if request.gpus else []
    if request.all_vfs:
        want.append(_plural(request.all_vfs, "VF"))
    if request.pfs:
        want.append(_plural(request.pfs, "whole PF"))
    hints = []
    if request.max_distance is not None:
        hints.append(f"maxDistance {request.max_distance.name}")
    if request.pairing_hint is not None:
        hints.append(f"pairing {request.pairing_hint}")
    if request.numa == "single":
        hints.append("numa single")
    if request.wanted_rails and request.rail_policy == "required":
        hints.append("rails required")
    what = ", ".join(want) or "the request"
    advice = "ask for fewer VFs or whole PFs per pod"
    if hints:
        what += f" ({', '.join(hints)})"
        advice += f", or drop {' / '.join(h.split()[0] for h in hints)}"
    return Refusal(
        f"search budget spent: the allocator explored {limit:,} states for {what} without "
        f"settling the best placement, and refuses rather than place it unproven; {advice}",
        unresolvable=True, search_budget_spent=True)
