"""The joint allocator: GPUs, RDMA VFs/PFs, CPUs and memory on one node, with GPU↔NIC pairs.

`Allocator.allocate` minimises the key of docs/allocation.md exactly (`allocation.search`) and
turns the abstract answer into devices: the lowest free VF index of each chosen PF and the
lowest free CPUs of each chosen NUMA node. Answers are memoised by (node shape, free-state
signature, request shape): thousands of nodes share a few signatures, so a cluster-wide
filter searches each signature once. `node_score` ranks nodes for the extender.

Each decision explores at most `search_budget` states; one that spends it is refused with a
reason that says so, and that refusal is never memoised as the shape's answer
(docs/decisions/0077).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from railyard.allocation.explain import budget_refusal, explain, rails_reason
from railyard.allocation.ledger import Ledger
from railyard.allocation.outlook import RailOutlook
from railyard.allocation.request import Request
from railyard.allocation.search import (
    SEARCH_BUDGET,
    Budget,
    Choice,
    SearchBudgetSpent,
    Spec,
    feasible,
    fits_by_counts,
    search,
)
from railyard.allocation.shape import (
    NodeShape,
    ShapeCaches,
    build_shape,
    empty_state,
    free_state,
    same_shape,
)
from railyard.allocation.types import Affinity, Allocation, Infeasible, NicRef, Pair, Refusal
from railyard.topology.cpus import format_cpulist
from railyard.topology.model import Distance, NodeTopology

Packing = Literal["binpack", "spread"]
_EMPTY_SIGNATURE: tuple = ((), (), (), (), (), (), ())
_MEMO_LIMIT = 1 << 16
_SHAPE_LIMIT = 1 << 14


class Allocator:
    """Exact joint allocation with a memo; one per extender, simulator or agent.

    `packing` orders nodes that the key cannot tell apart: `binpack` prefers fuller nodes
    (keeps whole nodes free for large pods), `spread` emptier ones. `search_budget` is the
    most states one decision explores (None: no bound). An answer found within one budget is
    the answer under any other (only a no's reason may be plainer, when explaining it ran
    short), so the memo keeps answers across changes of the budget.

    `allocate` and `node_score`, which may search, are called from one thread at a time;
    `allocate_known`, `node_score_known`, `shape` and `group_key`, which never search, from
    any thread (the extender searches in a worker thread while its event loop answers from
    the memo and regroups nodes).
    """

    def __init__(self, packing: Packing = "binpack",
                 search_budget: int | None = SEARCH_BUDGET) -> None:
        if packing not in ("binpack", "spread"):
            raise ValueError(f"packing must be 'binpack' or 'spread', got {packing!r}")
        Budget(search_budget)  # the same check as every decision's
        self.packing = packing
        self.search_budget = search_budget
        # id(topology) -> its shape; the shape holds the topology, so the id stays valid.
        self._shapes: dict[int, NodeShape] = {}
        # shape_key -> a built shape: another node of a known shape costs no search build.
        self._by_key: dict[tuple, NodeShape] = {}
        # (gpus, nics, numa_nodes, distance) objects -> a built shape: nodes built from one
        # profile share these, so they skip even `shape_key` (~30 µs on a DGX).
        self._by_parts: dict[tuple[int, ...], tuple[tuple, NodeShape]] = {}
        self._shape_ids: dict[tuple, int] = {}  # full shape key -> small int for memo keys
        self._caches: dict[tuple, ShapeCaches] = {}
        # Answers name no node (a `Refusal`, not an `Infeasible`): one serves every node of
        # the group.
        self._memo: dict[tuple, Choice | Refusal] = {}
        # Same key as `_memo`: the memoised answer with everything but the free VFs and
        # CPUs worked out, in shape indices (so valid for every node of the shape).
        self._plans: dict[tuple, _Plan | Refusal] = {}
        self._scores: dict[tuple, int] = {}
        # What the last request asked about needs (`_asked`).
        self._last_asked: _Asked | None = None
        # Group key -> its rail outlook (computed once per free state; docs/rails.md).
        self._outlooks: dict[tuple, RailOutlook] = {}
        # (wanted rails, free rails) -> the refusal counting proves for a required sequence:
        # one object (and one reason string) for every group with those free rails.
        self._rail_refusals: dict[tuple, Refusal] = {}
        # (shape id, search shape without rails, rails) -> key items 1–6 of the best choice
        # found without a sequence that kept those rails (`_note_rails`).
        self._kept_rails: dict[tuple, tuple] = {}
        # (shape id, search shape) -> whether the empty node fits a request by counting.
        self._empty_counts: dict[tuple, bool] = {}
        # Memo keys a feasibility-only search proved to fit (`fits`), best choice unknown.
        self._feasible: set[tuple] = set()
        # (memo key, budget) -> the refusal of a decision that spent that budget: the search
        # is deterministic, so the same budget spends again at the same state; a larger one
        # searches afresh. Kept apart from the answers above, which never hold it.
        self._spent: dict[tuple, Refusal] = {}
        # States explored by every decision so far (memo hits explore none): what a caller
        # asking about many nodes at once counts against its own cap (the extender's filter).
        self.explored = 0
        # Building a shape hands out its small id: two threads building two shapes at once
        # must not get the same one (memo keys would collide).
        self._shape_lock = threading.Lock()

    # ------------------------------------------------------------------ public

    def allocate(self, topology: NodeTopology, ledger: Ledger,
                 request: Request) -> Allocation | Infeasible:
        """The best allocation for `request` on this node now, or why there is none."""
        answer = self._allocate(topology, ledger, request, search=True)
        assert answer is not None
        return answer

    def allocate_known(self, topology: NodeTopology, ledger: Ledger,
                       request: Request) -> Allocation | Infeasible | None:
        """`allocate`'s answer when the memo holds the decision, else None: never searches,
        so any thread may ask while another one searches."""
        return self._allocate(topology, ledger, request, search=False)

    def _allocate(self, topology: NodeTopology, ledger: Ledger, request: Request,
                  search: bool) -> Allocation | Infeasible | None:
        shape = self.shape(topology)
        group = (shape.id, ledger.signature(), _odd_used(shape, ledger))
        key = (group, request.search_shape)
        plan = self._plans.get(key)
        if plan is None:
            decided = self._decide(shape, group, ledger, request, search)
            if decided is None:
                return None
            if isinstance(decided, Refusal) and decided.search_budget_spent:
                return decided.at(topology.node)  # not the shape's answer: not kept
            plan = decided if isinstance(decided, Refusal) else _plan(shape, decided, request)
            _remember(self._plans, key, plan)
        if isinstance(plan, Refusal):
            return plan.at(topology.node)
        alloc = _concrete(shape, ledger, plan)
        if request.prefer_distance is not None and alloc.pairs:
            # Recorded, never searched for: the worst pair is already the best this node has
            # (item 2 of the key), whatever the pod prefers (docs/decisions/0091).
            achieved = max(p.distance for p in alloc.pairs)
            alloc = replace(alloc, affinity=Affinity(request.prefer_distance, achieved))
        return alloc

    def group_key(self, topology: NodeTopology, ledger: Ledger | None) -> tuple:
        """Nodes with equal keys get equal answers to every request (up to their names).

        The one definition of "same machine, same free state": the shape id (hardware and
        what is offered), the ledger's signature, and the used VFs that are never offered
        (the signature does not count them). The memo is keyed by this plus the request
        shape; the extender groups nodes by it. `None` is the empty ledger.
        """
        shape = self.shape(topology)
        if ledger is None:
            return _empty_group(shape)
        return (shape.id, ledger.signature(), _odd_used(shape, ledger))

    def node_score(self, topology: NodeTopology, ledger: Ledger, request: Request) -> int:
        """0 when infeasible, else 1–10: tiers of the key, then graded packing.

        Tiers: 5 = no pair worse than PIX and as good as on the empty node (worst and summed
        distance, NUMA span, crowding), 4 = PIX but worse than empty, 3/2 = the same for
        PXB, 1 = a pair beyond PXB (no GPUDirect RDMA). Each tier owns a band of scores
        (`_BANDS`, higher tiers above lower ones); within its band a node moves up with how
        full it is after placing the pod (`binpack`) or how empty (`spread`), see `_packing`.
        A pod preferring PHB or NODE (`Request.scored_preference`) splits tier 1: a node
        whose worst pair meets the preference ranks above one beyond it (`_PREFERRED_BANDS`).
        """
        score = self._node_score(topology, ledger, request, search=True)
        assert score is not None
        return score

    def node_score_known(self, topology: NodeTopology, ledger: Ledger,
                         request: Request) -> int | None:
        """`node_score` when the memo holds what it needs, else None (never searches)."""
        return self._node_score(topology, ledger, request, search=False)

    def fits(self, topology: NodeTopology, ledger: Ledger, request: Request,
             search: bool = True) -> Infeasible | bool | None:
        """True when `request` fits this node now, else why not: the extender's filter
        question, which needs no best choice. The same answer as `allocate` (an Allocation
        exactly when True), cheaper for a `rails: required` sequence that the best choice
        without it does not keep: there a feasibility-only search answers a yes, and only a
        no costs the full decision, which says why (docs/rails.md, "Cost"). Without
        `search`, None when the answer is not known yet."""
        if not (request.rail_policy == "required" and request.wanted_rails
                and Spec.of(request).pairs):
            answer = self._allocate(topology, ledger, request, search)
            return answer if answer is None or isinstance(answer, Infeasible) else True
        shape = self.shape(topology)
        group = (shape.id, ledger.signature(), _odd_used(shape, ledger))
        key = (group, request.search_shape)  # `_decide`'s memo key
        known = self._memo.get(key)
        if known is not None:
            return True if isinstance(known, Choice) else known.at(topology.node)
        if key in self._feasible:
            return True
        plain = self._decide(shape, group, ledger, replace(request, rails=()), search)
        if plain is None:
            return None
        if isinstance(plain, Choice) and _keeps_rails(shape, plain, request):
            return True
        if not search:
            return None
        if isinstance(plain, Refusal) and not plain.search_budget_spent:
            found = False  # the sequence only narrows what fits
        else:
            found = self._feasible_with_rails(shape, group, ledger, request)
        if found:
            if len(self._feasible) >= _MEMO_LIMIT:
                self._feasible.clear()
            self._feasible.add(key)
            return True
        # No (or not known): the decision says why. Not the answer without the sequence,
        # which may be true but name a reason preemption could mend where the rails' cannot.
        answer = self._allocate(topology, ledger, request, search)
        return answer if isinstance(answer, Infeasible) else True

    def _feasible_with_rails(self, shape: NodeShape, group: tuple, ledger: Ledger,
                             request: Request) -> bool:
        """Whether anything fits with the sequence (False also when the budget ran out
        first: the full decision then says so)."""
        budget = Budget(self.search_budget)
        try:
            return feasible(shape, free_state(shape, ledger, group[1]), request, budget)
        except SearchBudgetSpent:
            return False
        finally:
            self.explored += budget.used

    @staticmethod
    def coarse_rail_bound(plain: int, request: Request) -> int:
        """`rail_score_bound(plain, request)`: the bound from the plain score alone."""
        return rail_score_bound(plain, request)

    def rail_outlook(self, topology: NodeTopology, ledger: Ledger | None) -> RailOutlook:
        """The node's rail outlook (`allocation.outlook`), once per free state. Never
        searches; any thread may ask."""
        shape = self.shape(topology)
        group = self.group_key(topology, ledger)
        known = self._outlooks.get(group)
        if known is None:
            free = empty_state(shape) if ledger is None else free_state(shape, ledger,
                                                                        group[1])
            known = RailOutlook.of(shape, free, group)
            _remember(self._outlooks, group, known)
        return known

    def _asked(self, request: Request) -> _Asked:
        """What the questions about many groups need of `request`, kept for the last request
        asked about (one object, swapped whole: another thread asking about another request
        meanwhile never mixes the two)."""
        last = self._last_asked
        if last is not None and last.request is request:
            return last
        spec = Spec.of(request)
        plain = request if not request.rails else replace(request, rails=())
        last = self._last_asked = _Asked(request, spec, request.search_shape,
                                         plain.search_shape, RailOutlook.wanted_on_rails(spec),
                                         RailOutlook.counted_rails(spec))
        return last

    def rail_fits_known(self, topology: NodeTopology, outlook: RailOutlook, request: Request,
                        plain_fits: bool, search: bool = True) -> bool | Refusal | None:
        """`fits` for a `rails: required` sequence on the node of `outlook`, given whether
        the request without the sequence fits there (`plain_fits`), without searching the
        node — for the requests `search.fits_by_counts` answers, by the outlook's counts per
        rail: True; the refusal (one object per wanted and free rails, or the empty node's
        when the sequence cannot fit the shape at all); False when the pod does not fit
        without the sequence and the refusal is that one. None: the outlook cannot say (the
        caller asks `fits`), or, without `search`, the empty node is not decided yet."""
        asked = self._asked(request)
        if asked.wanted is None:
            return None  # not a request the counts answer
        return self._rail_fits(asked, asked.wanted, topology, outlook, plain_fits, search)

    def rail_fits_known_many(
            self, request: Request, asks: Sequence[tuple[NodeTopology, RailOutlook, bool]],
            may_search: Callable[[], bool]) -> list[bool | Refusal | None]:
        """`rail_fits_known` for many groups at once (`asks`: per group a topology, its
        outlook and whether the request without the sequence fits there), the request's part
        worked out once: what the extender's filter asks of every group when a job's
        sequence is new to them. Searches only for an empty node's answer with the sequence
        (once per shape), and only while `may_search()` says so."""
        asked = self._asked(request)
        wanted = asked.wanted
        if wanted is None:
            return [None] * len(asks)
        fits = self._rail_fits
        out: list[bool | Refusal | None] = []
        for topology, outlook, plain_fits in asks:
            said = fits(asked, wanted, topology, outlook, plain_fits, False)
            if said is None and outlook.plain_pool and may_search():
                said = fits(asked, wanted, topology, outlook, plain_fits, True)
            out.append(said)
        return out

    def _rail_fits(self, asked: _Asked, wanted: tuple[tuple[int, int], ...],
                   topology: NodeTopology, outlook: RailOutlook, plain_fits: bool,
                   search: bool) -> bool | Refusal | None:
        """`rail_fits_known` for a request the counts answer (`wanted`: `asked.wanted`)."""
        counted = outlook.keeps_wanted(wanted)
        if counted is None or (counted and plain_fits):
            return counted
        spec, request = asked.spec, asked.request
        # The empty node's answer with the sequence, once per shape for this request: True
        # where it fits by counting (no search for it), else its decision.
        ideal = asked.empty.get(outlook.group[0])
        if ideal is None:
            shape = self.shape(topology)
            empty = _empty_group(shape)
            if self._memo.get((empty, asked.search_shape)) is None and \
                    self._empty_fits_by_counts(shape, asked.search_shape, spec):
                ideal = True
            else:
                ideal = self._decide(shape, empty, None, request, search)
                if ideal is None or (isinstance(ideal, Refusal) and ideal.search_budget_spent):
                    return None
            asked.empty[shape.id] = ideal
        if isinstance(ideal, Refusal):
            return ideal  # the shape cannot keep the sequence: what every node of it says
        if not plain_fits:
            return False
        key = (spec.rails, outlook.free_rails)
        refusal = self._rail_refusals.get(key)
        if refusal is None:
            refusal = Refusal(rails_reason(spec.rails, outlook.free_rails))
            _remember(self._rail_refusals, key, refusal)
        return refusal

    def _empty_fits_by_counts(self, shape: NodeShape, asked: tuple, spec: Spec) -> bool:
        """Whether `fits_by_counts` says yes on the empty node of `shape`, once per shape and
        request (`asked`: its search shape)."""
        key = (shape.id, asked)
        known = self._empty_counts.get(key)
        if known is None:
            known = bool(fits_by_counts(shape, empty_state(shape), spec))
            _remember(self._empty_counts, key, known)
        return known

    def rail_score_bound(self, topology: NodeTopology, outlook: RailOutlook, request: Request,
                         plain: int, search: bool = True) -> int | None:
        """An upper bound of `node_score(request)` on the node of `outlook`, for a request
        with a rail sequence, from `plain`, the node's score without the sequence: what
        lets the extender score exactly only the nodes that might win (docs/rails.md,
        "Cost"). Tighter than `rail_score_bound(plain, request)` where the memo holds the
        answer without the sequence: the node can equal the empty node with the sequence
        (its upper tier) only when its answer without the sequence is no worse than that
        empty node's (the sequence only adds mismatches or, required, removes choices) and
        the outlook does not prove more mismatches than the empty node has. Searches only
        for the empty node of the shape with the sequence (once per shape and sequence;
        None when that is needed without `search`)."""
        coarse = rail_score_bound(plain, request)
        asked = self._asked(request)
        spec = asked.spec
        if plain == 0 or not spec.rails:
            return coarse if spec.rails else plain
        shape = self.shape(topology)
        decided = self._memo.get((outlook.group, asked.plain_search_shape))
        if not isinstance(decided, Choice):
            return coarse
        if _keeps_rails(shape, decided, request, spec.rails) and (
                (outlook.group, asked.search_shape) in self._memo):
            return coarse  # about to be exact at no cost: nothing to gain here
        empty = _empty_group(shape)
        worst = decided.key[0]
        if spec.rails_required:
            clear = outlook.clear_worst(asked.counted, worst)
            if clear is None:
                return 0
            worst = clear  # the sequence's worst pair is at least this
        if worst > Distance.PXB:
            # Beyond PXB the band does not ask how the empty node does (`_band`): the bound
            # needs neither its answer nor a search for it.
            low, levels = _band(worst, False, request.scored_preference)
            return min(coarse, low + _packing(self.packing, levels, shape, outlook.group[1],
                                              request))
        # The empty node's answer with the sequence, key items 1–6 (mismatches: item 2),
        # known without searching it where `_empty_with_rails` knows it; else the upper tier
        # proved without it (`_no_worse_than_empty`), else the search.
        ideal: tuple | None = None
        proved = False
        if self._memo.get((empty, asked.search_shape)) is None:
            ideal = self._empty_with_rails(shape, asked)
            proved = ideal is None and self._no_worse_than_empty(shape, asked, decided, worst,
                                                                 outlook)
        if ideal is None and not proved:
            decided_empty = self._decide(shape, empty, None, request, search)
            if decided_empty is None:
                return None
            if isinstance(decided_empty, Refusal):
                # Nothing with the sequence fits the empty node: nor this one (required); a
                # spent budget says nothing.
                return (0 if not decided_empty.search_budget_spent and spec.rails_required
                        else coarse)
            ideal = decided_empty.key[:6]
        if spec.rails_required:
            same = ideal is None or (decided.key[:6] <= ideal and worst <= ideal[0])
        else:
            same = ideal is None or (
                decided.key[:6] <= (ideal[0], 0, *ideal[2:6])
                and outlook.misses_counted(asked.counted, worst) <= ideal[1])
        low, levels = _band(worst, same, request.scored_preference)
        return min(coarse, low + _packing(self.packing, levels, shape, outlook.group[1],
                                          request))

    def _no_worse_than_empty(self, shape: NodeShape, asked: _Asked, decided: Choice,
                             worst: int, outlook: RailOutlook) -> bool:
        """Whether `rail_score_bound` may take the upper tier for a node whose answer
        without the sequence is `decided`, without the empty node's answer with it: proved
        from the empty node's answer *without* the sequence (the memo's), a lower bound of
        the one with it in the key's first six items (the sequence only removes choices,
        required, or adds mismatches, preferred, which come after the worst pair; on the
        empty node a preferred sequence keeps the same worst pair, so the items after the
        mismatches are no better either). So when `decided` is no worse than the empty
        node without the sequence, it is no worse than the empty node with it:

        - required: also the sequence's own worst pair here (`worst`, raised by the
          outlook's count below) no worse than that empty node's, and the empty node known
          to keep the sequence (the counts say so for the requests they answer: never the
          empty node's refusal, which the bound would have been 0 for);
        - preferred: also no pair here counted to miss its rail at that worst pair.

        False where this cannot be shown (the caller asks the empty node with the
        sequence)."""
        low = self._empty_without_rails(shape, asked)
        if low is None or not decided.key[:6] <= low.key[:6]:
            return False
        spec = asked.spec
        if spec.rails_required:
            if asked.wanted is None or not self._empty_fits_by_counts(
                    shape, asked.search_shape, spec):
                return False
            clear = outlook.clear_worst(asked.counted, worst)
            # None: the counts refuse the sequence here; the bound is 0 whatever the empty
            # node says.
            return clear is None or clear <= low.key[0]
        return outlook.misses_counted(asked.counted, worst) == 0

    def _as_good_as_empty_without_rails(self, shape: NodeShape, request: Request,
                                        decided: Choice) -> bool:
        """Whether `decided`, a node's best choice with the request's rail sequence, is as
        good (key items 1–6) as the empty node's best without the sequence (the memo's):
        then it is as good as the empty node's with it, which lies between the two (the
        sequence only removes choices or adds mismatches; a node's choices are the empty
        node's too, with the same key), so `node_score` needs no search of the empty
        node with the sequence."""
        low = self._empty_without_rails(shape, self._asked(request))
        return low is not None and decided.key[:6] == low.key[:6]

    def _empty_with_rails(self, shape: NodeShape, asked: _Asked) -> tuple | None:
        """Key items 1–6 of the empty node's best choice with the request's rail sequence,
        where known without a search: when a best choice *without* the sequence, on any
        node of the shape, kept exactly that sequence (`_note_rails`) and was as good as the
        empty node's best without it (the memo's). That choice is the empty node's too,
        with the same key (a choice's key depends on it alone), so the empty node's best
        with the sequence is no worse than it, and no better than the best without the
        sequence: it is that key. None where this is not known (the caller searches)."""
        spec = asked.spec
        if not spec.rails:
            return None
        kept = self._kept_rails.get((shape.id, asked.plain_search_shape, spec.rails))
        if kept is None:
            return None
        low = self._empty_without_rails(shape, asked)
        if low is None or low.key[:6] != kept:
            return None
        return kept

    def _empty_without_rails(self, shape: NodeShape, asked: _Asked) -> Choice | None:
        """The empty node's best choice for the request without its rail sequence, where the
        memo holds one: what the proofs that spare the search with the sequence start from
        (the sequence only removes choices or adds mismatches)."""
        low = self._memo.get((_empty_group(shape), asked.plain_search_shape))
        return low if isinstance(low, Choice) else None

    def _note_rails(self, shape: NodeShape, request: Request, choice: Choice) -> None:
        """Keep, for a best choice just decided for a request without a rail sequence, the
        rails it keeps and its key items 1–6 (the best such key per shape, request and
        rails): what `_empty_with_rails` reads. A job's sequence is most often what the
        best choice of its first pod kept."""
        rails = [shape.pf_rail[t[0]] for t in choice.targets if t is not None]
        while rails and rails[-1] < 0:
            rails.pop()
        if not rails:
            return
        key = (shape.id, request.search_shape, tuple(rails))
        known = self._kept_rails.get(key)
        if known is None or choice.key[:6] < known:
            _remember(self._kept_rails, key, choice.key[:6])

    def _node_score(self, topology: NodeTopology, ledger: Ledger, request: Request,
                    search: bool) -> int | None:
        group = self.group_key(topology, ledger)
        key = (group, request.shape)  # the preference is part of it: it moves the score
        score = self._scores.get(key)
        if score is not None:
            return score
        shape = self.shape(topology)
        decided = self._decide(shape, group, ledger, request, search)
        if decided is None:
            return None
        spent = isinstance(decided, Refusal) and decided.search_budget_spent
        if isinstance(decided, Refusal):
            score = 0
        else:
            worst = decided.key[0] if Spec.of(request).pairs else int(Distance.PIX)
            same = False  # beyond PXB the band does not ask: no empty node to compare with
            if worst <= Distance.PXB:
                compared, spent = self._as_good_as_empty(shape, request, decided, search)
                if compared is None:
                    return None
                same = compared
            low, levels = _band(worst, same, request.scored_preference)
            score = low + _packing(self.packing, levels, shape, group[1], request)
        if spent:
            return score  # depends on the budget, not only on the shape: not kept
        _remember(self._scores, key, score)
        return score

    def _as_good_as_empty(self, shape: NodeShape, request: Request, decided: Choice,
                          search: bool) -> tuple[bool | None, bool]:
        """Whether `decided`, a node's best choice, is as good as the empty node's (key
        items 1–6), and whether finding out spent the search budget (the score then depends
        on the budget). None, without `search`, where the empty node is not decided yet."""
        empty = _empty_group(shape)
        # The empty node with the sequence, known without searching it (see there).
        unknown = bool(request.wanted_rails) and self._memo.get(
            (empty, request.search_shape)) is None
        known = self._empty_with_rails(shape, self._asked(request)) if unknown else None
        if known is not None:
            return decided.key[:6] == known, False
        if unknown and self._as_good_as_empty_without_rails(shape, request, decided):
            return True, False
        ideal = self._decide(shape, empty, None, request, search)
        if ideal is None:
            return None, False
        # An empty node whose search spends the budget: not known to be as good.
        if isinstance(ideal, Refusal):
            return False, ideal.search_budget_spent
        # Worst and summed distance, rail mismatches, span and crowding.
        return decided.key[:6] == ideal.key[:6], False

    def shape(self, topology: NodeTopology) -> NodeShape:
        """The search view of a topology: built once per shape, then shared by every
        topology object of that shape (only device names are per node)."""
        shape = self._shapes.get(id(topology))
        if shape is not None and shape.topology is topology:
            return shape
        with self._shape_lock:
            return self._shape(topology)

    def _shape(self, topology: NodeTopology) -> NodeShape:
        parts = (topology.gpus, topology.nics, topology.numa_nodes, topology.distance)
        ids = tuple(map(id, parts))
        seen = self._by_parts.get(ids)
        if seen is not None and all(map(operator.is_, seen[0], parts)):
            known: NodeShape | None = seen[1]
        else:
            known = self._by_key.get(topology.shape_key)
        if known is None:
            shape = build_shape(topology, self._caches, self._shape_ids)
            if len(self._by_key) >= _SHAPE_LIMIT:
                self._by_key.clear()
            self._by_key[shape.key] = shape
        else:
            shape = same_shape(known, topology)
        if seen is None:
            if len(self._by_parts) >= _SHAPE_LIMIT:
                self._by_parts.clear()
            self._by_parts[ids] = (parts, shape)  # holds the parts: their ids stay theirs
        if len(self._shapes) >= _SHAPE_LIMIT:
            self._shapes.clear()
        self._shapes[id(topology)] = shape
        return shape

    # ------------------------------------------------------------------ memo

    def _decide(self, shape: NodeShape, group: tuple, ledger: Ledger | None,
                request: Request, search: bool = True) -> Choice | Refusal | None:
        """The memo's decision, else (with `search`) a new one; None when it would search."""
        key = (group, request.search_shape)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        limit = self.search_budget
        spent = self._spent.get((key, limit))
        if spent is not None:
            return spent
        asked = request
        if request.wanted_rails:
            # The best choice without the job's rails, when it keeps them, is the best with
            # them (it wins on the worst pair, and ties it with no mismatch); and a preferred
            # sequence never changes whether a pod fits. Both come from the memo of pods
            # without a job more often than not (docs/decisions/0089).
            plain = self._decide(shape, group, ledger, replace(request, rails=()), search)
            if plain is None:
                return None
            if ((isinstance(plain, Choice) and _keeps_rails(shape, plain, request))
                    or (isinstance(plain, Refusal) and not plain.search_budget_spent
                        and request.rail_policy != "required")):
                _remember(self._memo, key, plain)
                return plain
            if isinstance(plain, Choice) and request.rail_policy == "preferred" and Spec.of(
                    request).pairs:
                # The worst pair comes before the rails in the key: the best with them has
                # the same worst pair as the best without, so search only that far.
                worst = Distance(plain.key[0])
                if request.max_distance is None or worst < request.max_distance:
                    asked = replace(request, max_distance=worst)
        if not search:
            return None
        budget = Budget(limit)
        try:
            hit = self._search(shape, group, ledger, asked, budget)
        finally:
            self.explored += budget.used
        if hit is None:
            assert limit is not None
            spent = budget_refusal(request, limit)
            _remember(self._spent, (key, limit), spent)
            return spent
        _remember(self._memo, key, hit)
        if isinstance(hit, Choice) and not request.wanted_rails:
            self._note_rails(shape, request, hit)
        return hit

    def _search(self, shape: NodeShape, group: tuple, ledger: Ledger | None, request: Request,
                budget: Budget) -> Choice | Refusal | None:
        """The decision itself: the best choice, or why none; None when the search spent
        the budget before it could say."""
        free = empty_state(shape) if ledger is None else free_state(shape, ledger, group[1])
        try:
            # A no that counting proves needs no search (docs/rails.md, "Cost").
            found = None if fits_by_counts(shape, free, Spec.of(request)) is False else search(
                shape, free, request, budget)
        except SearchBudgetSpent:
            return None
        if found is None:
            # Nothing fits: proved. What is left of the budget goes to saying why; a check
            # that spends it leaves the plainer reason (and preemption allowed).
            empty = free if ledger is None else empty_state(shape)
            try:
                unresolvable = ledger is None or not feasible(shape, empty, request, budget)
            except SearchBudgetSpent:
                unresolvable = False
            return explain(shape, empty if unresolvable else free, request, unresolvable,
                           budget)
        return found


@dataclass(frozen=True, slots=True)
class _Asked:
    """A request as the questions about many groups need it, worked out once per request."""

    request: Request
    spec: Spec
    search_shape: tuple
    plain_search_shape: tuple  # the request's without its rail sequence
    # (rail, pairs wanting it) of a required sequence whose answer the outlook's counts
    # give (`RailOutlook.wanted_on_rails`); None for every other request.
    wanted: tuple[tuple[int, int], ...] | None
    counted: tuple[tuple[int, int], ...] | None  # `RailOutlook.counted_rails`
    # Shape id -> the empty node's answer with the sequence as `rail_fits_known` needs it
    # (True: fits by counting), filled as groups are asked: once per shape per request.
    empty: dict[int, Choice | Refusal | bool] = field(default_factory=dict)


# Score band per tier: (lowest score, number of packing levels). Tiers never overlap, so
# packing never outranks a better tier; the common tiers (PIX, PXB) get the most levels.
_BANDS = {5: (7, 4), 4: (5, 2), 3: (3, 2), 2: (2, 1), 1: (1, 1)}
# With a preference beyond PXB (PHB, NODE), tier 1 splits in two: 1 = its worst pair meets
# the preference, 0 = it does not. The room comes from tier 3's packing levels: ranking by
# the preference the pod asked for is worth more than grading PXB nodes by fullness.
_PREFERRED_BANDS = {5: (7, 4), 4: (5, 2), 3: (4, 1), 2: (3, 1), 1: (2, 1), 0: (1, 1)}


def _empty_group(shape: NodeShape) -> tuple:
    """The group key of an empty node of `shape` (`Allocator.group_key` with no ledger)."""
    return (shape.id, _EMPTY_SIGNATURE, ())


def _remember(memo: dict, key: object, value: object) -> None:
    """Keep `value` in one of the allocator's memos, emptied first once it holds
    _MEMO_LIMIT entries (a cheap bound: the answers come back by searching again)."""
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = value


def _band(worst: int, same: bool, preferred: int | None) -> tuple[int, int]:
    """The score band (lowest score, levels) of a node whose best choice has `worst` as its
    worst pair, `same` when that choice is as good as the empty node's (key items 1–6);
    `preferred`: the pod's scored distance preference, if any (docs/allocation.md)."""
    if worst <= Distance.PIX:
        tier = 5 if same else 4
    elif worst <= Distance.PXB:
        tier = 3 if same else 2
    elif preferred is not None and worst > preferred:
        tier = 0  # beyond PXB and beyond what the pod prefers
    else:
        tier = 1
    return (_BANDS if preferred is None else _PREFERRED_BANDS)[tier]


def rail_score_bound(plain: int, request: Request) -> int:
    """An upper bound of a node's `node_score` for `request` with its job's rail sequence
    (preferred or required), from the node's score for it without one (`plain`).

    The sequence never improves the worst pair (preferred: the same one, item 2 comes
    before the rails; required: only fewer choices), and packing does not depend on it, so
    the node stays in its band or falls below it. Within a band it may rise from the lower
    tier ("worse than the empty node") to the upper one: the empty node it is compared with
    is held to the same sequence, and may be worse off with it than without. So a score in
    tier 4 or 2 is bounded by the top of tier 5 or 3; any other score by itself. 0 (the pod
    does not fit) stays 0."""
    bands = _BANDS if request.scored_preference is None else _PREFERRED_BANDS
    for tier, (low, levels) in bands.items():
        if low <= plain < low + levels:
            if tier in (4, 2):
                top, top_levels = bands[tier + 1]
                return top + top_levels - 1
            return plain
    return plain


def _packing(packing: Packing, levels: int, shape: NodeShape, signature: tuple,
             request: Request) -> int:
    """0..levels−1, higher for the node the packing prefers.

    binpack: an idle node is 0 (kept whole for big pods); a node in use climbs with the
    share of its GPUs (VFs on a GPU-less node) held once the pod is placed, the top level
    only for a pod that fills it. spread: the mirror image.
    """
    if levels == 1:
        return 0
    if any(signature):
        total = len(shape.gpus)
        if total:
            used = len(signature[0]) + request.gpus
        else:
            total = sum(map(len, shape.vfs)) or 1
            used = sum(c for _, c in signature[1]) + request.all_vfs
        level = 1 + (levels - 2) * min(used, total) // total
    else:
        level = 0
    return level if packing == "binpack" else levels - 1 - level


def _keeps_rails(shape: NodeShape, choice: Choice, request: Request,
                 wanted: tuple[int, ...] | None = None) -> bool:
    """Whether every pair of `choice` (pair order: its paired GPUs in order) is on the rail
    the request's sequence wants there."""
    if wanted is None:
        wanted = Spec.of(request).rails
    rails = [shape.pf_rail[t[0]] for t in choice.targets if t is not None]
    return all(w < 0 or (p < len(rails) and rails[p] == w) for p, w in enumerate(wanted))


def _odd_used(shape: NodeShape, ledger: Ledger) -> tuple:
    """Used VFs that were never offered: not in the signature's counts, so in the memo key."""
    if not shape.nonallocatable_vfs:
        return ()
    return tuple(sorted(v for v in ledger.used_vfs if v in shape.nonallocatable_vfs))


@dataclass(frozen=True, slots=True)
class _Plan:
    """A memoised `Choice` worked out up to which VFs and CPUs are free (shape indices).

    `_concrete` then only picks the lowest free VF index of each PF and the lowest free
    CPUs, and fetches the record objects; everything here holds for any node of the shape.
    """

    takes: tuple[tuple[int, int], ...]  # (PF, VFs to pick) of the paired pool, ascending
    pool: int  # the paired pool's index in `shape.pool_names`
    # Other pools' VFs, all unpaired: (PF, pool index, VFs to pick).
    other_takes: tuple[tuple[int, int, int], ...]
    whole: tuple[int, ...]  # PFs taken whole
    pairs: tuple[tuple[int, int, int], ...]  # (GPU, PF, instance of that PF), in pair order
    lone: tuple[int, ...]  # GPUs without a NIC
    unpaired: tuple[tuple[int, int], ...]  # (PF, instance) paired with no GPU
    cpus: tuple[tuple[int, int], ...]  # (NUMA bit, CPUs)
    exclusive: bool
    numa_nodes: tuple[int, ...]  # real ids
    memory_bytes: tuple[tuple[int, int], ...]
    bandwidth: int = 0  # each VF's share, percent (0: none asked)


def _plan(shape: NodeShape, choice: Choice, request: Request) -> _Plan:
    """Work out a choice once, when it is memoised: pair slots, NUMA ids, memory."""
    counts: dict[int, int] = {j: t for j, t in enumerate(choice.vf_counts) if t}
    for j in choice.whole:
        counts[j] = 1
    # GPUs served by each PF, in GPU order; spread over its instances as evenly as possible
    # (one-to-one: one GPU each, extra instances stay unpaired).
    served: dict[int, list[int]] = {}
    for pos, target in enumerate(choice.targets):
        if target is not None:
            served.setdefault(target[0], []).append(pos)
    slot_at: dict[int, tuple[int, int]] = {}
    unpaired: list[tuple[int, int]] = []
    for j, n_refs in counts.items():
        positions = served.get(j)
        if not positions:
            unpaired.extend((j, n) for n in range(n_refs))
            continue
        q, r = divmod(len(positions), n_refs)
        at = 0
        for n in range(n_refs):
            count = q + 1 if n < r else q
            if count == 0:
                unpaired.append((j, n))
            for pos in positions[at:at + count]:
                slot_at[pos] = (j, n)
            at += count
    pairs: list[tuple[int, int, int]] = []
    lone: list[int] = []
    for pos, i in enumerate(choice.gpus):
        slot = slot_at.get(pos)
        if slot is None:
            lone.append(i)
        else:
            pairs.append((i, *slot))
    ids = shape.numa_ids
    return _Plan(
        takes=tuple((j, t) for j, t in enumerate(choice.vf_counts) if t),
        pool=choice.pool,
        other_takes=tuple((j, q, t) for q, counts in choice.other_counts
                          for j, t in enumerate(counts) if t),
        whole=choice.whole,
        pairs=tuple(pairs),
        lone=tuple(lone),
        unpaired=tuple(unpaired),
        cpus=choice.cpus,
        exclusive=bool(request.exclusive_cpus),
        numa_nodes=tuple(ids[b] for b in range(len(ids)) if (choice.numa_mask >> b) & 1),
        memory_bytes=tuple((ids[b], m) for b, m in choice.memory),
        bandwidth=request.vf_bandwidth,
    )


def _concrete(shape: NodeShape, ledger: Ledger, plan: _Plan) -> Allocation:
    """Devices for a plan: lowest free VF index per PF, lowest free CPUs."""
    used_vfs = ledger.used_vfs
    pooled = len(shape.pool_names) > 1

    def pick(j: int, q: int, t: int) -> list[tuple[int, NicRef]]:
        got: list[tuple[int, NicRef]] = []
        in_pool = shape.vf_pool[j]
        for p, (address, ref) in enumerate(shape.vf_refs[j]):
            if address not in used_vfs and (not pooled or in_pool[p] == q):
                got.append((p, ref))
                if len(got) == t:
                    break
        return got

    # Per PF, the picked instances as (position in `shape.vf_refs[j]`, ref); −1 = whole.
    picked: dict[int, list[tuple[int, NicRef]]] = {}
    for j, t in plan.takes:
        picked[j] = pick(j, plan.pool, t)
    for j in plan.whole:
        picked[j] = [(-1, shape.pf_refs[j])]

    cache = shape.pair_cache
    pairs: list[Pair] = []
    for i, j, n in plan.pairs:
        p, ref = picked[j][n]
        pair = cache.get((i, j, p))
        if pair is None:
            rail = shape.pf_rail[j]
            pair = cache[(i, j, p)] = Pair(shape.gpu_refs[i], ref, shape.distances[i][j],
                                           None if rail < 0 else rail)
        pairs.append(pair)
    unpaired_nics = [picked[j][n][1] for j, n in plan.unpaired]
    for j, q, t in plan.other_takes:
        unpaired_nics += [ref for _, ref in pick(j, q, t)]
    if len(unpaired_nics) > 1:
        unpaired_nics.sort(key=lambda n: n.pci_address)

    cpus: list[int] = []
    if plan.cpus:
        used_cpus = ledger.used_cpus
        for bit, count in plan.cpus:
            taken = 0
            for c in shape.cpus[bit]:
                if c not in used_cpus:
                    cpus.append(c)
                    taken += 1
                    if taken == count:
                        break
    gpu_refs = shape.gpu_refs
    if plan.bandwidth:  # each VF records its share (docs/decisions/0093)
        share = plan.bandwidth
        pairs = [replace(p, nic=replace(p.nic, bandwidth=share)) if p.nic.kind == "vf" else p
                 for p in pairs]
        unpaired_nics = [replace(n, bandwidth=share) if n.kind == "vf" else n
                         for n in unpaired_nics]
    return Allocation(
        node=shape.topology.node,
        numa_nodes=plan.numa_nodes,
        cpus=format_cpulist(cpus) if plan.exclusive else None,
        memory_bytes=plan.memory_bytes,
        pairs=tuple(pairs),
        nics=tuple(unpaired_nics),
        gpus=tuple(gpu_refs[i] for i in plan.lone),
    )


def allocate(topology: NodeTopology, ledger: Ledger, request: Request) -> Allocation | Infeasible:
    """One allocation with a fresh (cold) allocator; hold an `Allocator` to reuse its memo."""
    return Allocator().allocate(topology, ledger, request)
