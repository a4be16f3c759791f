"""The exact search behind the allocator: minimise the key (docs/allocation.md) by branch and bound.

The key, compared lexicographically (items 2–8; item 1, the hard limits, filters):
    (worst pair distance, rail mismatches, sum of pair distances, NUMA nodes spanned,
     largest number of pairs on one PF, sum over PFs of pairs², −aligned capacity kept,
     addresses)
where a rail mismatch is a pair whose NIC is not on the rail the job's sequence gives that
pair index (docs/rails.md; 0 for a request without one, `rails: required` makes any one
infeasible)
where "addresses" is (GPU indices, each GPU's target in GPU order, whole PFs, the sorted
multiset of PFs giving VFs); indices follow PCI address order, so this is "lowest PCI
addresses". VFs of one PF are interchangeable, and so are CPUs of one NUMA node, so the search
works on counts: which GPUs, which PF (VF or whole) serves each GPU, how many VFs each PF
gives, which NUMA nodes hold the CPUs. The allocator turns that into concrete devices.

Three nested levels, each enumerated completely and pruned only by valid lower bounds:
GPU sets (sorted by their bound, so the search stops at the first set that cannot win),
GPU→PF pairings (depth-first, nearest PF first), and the NIC instances that are not fixed by
the pairing (extra VFs, whole PFs, VF counts under shared pairing), enumerated in address
order so that the first of equal keys is the winner. Every bound is monotone: adding devices
never lowers the worst or summed distance or the NUMA span, and never raises the aligned
capacity kept. The tests prove the result against brute force.

Some request shapes make the exact search large (many VFs beside whole PFs: the ways to
spread the VFs over PFs multiply). A `Budget` bounds the states one decision explores and
`SearchBudgetSpent` says so when it runs out: counted, not timed, so every replica and every
memo reach the same answer (docs/decisions/0077).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from itertools import combinations
from operator import getitem
from typing import NoReturn, TypeVar

from railyard.allocation.request import Request
from railyard.allocation.shape import FreeState, NodeShape, PfMode
from railyard.topology.model import Distance

INF = 1 << 20
INF_STATES = 1 << 62  # no budget
_MISSING = object()
_T = TypeVar("_T")


def _same(value: _T) -> _T:
    """With `partial`: a bound already known, handed to `Search._loses` as a callable."""
    return value


# The members bound once: looking one up on the enum class costs ~100 ns, and the pairing
# search compares modes in its innermost loop.
_UNUSED, _VF, _WHOLE = PfMode.UNUSED, PfMode.VF, PfMode.WHOLE
# What `_Pairing._unplace` puts back: the PF's load and mode, then the prefix's counts.
_Undo = tuple[int, PfMode, int, int, int, int, int, int, int, int, int]


def ceil_div(a: int, b: int) -> int:
    """⌈a / b⌉ for integers, b > 0."""
    return -(-a // b)


class _Found(Exception):
    """Unwinds the search once any feasible choice is enough."""


# The states one decision may explore: GPU sets, pairing prefixes, choices of whole PFs and
# VF-count prefixes, each weighted by its work, over its search and the feasibility checks
# that explain a no. The simulator's requests and the tests' stay under 1/50 of it, the
# benchmark sweep's slowest (8 GPUs, 1 VF, 2 whole PFs on dgx-h100) under 1/4; a unit costs
# about 1 µs, so a spent budget is about half a second (docs/decisions/0077).
SEARCH_BUDGET = 500_000


class Budget:
    """The states a decision may explore, shared by the searches it runs, and how many it
    has explored so far. `None` as a limit: no bound (tools and tests that want the exact
    answer whatever it costs)."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int | None = SEARCH_BUDGET) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"a search budget is a count of states ≥ 0, got {limit}")
        self.limit = limit
        self.used = 0

    @property
    def left(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.used)


class SearchBudgetSpent(Exception):
    """The search explored its whole budget before it could prove an answer."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"search budget of {limit} states spent")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Spec:
    """A request in search terms. Each NIC serves between `lo` and `hi` GPUs; `pairs` GPUs
    get a NIC (one-to-one: each NIC at most one GPU; shared: ⌊k/n⌋..⌈k/n⌉ GPUs per NIC)."""

    gpus: int
    vfs: int
    pfs: int
    cpus: int
    memory: int
    max_distance: int
    numa: str
    lo: int
    hi: int
    pairs: int
    # VF pools (docs/decisions/0085): `vfs` counts the paired pool's VFs (`pool`, None the
    # default); `others` the VFs of every other pool asked, (pool, count), unpaired.
    pool: str | None = None
    others: tuple[tuple[str | None, int], ...] = ()
    # The job's rail per pair index (−1: any), at most `pairs` long; `rails_required`: a
    # mismatch is infeasible rather than counted (docs/rails.md).
    rails: tuple[int, ...] = ()
    rails_required: bool = False
    # Each VF's bandwidth share, percent (0: none): the search sees each PF's VFs capped to
    # what its bandwidth left holds (`FreeState.capped`; docs/decisions/0093).
    share: int = 0

    @classmethod
    def of(cls, r: Request) -> Spec:
        k, n = r.gpus, r.nics
        if r.pairing == "none" or k == 0 or n == 0:
            lo = hi = pairs = 0
        elif n >= k:
            lo, hi, pairs = 0, 1, k
        elif r.pairing == "shared":
            lo, hi, pairs = k // n, ceil_div(k, n), k
        else:  # one-to-one asked for with fewer NICs than GPUs: the rest go unpaired
            lo = hi = 1
            pairs = n
        maxd = int(r.max_distance) if r.max_distance is not None else int(Distance.SYS)
        others = tuple((p, c) for p, c in r.vf_counts if p != r.pair_pool) if r.pool_vfs \
            else ()
        rails = tuple(-1 if x is None else x for x in r.wanted_rails[:pairs])
        while rails and rails[-1] < 0:
            rails = rails[:-1]
        return cls(k, r.paired_vfs, r.pfs, r.exclusive_cpus, r.memory_bytes, maxd, r.numa,
                   lo, hi, pairs, r.pair_pool, others, rails,
                   bool(rails) and r.rail_policy == "required", r.vf_bandwidth)


@dataclass(frozen=True, slots=True)
class Choice:
    """The abstract winner: everything but which VF of a PF and which CPU of a NUMA node."""

    gpus: tuple[int, ...]  # GPU indices, ascending (pair order)
    targets: tuple[tuple[int, PfMode] | None, ...]  # per GPU: (PF index, VF|WHOLE) or unpaired
    whole: tuple[int, ...]  # PFs taken whole, ascending
    vf_counts: tuple[int, ...]  # VFs of the paired pool taken per PF
    numa_mask: int  # NUMA bits spanned by devices and CPUs
    cpus: tuple[tuple[int, int], ...]  # (NUMA bit, CPUs), for NUMA nodes holding CPUs
    memory: tuple[tuple[int, int], ...]  # (NUMA bit, bytes)
    key: tuple[int, ...]  # items 2–7 of the key (aligned capacity negated)
    pool: int = 0  # the paired pool's index in `shape.pool_names`
    # Every other pool asked: (its index, VFs taken per PF), in `Spec.others` order.
    other_counts: tuple[tuple[int, tuple[int, ...]], ...] = ()


def max_matching(adj: tuple[int, ...], gpu_mask: int, pf_mask: int) -> int:
    """Largest matching of GPUs in `gpu_mask` to PFs in `pf_mask` (Kuhn's augmenting paths)."""
    match: dict[int, int] = {}

    def augment(i: int, seen: list[int]) -> bool:
        cand = adj[i] & pf_mask & ~seen[0]
        while cand:
            low = cand & -cand
            seen[0] |= low
            j = low.bit_length() - 1
            owner = match.get(j)
            if owner is None or augment(owner, seen):
                match[j] = i
                return True
            cand &= ~seen[0]
        return False

    count = 0
    m = gpu_mask
    while m:
        low = m & -m
        m ^= low
        i = low.bit_length() - 1
        if adj[i] & pf_mask and augment(i, [0]):
            count += 1
    return count


def water_fill(total: int, caps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Split `total` as evenly as capacities allow over (bit, cap) slots; sum(cap) ≥ total."""
    out: dict[int, int] = {}
    rem = total
    order = sorted(caps, key=lambda bc: (bc[1], bc[0]))
    for idx, (b, cap) in enumerate(order):
        give = min(cap, ceil_div(rem, len(order) - idx))
        out[b] = give
        rem -= give
    return sorted(out.items())


def vfs_beside_whole(free: FreeState, pfs: int, only: Collection[int] | None = None) -> int:
    """The most VFs still free once `pfs` PFs are taken whole (a PF held whole gives no VFs):
    take whole the whole-able PFs with the fewest free VFs. `only`: these PF indices alone."""
    js = range(len(free.vfs)) if only is None else only
    kept = sorted(free.vfs[j] for j in js if free.whole_ok[j])[:pfs]
    return sum(free.vfs[j] for j in js) - sum(kept)


def _counts_fit(free: FreeState, spec: Spec, gpus: int, pfs: Collection[int] | None,
                others: Collection[tuple[FreeState, int]] = ()) -> bool:
    """Whether `gpus` free GPUs and the PFs `pfs` (None: all) hold the request's device
    counts: VFs, whole PFs, and both at once; `others`: each other pool's free state and
    count, checked the same way."""
    js = range(len(free.vfs)) if pfs is None else pfs
    return (gpus >= spec.gpus and sum(free.vfs[j] for j in js) >= spec.vfs
            and sum(free.whole_ok[j] for j in js) >= spec.pfs
            and not (spec.vfs and spec.pfs and vfs_beside_whole(free, spec.pfs, js) < spec.vfs)
            and all(sum(f.vfs[j] for j in js) >= n
                    and not (spec.pfs and vfs_beside_whole(f, spec.pfs, js) < n)
                    for f, n in others))


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class Search:
    """One minimisation of the key for one (shape, free state, request)."""

    def __init__(self, shape: NodeShape, free: FreeState, spec: Spec,
                 any_feasible: bool = False, budget: Budget | None = None) -> None:
        self.any_feasible = any_feasible  # stop at the first feasible choice (explanations)
        self.budget = budget
        self.shape = shape
        self.spec = spec
        self.npf = len(shape.pfs)
        # VF pools: the search proper sees the paired pool's VFs as `free.vfs`; each other
        # pool asked is (its index, its free state, the count), filled in at level 3. A PF
        # counts as open (aligned capacity) while it has a free VF of any pool.
        any_vfs = free.any_vfs or free.vfs
        if len(shape.pool_names) == 1 and spec.pool is None and not spec.others:
            # No pools (the common node): the default pool is all there is.
            self.pool, self.free = 0, free
            self.others: list[tuple[int, FreeState, int]] = []
            self.other_free = [0] * self.npf
        else:
            index = {p: q for q, p in enumerate(shape.pool_names)}
            self.pool = index.get(spec.pool, -1)
            self.free = free.for_pool(index.get(spec.pool))
            self.others = [(index.get(p, -1), free.for_pool(index.get(p)), n)
                           for p, n in spec.others]
            # Per PF: free VFs of pools other than the paired one (keep the PF open).
            self.other_free = [a - b for a, b in zip(any_vfs, self.free.vfs, strict=True)]
        # The paired pool's free VFs per PF: a PF closes (no free VF left, for the aligned
        # capacity) only when the pod takes all of them — also where a bandwidth share caps
        # what this pod may take below that.
        self.left = self.free.vfs
        if spec.share:
            # Only the paired pool's VFs: a request with a share asks one pool (`Request`).
            self.free = self.free.capped(spec.share)
        self.open0 = sum(1 << j for j, r in enumerate(any_vfs) if r > 0)
        # Another pool asked, or free VFs of a pool not paired: level 3 counts pools.
        self.pooled = bool(self.others) or any(self.other_free)
        self._span: dict[int, tuple[int, int] | None] = {}
        self.best_key: tuple[int, ...] | None = None
        self.best_tie: tuple | None = None
        self.best: tuple | None = None
        # States explored (GPU sets, pairing prefixes, choices of whole PFs, VF-count
        # prefixes), each weighted by its work (placements tried, passes over the PFs), so
        # that a unit costs about the same whatever the shape; past `limit` the search stops
        # at the next state (`spend`). One compare per state.
        self.explored = 0
        left = budget.left if budget is not None else None
        self.limit = left if left is not None else INF_STATES
        # The target of a GPU left unpaired: it sorts after every PF, so on ties the lower
        # GPUs get paired first.
        self.unpaired_target = (self.npf, _UNUSED)
        # Rails (docs/rails.md): per pair index the rail wanted (−1 any); pair p is the p-th
        # GPU of the set when every GPU is paired, which is when the rails bound GPU sets.
        self.rails = spec.rails
        self.rails_fixed = bool(spec.rails) and spec.pairs == spec.gpus
        # Crowding can be no better than n NICs on n distinct PFs with loads as even as
        # the pairing allows: r NICs serve `hi` GPUs, the others `lo`.
        n, lo, hi = spec.vfs + spec.pfs, spec.lo, spec.hi
        r = spec.pairs - n * lo
        self.crowd_min = ((hi if r else lo), r * hi * hi + (n - r) * lo * lo) if spec.pairs \
            else (0, 0)

    # ------------------------------------------------------------------ key parts

    def span(self, mask: int) -> tuple[int, int] | None:
        """(NUMA nodes spanned, NUMA bits holding CPUs and memory) for devices on `mask`;
        None when no placement of the CPUs and memory fits (or `numa: single` breaks)."""
        hit = self._span.get(mask, _MISSING)
        if hit is _MISSING:
            hit = self._span[mask] = self._place_cpus(mask)
        return hit  # type: ignore[return-value]

    def span_numa(self, mask: int) -> int | None:
        """`span`'s first item (NUMA nodes spanned), None when nothing fits."""
        s = self.span(mask)
        return None if s is None else s[0]

    def _place_cpus(self, mask: int) -> tuple[int, int] | None:
        sp, fr = self.spec, self.free
        nreal = len(self.shape.numa_ids)
        real = mask & ((1 << nreal) - 1)
        unknown = (mask >> nreal) & 1
        single = sp.numa == "single"
        if single and real.bit_count() + unknown > 1:
            return None
        cpu_mask = real
        if sp.cpus or sp.memory:
            def fits(t: int) -> bool:
                bits = _bits(t)
                return (sum(fr.cpus[b] for b in bits) >= sp.cpus
                        and sum(fr.memory[b] for b in bits) >= sp.memory)

            if not fits(real):
                # The fewest extra NUMA nodes that hold the CPUs and memory; the lowest ids
                # among equals. Fewest is what makes the span bound monotone.
                others = [b for b in range(nreal) if not (real >> b) & 1]
                limit = (0 if real or unknown else 1) if single else len(others)
                found = None
                for extra in range(1, limit + 1):
                    for combo in combinations(others, extra):
                        t = real | sum(1 << b for b in combo)
                        if fits(t):
                            found = t
                            break
                    if found is not None:
                        break
                if found is None:
                    return None
                cpu_mask = found
        value = 0 if sp.numa == "none" else cpu_mask.bit_count() + unknown
        return value, cpu_mask

    def aligned(self, gpu_mask: int, pf_mask: int) -> int:
        cache = self.shape.caches.aligned
        key = (gpu_mask, pf_mask)
        v = cache.get(key)
        if v is None:
            v = cache[key] = max_matching(self.shape.aligned_adj, gpu_mask, pf_mask)
        return v

    def _loses(self, worst: int, mism: int, total: int, span_lb: Callable[[], int | None],
               crowd: tuple[int, int], aligned_ub: Callable[[], int],
               ties_lose: Callable[[], bool]) -> bool:
        """True when nothing below a node with these lower bounds can beat the incumbent.

        Bounds are compared lexicographically and computed lazily: the costly ones (span,
        aligned capacity) only when everything before them ties.
        """
        bk = self.best_key
        if bk is None:
            return span_lb() is None  # infeasible below: CPUs do not fit or NUMA breaks
        if worst != bk[0]:
            return worst > bk[0]
        if mism != bk[1]:
            return mism > bk[1]
        if total != bk[2]:
            return total > bk[2]
        s = span_lb()
        if s is None:
            return True
        if s != bk[3]:
            return s > bk[3]
        if crowd[0] != bk[4]:
            return crowd[0] > bk[4]
        if crowd[1] != bk[5]:
            return crowd[1] > bk[5]
        a = -aligned_ub()
        if a != bk[6]:
            return a > bk[6]
        return ties_lose()

    def _tie_gpus_after(self, gset: tuple[int, ...]) -> bool:
        """Whether the incumbent's GPU set sorts before `gset` (asked only once there is
        an incumbent)."""
        bt = self.best_tie
        assert bt is not None
        return bt[0] < gset

    def _tie_not_after(self, prefix: tuple) -> bool:
        """Whether the incumbent's (GPUs, targets, whole PFs) sorts at or before `prefix`."""
        bt = self.best_tie
        return bt is not None and bt[:3] <= prefix

    # ------------------------------------------------------------------ level 1: GPU sets

    def run(self) -> Choice | None:
        """The key's minimum, or None when nothing is feasible. Raises SearchBudgetSpent
        when the budget runs out first; what was explored comes off the budget either way."""
        try:
            return self._run()
        finally:
            if self.budget is not None:
                self.budget.used += self.explored

    def spend(self) -> NoReturn:
        """Called once `explored` passes `limit`: stop here, the same state every time."""
        assert self.budget is not None and self.budget.limit is not None
        raise SearchBudgetSpent(self.budget.limit)

    def _run(self) -> Choice | None:
        sh, fr, sp = self.shape, self.free, self.spec
        k = sp.gpus
        free_gpus = _bits(fr.gpus)
        if (len(free_gpus) < k or sum(fr.vfs) < sp.vfs or sum(fr.whole_ok) < sp.pfs
                or sum(fr.cpus) < sp.cpus or sum(fr.memory) < sp.memory):
            return None  # plain counts: no search needed to say no
        # VFs and whole PFs compete for the same PFs, and `numa: single` wants every device
        # on one NUMA node. Without these counts the search, having no incumbent to prune
        # with, walks every GPU set and pairing to find nothing.
        others = [(f, n) for _, f, n in self.others]
        if not _counts_fit(fr, sp, len(free_gpus), None, others):
            return None
        if sp.numa == "single" and not any(
                _counts_fit(fr, sp, sum(1 for i in free_gpus if sh.gpu_numa[i] == b),
                            [j for j in range(self.npf) if sh.pf_numa[j] == b], others)
                for b in range(len(sh.numa_ids) + 1)):
            return None
        self.offers: dict[int, list[tuple[int, int, PfMode]]] = {}  # (distance, PF, mode)
        self.best_of: dict[int, int] = {}
        for i in free_gpus:
            row = sh.dist[i]
            offers = []
            for j in range(self.npf):
                d = row[j]
                if d > sp.max_distance:
                    continue
                if sp.vfs and fr.vfs[j] > 0:
                    offers.append((d, j, _VF))
                if sp.pfs and fr.whole_ok[j]:
                    offers.append((d, j, _WHOLE))
            offers.sort()
            self.offers[i] = offers
            self.best_of[i] = offers[0][0] if offers else INF
        # Per GPU: the nearest class at which its offers reach each rail. A choice whose
        # worst pair is w has at least the mismatches of the positions whose GPU reaches its
        # rail only beyond w (or not at all), so (w, those) bounds the key's first two items.
        self.rail_dist: dict[int, dict[int, int]] = {}
        if self.rails_fixed:
            for i in free_gpus:
                near: dict[int, int] = {}
                for d, j, _ in self.offers[i]:
                    near.setdefault(sh.pf_rail[j], d)
                self.rail_dist[i] = near
        if self.rails_fixed and sp.rails_required:
            self.need = self._required_table(free_gpus, k)
        candidates = self._candidates(free_gpus, k)
        candidates.sort()
        for lw, lm, ls, lspan, gset, mask in candidates:
            bk = self.best_key
            if bk is not None and (lw, lm, ls, lspan) > bk[:4]:
                break  # sorted by these bounds: no later set can win either
            gmask = sum(1 << i for i in gset)
            after = fr.gpus & ~gmask
            if self._loses(lw, lm, ls, partial(_same, lspan), self.crowd_min,
                           partial(self.aligned, after, self.open0),
                           partial(self._tie_gpus_after, gset)):
                continue
            try:
                self._pair(gset, mask, after)
            except _Found:
                break
        if self.best is None:
            return None
        return self._choice()

    def _candidates(self, free_gpus: list[int], k: int) -> list[tuple]:
        """Level 1: per GPU set that may hold a choice, lower bounds of the key's first
        items (worst, mismatches, sum, NUMA span), with the set and its NUMA mask."""
        sh, sp = self.shape, self.spec
        pairs, plain = sp.pairs, self._plain_bound_counts()
        candidates = []
        for gset in combinations(free_gpus, k):
            self.explored += 1
            if self.explored > self.limit:
                self.spend()
            if pairs and plain:
                bests = sorted(self.best_of[i] for i in gset)
                if bests[pairs - 1] >= INF:
                    continue
                lw, ls = bests[pairs - 1], sum(bests[:pairs])
                if sp.hi > 1:
                    lw, ls = self._few_nics_bound(gset, lw, ls)
            else:
                lw = ls = 0
            lm = 0
            if self.rails_fixed:
                if sp.rails_required:
                    # Pair p must reach rail r_p: its class there bounds worst and sum.
                    bound = self._required_bound(gset)
                    if bound is None:
                        continue
                    lw, ls = max(lw, bound[0]), max(ls, bound[1])
                else:
                    lm = self.rail_misses(gset, 0, lw)
            mask = 0
            for i in gset:
                mask |= 1 << sh.gpu_numa[i]
            s = self.span(mask)
            if s is None:
                continue
            candidates.append((lw, lm, ls, s[0], gset, mask))
        return candidates

    def _plain_bound_counts(self) -> bool:
        """Whether the first level works out each GPU set's plain bound (its GPUs' nearest
        classes): not under a required sequence with one GPU per NIC, where every GPU is
        paired and none nearer than its class on its position's rail, so `_required_bound`
        is at least the plain bound and alone decides."""
        sp = self.spec
        return not (self.rails_fixed and sp.rails_required and sp.hi <= 1)

    def _required_table(self, free_gpus: list[int], k: int) -> list[list[int]]:
        """Per pair position p, per GPU i: i's class as pair p — to the rail p wants, or its
        nearest offer where p wants none (INF: i cannot be pair p). What `_required_bound`
        reads for every GPU set."""
        rails, rail_dist, best_of = self.rails, self.rail_dist, self.best_of
        need = []
        for p in range(k):
            want = rails[p] if p < len(rails) else -1
            row = [INF] * len(self.shape.gpus)
            for i in free_gpus:
                row[i] = best_of[i] if want < 0 else rail_dist[i].get(want, INF)
            need.append(row)
        return need

    def rail_misses(self, gset: tuple[int, ...], d: int, within: int) -> int:
        """The rail mismatches pairs d, d+1, … of `gset` have at least when no pair is worse
        than `within` (every GPU paired, so pair p is `gset[p]`): positions whose GPU
        reaches its rail only beyond `within`. With `within` a lower bound on the worst pair,
        (within, this) is a lower bound on the key's first two items."""
        rails, rail_dist = self.rails, self.rail_dist
        return sum(1 for p in range(d, min(len(rails), len(gset)))
                   if rails[p] >= 0 and rail_dist[gset[p]].get(rails[p], INF) > within)

    def _required_bound(self, gset: tuple[int, ...]) -> tuple[int, int] | None:
        """`rails: required`, every GPU paired: (worst, sum) lower bounds from each GPU's
        class to the rail its position wants (its nearest offer elsewhere); None when a
        position's GPU reaches its rail not at all."""
        ds = list(map(getitem, self.need, gset))  # pair p is gset[p]
        worst = max(ds)
        return None if worst >= INF else (worst, sum(ds))

    def _few_nics_bound(self, gset: tuple[int, ...], lw: int, ls: int) -> tuple[int, int]:
        """Shared pairing: n NICs sit on at most n PFs, so at most the GPUs those PFs are
        nearest to get their nearest class; every other GPU pays its next class at least."""
        n = self.spec.vfs + self.spec.pfs
        cover: dict[int, int] = {}
        for i in gset:
            best = self.best_of[i]
            for j in {j for d, j, _ in self.offers[i] if d == best}:  # a PF once, VF or whole
                cover[j] = cover.get(j, 0) + 1
        at_best = min(len(gset), sum(sorted(cover.values(), reverse=True)[:n]))
        worse = len(gset) - at_best
        if worse <= 0:
            return lw, ls
        steps = []
        for i in gset:
            best = self.best_of[i]
            nxt = next((d for d, _, _ in self.offers[i] if d > best), INF)
            steps.append((nxt - best, nxt))
        steps.sort()
        extra = sum(step for step, _ in steps[:worse])
        worst_next = sorted(nxt for _, nxt in steps)[worse - 1]
        return max(lw, worst_next), ls + extra

    # ------------------------------------------------------------------ level 2: pairings

    def _pair(self, gset: tuple[int, ...], numa: int, gpus_after: int) -> None:
        """Every pairing of `gset`'s GPUs with PFs that can still beat the incumbent."""
        _Pairing(self, gset, numa, gpus_after).extend(0)

    # ------------------------------------------------------------------ level 3: instances

    def _instances(self, p: _Pairing) -> None:
        """The NIC instances a complete pairing `p` leaves open: extra whole PFs, then the
        VF counts per PF (`_fill`)."""
        gset, targets, loads, mode = p.gset, tuple(p.targets), p.loads, p.mode
        worst, mism, total, mask, gpus_after = p.worst, p.mism, p.total, p.numa, p.gpus_after
        sp, fr = self.spec, self.free
        lo, hi, npf = sp.lo, sp.hi, self.npf
        self.explored += npf  # its passes over the PFs
        rvf = fr.vfs
        tmin = [0] * npf
        tmax = [0] * npf
        paired_whole = 0
        paired_whole_mask = 0
        for j in range(npf):
            if mode[j] == _WHOLE:
                if loads[j] < lo:
                    return
                paired_whole += 1
                paired_whole_mask |= 1 << j
            elif mode[j] == _VF:
                tmin[j] = ceil_div(loads[j], hi)
                tmax[j] = min(rvf[j], loads[j] // lo) if lo else rvf[j]
                if tmin[j] > tmax[j]:
                    return
            elif lo == 0 and sp.vfs:
                tmax[j] = rvf[j]
        extra_whole = sp.pfs - paired_whole
        if extra_whole < 0 or (extra_whole and lo):
            return
        whole_cands = [j for j in range(npf) if mode[j] == _UNUSED and fr.whole_ok[j]]
        if len(whole_cands) < extra_whole:
            return
        crowd = (p.maxload, p.sumsq)
        fixed = (gset, targets, worst, mism, total, crowd, mask, gpus_after, paired_whole_mask)
        # `_fill`'s own first test, done here without its setup: most choices of whole PFs
        # lose at once, and there are C(candidates, extra_whole) of them per pairing.
        pf_numa, vfs = self.shape.pf_numa, sp.vfs
        need_numa, need_closed = mask, paired_whole_mask
        for j in range(npf):
            if tmin[j]:
                need_numa |= 1 << pf_numa[j]
                if tmin[j] >= self.left[j] and not self.other_free[j]:
                    need_closed |= 1 << j
        smin, smax_all = sum(tmin), sum(tmax)
        for wset in combinations(whole_cands, extra_whole):
            self.explored += 1
            if self.explored > self.limit:
                self.spend()
            if not smin <= vfs <= smax_all - sum(tmax[j] for j in wset):
                continue
            if self.others and any(
                    sum(f.vfs[j] for j in range(npf) if mode[j] != _WHOLE and j not in wset) < n
                    for _, f, n in self.others):
                continue  # another pool's VFs do not fit beside the whole PFs
            wnuma, wmask = need_numa, need_closed
            for j in wset:
                wnuma |= 1 << pf_numa[j]
                wmask |= 1 << j
            if self._loses(worst, mism, total, partial(self.span_numa, wnuma), crowd,
                           partial(self.aligned, gpus_after, self.open0 & ~wmask),
                           partial(self._tie_not_after, (gset, targets, wset))):
                continue
            self._fill(fixed, wset, tmin, tmax)

    def _fill(self, fixed: tuple, wset: tuple[int, ...], tmin: list[int],
              tmax: list[int]) -> None:
        """Choose VF counts per PF (address order, most on the lowest PF first, so the first
        of equal keys found is the lowest) once the pairing and the whole PFs are fixed:
        the paired pool's first, then each other pool's asked (`Spec.others`) the same way.
        """
        if not self.pooled:
            self._fill_one_pool(fixed, wset, tmin, tmax)
            return
        gset, targets, worst, mism, total, crowd, mask, gpus_after, paired_whole_mask = fixed
        sp, npf, rvf = self.spec, self.npf, self.free.vfs
        self.explored += npf * (1 + len(self.others))  # its passes over the PFs
        pf_numa = self.shape.pf_numa
        wmask_pf = sum(1 << j for j in wset)
        whole_mask = paired_whole_mask | wmask_pf
        # Slots: (PF, segment, least, most, free VFs of that pool there); segment 0 is the
        # paired pool, then one per other pool. Counts are chosen slot by slot.
        slots = [(j, 0, tmin[j], tmax[j], rvf[j]) for j in range(npf)
                 if not (wmask_pf >> j) & 1 and (tmax[j] > 0 or tmin[j] > 0)]
        needs = [sp.vfs]
        for seg, (_, f, n) in enumerate(self.others, 1):
            slots += [(j, seg, 0, f.vfs[j], f.vfs[j]) for j in range(npf)
                      if not (whole_mask >> j) & 1 and f.vfs[j] > 0]
            needs.append(n)
        n = len(slots)
        # A PF can end with no free VF only when every pool with a free VF there has a slot.
        covered = [0] * npf
        for j, _, _, _, cap in slots:
            covered[j] += cap
        any_vfs = self.free.any_vfs or rvf
        closable = sum(1 << j for j in range(npf) if covered[j] >= any_vfs[j] > 0)
        # Suffix sums bound what the slots from position idx on can still take, within
        # their segment (each segment's count is the request's).
        smin = [0] * (n + 1)
        smax = [0] * (n + 1)
        snuma = [0] * (n + 1)  # NUMA bits of later slots that must give VFs
        sforced = [0] * (n + 1)  # PFs whose later slots must all give every free VF
        sforced[n] = (1 << npf) - 1
        for idx in range(n - 1, -1, -1):
            j, seg, lo_t, hi_t, cap = slots[idx]
            same = idx + 1 < n and slots[idx + 1][1] == seg
            smin[idx] = (smin[idx + 1] if same else 0) + lo_t
            smax[idx] = (smax[idx + 1] if same else 0) + hi_t
            snuma[idx] = snuma[idx + 1] | ((1 << pf_numa[j]) if lo_t else 0)
            sforced[idx] = sforced[idx + 1] & ~(0 if lo_t >= cap else 1 << j)
        starts = {idx: slots[idx][1] for idx in range(n)
                  if idx == 0 or slots[idx - 1][1] != slots[idx][1]}
        if any(not smin[idx] <= needs[seg] <= smax[idx] for idx, seg in starts.items()):
            return
        present = set(starts.values())
        if any(need and seg not in present for seg, need in enumerate(needs)):
            return  # a pool asked for has no PF left to give its VFs
        wnuma = mask
        for j in wset:
            wnuma |= 1 << pf_numa[j]
        ctx = (gset, targets, wset)
        counts = [[0] * npf for _ in needs]
        # States counted in a local (cheaper than the attribute in this, the hottest loop),
        # added to `explored` on the way out; `room` is what the budget still allows.
        room = self.limit - self.explored
        visited = 0

        def ties_lose() -> bool:
            bt = self.best_tie
            return bt is not None and (bt[0], bt[1], bt[2]) <= ctx

        def dfs(idx: int, rem: int, cmask: int, notfull: int) -> None:
            nonlocal visited
            visited += 1
            if visited > room:
                self.spend()
            if idx in starts:
                if rem:
                    return  # the previous segment did not reach its count
                rem = needs[starts[idx]]
            if idx == n:
                if rem:
                    return
                s = self.span(cmask)
                if s is None:
                    return
                closed = whole_mask | (closable & ~notfull)
                a = self.aligned(gpus_after, self.open0 & ~closed)
                key = (worst, mism, total, s[0], crowd[0], crowd[1], -a)
                vfms = tuple(j for c in counts for j in range(npf) for _ in range(c[j]))
                tie = (gset, targets, wset, vfms)
                if self.best_key is None or (key, tie) < (self.best_key, self.best_tie):
                    self.best_key, self.best_tie = key, tie
                    self.best = (gset, targets, wset, tuple(counts[0]), cmask, s[1],
                                 tuple(tuple(c) for c in counts[1:]))
                    if self.any_feasible:
                        raise _Found
                return
            if self._loses(worst, mism, total,
                           lambda: (self.span(cmask | snuma[idx]) or (None,))[0], crowd,
                           lambda: self.aligned(
                               gpus_after, self.open0 & ~(
                                   whole_mask | (closable & ~notfull & sforced[idx]))),
                           ties_lose):
                return
            j, seg, lo_t, hi_t, cap = slots[idx]
            last = idx + 1 == n or slots[idx + 1][1] != seg
            after_min = 0 if last else smin[idx + 1]
            after_max = 0 if last else smax[idx + 1]
            top = min(hi_t, rem - after_min)
            bottom = max(lo_t, rem - after_max)
            bit = 1 << pf_numa[j]
            row = counts[seg]
            for t in range(top, bottom - 1, -1):
                row[j] = t
                dfs(idx + 1, rem - t, cmask | bit if t else cmask,
                    notfull if t >= cap else notfull | (1 << j))
            row[j] = 0

        try:
            # PFs taken whole leave no free VF behind.
            dfs(0, 0 if 0 in starts else sp.vfs, wnuma, 0)
        finally:
            self.explored += visited

    def _fill_one_pool(self, fixed: tuple, wset: tuple[int, ...], tmin: list[int],
                       tmax: list[int]) -> None:
        """`_fill` where one pool is all there is (no other pool asked, none with a free VF):
        its hottest loop without the pools' bookkeeping, which costs a node without pools
        about 10% of a cold search (docs/decisions/0085)."""
        gset, targets, worst, mism, total, crowd, mask, gpus_after, paired_whole_mask = fixed
        sp, npf, left = self.spec, self.npf, self.left
        self.explored += npf  # its passes over the PFs
        pf_numa = self.shape.pf_numa
        wmask_pf = sum(1 << j for j in wset)
        order = [j for j in range(npf)
                 if not (wmask_pf >> j) & 1 and (tmax[j] > 0 or tmin[j] > 0)]
        n = len(order)
        # Suffix sums bound what the PFs from position idx on can still take.
        smin = [0] * (n + 1)
        smax = [0] * (n + 1)
        snuma = [0] * (n + 1)  # NUMA bits of later PFs that must give VFs
        sclosed = [0] * (n + 1)  # later PFs that must give all their free VFs
        for idx in range(n - 1, -1, -1):
            j = order[idx]
            smin[idx] = smin[idx + 1] + tmin[j]
            smax[idx] = smax[idx + 1] + tmax[j]
            snuma[idx] = snuma[idx + 1] | ((1 << pf_numa[j]) if tmin[j] else 0)
            sclosed[idx] = sclosed[idx + 1] | ((1 << j) if tmin[j] >= left[j] else 0)
        if not smin[0] <= sp.vfs <= smax[0]:
            return
        wnuma = mask
        for j in wset:
            wnuma |= 1 << pf_numa[j]
        ctx = (gset, targets, wset)
        counts = [0] * npf
        # States counted in a local (cheaper than the attribute in this, the hottest loop),
        # added to `explored` on the way out; `room` is what the budget still allows.
        room = self.limit - self.explored
        visited = 0

        def ties_lose() -> bool:
            bt = self.best_tie
            return bt is not None and (bt[0], bt[1], bt[2]) <= ctx

        def dfs(idx: int, rem: int, cmask: int, closed: int) -> None:
            nonlocal visited
            visited += 1
            if visited > room:
                self.spend()
            if idx == n:
                s = self.span(cmask)
                if s is None:
                    return
                a = self.aligned(gpus_after, self.open0 & ~closed)
                key = (worst, mism, total, s[0], crowd[0], crowd[1], -a)
                vfms = tuple(j for j in range(npf) for _ in range(counts[j]))
                tie = (gset, targets, wset, vfms)
                if self.best_key is None or (key, tie) < (self.best_key, self.best_tie):
                    self.best_key, self.best_tie = key, tie
                    self.best = (gset, targets, wset, tuple(counts), cmask, s[1], ())
                    if self.any_feasible:
                        raise _Found
                return
            if self._loses(worst, mism, total,
                           lambda: (self.span(cmask | snuma[idx]) or (None,))[0], crowd,
                           lambda: self.aligned(gpus_after,
                                                self.open0 & ~(closed | sclosed[idx])),
                           ties_lose):
                return
            j = order[idx]
            top = min(tmax[j], rem - smin[idx + 1])
            bottom = max(tmin[j], rem - smax[idx + 1])
            bit = 1 << pf_numa[j]
            for t in range(top, bottom - 1, -1):
                counts[j] = t
                dfs(idx + 1, rem - t, cmask | bit if t else cmask,
                    closed | (1 << j) if t >= left[j] else closed)
            counts[j] = 0

        try:
            # PFs taken whole leave no free VF behind.
            dfs(0, sp.vfs, wnuma, paired_whole_mask | wmask_pf)
        finally:
            self.explored += visited

    # ------------------------------------------------------------------ result

    def _choice(self) -> Choice:
        assert self.best is not None and self.best_key is not None
        gset, targets, wset, counts, dev_mask, cpu_mask, other_counts = self.best
        sp, fr = self.spec, self.free
        nreal = len(self.shape.numa_ids)
        cpu_bits = _bits(cpu_mask)
        cpus = water_fill(sp.cpus, [(b, fr.cpus[b]) for b in cpu_bits]) if sp.cpus else []
        memory = (water_fill(sp.memory, [(b, fr.memory[b]) for b in cpu_bits])
                  if sp.memory else [])
        unpaired = self.unpaired_target
        return Choice(
            gpus=gset,
            targets=tuple(None if t == unpaired else t for t in targets),
            whole=tuple(sorted({j for t in targets if t != unpaired and t[1] == _WHOLE
                                for j in (t[0],)} | set(wset))),
            vf_counts=counts,
            numa_mask=(dev_mask | cpu_mask) & ((1 << nreal) - 1),
            cpus=tuple(c for c in cpus if c[1]),
            memory=tuple(m for m in memory if m[1]),
            key=self.best_key,
            pool=max(self.pool, 0),
            other_counts=tuple((q, c) for (q, _, _), c in zip(self.others, other_counts,
                                                                strict=True)),
        )


class _Pairing:
    """Level 2 for one GPU set: its GPU→PF pairings, depth first, GPU by GPU in `gset`
    order, nearest PF first. Holds the prefix built so far (the first `d` GPUs placed),
    changed in place going down (`_place`) and put back coming up (`_unplace`), and the
    tables that prune it. Each complete pairing goes on to level 3 (`Search._instances`).
    """

    __slots__ = ("closed", "gpus_after", "gset", "inst", "loads", "maxload", "mism", "mode",
                 "nearest_pfs", "next_class", "numa", "paired", "rail_bound", "search",
                 "suffix", "sumsq", "targets", "total", "unpaired", "unpaired_max", "visited",
                 "wholes", "worst")

    def __init__(self, search: Search, gset: tuple[int, ...], numa: int,
                 gpus_after: int) -> None:
        self.search = search
        self.gset = gset
        self.gpus_after = gpus_after  # the free GPUs once `gset` is taken
        self.unpaired_max = len(gset) - search.spec.pairs
        best_of, offers = search.best_of, search.offers
        # Lower bounds for the GPUs still to pair: their nearest offers, cheapest first.
        self.suffix: list[tuple[list[int], list[int]]] = []
        for d in range(len(gset) + 1):
            b = sorted(best_of[i] for i in gset[d:])
            sums = [0]
            for x in b:
                sums.append(sums[-1] + x)
            self.suffix.append((b, sums))
        # Per GPU: the PFs at its nearest class, and its next class (for `_shared_bound`).
        self.nearest_pfs = {i: {j for dd, j, _ in offers[i] if dd == best_of[i]} for i in gset}
        self.next_class = {i: next((dd for dd, _, _ in offers[i] if dd > best_of[i]), INF)
                           for i in gset}
        # `rails: preferred` with every GPU paired: mismatches of the positions left are
        # bounded in `_loses` (`Search.rail_misses`).
        self.rail_bound = search.rails_fixed and not search.spec.rails_required
        # Prefixes met so far, by what decides their futures (`_dominated`).
        self.visited: dict[tuple, list[tuple[int, int, int, tuple]]] = {}
        # The prefix.
        npf = search.npf
        self.loads = [0] * npf  # pairs on each PF
        self.mode = [_UNUSED] * npf  # how each PF serves the pod
        self.targets: list[tuple[int, PfMode]] = []  # per GPU placed: (PF, mode) or unpaired
        self.paired = 0  # GPUs placed with a NIC
        self.unpaired = 0  # GPUs placed without one
        self.worst = 0  # worst pair distance
        self.mism = 0  # pairs off the rail the job's sequence wants there
        self.total = 0  # sum of pair distances
        self.numa = numa  # NUMA bits of the GPUs and of the PFs chosen
        self.inst = 0  # VFs the PFs giving VFs need at least (each serves ≤ `hi` GPUs)
        self.wholes = 0  # PFs taken whole
        self.maxload = 0  # crowding: the most pairs on one PF
        self.sumsq = 0  # crowding: the sum over PFs of pairs²
        self.closed = 0  # PFs left with no free VF (for the aligned capacity kept)

    def extend(self, d: int) -> None:
        """Search every completion of the prefix of `d` GPUs that can still win."""
        s = self.search
        s.explored += 1
        if s.explored > s.limit:
            s.spend()
        if self._loses(d) or self._dominated(d):
            return
        if d == len(self.gset):
            s._instances(self)
            return
        if self.paired < s.spec.pairs:
            offers = s.offers[self.gset[d]]
            rails = s.spec.rails
            tried = len(offers)  # each offer is a placement tried
            if rails and self.paired < len(rails) and rails[self.paired] >= 0:
                want, pf_rail, loads = rails[self.paired], s.shape.pf_rail, self.loads
                if s.spec.rails_required:
                    # Only the wanted rail can be placed (`_place` refuses the others).
                    offers = sorted([o for o in offers if pf_rail[o[1]] == want],
                                    key=lambda o: (o[0], loads[o[1]], o[1], o[2]))
                else:
                    # The rail wanted here first among equals: the first leaf then usually
                    # keeps the sequence, which prunes the rest sooner.
                    offers = sorted(offers, key=lambda o: (o[0], pf_rail[o[1]] != want,
                                                           loads[o[1]], o[1], o[2]))
            elif self.paired:
                # Nearest first and, among equals, the least loaded PF first: the first
                # leaf is then usually uncrowded, which prunes the rest sooner.
                loads = self.loads
                offers = sorted(offers, key=lambda o: (o[0], loads[o[1]], o[1], o[2]))
            s.explored += tried
            for dist, j, kind in offers:
                undo = self._place(j, kind, dist)
                if undo is not None:
                    self.extend(d + 1)
                    self._unplace(j, undo)
        if self.unpaired < self.unpaired_max:
            self.targets.append(s.unpaired_target)
            self.unpaired += 1
            self.extend(d + 1)
            self.unpaired -= 1
            self.targets.pop()

    def _place(self, j: int, kind: PfMode, dist: int) -> _Undo | None:
        """Pair the next GPU with PF `j` (one of its VFs, or the PF whole) at `dist`.
        Returns what `_unplace` puts back, or None when the request's counts forbid it."""
        sp = self.search.spec
        miss = 0
        rails = sp.rails
        if rails and self.paired < len(rails):
            want = rails[self.paired]
            if want >= 0 and self.search.shape.pf_rail[j] != want:
                if sp.rails_required:
                    return None
                miss = 1
        load, m = self.loads[j], self.mode[j]
        inst, wholes, closed = self.inst, self.wholes, self.closed
        if kind == _VF:
            if m == _WHOLE:
                return None
            # Each VF serves at most `hi` GPUs: the PF needs ⌈load / hi⌉ of its VFs.
            free_vfs = self.search.free.vfs[j]
            tmin_old, tmin_new = ceil_div(load, sp.hi), ceil_div(load + 1, sp.hi)
            if tmin_new > free_vfs or inst - tmin_old + tmin_new > sp.vfs:
                return None
            self.inst = inst - tmin_old + tmin_new
            if tmin_new >= self.search.left[j] and not self.search.other_free[j]:
                self.closed = closed | (1 << j)
        else:
            if m == _VF or load + 1 > sp.hi or (m == _UNUSED and wholes + 1 > sp.pfs):
                return None
            self.wholes = wholes + (m == _UNUSED)
            self.closed = closed | (1 << j)
        undo: _Undo = (load, m, inst, wholes, closed, self.worst, self.mism, self.total,
                       self.numa, self.maxload, self.sumsq)
        self.loads[j] = load + 1
        self.mode[j] = kind
        self.targets.append((j, kind))
        self.paired += 1
        self.worst = max(self.worst, dist)
        self.mism += miss
        self.total += dist
        self.numa |= 1 << self.search.shape.pf_numa[j]
        self.maxload = max(self.maxload, load + 1)
        self.sumsq += 2 * load + 1
        return undo

    def _unplace(self, j: int, undo: _Undo) -> None:
        (self.loads[j], self.mode[j], self.inst, self.wholes, self.closed, self.worst,
         self.mism, self.total, self.numa, self.maxload, self.sumsq) = undo
        self.targets.pop()
        self.paired -= 1

    def _loses(self, d: int) -> bool:
        """Whether no completion of the prefix can beat the incumbent (`Search._loses`)."""
        s, sp = self.search, self.search.spec
        worst, total = self.worst, self.total
        need = sp.pairs - self.paired
        if need:
            b, sums = self.suffix[d]
            if need > len(b) or b[need - 1] >= INF:
                return True
            lw, ls = max(worst, b[need - 1]), total + sums[need]
            if sp.hi > 1 and d:
                bound = self._shared_bound(d)
                if bound is None:
                    return True
                lw, ls = max(lw, bound[0]), max(ls, total + bound[1])
        else:
            lw, ls = worst, total
        crowd_min = s.crowd_min
        lm = self.mism + (s.rail_misses(self.gset, d, lw) if self.rail_bound else 0)
        return s._loses(lw, lm, ls, lambda: s.span_numa(self.numa),
                        (max(self.maxload, 1 if need else 0, crowd_min[0]),
                         max(self.sumsq + need, crowd_min[1])),
                        lambda: s.aligned(self.gpus_after, s.open0 & ~self.closed),
                        lambda: self._ties_lose(d))

    def _ties_lose(self, d: int) -> bool:
        bt = self.search.best_tie
        return bt is not None and (self.gset, tuple(self.targets)) > (bt[0], bt[1][:d])

    def _dominated(self, d: int) -> bool:
        """Prefixes that reach the same loads on the same PFs have the same futures: one
        that is no better in worst and summed distance cannot win, unless the sums tie and
        it is lower in address order. A lower worst so far is no reason to drop a lower
        prefix: a GPU paired later can raise both worsts to the same value. This collapses
        GPU orders that shared pairing multiplies."""
        state = (d, tuple(self.loads), tuple(self.mode))
        worst, mism, total, prefix = self.worst, self.mism, self.total, tuple(self.targets)
        seen = self.visited.get(state)
        if seen is None:
            self.visited[state] = [(worst, mism, total, prefix)]
            return False
        for w, m, t, p in seen:
            if w <= worst and m <= mism and t <= total and (m < mism or t < total
                                                             or p < prefix):
                return True
        seen.append((worst, mism, total, prefix))
        return False

    def _shared_bound(self, d: int) -> tuple[int, int] | None:
        """Shared pairing has few NICs. A GPU left either joins a NIC already chosen
        (where it still has room: cost `near`) or uses one of the `left` NIC instances,
        each serving at most `hi` GPUs; and those instances sit on at most `left` new
        PFs, so only the GPUs those PFs are nearest to get their nearest class, the
        others pay at least their next one. Bounds (worst, sum) of the GPUs left; None
        when they cannot fit."""
        s, sp = self.search, self.search.spec
        hi, maxd, dist = sp.hi, sp.max_distance, s.shape.dist
        loads, mode = self.loads, self.mode
        spare = [j for j in range(s.npf)
                 if (mode[j] == _VF and loads[j] % hi) or (mode[j] == _WHOLE and loads[j] < hi)]
        left = (sp.vfs - self.inst) + (sp.pfs - self.wholes)
        slots = left * hi
        rest = self.gset[d:]
        s.explored += len(rest) * (len(spare) + 4)  # its work, in placements' worth
        near = []
        for i in rest:
            row = dist[i]
            near.append(min((row[j] for j in spare if row[j] <= maxd), default=INF))
        best = [s.best_of[i] for i in rest]
        # (1) at most `slots` GPUs use new instances.
        worst1 = max(best)
        if len(rest) > slots:
            by_near = sorted(near, reverse=True)
            if by_near[slots] >= INF:
                return None
            worst1 = max(worst1, by_near[slots])
        savings = sorted((a - b for a, b in zip(near, best, strict=True)), reverse=True)
        sum1 = sum(near) - sum(savings[:slots])
        # (2) at most `covered` GPUs get their nearest class from a new PF.
        cover: dict[int, int] = {}
        for i in rest:
            for j in self.nearest_pfs[i]:
                cover[j] = cover.get(j, 0) + 1
        covered = min(len(rest), sum(sorted(cover.values(), reverse=True)[:left]))
        other = [min(a, self.next_class[i]) for a, i in zip(near, rest, strict=True)]
        worst2 = sorted(other, reverse=True)[covered] if len(rest) > covered else 0
        gains = sorted((o - b for o, b in zip(other, best, strict=True)), reverse=True)
        sum2 = sum(other) - sum(gains[:covered])
        return max(worst1, worst2), max(sum1, sum2)


def search(shape: NodeShape, free: FreeState, request: Request,
           budget: Budget | None = None) -> Choice | None:
    """The key's minimum for `request` on this node, or None when nothing is feasible.
    Raises SearchBudgetSpent when `budget` runs out first (None: no bound)."""
    return Search(shape, free, Spec.of(request), budget=budget).run()


def feasible(shape: NodeShape, free: FreeState, request: Request,
             budget: Budget | None = None) -> bool:
    """Whether anything fits, without looking for the best. Raises SearchBudgetSpent when
    `budget` runs out first (None: no bound)."""
    spec = Spec.of(request)
    counted = fits_by_counts(shape, free, spec)
    if counted is not None:
        return counted
    return Search(shape, free, spec, any_feasible=True, budget=budget).run() is not None


def fits_by_counts(shape: NodeShape, free: FreeState, spec: Spec) -> bool | None:
    """Whether a request fits, by counting, for the plainest kind: one VF per GPU or more
    (or no GPU), no whole PF, no CPUs or memory, no distance limit, no `numa: single`.
    There any GPU may pair with any VF, so it fits exactly when there are GPUs enough, VFs
    enough, and — under a required rail sequence — on each rail as many free VFs as pairs
    want it. None for every other kind (the search answers): what keeps the extender's
    filter cheap for a job's later pods (docs/rails.md, "Cost")."""
    if not (spec.pairs == spec.gpus and spec.hi <= 1
            and spec.pfs == 0 and not spec.others and spec.cpus == 0 and spec.memory == 0
            and spec.max_distance >= Distance.SYS and spec.numa != "single"):
        return None
    if len(shape.pool_names) == 1 and spec.pool is None:
        vfs = free.capped(spec.share).vfs
    else:
        index = {p: q for q, p in enumerate(shape.pool_names)}
        vfs = free.for_pool(index.get(spec.pool)).capped(spec.share).vfs
    if free.gpus.bit_count() < spec.gpus or sum(vfs) < spec.vfs:
        return False
    if not spec.rails_required:
        return True
    wanted: dict[int, int] = {}
    for rail in spec.rails:
        if rail >= 0:
            wanted[rail] = wanted.get(rail, 0) + 1
    return all(sum(n for n, r in zip(vfs, shape.pf_rail, strict=True) if r == rail) >= count
               for rail, count in wanted.items())
