"""A group's rail outlook: what its free state offers on each rail (docs/rails.md, "Cost").

Computed once per free state (the allocator keeps it beside its memo, by group key), it
answers, without a search, the two questions a job's rail sequence asks of every group:

- how many pairs of a sequence must miss their rail at a given worst pair (a lower bound),
  which bounds the node's score with the sequence from above (`Allocator.rail_score_bound`);
- whether a `rails: required` sequence fits the plainest requests (the counts of
  `search.fits_by_counts`), and which rails the free NICs are on (the refusal's reason).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from railyard.allocation.search import Spec
from railyard.allocation.shape import FreeState, NodeShape, free_rails
from railyard.topology.model import Distance


@dataclass(frozen=True, slots=True)
class RailOutlook:
    """Per rail, the free VFs of the default pool and how near the free GPUs are to them."""

    group: tuple  # the allocator's group key (shape id, signature, odd used VFs)
    free_gpus: int  # how many GPUs are free
    vfs_on: dict[int, int]  # rail -> free VFs (default pool) on its PFs; known rails only
    # rail -> per free GPU, its distance class to the nearest PF on that rail with a free
    # VF, ascending (a GPU with none there is left out).
    reach: dict[int, tuple[int, ...]]
    # The rails of the PFs with a free VF or free whole (what a refusal names), ascending.
    free_rails: tuple[int, ...]
    plain_pool: bool  # one VF pool: `vfs_on` is what a VF without a bandwidth share sees

    @classmethod
    def of(cls, shape: NodeShape, free: FreeState, group: tuple) -> RailOutlook:
        pf_rail, dist = shape.pf_rail, shape.dist
        vfs_on: dict[int, int] = {}
        on_rail: dict[int, list[int]] = {}  # rail -> its PFs with a free VF, ascending
        for j, n in enumerate(free.vfs):
            if n > 0 and (rail := pf_rail[j]) >= 0:
                vfs_on[rail] = vfs_on.get(rail, 0) + n
                on_rail.setdefault(rail, []).append(j)
        gpus = [i for i in range(len(shape.gpus)) if (free.gpus >> i) & 1]
        reach: dict[int, tuple[int, ...]] = {}
        for rail, on in on_rail.items():
            if len(on) == 1:
                j = on[0]
                reach[rail] = tuple(sorted([dist[i][j] for i in gpus]))
            else:
                reach[rail] = tuple(sorted([min([dist[i][j] for j in on]) for i in gpus]))
        return cls(group, len(gpus), vfs_on, reach, free_rails(shape, free),
                   len(shape.pool_names) == 1)

    def counts_apply(self, spec: Spec) -> bool:
        """Whether the counts below speak for `spec` on this node: one VF pool here, and
        `spec`'s pairs are plain (`plain_pairs`)."""
        return self.plain_pool and self.plain_pairs(spec)

    @staticmethod
    def plain_pairs(spec: Spec) -> bool:
        """Whether `spec`'s pairs are one VF each (one-to-one, no whole PF) of the default
        pool, without bandwidth shares: what the per-rail counts count."""
        return spec.pool is None and not spec.share and spec.pfs == 0 and spec.hi <= 1

    def misses_at_least(self, spec: Spec, worst: int = Distance.SYS) -> int:
        """A lower bound of the rail mismatches of any choice for `spec` whose pairs are all
        within `worst`: pair *i* can keep rail *r* only with its own free VF on *r* and its
        own free GPU within `worst` of one (0 when the counts do not apply)."""
        return self.misses_counted(self.counted_rails(spec), worst)

    @staticmethod
    def counted_rails(spec: Spec) -> tuple[tuple[int, int], ...] | None:
        """(rail, pairs wanting it), ascending, for a sequence of plain pairs (`plain_pairs`);
        None when there is no sequence or its pairs are not plain. Worked out once per
        request, not once per group."""
        if not spec.rails or not RailOutlook.plain_pairs(spec):
            return None
        wanted: dict[int, int] = {}
        for rail in spec.rails:
            if rail >= 0:
                wanted[rail] = wanted.get(rail, 0) + 1
        return tuple(sorted(wanted.items()))

    def misses_counted(self, counted: tuple[tuple[int, int], ...] | None,
                       worst: int = Distance.SYS) -> int:
        """`misses_at_least` for the request whose `counted_rails` is `counted`."""
        if counted is None or not self.plain_pool:
            return 0
        short = 0
        reach, vfs_on = self.reach, self.vfs_on
        for rail, n in counted:
            near = bisect_right(reach.get(rail, ()), worst)
            short += max(0, n - min(vfs_on.get(rail, 0), near))
        return short

    def required_fits(self, spec: Spec) -> bool | None:
        """Whether a required sequence fits where the request without it does, for the
        requests `search.fits_by_counts` answers (None for the others): on each rail as
        many free VFs as pairs want it."""
        wanted = self.wanted_on_rails(spec)
        if wanted is None or not self.plain_pool:
            return None
        return self.keeps_wanted(wanted)

    def clear_worst(self, counted: tuple[tuple[int, int], ...] | None,
                    worst: int) -> int | None:
        """The least worst pair from `worst` on at which `misses_counted` is 0 (each wanted
        rail has a free VF and a free GPU within it for each pair wanting it); None when
        there is none, even at SYS."""
        if counted is None or not self.plain_pool:
            return worst
        reach, vfs_on = self.reach, self.vfs_on
        for rail, n in counted:
            near = reach.get(rail, ())
            if vfs_on.get(rail, 0) < n or len(near) < n:
                return None
            worst = max(worst, near[n - 1])
        return worst

    @staticmethod
    def wanted_on_rails(spec: Spec) -> tuple[tuple[int, int], ...] | None:
        """`counted_rails` for a required sequence of the requests `search.fits_by_counts`
        answers; None for every other request. What `keeps_wanted` takes."""
        if not (spec.rails_required and spec.pairs == spec.gpus
                and spec.max_distance >= Distance.SYS and spec.numa != "single"
                and spec.cpus == 0 and spec.memory == 0 and not spec.others):
            return None
        return RailOutlook.counted_rails(spec)

    def keeps_wanted(self, wanted: tuple[tuple[int, int], ...]) -> bool | None:
        """`required_fits` for `wanted` (`wanted_on_rails` of the request, not None): every
        wanted rail has as many free VFs, and free GPUs, as pairs want it (each free GPU
        reaches every rail with a free VF within SYS). None when the node has more than one
        VF pool (the counts do not apply)."""
        if not self.plain_pool:
            return None
        vfs_on, free = self.vfs_on, self.free_gpus
        for rail, n in wanted:  # noqa: SIM110 (a loop: 0.09 µs, all() over a generator 0.24)
            if n > free or n > vfs_on.get(rail, 0):
                return False
        return True
