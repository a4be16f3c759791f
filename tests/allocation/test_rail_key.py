"""The allocator's key with rail sequences (docs/allocation.md item 3, docs/rails.md) equals
the brute-force minimum: random small nodes whose NICs are on random rails (some on none,
some sharing one), random ledgers, and requests carrying a job's rail sequence, required or
preferred. A required sequence that cannot be met is infeasible, and says so."""

from __future__ import annotations

from dataclasses import replace

from alloc_brute import brute_force
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_allocator_key import check_exact, ledgers, topologies

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.search import SEARCH_BUDGET, Budget, Search, Spec, fits_by_counts
from railyard.allocation.shape import free_state
from railyard.allocation.types import Allocation, Infeasible
from railyard.discovery.profiles import DGX_H100, HGX_H100_4NIC, build_topology
from railyard.topology.model import Distance, NodeTopology
from support.allocations import allocation, nearest_vf

RAIL = st.sampled_from([None, 0, 1, 2])


@st.composite
def railed_topologies(draw, min_gpus: int = 1) -> NodeTopology:
    t = draw(topologies(min_gpus))
    return replace(t, nics=tuple(replace(n, rail=draw(RAIL)) for n in t.nics))


@st.composite
def railed_requests(draw, t: NodeTopology, shared: bool = False) -> Request:
    gpus = draw(st.integers(2 if shared else 1, len(t.gpus) if shared else min(3, len(t.gpus))))
    vfs = draw(st.integers(1, gpus - 1)) if shared else draw(st.integers(1, 3))
    return Request(
        gpus=gpus, vfs=vfs,
        pfs=draw(st.sampled_from([0, 0, 1])),
        max_distance=draw(st.one_of(st.none(), st.none(), st.sampled_from(list(Distance)))),
        numa=draw(st.sampled_from(["preferred", "preferred", "single", "none"])),
        pairing_hint=draw(st.sampled_from([None, None, None, "one-to-one", "shared"])),
        rails=tuple(draw(st.lists(RAIL, min_size=1, max_size=4))),
        rail_policy=draw(st.sampled_from(["preferred", "preferred", "required", "none"])),
    )


def check(data, shared: bool = False) -> None:
    t = data.draw(railed_topologies(3 if shared else 1))
    ledger = data.draw(ledgers(t))
    r = data.draw(railed_requests(t, shared))
    alloc = Allocator(search_budget=SEARCH_BUDGET)
    result = alloc.allocate(t, ledger, r)
    check_exact(t, ledger, r, result)
    if not isinstance(result, Allocation):
        return
    rails = {n.pci_address: n.rail for n in t.nics}
    assert result.rails == tuple(rails[p.nic.pf_pci_address] for p in result.pairs)
    if r.rail_policy == "required":
        assert all(w is None or w == got for w, got in zip(r.rails, result.rails, strict=False))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_rail_sequences_required_or_preferred_match_brute_force_minimum(data):
    check(data)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_rail_sequences_under_shared_pairing_match_brute_force_minimum(data):
    check(data, shared=True)


def first_two_gpus_held(alloc: Allocator) -> tuple[NodeTopology, Ledger]:
    """dgx-h100 (2 VFs per PF) with GPUs 0 and 1 held by a pod without a job, which `alloc`
    placed on rails 0 and 1: those rails keep free VFs but no free GPU at PIX to them."""
    t = build_topology(DGX_H100, 2)
    held = Ledger(t)
    first = alloc.allocate(t, held, Request(gpus=2, vfs=2))
    assert isinstance(first, Allocation) and first.rails == (0, 1)
    held.add("first", first)
    return t, held


def test_a_preferred_sequence_moves_pairs_onto_their_rails_before_the_sum_of_distances():
    """dgx-h100 with GPUs 0 and 1 held: a 2-GPU pod of a job on rails (0, 1) elsewhere gets
    no rail-matching PIX pair here; preferred, it takes the GPUs 2, 3 (PIX, rails 2, 3);
    asked for rails (2, 3) it gets them at PIX; required (0, 1) it is refused."""
    t = build_topology(DGX_H100, 2)
    alloc = Allocator()
    empty = Ledger(t)
    got = alloc.allocate(t, empty, Request(gpus=2, vfs=2, rails=(2, 3)))
    assert isinstance(got, Allocation)
    assert got.rails == (2, 3) and {p.distance for p in got.pairs} == {Distance.PIX}
    t, held = first_two_gpus_held(alloc)
    preferred = alloc.allocate(t, held, Request(gpus=2, vfs=2, rails=(0, 1)))
    assert isinstance(preferred, Allocation)
    required = alloc.allocate(t, held, Request(gpus=2, vfs=2, rails=(0, 1),
                                               rail_policy="required"))
    assert isinstance(required, Allocation)
    # Rails 0 and 1 still have free VFs: the pairs take them, through farther GPUs.
    assert required.rails == (0, 1)
    assert alloc.node_score(t, held, Request(gpus=2, vfs=2, rails=(0, 1))) < alloc.node_score(
        t, Ledger(t), Request(gpus=2, vfs=2, rails=(0, 1)))


def test_a_node_with_fewer_nics_than_gpus_shares_rails_in_pair_order():
    """hgx-h100-4nic: 8 GPUs, NICs on rails 0–3; shared pairing gives pairs the rails
    (0, 0, 1, 1, …); a sequence learned on such a node is met by another one exactly."""
    t = build_topology(HGX_H100_4NIC, 2)
    alloc = Allocator()
    first = alloc.allocate(t, Ledger(t), Request(gpus=8, vfs=4))
    assert isinstance(first, Allocation)
    again = alloc.allocate(t, Ledger(t), Request(gpus=8, vfs=4, rails=first.rails,
                                                 rail_policy="required"))
    assert isinstance(again, Allocation) and again.rails == first.rails
    refused = alloc.allocate(t, Ledger(t), Request(gpus=2, vfs=2, rails=(5, 6),
                                                   rail_policy="required"))
    assert isinstance(refused, Infeasible) and "rail" in refused.reason


def test_four_pods_of_a_job_on_four_differently_used_nodes_get_one_rail_sequence():
    """The allocator alone: the first pod's rails, handed to the next three pods as their
    job's sequence, are what each of them gets, although packing alone would put each on
    other rails (the nodes hold different GPUs)."""
    alloc = Allocator()
    nodes = [build_topology(DGX_H100, 2, node=f"n{i}") for i in range(4)]
    ledgers = [Ledger(t) for t in nodes]
    t2 = nodes[2]  # GPUs 4-7 held: packing alone would take 0-1
    ledgers[2].add("other", allocation(t2, [(g, nearest_vf(t2, g)) for g in (4, 5, 6, 7)]))
    for ledger, sizes in zip(ledgers, ([2], [], [], [1]), strict=True):
        for k, gpus in enumerate(sizes):
            other = alloc.allocate(ledger.topology, ledger, Request(gpus=gpus, vfs=gpus))
            assert isinstance(other, Allocation)
            ledger.add(f"other-{k}", other)
    first = alloc.allocate(nodes[0], ledgers[0], Request(gpus=2, vfs=2))
    assert isinstance(first, Allocation)
    plain = [alloc.allocate(t, lg, Request(gpus=2, vfs=2)) for t, lg in zip(nodes, ledgers,
                                                                             strict=True)]
    assert len({a.rails for a in plain if isinstance(a, Allocation)}) > 1
    for policy in ("preferred", "required"):
        job = [alloc.allocate(t, lg, Request(gpus=2, vfs=2, rails=first.rails,
                                             rail_policy=policy))
               for t, lg in zip(nodes, ledgers, strict=True)]
        assert [a.rails for a in job if isinstance(a, Allocation)] == [first.rails] * 4, policy


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), decided_first=st.booleans())
def test_fits_under_a_required_sequence_agrees_with_brute_force(data, decided_first):
    """`Allocator.fits`, the filter's question (a feasibility-only search where the best
    choice without the sequence does not keep it), says True exactly when brute force finds
    a choice, and its no is the decision's own refusal; asked before or after the full
    decision (whose memo it then reads), the same answer."""
    t = data.draw(railed_topologies())
    ledger = data.draw(ledgers(t))
    r = replace(data.draw(railed_requests(t)), rail_policy="required")
    alloc = Allocator(search_budget=SEARCH_BUDGET)
    decided = alloc.allocate(t, ledger, r) if decided_first else None
    got = alloc.fits(t, ledger, r)
    best = brute_force(t, ledger, r)
    if best is None:
        assert isinstance(got, Infeasible) and got.reason
        assert got.reason == Allocator().allocate(t, ledger, r).reason
    else:
        assert got is True, got
    if decided is not None:
        assert (got is True) == isinstance(decided, Allocation)
    assert alloc.fits(t, ledger, r, search=False) == got  # now known without a search


def test_fits_answers_a_required_sequence_without_the_full_decision():
    """dgx-h100 with GPUs 0 and 1 held, a job on rails (0, 1): the pod fits (farther GPUs
    reach those rails), and `fits` says so from a feasibility-only search, leaving the best
    choice undecided (allocate_known still has none) — what makes the extender's filter
    cheap for `rails: required` (docs/rails.md, "Cost")."""
    alloc = Allocator()
    t, held = first_two_gpus_held(alloc)
    job = Request(gpus=2, vfs=2, rails=(0, 1), rail_policy="required")
    assert alloc.fits(t, held, job) is True
    assert alloc.allocate_known(t, held, job) is None
    refused = alloc.fits(t, held, replace(job, rails=(0, 9)))
    assert isinstance(refused, Infeasible) and "rail" in refused.reason


class _GeneralLevelOne(Search):
    """The search with the plain bound worked out at its first level for every request, as
    before required sequences went without it (`Search._plain_bound_counts`)."""

    def _plain_bound_counts(self) -> bool:
        return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_required_sequence_explores_what_the_general_first_level_explores(data):
    """One GPU per VF under a required sequence: the first level bounded by the required
    bound alone finds the same choice after exactly the same states as with the plain bound
    too (the search budget counts states, so a budget spends at the same place either
    way)."""
    t = data.draw(railed_topologies())
    ledger = data.draw(ledgers(t))
    gpus = data.draw(st.integers(1, min(4, len(t.gpus))))
    r = Request(gpus=gpus, vfs=gpus,
                max_distance=data.draw(st.one_of(st.none(), st.sampled_from(list(Distance)))),
                numa=data.draw(st.sampled_from(["preferred", "single", "none"])),
                rails=tuple(data.draw(st.lists(RAIL, min_size=1, max_size=gpus))),
                rail_policy="required")
    shape = Allocator().shape(t)
    free = free_state(shape, ledger, ledger.signature())
    fast, general = (kind(shape, free, Spec.of(r), budget=Budget(None))
                     for kind in (Search, _GeneralLevelOne))
    assert fast.run() == general.run()
    assert fast.explored == general.explored


@st.composite
def plainest(draw, t: NodeTopology) -> Request:
    """The kind `fits_by_counts` answers: one VF per GPU or more (or no GPU), nothing else
    asked; any rail policy (only `required` narrows what fits)."""
    gpus = draw(st.integers(0, min(3, len(t.gpus))))
    return Request(gpus=gpus, vfs=draw(st.integers(max(gpus, 1), gpus + 2)),
                   numa=draw(st.sampled_from(["preferred", "none"])),
                   rails=tuple(draw(st.lists(RAIL, min_size=0, max_size=4))),
                   rail_policy=draw(st.sampled_from(["required", "required", "preferred"])),
                   vf_bandwidth=draw(st.sampled_from([0, 0, 0, 50])))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_counting_answers_the_plainest_requests_as_brute_force_does(data):
    """`feasible`'s counting path (no search) against brute force, for the one kind of
    request it answers; and it answers that kind (not None), so the path is exercised."""
    t = data.draw(railed_topologies())
    ledger = data.draw(ledgers(t))
    r = data.draw(plainest(t))
    alloc = Allocator()
    shape = alloc.shape(t)
    free = free_state(shape, ledger, ledger.signature())
    counted = fits_by_counts(shape, free, Spec.of(r))
    assert counted is not None
    assert counted == (brute_force(t, ledger, r) is not None)
    assert counted == isinstance(alloc.allocate(t, ledger, r), Allocation)


def test_counting_leaves_every_other_kind_to_the_search():
    t = build_topology(DGX_H100, 2)
    shape = Allocator().shape(t)
    free = free_state(shape, Ledger(t), Ledger(t).signature())
    for r in (Request(gpus=2, vfs=2, max_distance=Distance.PXB), Request(gpus=2, vfs=2, pfs=1),
              Request(gpus=2, vfs=2, numa="single"), Request(gpus=2, vfs=2, exclusive_cpus=4),
              Request(gpus=4, vfs=2), Request(gpus=2), Request(gpus=2, vfs=2, pairing_hint="none")):
        assert fits_by_counts(shape, free, Spec.of(r)) is None, r
