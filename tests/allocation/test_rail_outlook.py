"""A group's rail outlook (`allocation.outlook`, docs/decisions/0096) against the full search:
on random small railed nodes and ledgers, the bounds it gives never undercut what the search
finds, and the answers it gives for `rails: required` are the search's own."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_allocator_key import ledgers
from test_rail_key import (
    RAIL,
    first_two_gpus_held,
    plainest,
    railed_requests,
    railed_topologies,
)

from railyard.allocation.allocator import Allocator, rail_score_bound
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.search import Spec, search
from railyard.allocation.shape import free_state
from railyard.allocation.types import Infeasible, Refusal
from railyard.topology.model import Distance
from support.searching import SearchingEmpty


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), packing=st.sampled_from(["binpack", "spread"]))
def test_score_bounds_never_undercut_the_exact_score_with_the_sequence(data, packing):
    """`rail_score_bound` (from the plain score alone) and `Allocator.rail_score_bound` (with
    the outlook) are upper bounds of `node_score` with the sequence, preferred or required:
    what lets the extender score exactly only the groups that might win."""
    t = data.draw(railed_topologies())
    ledger = data.draw(ledgers(t))
    r = data.draw(railed_requests(t))
    r = replace(r, rail_policy=data.draw(st.sampled_from(["preferred", "required"])),
                prefer_distance=data.draw(st.sampled_from([None, None, Distance.PHB,
                                                           Distance.NODE])))
    alloc = Allocator(packing)
    plain = alloc.node_score(t, ledger, replace(r, rails=()))
    exact = Allocator(packing).node_score(t, ledger, r)  # a fresh memo: nothing shared
    assert rail_score_bound(plain, r) >= exact, (plain, exact)
    fine = alloc.rail_score_bound(t, alloc.rail_outlook(t, ledger), r, plain)
    assert fine is not None and rail_score_bound(plain, r) >= fine >= exact, (plain, fine, exact)
    assert alloc.node_score(t, ledger, r) == exact  # asking the bound changed no answer


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_missed_rails_are_a_lower_bound_of_the_searched_mismatches(data):
    """`misses_at_least(spec, worst)` never exceeds the mismatches of the best choice with
    the sequence whose pairs are all within `worst`."""
    t = data.draw(railed_topologies())
    ledger = data.draw(ledgers(t))
    r = replace(data.draw(plainest(t)), rail_policy="preferred", vf_bandwidth=0)
    alloc = Allocator()
    shape = alloc.shape(t)
    outlook = alloc.rail_outlook(t, ledger)
    free = free_state(shape, ledger, ledger.signature())
    found = search(shape, free, r)
    if found is None or not Spec.of(r).pairs:
        return
    worst = found.key[0]
    assert outlook.misses_at_least(Spec.of(r), worst) <= found.key[1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_required_fits_from_the_outlook_is_the_allocators_answer(data):
    """`rail_fits_known` for a required sequence says what `fits` says — True, or a refusal
    with the same reason and the same resolvability — wherever it answers (None: it leaves
    the question to `fits`); `rail_fits_known_many`, the filter's batch, says the same."""
    t = data.draw(railed_topologies())
    ledger = data.draw(ledgers(t))
    r = replace(data.draw(plainest(t)), rail_policy="required",
                rails=tuple(data.draw(st.lists(RAIL, min_size=1, max_size=4))))
    alloc = Allocator()
    plain_fits = alloc.fits(t, ledger, replace(r, rails=())) is True
    said = alloc.rail_fits_known(t, alloc.rail_outlook(t, ledger), r, plain_fits)
    # The filter's batch says the same, and without leave to search only what it knows.
    for may_search in (True, False):
        fresh = Allocator()
        [batch] = fresh.rail_fits_known_many(
            r, [(t, fresh.rail_outlook(t, ledger), plain_fits)], lambda m=may_search: m)
        assert batch == said or (not may_search and batch is None), (may_search, batch, said)
    truth = Allocator().fits(t, ledger, r)
    if said is None:
        return
    if said is True:
        assert truth is True
        return
    assert isinstance(truth, Infeasible)
    refusal = said if isinstance(said, Refusal) else alloc.fits(
        t, ledger, replace(r, rails=())).refusal  # type: ignore[union-attr]
    assert refusal is not None
    assert (refusal.text(t.node), refusal.unresolvable) == (truth.reason, truth.unresolvable)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_counts_per_request_say_what_the_mismatch_count_says(data):
    """`required_fits` from the request's wanted rails (`wanted_on_rails`, worked out once
    per request, and `keeps_wanted` per group) is the count of decision 0096: None where the
    counts do not apply, else whether no pair must miss its rail."""
    t = data.draw(railed_topologies())
    ledger = data.draw(ledgers(t))
    r = data.draw(st.one_of(plainest(t), railed_requests(t)))
    r = replace(r, rail_policy=data.draw(st.sampled_from(["required", "preferred"])))
    outlook = Allocator().rail_outlook(t, ledger)
    spec = Spec.of(r)
    applies = (spec.rails_required and outlook.counts_apply(spec) and spec.pairs == spec.gpus
               and spec.max_distance >= Distance.SYS and spec.numa != "single"
               and spec.cpus == 0 and spec.memory == 0 and not spec.others)
    assert outlook.required_fits(spec) == (
        (outlook.misses_at_least(spec) == 0) if applies else None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), packing=st.sampled_from(["binpack", "spread"]))
def test_sparing_the_empty_nodes_search_changes_no_bound_and_no_score(data, packing):
    """With the empty node's answer without the sequence in the memo (as prioritize has it,
    having scored every group without the sequence first), the refined bound and the exact
    score with the sequence are what searching the empty node with the sequence gives."""
    t = data.draw(railed_topologies())
    ledger = data.draw(ledgers(t))
    r = data.draw(st.one_of(railed_requests(t), plainest(t)))
    r = replace(r, rail_policy=data.draw(st.sampled_from(["preferred", "required"])),
                prefer_distance=data.draw(st.sampled_from([None, None, Distance.PHB])))
    if not r.wanted_rails:
        r = replace(r, rails=(0,))
    answers = []
    for alloc in (Allocator(packing), SearchingEmpty(packing)):
        empty = Ledger(t)
        alloc.node_score(t, empty, replace(r, rails=()))  # the empty node, no sequence
        plain = alloc.node_score(t, ledger, replace(r, rails=()))
        fine = alloc.rail_score_bound(t, alloc.rail_outlook(t, ledger), r, plain)
        answers.append((plain, fine, alloc.node_score(t, ledger, r),
                        alloc.node_score(t, empty, r)))
    assert answers[0] == answers[1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_outlook_is_what_its_definition_counts(data):
    """`RailOutlook.of` against its definition written plainly: per rail, the free VFs on
    its PFs and, per free GPU, the distance to the nearest of them with a free VF; the
    rails of the PFs with a free VF or free whole."""
    t = data.draw(railed_topologies())
    ledger = data.draw(ledgers(t))
    alloc = Allocator()
    shape = alloc.shape(t)
    free = free_state(shape, ledger, ledger.signature())
    outlook = alloc.rail_outlook(t, ledger)
    pfs = range(len(shape.pfs))
    rails = {shape.pf_rail[j] for j in pfs if free.vfs[j] and shape.pf_rail[j] >= 0}
    gpus = [i for i in range(len(shape.gpus)) if (free.gpus >> i) & 1]
    assert outlook.free_gpus == len(gpus)
    assert outlook.vfs_on == {r: sum(free.vfs[j] for j in pfs if shape.pf_rail[j] == r)
                              for r in rails}
    assert outlook.reach == {
        r: tuple(sorted(min(shape.dist[i][j] for j in pfs
                            if shape.pf_rail[j] == r and free.vfs[j]) for i in gpus))
        for r in rails}
    assert outlook.free_rails == tuple(sorted(
        {shape.pf_rail[j] for j in pfs
         if (free.vfs[j] or free.whole_ok[j]) and shape.pf_rail[j] >= 0}))


def test_outlook_counts_free_vfs_and_near_gpus_per_rail():
    """dgx-h100, GPUs 0 and 1 held: rails 0 and 1 still have free VFs, but no free GPU is
    PIX to them, so a preferred pair on rail 0 at a PIX worst pair must miss it."""
    alloc = Allocator()
    t, held = first_two_gpus_held(alloc)
    outlook = alloc.rail_outlook(t, held)
    assert outlook.free_gpus == 6 and outlook.vfs_on[0] == 1 and outlook.vfs_on[2] == 2
    assert alloc.rail_outlook(t, held) is outlook  # once per free state
    spec = Spec.of(Request(gpus=1, vfs=1, rails=(0,)))
    assert outlook.misses_at_least(spec, 0) == 1  # PIX
    assert outlook.misses_at_least(spec) == 0  # some free GPU reaches rail 0 at all
