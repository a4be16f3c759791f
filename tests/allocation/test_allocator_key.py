"""The allocator's key equals the brute-force minimum on random small nodes, ledgers, requests.

Topologies are built directly (a few GPUs, PFs and VFs, random distances and NUMA nodes,
some VFs bound to vfio-pci or inside pods, ports down, a default-route PF), so every rule
of docs/allocation.md's key is exercised, not only the shapes of real servers.

The search has a budget (docs/decisions/0077): with the default one these searches never
spend it and answer exactly; with a tiny one the answer is brute force's or the budget's
refusal, never a wrong allocation, and the refusal is not memoised as the answer.
"""

from __future__ import annotations

import contextlib

import pytest
from alloc_brute import brute_force, key_of, pairing_bounds
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger, LedgerConflict
from railyard.allocation.request import Request
from railyard.allocation.search import SEARCH_BUDGET
from railyard.allocation.types import Allocation, GpuRef, Infeasible, NicRef
from railyard.topology.cpus import format_cpulist, parse_cpulist
from railyard.topology.model import Distance, Gpu, Nic, NodeTopology, NumaNode, Vf

MEMORY_UNIT = 1 << 30
POOL_B = "railyard.dev/vf-b"  # the second VF pool of pooled nodes (docs/decisions/0085)


@st.composite
def topologies(draw, min_gpus: int = 1, pools: bool = False) -> NodeTopology:
    """`pools`: each VF is in the default pool or in POOL_B, also several of one PF."""
    n_numa = draw(st.integers(1, 3))
    numa = []
    cpu = 0
    for i in range(n_numa):
        width = draw(st.integers(1, 4))
        numa.append(NumaNode(i, format_cpulist(range(cpu, cpu + width)),
                             draw(st.integers(1, 4)) * MEMORY_UNIT))
        cpu += width
    numa_id = st.one_of(st.integers(0, n_numa - 1), st.just(None)) if draw(
        st.booleans()) else st.integers(0, n_numa - 1)
    gpus = tuple(
        Gpu(i, f"0000:{0x10 + i:02x}:00.0", draw(numa_id), f"GPU-{i}", "0x10de", "0x2330",
            "pci0000:00", None)
        for i in range(draw(st.integers(min_gpus, 4)))
    )
    nics = []
    for j in range(draw(st.integers(1, 3))):
        bus = 0x40 + j
        vfs = []
        for v in range(draw(st.sampled_from([0, 1, 2, 2, 3, 3]))):
            state = draw(st.sampled_from(["ok"] * 6 + ["vfio", "held", "unbound"]))
            gone = state in ("held", "unbound")
            vfs.append(Vf(
                f"0000:{bus:02x}:00.{v + 1}", v,
                None if gone else f"mlx5_{10 * j + v + 10}",
                None if gone else f"ib{j}v{v}",
                {"vfio": "vfio-pci", "unbound": None}.get(state, "mlx5_core"), None,
                draw(st.sampled_from([None, POOL_B])) if pools else None))
        nics.append(Nic(
            f"0000:{bus:02x}:00.0", f"mlx5_{j}", f"ib{j}", draw(numa_id), "InfiniBand",
            draw(st.sampled_from(["4: ACTIVE"] * 6 + ["1: DOWN", None])),
            None, "mlx5_core", "pci0000:00", None, len(vfs), tuple(vfs),
            default_route=draw(st.integers(0, 7)) == 0))
    distance = {
        g.pci_address: {n.pci_address: draw(st.sampled_from(list(Distance))) for n in nics}
        for g in gpus
    }
    return NodeTopology("n1", tuple(numa), gpus, tuple(nics), distance)


@st.composite
def ledgers(draw, t: NodeTopology) -> Ledger:
    """A few holders taking random GPUs, VFs (also held ones), whole PFs, CPUs and memory."""
    ledger = Ledger(t)
    for h in range(draw(st.integers(0, 2))):
        gpus = draw(st.lists(st.sampled_from(t.gpus), max_size=1, unique=True))
        nics: list[NicRef] = []
        for pf in t.nics:
            choice = draw(st.sampled_from(["none"] * 4 + ["vfs", "vfs", "whole"]))
            if choice == "whole":
                nics.append(NicRef.of_pf(pf))
            elif choice == "vfs" and pf.vfs:
                for v in draw(st.lists(st.sampled_from(pf.vfs), min_size=1, max_size=2,
                                             unique=True)):
                    nics.append(NicRef.of_vf(pf, v))
        cpus = draw(st.lists(st.sampled_from(sorted(
            c for n in t.numa_nodes for c in parse_cpulist(n.cpus))), max_size=2, unique=True))
        memory = tuple((n.id, draw(st.integers(0, 1)) * MEMORY_UNIT) for n in t.numa_nodes)
        alloc = Allocation("n1", (), format_cpulist(cpus) if cpus else None,
                           tuple(m for m in memory if m[1]), nics=tuple(nics),
                           gpus=tuple(GpuRef.of(g) for g in gpus))
        with contextlib.suppress(LedgerConflict):  # overlapping draws simply hold less
            ledger.add(f"pod-{h}", alloc)
    return ledger


@st.composite
def paired_requests(draw, t: NodeTopology) -> Request:
    """GPUs with NICs and few other limits: where pairing, crowding and alignment decide."""
    return Request(
        gpus=draw(st.integers(1, min(3, len(t.gpus)))),
        vfs=draw(st.integers(1, 3)),
        pfs=draw(st.sampled_from([0, 0, 1])),
        max_distance=draw(st.one_of(st.none(), st.none(), st.sampled_from(list(Distance)))),
        pairing_hint=draw(st.sampled_from([None, None, None, "one-to-one", "shared"])),
    )


@st.composite
def shared_requests(draw, t: NodeTopology) -> Request:
    """More GPUs than NICs: shared pairing, where the search prunes hardest."""
    gpus = draw(st.integers(2, len(t.gpus)))
    return Request(gpus=gpus, vfs=draw(st.integers(1, gpus - 1)),
                   pfs=draw(st.sampled_from([0, 0, 1])),
                   max_distance=draw(st.sampled_from([None, None, Distance.NODE])))


@st.composite
def requests(draw, t: NodeTopology) -> Request:
    """Mostly requests the node could hold, with hard limits and hints now and then."""
    total_vfs = sum(len(n.vfs) for n in t.nics)
    return Request(
        gpus=draw(st.integers(0, min(3, len(t.gpus) + draw(st.sampled_from([0, 0, 0, 1]))))),
        vfs=draw(st.integers(0, min(3, total_vfs))),
        pfs=draw(st.sampled_from([0, 0, 0, 1])),
        exclusive_cpus=draw(st.sampled_from([0, 0, 1, 2, 3])),
        memory_bytes=draw(st.sampled_from([0, 0, 0, MEMORY_UNIT, 3 * MEMORY_UNIT])),
        max_distance=draw(st.one_of(st.none(), st.none(), st.sampled_from(list(Distance)))),
        numa=draw(st.sampled_from(["preferred", "preferred", "preferred", "single", "none"])),
        pairing_hint=draw(st.sampled_from(
            [None, None, None, None, "one-to-one", "shared", "none"])),
    )


@st.composite
def pooled_requests(draw, t: NodeTopology) -> Request:
    """VFs of the default pool and of POOL_B, either one paired (by the rule or the hint)."""
    vfs, pool_b = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    pool_vfs = ((POOL_B, pool_b),) if pool_b else ()
    pair_pool = draw(st.sampled_from([None, POOL_B])) if vfs and pool_b else (
        POOL_B if pool_b and not vfs else None)
    return Request(
        gpus=draw(st.integers(0, min(3, len(t.gpus)))),
        vfs=vfs,
        pfs=draw(st.sampled_from([0, 0, 0, 1])),
        exclusive_cpus=draw(st.sampled_from([0, 0, 1, 2])),
        max_distance=draw(st.one_of(st.none(), st.none(), st.sampled_from(list(Distance)))),
        numa=draw(st.sampled_from(["preferred", "preferred", "single", "none"])),
        pairing_hint=draw(st.sampled_from([None, None, None, "shared"])),
        pool_vfs=pool_vfs,
        pair_pool=pair_pool,
    )


def check_valid(t: NodeTopology, ledger: Ledger, r: Request, a: Allocation) -> None:
    """Counts, limits, pairing rules, allocatable devices; and the ledger accepts it."""
    assert len(a.all_gpus) == r.gpus
    assert len(a.vfs) == r.all_vfs and len(a.pfs) == r.pfs
    for pool, count in r.vf_counts:  # each pool's VFs from that pool, named as its own
        assert sum(1 for n in a.vfs if n.pool == pool) == count
    assert all(t.vf(n.pci_address)[1].pool == n.pool for n in a.vfs)
    assert all(p.nic.pool == r.pair_pool for p in a.pairs if p.nic.kind == "vf")
    lo, hi, pairs = pairing_bounds(r)
    assert len(a.pairs) == pairs
    served: dict[str, int] = {n.pci_address: 0 for n in a.all_nics
                              if n.kind == "pf" or n.pool == r.pair_pool}  # the pairing's
    for p in a.pairs:
        assert p.distance == t.distance[p.gpu.pci_address][p.nic.pf_pci_address]
        if r.max_distance is not None:
            assert p.distance <= r.max_distance
        served[p.nic.pci_address] += 1
    assert all(lo <= n <= hi for n in served.values()), served
    for n in a.vfs:
        pf, vf = t.vf(n.pci_address)
        assert vf.is_rdma and (vf.netdev or vf.rdma_device)
        assert pf.port_state is None or pf.port_state.endswith("ACTIVE")
    for n in a.pfs:
        assert not t.nic(n.pci_address).default_route
    cpus = parse_cpulist(a.cpus or "")
    assert len(cpus) == r.exclusive_cpus
    assert sum(b for _, b in a.memory_bytes) == r.memory_bytes
    numa_of_cpu = {c: n.id for n in t.numa_nodes for c in n.cpu_ids}
    assert {numa_of_cpu[c] for c in cpus} <= set(a.numa_nodes)
    assert {n for n, _ in a.memory_bytes} <= set(a.numa_nodes)
    if r.numa == "single":
        assert len(a.numa_nodes) <= 1
    ledger.add("new-pod", a)  # raises on any overlap with what is held


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_allocator_key_equals_brute_force_minimum(data):
    check_against_brute_force(data, requests)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_paired_allocations_match_brute_force_minimum(data):
    check_against_brute_force(data, paired_requests)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_shared_pairings_match_brute_force_minimum(data):
    check_against_brute_force(data, shared_requests, min_gpus=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_two_pool_allocations_match_brute_force_minimum(data):
    check_against_brute_force(data, pooled_requests, pools=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_two_pool_requests_without_pool_vfs_match_brute_force_minimum(data):
    """Single-pool requests on pooled nodes: the other pool's VFs are never taken, yet keep
    their PFs open for the aligned capacity."""
    check_against_brute_force(data, requests, pools=True)


def check_against_brute_force(data, make_request, min_gpus: int = 1,
                              pools: bool = False) -> None:
    t = data.draw(topologies(min_gpus, pools))
    ledger = data.draw(ledgers(t))
    r = data.draw(make_request(t))
    alloc = Allocator(search_budget=SEARCH_BUDGET)  # the default: large enough for these
    result = alloc.allocate(t, ledger, r)
    assert alloc.explored < SEARCH_BUDGET // 100  # nowhere near it
    check_exact(t, ledger, r, result)


def check_exact(t: NodeTopology, ledger: Ledger, r: Request,
                result: Allocation | Infeasible) -> None:
    """`result` is brute force's answer exactly: its key (and a valid allocation, which is
    then added to `ledger`), or a refusal that is unresolvable exactly when the empty node
    refuses too; never a spent budget."""
    assert not spent(result), result
    best = brute_force(t, ledger, r)
    if best is None:
        assert isinstance(result, Infeasible)
        assert result.reason
        assert result.unresolvable == (brute_force(t, None, r) is None)
        return
    assert isinstance(result, Allocation), result
    assert key_of(t, ledger, r, result) == best
    check_valid(t, ledger, r, result)


def spent(result: Allocation | Infeasible) -> bool:
    """Whether this is the refusal of a search that spent its budget."""
    return (isinstance(result, Infeasible) and result.refusal is not None
            and result.refusal.search_budget_spent)


def check_answer(t: NodeTopology, ledger: Ledger, r: Request, result: Allocation | Infeasible,
                 best: tuple | None) -> None:
    """`result` is brute force's answer: its key, or no allocation. An Infeasible may claim
    less than brute force would (a budget spent on explaining it leaves it resolvable), never
    more."""
    if best is None:
        assert isinstance(result, Infeasible) and result.reason
        if result.unresolvable:
            assert brute_force(t, None, r) is None
        return
    assert isinstance(result, Allocation), result
    assert key_of(t, ledger, r, result) == best
    check_valid(t, ledger, r, result)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_tiny_budget_gives_brute_forces_answer_or_says_it_was_spent(data):
    t = data.draw(topologies())
    ledger = data.draw(ledgers(t))
    r = data.draw(data.draw(st.sampled_from([requests, paired_requests]))(t))
    budget = data.draw(st.integers(0, 80))
    alloc = Allocator(search_budget=budget)
    result = alloc.allocate(t, ledger, r)
    best = brute_force(t, ledger, r)
    event("spent" if spent(result) else "answered")
    if spent(result):
        assert isinstance(result, Infeasible)
        assert result.reason.startswith("search budget spent:") and result.unresolvable
        assert f"explored {budget:,} states" in result.reason
        assert alloc.node_score(t, ledger, r) == 0
        # Never memoised as the answer: without the bound the same allocator answers exactly.
        alloc.search_budget = None
        result = alloc.allocate(t, ledger, r)
        assert not spent(result)
    check_answer(t, ledger, r, result, best)
    # Counted, not timed: another allocator with the same budget answers the same.
    again = Allocator(search_budget=budget)
    assert again.allocate(t, ledger, r) == Allocator(search_budget=budget).allocate(t, ledger, r)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_memoised_answer_equals_cold_answer_on_a_node_with_other_used_vfs(data):
    """Same shape and signature, different concrete VFs in use: the memo may answer."""
    t = data.draw(topologies())
    r = data.draw(requests(t))
    pf = data.draw(st.sampled_from(t.nics))
    usable = [v for v in pf.vfs if v.is_rdma and (v.netdev or v.rdma_device)]
    if len(usable) < 2:
        return
    first, second = data.draw(st.permutations(usable))[:2]

    def holding(vf: Vf) -> Ledger:
        return Ledger(t, [("other", Allocation("n1", (), None, (),
                                               nics=(NicRef.of_vf(pf, vf),)))])

    warm = Allocator()
    a, b = holding(first), holding(second)
    assert a.signature() == b.signature()
    warm.allocate(t, a, r)
    memoised = warm.allocate(t, b, r)
    cold = Allocator().allocate(t, b, r)
    assert memoised == cold
    if isinstance(memoised, Allocation):
        check_valid(t, b, r, memoised)


def test_brute_force_reference_agrees_with_itself_on_a_known_answer():
    """The reference is code too: one hand-checked case keeps it honest."""
    gpus = tuple(Gpu(i, f"0000:1{i}:00.0", 0, None, "", "", "pci0000:00", None) for i in range(2))
    vfs = (Vf("0000:40:00.1", 0, "mlx5_2", "v0", "mlx5_core", None),)
    nics = (Nic("0000:40:00.0", "mlx5_0", "ib0", 0, None, None, None, "mlx5_core",
                "pci0000:00", None, 1, vfs),)
    t = NodeTopology("n1", (NumaNode(0, "0-1", 1 << 30),), gpus, nics,
                     {g.pci_address: {"0000:40:00.0": Distance.PXB} for g in gpus})
    best = brute_force(t, Ledger(t), Request(gpus=2, vfs=1))
    assert best is not None
    # Shared pairing: one VF serves both GPUs at PXB.
    # (worst, rail mismatches: none asked, sum, span, crowding)
    assert best[:6] == (1, 0, 2, 1, 2, 4)



def test_equal_keys_resolve_to_the_lowest_pci_addresses():
    """Item 7: among choices equal on items 2-6 the lowest PCI addresses win.

    GPUs A, B, C and PFs X < Y < Z. A→X, B→Y, C→Z (NODE, PIX, NODE) and A→Y, B→X, C→Z
    (PHB, PXB, NODE) both have worst NODE and sum 6, one NUMA node, one pair per PF and no
    GPU left, so the tie-break decides: A→X. The pairing search meets the prefix (A→Y, B→X)
    first; its table of equivalent prefixes used to drop (A→X, B→Y) because that prefix's
    worst so far is larger, although C's NODE pair makes both worsts equal in the end.
    """
    gpus = tuple(Gpu(i, f"0000:{0x10 + i:02x}:00.0", 0, None, "0x10de", "0x2330",
                     "pci0000:00", None) for i in range(3))
    nics = tuple(
        Nic(f"0000:{0x40 + j:02x}:00.0", f"mlx5_{j}", f"ib{j}", 0, "InfiniBand", "4: ACTIVE",
            None, "mlx5_core", "pci0000:00", None, 1,
            (Vf(f"0000:{0x40 + j:02x}:00.1", 0, f"mlx5_{10 + j}", f"ib{j}v0", "mlx5_core",
                None),))
        for j in range(3))
    a, b, c = (g.pci_address for g in gpus)
    x, y, z = (n.pci_address for n in nics)
    d = Distance
    distance = {a: {x: d.NODE, y: d.PHB, z: d.SYS},
                b: {x: d.PXB, y: d.PIX, z: d.SYS},
                c: {x: d.SYS, y: d.SYS, z: d.NODE}}
    t = NodeTopology("n1", (NumaNode(0, "0-3", 1 << 30),), gpus, nics, distance)
    r = Request(gpus=3, vfs=3)
    got = Allocator().allocate(t, Ledger(t), r)
    assert isinstance(got, Allocation), got
    best = brute_force(t, Ledger(t), r)
    assert key_of(t, Ledger(t), r, got)[:6] == best[:6]  # items 2-6 agree ...
    assert [(p.gpu.pci_address, p.nic.pf_pci_address) for p in got.pairs] == [
        (a, x), (b, y), (c, z)]  # ... and item 7 picks the lowest addresses
    assert key_of(t, Ledger(t), r, got) == best


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
