"""Each pair's rail on the Allocation record (docs/rails.md): optional, `version: 1` stays;
a record without rails (written before them) reads as rails unknown, and a record with them
keeps them through the one codec."""

from __future__ import annotations

import json

import pytest

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request, RequestError, parse_hints
from railyard.allocation.types import Allocation
from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.records.allocation import RecordError, decode_allocation, encode_allocation


def allocation(rails: bool = True) -> Allocation:
    t = build_topology(DGX_H100, 1, rails=rails)
    a = Allocator().allocate(t, Ledger(t), Request(gpus=2, vfs=2))
    assert isinstance(a, Allocation)
    return a


def test_rails_are_recorded_per_pair_and_round_trip():
    a = allocation()
    assert a.rails == (0, 1)
    doc = json.loads(encode_allocation(a))
    assert doc["version"] == 1 and [p["rail"] for p in doc["pairs"]] == [0, 1]
    assert decode_allocation(encode_allocation(a)) == a


def test_a_record_without_rails_reads_as_rails_unknown():
    a = allocation(rails=False)
    text = encode_allocation(a)
    assert '"rail"' not in text
    assert decode_allocation(text).rails == (None, None)


@pytest.mark.parametrize("bad", [-1, "0", 1024, 1.0])
def test_a_bad_rail_is_refused_naming_the_pair(bad):
    doc = json.loads(encode_allocation(allocation()))
    doc["pairs"][1]["rail"] = bad
    with pytest.raises(RecordError) as e:
        decode_allocation(json.dumps(doc))
    assert e.value.path == "allocation.pairs[1].rail"


def test_the_rails_hint_takes_required_preferred_or_none():
    assert parse_hints({"rails": "required"}) == {"rail_policy": "required"}
    assert Request().rail_policy == "preferred"
    with pytest.raises(RequestError) as e:
        parse_hints({"rails": [0, 1]})
    assert e.value.field == "hints.rails"
