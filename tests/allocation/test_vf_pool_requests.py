"""A pod asks VFs of several pools (docs/decisions/0085): one count per pool, and which pool
pairs with the GPUs — the `pairPool` hint, else the default pool when asked, else the one
other pool asked; several other pools without a hint is an error saying so."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.names import REQUEST_ANNOTATION, ResourceNames
from railyard.allocation.request import Request, RequestError, request_from_pod
from railyard.allocation.types import Allocation, Infeasible, NicRef
from railyard.discovery.profiles import DGX_H100, build_topology

RAIL, EAST = "railyard.dev/vf-rail", "example.com/vf-east"
NAMES = ResourceNames(vf_pools=(EAST, RAIL))


def pod(limits: dict, hints: dict | None = None) -> dict:
    meta = {"annotations": {REQUEST_ANNOTATION: json.dumps(hints)}} if hints else {}
    return {"metadata": meta,
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def test_default_pool_count_stays_vfs_and_other_pools_are_counted_by_name():
    r = request_from_pod(pod({"nvidia.com/gpu": 2, "railyard.dev/vf": 2, RAIL: 1}), NAMES)
    assert (r.vfs, r.pool_vfs, r.pair_pool) == (2, ((RAIL, 1),), None)
    assert r.paired_vfs == 2 and r.nics == 2 and r.all_vfs == 3
    assert r.vf_counts == ((None, 2), (RAIL, 1))


def test_the_one_other_pool_asked_pairs_when_the_default_is_not_asked():
    r = request_from_pod(pod({"nvidia.com/gpu": 2, RAIL: 2}), NAMES)
    assert (r.vfs, r.pair_pool, r.paired_vfs, r.pairing) == (0, RAIL, 2, "one-to-one")


def test_pair_pool_hint_chooses_the_paired_pool():
    r = request_from_pod(pod({"nvidia.com/gpu": 2, "railyard.dev/vf": 1, RAIL: 2},
                             {"pairPool": RAIL}), NAMES)
    assert r.pair_pool == RAIL and r.vf_counts == ((RAIL, 2), (None, 1))
    r = request_from_pod(pod({"nvidia.com/gpu": 2, "railyard.dev/vf": 2, RAIL: 2},
                             {"pairPool": "railyard.dev/vf"}), NAMES)
    assert r.pair_pool is None


def test_several_other_pools_without_a_hint_is_an_error_naming_pair_pool():
    with pytest.raises(RequestError, match=r"pairPool.*name the pool"):
        request_from_pod(pod({"nvidia.com/gpu": 1, RAIL: 1, EAST: 1}), NAMES)


@pytest.mark.parametrize("hint", [EAST, "railyard.dev/vf", "nonsense", 3])
def test_a_pair_pool_the_pod_does_not_ask_is_an_error(hint):
    with pytest.raises(RequestError, match="pairPool"):
        request_from_pod(pod({"nvidia.com/gpu": 1, RAIL: 1}, {"pairPool": hint}), NAMES)


def test_a_pool_resource_unknown_to_the_names_is_not_counted():
    r = request_from_pod(pod({RAIL: 3}))
    assert not r.wants_devices


def pooled_dgx():
    """A DGX H100 whose VFs 2-3 of every PF are in RAIL, 0-1 in the default pool."""
    t = build_topology(DGX_H100, vfs_per_pf=4)
    nics = tuple(replace(n, vfs=tuple(replace(v, pool=RAIL if v.vf_index >= 2 else None)
                                      for v in n.vfs)) for n in t.nics)
    return replace(t, nics=nics)


def test_allocator_takes_each_pools_vfs_from_that_pool_and_pairs_only_the_paired_pool():
    t = pooled_dgx()
    r = Request(gpus=2, vfs=2, pool_vfs=((RAIL, 2),), pair_pool=RAIL)
    a = Allocator().allocate(t, Ledger(t), r)
    assert isinstance(a, Allocation)
    assert [p.nic.pool for p in a.pairs] == [RAIL, RAIL]
    assert sorted(str(n.pool) for n in a.nics) == ["None", "None"]
    for n in a.vfs:
        assert t.vf(n.pci_address)[1].pool == n.pool


def test_a_pool_the_node_lacks_is_refused_naming_it():
    t = build_topology(DGX_H100, vfs_per_pf=4)
    got = Allocator().allocate(t, Ledger(t), Request(gpus=1, pool_vfs=((RAIL, 1),),
                                                     pair_pool=RAIL))
    assert isinstance(got, Infeasible) and RAIL in got.reason


def test_nodes_differing_only_in_which_pool_is_used_do_not_share_a_memo_answer():
    t = pooled_dgx()
    pf = t.nics[0]
    hold = {p: Ledger(t, [("x", Allocation(t.node, (), None, (), nics=tuple(
        NicRef.of_vf(pf, v) for v in pf.vfs if v.pool == p)))]) for p in (None, RAIL)}
    assert hold[None].signature() != hold[RAIL].signature()
    alloc = Allocator()
    r = Request(gpus=8, pool_vfs=((RAIL, 8),), pair_pool=RAIL)
    warm = [alloc.allocate(t, hold[p], r) for p in (None, RAIL)]
    cold = [Allocator().allocate(t, hold[p], r) for p in (None, RAIL)]
    assert warm == cold
