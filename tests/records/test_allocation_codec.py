"""The Allocation codec: lossless round trips, and precise errors for edited annotations."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.discovery.profiles import PROFILES, build_topology
from railyard.records.allocation import (
    RecordError,
    allocation_to_json,
    decode_allocation,
    encode_allocation,
)
from railyard.topology.model import Distance

TOPOS = [build_topology(p, vfs_per_pf=4) for p in PROFILES.values()]


@st.composite
def allocations(draw) -> Allocation:
    topo = draw(st.sampled_from(TOPOS))
    pfs = [n for n in topo.nics if n.vfs]
    gpus = draw(st.lists(st.sampled_from(topo.gpus), unique=True, max_size=4))
    pairs = []
    for g in gpus:
        pf = draw(st.sampled_from(pfs))
        nic = (NicRef.of_pf(pf) if draw(st.booleans())
               else NicRef.of_vf(pf, draw(st.sampled_from(pf.vfs))))
        pairs.append(Pair(GpuRef.of(g), nic, draw(st.sampled_from(list(Distance)))))
    return Allocation(
        node=topo.node,
        numa_nodes=tuple(sorted(draw(st.sets(st.integers(0, 7), max_size=3)))),
        cpus=draw(st.sampled_from([None, "0-3", "4-11,112-119"])),
        memory_bytes=tuple(sorted(draw(st.dictionaries(st.integers(0, 7),
                                                        st.integers(0, 1 << 40))).items())),
        pairs=tuple(pairs),
        nics=tuple(NicRef.of_vf(pf, pf.vfs[-1]) for pf in pfs[: draw(st.integers(0, 2))]),
        decided_by=draw(st.sampled_from(["scheduler", "node"])),
        decided_at=draw(st.sampled_from([None, "2026-12-02T10:00:00Z"])),
    )


@given(allocations())
def test_encode_then_decode_is_identity(a):
    assert decode_allocation(encode_allocation(a)) == a


def test_document_shape_matches_the_published_example():
    topo = TOPOS[0]
    pf = topo.nics[0]
    a = Allocation(topo.node, (0,), "4-11", ((0, 68719476736),),
                   pairs=(Pair(GpuRef.of(topo.gpus[0]), NicRef.of_vf(pf, pf.vfs[0]),
                               Distance.PIX),),
                   decided_at="2026-12-02T10:00:00Z")
    doc = allocation_to_json(a)
    assert list(doc) == ["version", "node", "decidedBy", "decidedAt", "numaNodes", "cpus",
                         "memoryBytes", "pairs", "nics", "gpus"]
    assert doc["memoryBytes"] == {"0": 68719476736}
    assert doc["pairs"][0]["nic"] == {
        "kind": "vf", "pciAddress": "0000:18:00.1", "pfPciAddress": "0000:18:00.0",
        "vfIndex": 0, "rdmaDevice": "mlx5_12", "netdev": "ibp24s0v0"}
    assert doc["pairs"][0]["distance"] == "PIX"


def _valid() -> dict:
    return json.loads(encode_allocation(Allocation(
        "n1", (0,), None, (),
        pairs=(Pair(GpuRef(0, "0000:1b:00.0", None),
                    NicRef("vf", "0000:18:00.1", "0000:18:00.0", 0, "mlx5_12", "ib0v0"),
                    Distance.PIX),))))


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.update(version=2), "allocation.version"),
        (lambda d: d.pop("node"), "allocation.node"),
        (lambda d: d.update(decidedBy="me"), "allocation.decidedBy"),
        (lambda d: d["pairs"][0]["nic"].update(pciAddress="eth0"), "pairs[0].nic.pciAddress"),
        (lambda d: d["pairs"][0]["nic"].update(kind="pf"), "pairs[0].nic"),
        (lambda d: d["pairs"][0].update(distance="NEAR"), "pairs[0].distance"),
        (lambda d: d["pairs"][0]["gpu"].update(index="0"), "pairs[0].gpu.index"),
        (lambda d: d.update(cpus="1-x"), "allocation.cpus"),
        (lambda d: d.update(memoryBytes={"zero": 1}), "allocation.memoryBytes"),
        (lambda d: d.update(pairs={}), "allocation.pairs"),
        (lambda d: d.update(numaNodes=[True]), "allocation.numaNodes[0]"),
    ],
)
def test_edited_annotation_is_rejected_naming_the_field(edit, field):
    d = _valid()
    edit(d)
    with pytest.raises(RecordError) as e:
        decode_allocation(json.dumps(d))
    assert field in str(e.value)


@pytest.mark.parametrize("text", ["", "{", "null", "[]", b"\xff\xfe"])
def test_garbage_is_a_record_error_not_a_crash(text):
    with pytest.raises(RecordError):
        decode_allocation(text)


@pytest.mark.parametrize("cpus", ["0-4000000000", "1" * 5000, "0,99999999"])
def test_cpu_ids_beyond_any_kernel_are_refused_without_expanding_them(cpus):
    doc = allocation_to_json(Allocation("n", (0,), "0", ()))
    doc["cpus"] = cpus
    with pytest.raises(RecordError, match=r"allocation\.cpus"):
        decode_allocation(json.dumps(doc))


def test_an_over_long_integer_is_a_record_error_not_a_crash():
    with pytest.raises(RecordError, match="not valid JSON"):
        decode_allocation('{"version": ' + "1" * 5000 + "}")


def test_decided_at_is_utc_to_the_second_whatever_the_zone():
    from datetime import datetime, timedelta, timezone

    from railyard.records.allocation import format_decided_at

    moment = datetime(2026, 12, 2, 11, 0, 0, 750000, tzinfo=timezone(timedelta(hours=1)))
    assert format_decided_at(moment) == "2026-12-02T10:00:00Z"
