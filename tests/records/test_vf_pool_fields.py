"""VF pools in the records (docs/decisions/0085): a VF's `pool` in NodeTopology and in the
Allocation is optional, absent for the default pool, so today's documents read as before and
a reader of either version reads tomorrow's."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.records.allocation import (
    RecordError,
    allocation_to_json,
    decode_allocation,
    encode_allocation,
)
from railyard.records.topology import TopologyFormatError, topology_from_json, topology_to_json
from railyard.topology.model import Distance

POOL = "railyard.dev/vf-rail"


def pooled_topology():
    t = build_topology(DGX_H100, vfs_per_pf=2)
    first = t.nics[0]
    vfs = (first.vfs[0], replace(first.vfs[1], pool=POOL))
    return replace(t, nics=(replace(first, vfs=vfs), *t.nics[1:]))


def test_a_topology_without_pools_writes_no_pool_key():
    doc = topology_to_json(build_topology(DGX_H100, vfs_per_pf=2))
    assert all("pool" not in v for n in doc["nics"] for v in n["vfs"])


def test_a_vfs_pool_round_trips_and_the_default_pool_stays_absent():
    t = pooled_topology()
    doc = topology_to_json(t)
    vfs = doc["nics"][0]["vfs"]
    assert "pool" not in vfs[0] and vfs[1]["pool"] == POOL
    assert topology_from_json(json.loads(json.dumps(doc))) == t


def test_a_null_pool_is_the_default_pool_and_a_malformed_one_is_named():
    doc = topology_to_json(pooled_topology())
    doc["nics"][0]["vfs"][1]["pool"] = None
    assert topology_from_json(doc).nics[0].vfs[1].pool is None
    doc["nics"][0]["vfs"][1]["pool"] = "no-slash"
    with pytest.raises(TopologyFormatError, match=r"nics\[0\]\.vfs\[1\]\.pool"):
        topology_from_json(doc)


def allocation(t) -> Allocation:
    pf = t.nics[0]
    return Allocation(t.node, (0,), None, (), pairs=(
        Pair(GpuRef.of(t.gpus[0]), NicRef.of_vf(pf, pf.vfs[0]), Distance.PIX),),
        nics=(NicRef.of_vf(pf, pf.vfs[1]),))


def test_an_allocation_names_each_vfs_pool_except_the_defaults():
    a = allocation(pooled_topology())
    doc = allocation_to_json(a)
    assert "pool" not in doc["pairs"][0]["nic"] and doc["nics"][0]["pool"] == POOL
    assert decode_allocation(encode_allocation(a)) == a
    assert doc["version"] == 1


def test_todays_records_read_as_the_default_pool():
    """A record written before pools (no `pool` key) names default-pool VFs."""
    a = allocation(build_topology(DGX_H100, vfs_per_pf=2))
    text = encode_allocation(a)
    assert '"pool"' not in text
    assert all(n.pool is None for n in decode_allocation(text).all_nics)


def test_a_pf_with_a_pool_or_a_malformed_pool_is_refused_naming_the_field():
    a = allocation(pooled_topology())
    doc = allocation_to_json(a)
    doc["nics"][0]["pool"] = "bad"
    with pytest.raises(RecordError, match=r"nics\[0\]\.pool"):
        decode_allocation(json.dumps(doc))
    pf = NicRef.of_pf(pooled_topology().nics[1])
    doc = allocation_to_json(replace(a, nics=(pf,)))
    doc["nics"][0]["pool"] = POOL
    with pytest.raises(RecordError, match=r"nics\[0\]\.pool"):
        decode_allocation(json.dumps(doc))
