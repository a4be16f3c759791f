"""The ledger makes double allocation impossible: overlaps are errors that change nothing."""

from __future__ import annotations

import contextlib

import pytest

from railyard.allocation.ledger import Ledger, LedgerConflict
from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.topology.model import Distance

TOPO = build_topology(DGX_H100, vfs_per_pf=2)
PF = TOPO.nics[0]


def alloc(gpu: int = 0, vf: int | None = 0, whole_pf: bool = False, cpus: str | None = None,
          memory: int = 0) -> Allocation:
    g = TOPO.gpus[gpu]
    nic = NicRef.of_pf(PF) if whole_pf else NicRef.of_vf(PF, PF.vfs[vf or 0])
    return Allocation(TOPO.node, (0,), cpus, ((0, memory),) if memory else (),
                      pairs=(Pair(GpuRef.of(g), nic, Distance.PIX),))


def test_overlapping_allocation_is_an_error_and_changes_nothing():
    ledger = Ledger(TOPO, [("a", alloc(gpu=0, vf=0))])
    before = ledger.signature()
    with pytest.raises(LedgerConflict, match="already held by a"):
        ledger.add("b", alloc(gpu=0, vf=1))
    assert ledger.signature() == before
    assert ledger.allocation("b") is None


def test_whole_pf_excludes_its_vfs_both_ways():
    ledger = Ledger(TOPO, [("a", alloc(gpu=0, vf=0))])
    with pytest.raises(LedgerConflict, match="VFs in use"):
        ledger.add("b", alloc(gpu=1, whole_pf=True))
    ledger.remove("a")
    ledger.add("b", alloc(gpu=1, whole_pf=True))
    with pytest.raises(LedgerConflict, match="held whole"):
        ledger.add("c", alloc(gpu=2, vf=1))


def test_remove_frees_everything_and_is_idempotent():
    ledger = Ledger(TOPO)
    empty = ledger.signature()
    ledger.add("a", alloc(cpus="0-3", memory=1 << 30))
    assert ledger.signature() != empty
    assert ledger.remove("a") is not None
    assert ledger.remove("a") is None
    assert ledger.signature() == empty


def test_pinned_cpus_and_memory_are_exclusive():
    ledger = Ledger(TOPO, [("a", alloc(gpu=0, vf=0, cpus="0-3"))])
    with pytest.raises(LedgerConflict, match="CPU 3"):
        ledger.add("b", alloc(gpu=1, vf=1, cpus="3-5"))
    with pytest.raises(LedgerConflict, match="memory"):
        ledger.add("c", alloc(gpu=1, vf=1, memory=TOPO.numa_nodes[0].memory_bytes + 1))


def test_devices_of_another_node_are_refused():
    other = Allocation("elsewhere", (0,), None, (), pairs=alloc().pairs)
    with pytest.raises(LedgerConflict, match="elsewhere"):
        Ledger(TOPO).add("a", other)


def test_signature_ignores_which_vf_of_a_pf_is_used():
    a, b = Ledger(TOPO), Ledger(TOPO)
    a.add("x", alloc(gpu=0, vf=0))
    b.add("x", alloc(gpu=0, vf=1))
    assert a.signature() == b.signature()


def test_cached_signature_follows_every_add_remove_and_failed_add():
    """The signature is cached between changes; it must equal a freshly built ledger's."""
    ledger = Ledger(TOPO)
    steps = [
        ("add", "a", alloc(gpu=0, vf=0, cpus="0-1", memory=1 << 30)),
        ("add", "b", alloc(gpu=0, vf=1)),  # conflicts: changes nothing
        ("add", "c", alloc(gpu=1, vf=1, cpus="2")),
        ("remove", "a", None),
        ("remove", "a", None),  # idempotent
        ("add", "d", alloc(gpu=2, whole_pf=True)),  # conflicts: c holds a VF of the PF
        ("remove", "c", None),
        ("add", "d", alloc(gpu=2, whole_pf=True)),
    ]
    for op, holder, allocation in steps:
        ledger.signature()  # fill the cache before each change
        if op == "add":
            assert allocation is not None
            with contextlib.suppress(LedgerConflict):
                ledger.add(holder, allocation)
        else:
            ledger.remove(holder)
        assert ledger.signature() == Ledger(TOPO, ledger.holders()).signature()
    assert [h for h, _ in ledger.holders()] == ["d"]


def test_one_allocation_holding_a_pf_whole_and_one_of_its_vfs_is_refused():
    """A whole PF excludes its VFs within one allocation too, not only against other holders:
    a restored or hand-edited record naming both would grant the PF netdev and a VF of it."""
    both = Allocation(TOPO.node, (), None, (), nics=(NicRef.of_pf(PF), NicRef.of_vf(PF, PF.vfs[0])))
    ledger = Ledger(TOPO)
    with pytest.raises(LedgerConflict, match=f"holds PF {PF.pci_address} .* whole and its VF"):
        ledger.add("pod", both)
    assert len(ledger) == 0 and not ledger.used_pfs and not ledger.used_vfs
