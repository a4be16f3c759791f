"""Allocator.group_key (one home of the offer rules), the shape cache and graded packing."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

import railyard.allocation.allocator as allocator_module
from railyard.allocation.allocator import _BANDS, Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, GpuRef
from railyard.discovery.profiles import build_topology, profile
from railyard.topology.model import NodeTopology


def topo(name: str = "dgx-h100", node: str | None = None) -> NodeTopology:
    return build_topology(profile(name), vfs_per_pf=8, node=node or name)


def renamed(t: NodeTopology, node: str) -> NodeTopology:
    """The same machine with its own GPU UUIDs and interface names."""
    nics = tuple(dataclasses.replace(
        n, netdev=n.netdev and f"x{n.netdev}",
        vfs=tuple(dataclasses.replace(v, netdev=v.netdev and f"x{v.netdev}") for v in n.vfs))
        for n in t.nics)
    gpus = tuple(dataclasses.replace(g, uuid=f"GPU-{node}-{g.index}") for g in t.gpus)
    return dataclasses.replace(t, node=node, nics=nics, gpus=gpus)


def gpus_held(t: NodeTopology, k: int) -> Ledger:
    """A ledger holding the first k GPUs (by PCI address), nothing else."""
    gpus = sorted(t.gpus, key=lambda g: g.pci_address)[:k]
    held = Allocation(t.node, (), None, (), gpus=tuple(GpuRef.of(g) for g in gpus))
    return Ledger(t, [("h", held)] if k else [])


def test_nodes_of_one_shape_share_a_group_key_and_differ_by_free_state():
    alloc = Allocator()
    a, b = topo(node="a"), renamed(topo(node="b"), "b")
    assert alloc.group_key(a, None) == alloc.group_key(b, Ledger(b))
    assert alloc.group_key(a, gpus_held(a, 1)) == alloc.group_key(b, gpus_held(b, 1))
    assert alloc.group_key(a, gpus_held(a, 1)) != alloc.group_key(a, None)
    assert alloc.group_key(a, None) != alloc.group_key(topo("dgx-a100"), None)


def test_offer_rules_split_groups_default_route_and_vfio():
    alloc = Allocator()
    t = topo()
    nic = t.nics[0]
    routed = dataclasses.replace(t, nics=(dataclasses.replace(nic, default_route=True),
                                          *t.nics[1:]))
    vfio_vf = dataclasses.replace(nic.vfs[0], driver="vfio-pci", rdma_device=None)
    vfio = dataclasses.replace(t, nics=(dataclasses.replace(nic, vfs=(vfio_vf, *nic.vfs[1:])),
                                        *t.nics[1:]))
    keys = {alloc.group_key(x, None) for x in (t, routed, vfio)}
    assert len(keys) == 3


def test_a_known_shape_costs_no_search_build_and_names_its_own_devices(monkeypatch):
    alloc = Allocator()
    first = topo(node="a")
    alloc.shape(first)
    built = []
    real = allocator_module.build_shape
    monkeypatch.setattr(allocator_module, "build_shape",
                        lambda *a, **k: built.append(1) or real(*a, **k))
    other = renamed(topo(node="b"), "b")  # new objects, same shape_key
    shared = dataclasses.replace(first, node="c")  # same device tuples
    r = Request(gpus=2, vfs=2)
    got = alloc.allocate(other, Ledger(other), r)
    also = alloc.allocate(shared, Ledger(shared), r)
    assert built == []
    assert isinstance(got, Allocation) and got.node == "b"
    assert all(p.gpu.uuid.startswith("GPU-b-") and p.nic.netdev.startswith("x")
               for p in got.pairs)
    assert isinstance(also, Allocation) and also.node == "c"
    assert got == Allocator().allocate(other, Ledger(other), r)


def test_binpack_score_climbs_with_how_full_the_node_gets_and_spread_falls():
    t = topo()
    r = Request(gpus=1)  # no pairs: tier 5 on every ledger below
    binpack, spread = Allocator("binpack"), Allocator("spread")
    b = [binpack.node_score(t, gpus_held(t, k), r) for k in (0, 1, 4, 7)]
    s = [spread.node_score(t, gpus_held(t, k), r) for k in (0, 1, 4, 7)]
    assert b == sorted(b) and len(set(b)) == 4  # idle < in use < half full < fills it
    assert s == sorted(s, reverse=True) and len(set(s)) == 4
    assert all(7 <= x <= 10 for x in b + s)


def test_score_bands_keep_tiers_apart():
    bands = sorted(_BANDS.items())
    for (_, (low, levels)), (_, (next_low, _)) in itertools.pairwise(bands):
        assert low + levels - 1 < next_low
    top_low, top_levels = _BANDS[5]
    assert bands[0][1][0] == 1 and top_low + top_levels - 1 == 10


@settings(max_examples=30, deadline=None)
@given(used=st.integers(0, 7), gpus=st.integers(1, 8), vfs=st.integers(0, 8),
       packing=st.sampled_from(["binpack", "spread"]))
def test_scores_stay_in_range_and_zero_only_when_infeasible(used, gpus, vfs, packing):
    t = topo()
    ledger = gpus_held(t, used)
    alloc = Allocator(packing)
    r = Request(gpus=gpus, vfs=vfs)
    score = alloc.node_score(t, ledger, r)
    fits = isinstance(alloc.allocate(t, ledger, r), Allocation)
    assert (score == 0) == (not fits)
    assert 0 <= score <= 10
