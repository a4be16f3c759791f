"""The affinity a pod preferred and achieved, on the Allocation record (decision 0091):
optional, `version: 1` stays. During a rolling upgrade old and new components read each
other's records: a record without it (an old writer's) reads as affinity unknown, and a
reader that does not know the key (an old reader) passes over it, as it does over any key it
does not know."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Affinity, Allocation
from railyard.discovery.profiles import HGX_H100_4NIC, build_topology
from railyard.records.allocation import (
    RecordError,
    allocation_from_json,
    decode_allocation,
    encode_allocation,
)
from railyard.records.logline import decision_line
from railyard.records.signature import RecordTrust, sign_record
from railyard.topology.model import Distance


def fallen_back() -> Allocation:
    t = build_topology(HGX_H100_4NIC, 8)
    a = Allocator().allocate(t, Ledger(t), Request(gpus=8, vfs=8,
                                                   prefer_distance=Distance.PIX))
    assert isinstance(a, Allocation)
    return a.stamped("scheduler", "2026-12-03T18:00:00Z")


def test_affinity_is_recorded_last_and_round_trips():
    a = fallen_back()
    doc = json.loads(encode_allocation(a))
    assert doc["version"] == 1
    assert list(doc)[-1] == "affinity"
    assert doc["affinity"] == {"preferred": "PIX", "achieved": "NODE"}
    assert decode_allocation(encode_allocation(a)) == a


def test_a_record_without_affinity_reads_as_none_and_writes_without_the_key():
    """An old writer's record; and a record of a pod without a preference is written exactly
    as before preferences (no key, not a null)."""
    a = fallen_back()
    doc = json.loads(encode_allocation(a))
    del doc["affinity"]
    old = allocation_from_json(doc)
    assert old.affinity is None and old.pairs == a.pairs
    assert "affinity" not in json.loads(encode_allocation(old))
    assert encode_allocation(old) == json.dumps(doc, separators=(",", ":"))


def test_a_reader_ignores_keys_it_does_not_know_at_the_top_and_inside_affinity():
    """What an old reader does with `affinity`, and what this one does with a later writer's
    additions: the record's other fields are read as they are."""
    a = fallen_back()
    doc = json.loads(encode_allocation(a))
    doc["affinity"]["why"] = "a later writer's note"
    doc["somethingNewer"] = {"nested": [1, 2]}
    assert allocation_from_json(doc) == a
    del doc["affinity"]
    assert allocation_from_json(doc).affinity is None


def test_the_admission_policys_prefix_and_the_signature_cover_the_new_field():
    a = fallen_back()
    text = encode_allocation(a)
    assert text.startswith('{"version":1,"node":"' + a.node + '","decidedBy":"scheduler",')
    key = Ed25519PrivateKey.generate()
    trust = RecordTrust.keys([key.public_key()], lambda node: None)
    signed = sign_record(text, "uid-1", key)
    assert trust.refusal(signed, "uid-1") is None
    edited = signed.replace('"achieved":"NODE"', '"achieved":"PIX"')
    assert edited != signed and trust.refusal(edited, "uid-1") is not None


@pytest.mark.parametrize(("affinity", "path"), [
    ({"preferred": "NEAR", "achieved": "PIX"}, "allocation.affinity.preferred"),
    ({"preferred": "PIX"}, "allocation.affinity.achieved"),
    ("PIX", "allocation.affinity"),
])
def test_a_bad_affinity_is_refused_naming_the_field(affinity, path):
    doc = json.loads(encode_allocation(fallen_back()))
    doc["affinity"] = affinity
    with pytest.raises(RecordError) as e:
        allocation_from_json(doc)
    assert e.value.path == path


def test_the_decision_line_says_the_preferred_and_achieved_level():
    line = decision_line("bind", pod="ns/p", allocation=fallen_back())
    assert "worst=NODE" in line and "preferred=PIX achieved=NODE fallback=true" in line
    a = fallen_back()
    met = replace(a, affinity=Affinity(Distance.NODE, Distance.NODE))
    assert "preferred=NODE achieved=NODE fallback=false" in decision_line("bind", allocation=met)
    assert "preferred=" not in decision_line("bind", allocation=replace(a, affinity=None))
