"""The `preferDistance` hint (docs/decisions/0091): a preference with fallback. It never
changes what a node gives a pod, so it never makes a pod unschedulable; it records what the
pod got next to what it preferred, and it ranks nodes that meet it above nodes that do not."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_allocator_key import ledgers, requests, topologies

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import (
    Request,
    RequestError,
    hints_from_annotations,
    parse_hints,
    parse_request_spec,
)
from railyard.allocation.types import Affinity, Allocation, Infeasible
from railyard.discovery.profiles import (
    DGX_A100,
    DGX_H100,
    GENERIC,
    HGX_H100_4NIC,
    XE8640,
    build_topology,
)
from railyard.topology.model import Distance, NodeTopology


def _alloc(t: NodeTopology, r: Request, allocator: Allocator | None = None) -> Allocation:
    a = (allocator or Allocator()).allocate(t, Ledger(t), r)
    assert isinstance(a, Allocation), a
    return a


# ----------------------------------------------------------------- the hint


def test_prefer_distance_is_parsed_as_a_distance_class():
    assert parse_hints({"preferDistance": "pxb"}) == {"prefer_distance": Distance.PXB}
    r = parse_request_spec("gpus=2,vfs=2", '{"preferDistance": "PIX", "maxDistance": "NODE"}')
    assert (r.prefer_distance, r.max_distance) == (Distance.PIX, Distance.NODE)


@pytest.mark.parametrize("value", ["NEAR", 3, None, ["PIX"]])
def test_a_bad_prefer_distance_is_refused_naming_the_field(value):
    with pytest.raises(RequestError) as e:
        hints_from_annotations({"railyard.dev/request": f'{{"preferDistance": '
                                                        f'{__import__("json").dumps(value)}}}'})
    assert e.value.field == "metadata.annotations[railyard.dev/request].preferDistance"
    assert "PIX|PXB|PHB|NODE|SYS" in e.value.message


def test_an_unknown_hint_lists_prefer_distance_among_the_known_ones():
    with pytest.raises(RequestError, match="preferDistance"):
        parse_hints({"preferDistanc": "PIX"})


# ----------------------------------------------------------------- never a limit


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_a_preference_never_changes_what_a_node_gives(data):
    """Random nodes, ledgers and requests: with any preference the answer is the answer
    without it (a refusal stays the same refusal), the affinity aside; and the affinity, when
    there are pairs, says the preference and the worst pair."""
    t = data.draw(topologies())
    ledger = data.draw(ledgers(t))
    plain = data.draw(requests(t))
    prefer = data.draw(st.sampled_from(list(Distance)))
    asked = replace(plain, prefer_distance=prefer)
    allocator = Allocator()
    with_pref = allocator.allocate(t, ledger, asked)
    without = Allocator().allocate(t, ledger, plain)
    if isinstance(without, Infeasible):
        assert isinstance(with_pref, Infeasible)
        assert with_pref.reason == without.reason
        return
    assert isinstance(with_pref, Allocation)
    assert replace(with_pref, affinity=None) == without
    if without.pairs:
        assert with_pref.affinity == Affinity(prefer, without.worst_distance)  # type: ignore[arg-type]
    else:
        assert with_pref.affinity is None


def test_a_pod_preferring_pix_is_placed_where_max_distance_pix_is_not():
    """The issue's case: an 8-GPU pod on a node with 4 NICs, each under a switch of its own."""
    t = build_topology(HGX_H100_4NIC, 8)
    strict = Allocator().allocate(t, Ledger(t), Request(gpus=8, vfs=8,
                                                        max_distance=Distance.PIX))
    assert isinstance(strict, Infeasible)
    a = _alloc(t, Request(gpus=8, vfs=8, prefer_distance=Distance.PIX))
    assert a.affinity == Affinity(Distance.PIX, Distance.NODE)
    assert a.affinity.fell_back


def test_a_preference_never_goes_beyond_max_distance():
    t = build_topology(DGX_A100, 8)
    a = _alloc(t, Request(gpus=8, vfs=8, max_distance=Distance.PXB,
                          prefer_distance=Distance.PIX))
    assert max(p.distance for p in a.pairs) <= Distance.PXB
    assert a.affinity == Affinity(Distance.PIX, Distance.PXB)
    # A preference looser than the limit is the limit: the pair is the same, and it is met.
    loose = _alloc(t, Request(gpus=8, vfs=8, max_distance=Distance.PXB,
                              prefer_distance=Distance.SYS))
    assert loose.pairs == a.pairs and not loose.affinity.fell_back  # type: ignore[union-attr]


def test_a_met_preference_is_no_fallback():
    a = _alloc(build_topology(DGX_H100, 8), Request(gpus=2, vfs=2,
                                                    prefer_distance=Distance.PIX))
    assert a.affinity == Affinity(Distance.PIX, Distance.PIX) and not a.affinity.fell_back


def test_a_pod_without_pairs_records_no_affinity():
    t = build_topology(DGX_H100, 8)
    assert _alloc(t, Request(gpus=1, prefer_distance=Distance.PIX)).affinity is None
    assert _alloc(t, Request(vfs=1, prefer_distance=Distance.PIX)).affinity is None


def test_a_pod_without_a_preference_records_no_affinity():
    assert _alloc(build_topology(DGX_A100, 8), Request(gpus=8, vfs=8)).affinity is None


def test_the_search_memo_is_shared_with_pods_that_prefer_nothing():
    t = build_topology(HGX_H100_4NIC, 8)
    allocator = Allocator()
    _alloc(t, Request(gpus=8, vfs=8), allocator)
    explored = allocator.explored
    for p in Distance:
        _alloc(t, Request(gpus=8, vfs=8, prefer_distance=p), allocator)
        assert allocator.node_score(t, Ledger(t), Request(gpus=8, vfs=8,
                                                          prefer_distance=p)) > 0
    assert allocator.explored == explored  # every answer came from the memo


# ----------------------------------------------------------------- the node score


def test_preferring_phb_ranks_a_phb_node_above_a_node_beyond_it():
    """Without a preference both nodes are tier 1 (a pair beyond PXB) and tie; preferring
    PHB, the node whose worst pair is PHB (generic) wins over one at NODE (xe8640)."""
    phb, node = build_topology(GENERIC, 4), build_topology(XE8640, 4)
    allocator = Allocator()

    def score(t: NodeTopology, prefer: Distance | None) -> int:
        return allocator.node_score(t, Ledger(t), Request(gpus=2, vfs=2,
                                                          prefer_distance=prefer))

    assert max(p.distance for p in _alloc(phb, Request(gpus=2, vfs=2)).pairs) == Distance.PHB
    assert max(p.distance for p in _alloc(node, Request(gpus=2, vfs=2)).pairs) == Distance.NODE
    assert score(phb, None) == score(node, None) == 1
    assert score(phb, Distance.PHB) > score(node, Distance.PHB) >= 1
    assert score(phb, Distance.NODE) == score(node, Distance.NODE) == 2  # both meet it
    # Still below every node with GPUDirect RDMA: a preference is a floor, not a ceiling.
    pxb = build_topology(DGX_A100, 4)
    assert score(pxb, Distance.PHB) > score(phb, Distance.PHB)


@pytest.mark.parametrize("profile", [DGX_H100, DGX_A100, HGX_H100_4NIC, GENERIC, XE8640])
@pytest.mark.parametrize("prefer", [Distance.PIX, Distance.PXB, Distance.SYS])
def test_preferences_the_tiers_already_honour_leave_the_score_as_it_was(profile, prefer):
    """PIX and PXB are where the tiers already break, and SYS is met by every node."""
    t = build_topology(profile, 4)
    allocator = Allocator()
    for gpus in (1, 2, len(t.gpus)):
        plain = Request(gpus=gpus, vfs=gpus)
        assert allocator.node_score(t, Ledger(t), replace(plain, prefer_distance=prefer)) \
            == allocator.node_score(t, Ledger(t), plain)


def test_a_pod_that_does_not_fit_scores_zero_whatever_it_prefers():
    t = build_topology(XE8640, 4)
    r = Request(gpus=len(t.gpus) + 1, vfs=1, prefer_distance=Distance.NODE)
    assert Allocator().node_score(t, Ledger(t), r) == 0
