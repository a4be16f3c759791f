"""The search budget (docs/decisions/0077): a hostile request shape is refused in bounded
work with a reason that says why and what to do; ordinary shapes never come near the budget;
a spent budget is counted, not timed, and never memoised as the shape's answer."""

from __future__ import annotations

import pytest

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.search import SEARCH_BUDGET, Budget
from railyard.allocation.types import Allocation, GpuRef, Infeasible, NicRef
from railyard.discovery.profiles import PROFILES, build_topology, profile
from railyard.topology.model import Distance, NodeTopology

# Found by timing cold searches over many-VF + whole-PF + pairing + maxDistance shapes on the
# built-in profiles (docs/benchmarks.md, "Search budget"): 4–8 s each before the budget.
HOSTILE = Request(gpus=2, vfs=32, pfs=1, pairing_hint="one-to-one", max_distance=Distance.PIX)
# The weight of the heaviest single state: how far past the limit the count can go.
SLACK = 1_000


def dgx_h100() -> NodeTopology:
    return build_topology(profile("dgx-h100"), vfs_per_pf=8, node="n1")


def half_used(t: NodeTopology) -> Ledger:
    """Every other GPU and half of each PF's VFs in use (as benchmarks/allocator.py)."""
    gpus = tuple(GpuRef.of(g) for g in t.gpus[1::2])
    nics = tuple(NicRef.of_vf(n, v) for n in t.nics for v in n.vfs[: len(n.vfs) // 2])
    return Ledger(t, [("busy", Allocation(t.node, (), None, (), nics=nics, gpus=gpus))])


def spent(result: Allocation | Infeasible) -> bool:
    return (isinstance(result, Infeasible) and result.refusal is not None
            and result.refusal.search_budget_spent)


def test_a_hostile_shape_is_refused_within_the_budget_saying_what_to_change():
    t = dgx_h100()
    alloc = Allocator()
    result = alloc.allocate(t, Ledger(t), HOSTILE)
    assert spent(result)
    assert isinstance(result, Infeasible) and result.unresolvable  # preemption cannot help
    assert result.reason.startswith(f"search budget spent: the allocator explored "
                                    f"{SEARCH_BUDGET:,} states for 2 GPUs, 32 VFs, 1 whole PF "
                                    f"(maxDistance PIX, pairing one-to-one)")
    assert "ask for fewer VFs or whole PFs per pod, or drop maxDistance / pairing" in result.reason
    assert SEARCH_BUDGET < alloc.explored <= SEARCH_BUDGET + SLACK


def test_a_spent_budget_is_remembered_per_budget_not_as_the_answer():
    t = dgx_h100()
    request = Request(gpus=1, vfs=12, pfs=1)  # about a hundred states to the exact answer
    exact = Allocator(search_budget=None).allocate(t, Ledger(t), request)
    assert isinstance(exact, Allocation)
    alloc = Allocator(search_budget=20)
    assert spent(alloc.allocate(t, Ledger(t), request))
    explored = alloc.explored
    assert spent(alloc.allocate(t, Ledger(t), request))  # the same budget: spent again ...
    assert alloc.explored == explored  # ... known without searching again
    assert alloc.node_score(t, Ledger(t), request) == 0
    alloc.search_budget = 10_000  # a larger one searches afresh and finds the answer
    assert alloc.allocate(t, Ledger(t), request) == exact
    assert alloc.node_score(t, Ledger(t), request) > 0


def test_the_same_budget_spends_at_the_same_state_on_every_replica():
    t = dgx_h100()
    counts = set()
    for _ in range(3):
        alloc = Allocator(search_budget=5_000)
        assert spent(alloc.allocate(t, Ledger(t), HOSTILE))
        counts.add(alloc.explored)
    assert len(counts) == 1


def test_a_memoised_answer_equals_a_cold_one_under_the_same_budget():
    t = dgx_h100()
    warm = Allocator(search_budget=2_000)
    cold = Allocator(search_budget=2_000)
    for request in (HOSTILE, Request(gpus=2, vfs=2), Request(gpus=8, vfs=1, pfs=2)):
        first = warm.allocate(t, Ledger(t), request)
        assert warm.allocate(t, Ledger(t), request) == first == cold.allocate(t, Ledger(t),
                                                                              request)


def test_the_simulators_shapes_stay_far_below_the_budget_on_every_profile():
    """k GPUs with k VFs (with and without maxDistance PXB), with one VF, or alone; empty and
    fragmented nodes; allocate and score (which decides the empty node too)."""
    for name in PROFILES:
        t = build_topology(profile(name), vfs_per_pf=8, node=name)
        for ledger in (Ledger(t), half_used(t)):
            for k in range(1, len(t.gpus) + 1):
                for r in (Request(gpus=k, vfs=k),
                          Request(gpus=k, vfs=k, max_distance=Distance.PXB),
                          Request(gpus=k, vfs=1), Request(gpus=k)):
                    alloc = Allocator()
                    assert not spent(alloc.allocate(t, ledger, r))
                    alloc.node_score(t, ledger, r)
                    assert alloc.explored < SEARCH_BUDGET // 20, (name, r)


def test_an_explanation_that_spends_the_rest_of_the_budget_still_says_no():
    """The search proves that nothing fits; saying which limit failed takes more searches,
    from the same budget. With it gone the reason is plainer, never wrong, and the node is
    not called unresolvable (which would rule out preemption) on a guess. (Exclusive CPUs
    keep the relaxed requests from being answered by counting, which costs no budget.)"""
    t = dgx_h100()
    pf = t.nics[0]  # the only PF within PIX of GPU 0000:1b:00.0, all its VFs held
    ledger = Ledger(t, [("other", Allocation("n1", (), None, (), nics=tuple(
        NicRef.of_vf(pf, v) for v in pf.vfs)))])
    request = Request(gpus=8, vfs=8, max_distance=Distance.PIX, exclusive_cpus=2)
    exact = Allocator(search_budget=None).allocate(t, ledger, request)
    assert isinstance(exact, Infeasible) and not exact.unresolvable
    assert exact.reason.startswith("maxDistance PIX: 8 GPUs need a free NIC within PIX but "
                                   "only 7 of the 8 free GPUs have one")
    reasons = set()
    for limit in range(5, 400, 5):
        result = Allocator(search_budget=limit).allocate(t, ledger, request)
        assert isinstance(result, Infeasible) and not spent(result) and not result.unresolvable
        reasons.add(result.reason)
    assert reasons == {exact.reason, "no placement of 8 GPUs, 8 VFs and 0 whole PFs satisfies "
                                     "every limit at once"}


@pytest.mark.parametrize("limit", [-1, -100])
def test_a_negative_budget_is_refused(limit):
    with pytest.raises(ValueError, match="search budget"):
        Allocator(search_budget=limit)
    with pytest.raises(ValueError, match="search budget"):
        Budget(limit)


def test_the_known_answer_is_the_memos_and_never_a_search():
    """What the extender's loop asks while the worker searches: an answer only if known."""
    t = dgx_h100()
    alloc = Allocator()
    request = Request(gpus=2, vfs=2)
    assert alloc.allocate_known(t, Ledger(t), request) is None
    assert alloc.node_score_known(t, Ledger(t), request) is None
    assert alloc.explored == 0
    answer = alloc.allocate(t, Ledger(t), request)
    score = alloc.node_score(t, Ledger(t), request)
    explored = alloc.explored
    assert alloc.allocate_known(t, Ledger(t), request) == answer
    assert alloc.node_score_known(t, Ledger(t), request) == score
    assert alloc.explored == explored  # the known answers explored nothing more
    tiny = Allocator(search_budget=20)
    hostile = Request(gpus=1, vfs=12, pfs=1)
    assert spent(tiny.allocate(t, Ledger(t), hostile))
    assert spent(tiny.allocate_known(t, Ledger(t), hostile))  # known to spend this budget
    tiny.search_budget = 10_000
    assert tiny.allocate_known(t, Ledger(t), hostile) is None  # not known under this one
