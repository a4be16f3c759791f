"""The allocator's key with rail sequences (docs/allocation.md item 3, docs/rails.md) equals
the brute-force minimum: random small nodes whose NICs are on random rails (some on none,
some sharing one), random ledgers, and requests carrying a job's rail sequence, required or
preferred. A required sequence that cannot be met is infeasible, and says so."""

from __future__ import annotations

from dataclasses import replace

from alloc_brute import brute_force, key_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_allocator_key import check_valid, ledgers, spent, topologies

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.search import SEARCH_BUDGET
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
    assert not spent(result), result
    best = brute_force(t, ledger, r)
    if best is None:
        assert isinstance(result, Infeasible) and result.reason
        assert result.unresolvable == (brute_force(t, None, r) is None)
        return
    assert isinstance(result, Allocation), result
    assert key_of(t, ledger, r, result) == best
    check_valid(t, ledger, r, result)
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
    held = Ledger(t)
    first = alloc.allocate(t, held, Request(gpus=2, vfs=2))
    assert isinstance(first, Allocation) and first.rails == (0, 1)
    held.add("first", first)
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
