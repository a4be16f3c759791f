"""The Allocation codec: lossless round trips, and precise errors for edited annotations."""

from __future__ import annotations

import contextlib
import json
import time
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.discovery.profiles import PROFILES, build_topology
from railyard.records.allocation import (
    MAX_RECORD_BYTES,
    RecordError,
    allocation_to_json,
    decode_allocation,
    encode_allocation,
)
from railyard.topology.model import Distance

# Profiles with GPUs: an allocation here pairs some (the CPU node profile has none).
TOPOS = [t for t in (build_topology(p, vfs_per_pf=4) for p in PROFILES.values()) if t.gpus]


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


@pytest.mark.parametrize("cpus", ["0-9_9999", "0-9_999_999_999", "1_0", "\uff10-\uff13", "+3"],
                         ids=["underscore-range", "ten-billion", "underscore", "fullwidth",
                              "plus-sign"])
def test_cpus_that_are_not_an_ascii_kernel_cpulist_are_refused(cpus):
    # int() takes PEP 515 underscores, full-width digits and signs: a bound checked on \d+
    # runs let "0-9_9999" past 65535 ("0-9_999_999_999" would expand to ten billion CPUs in
    # the agent) and "1_0" silently mean CPU 10.
    doc = allocation_to_json(Allocation("n", (0,), None, ()))
    doc["cpus"] = cpus
    with pytest.raises(RecordError, match=r"allocation\.cpus"):
        decode_allocation(json.dumps(doc))


@pytest.mark.parametrize("text", [
    "[" * 100_000,  # RecursionError inside json.loads
    json.dumps({**allocation_to_json(Allocation("n", (0,), None, ())),
                "memoryBytes": {"\u00b2": 1}}),  # "²".isdigit(), but int("²") fails
    json.dumps({**allocation_to_json(Allocation("n", (0,), None, ())),
                "memoryBytes": {"9" * 5000: 1}}),  # past int()'s digit limit
], ids=["deeply-nested-json", "superscript-numa-key", "5000-digit-numa-key"])
def test_malformed_annotation_is_a_record_error_not_another_exception(text):
    # The kubelet plugins and `railyard allocate --used` catch RecordError only.
    with pytest.raises(RecordError):
        decode_allocation(text)


@pytest.mark.parametrize("keys", [{"0": 5, "00": 7}, {"01": 5}, {"1234567": 5}])
def test_memory_keys_must_name_a_numa_node_canonically(keys):
    # {"0": 5, "00": 7} would decode into two entries for NUMA node 0 that do not survive
    # re-encoding: the ledger's memory would change when an agent restores its state.
    doc = allocation_to_json(Allocation("n", (0,), None, ()))
    doc["memoryBytes"] = keys
    with pytest.raises(RecordError, match=r"allocation\.memoryBytes: key"):
        decode_allocation(json.dumps(doc))


def test_a_nic_named_twice_with_other_fields_is_refused():
    # Allocation.all_nics keeps the first mention of an address, so a second one naming
    # another PF would be silently dropped by the ledger, the kubelet and the CNI.
    d = _valid()
    twice = dict(d["pairs"][0], gpu=dict(d["pairs"][0]["gpu"], index=1,
                                         pciAddress="0000:29:00.0"))
    d["pairs"].append(dict(twice, nic=dict(twice["nic"], pfPciAddress="0000:19:00.0")))
    with pytest.raises(RecordError, match=r"allocation\.pairs\[1\]\.nic: 0000:18:00\.1 is also "
                                          r"allocation\.pairs\[0\]\.nic"):
        decode_allocation(json.dumps(d))
    d["pairs"][1] = twice  # shared pairing: the same NIC, described the same way
    assert len(decode_allocation(json.dumps(d)).all_nics) == 1


@pytest.mark.parametrize(("address", "ok"), [
    ("10000:13:00.1", True), ("ffffffff:00:00.0", True), ("100000000:13:00.1", False),
    ("000:13:00.1", False), ("0000:13:00.8", False), ("0000:13:00.1\n", False),
])
def test_pci_domains_of_four_to_eight_hex_digits_are_accepted(address, ok):
    # As the kernel (and discovery, the allocator, the CNI) write them: Intel VMD uses 5.
    d = _valid()
    d["pairs"][0]["nic"]["pciAddress"] = address
    if ok:
        assert decode_allocation(json.dumps(d)).pairs[0].nic.pci_address == address
    else:
        with pytest.raises(RecordError, match=r"pairs\[0\]\.nic\.pciAddress: not a PCI"):
            decode_allocation(json.dumps(d))


def test_an_over_long_integer_is_a_record_error_not_a_crash():
    with pytest.raises(RecordError, match="not valid JSON"):
        decode_allocation('{"version": ' + "1" * 5000 + "}")


def test_decided_at_is_utc_to_the_second_whatever_the_zone():
    from datetime import datetime, timedelta, timezone

    from railyard.records.allocation import format_decided_at

    moment = datetime(2026, 12, 2, 11, 0, 0, 750000, tzinfo=timezone(timedelta(hours=1)))
    assert format_decided_at(moment) == "2026-12-02T10:00:00Z"


def _measured(call):
    """(what `call()` raised, the seconds it took, the peak bytes it allocated): timed on a
    run of its own, since tracing allocations slows Python several times over."""
    started = time.perf_counter()
    try:
        call()
    except Exception as e:  # the caller checks which
        raised = e
    else:
        raised = None
    elapsed = time.perf_counter() - started
    tracemalloc.start()
    try:
        with contextlib.suppress(Exception):
            call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return raised, elapsed, peak


@pytest.mark.parametrize("repeats", [500, 29_000], ids=["4-KB", "232-KB"])
def test_a_cpulist_repeating_its_ranges_is_refused_fast_without_expanding_them(repeats):
    # Issue 19, class 1: 4 KB of "0-65535," took the agent to 1.3 GB and 4 s (past kubelet's
    # 5 s deadline for Allocate) because every range was expanded before de-duplication.
    doc = allocation_to_json(Allocation("n", (0,), None, ()))
    doc["cpus"] = ",".join(["0-65535"] * repeats)
    text = json.dumps(doc)
    raised, elapsed, peak = _measured(lambda: decode_allocation(text))
    assert isinstance(raised, RecordError)
    assert str(raised).startswith("allocation.cpus: bad CPU list '0-65535,0-65535"), raised
    assert "0-65535 does not come after CPU 65535" in str(raised)
    assert elapsed < 0.5 and peak < 32 << 20, (elapsed, peak)


def test_cpus_out_of_order_or_repeated_are_refused_naming_the_element():
    doc = allocation_to_json(Allocation("n", (0,), None, ()))
    for cpus, element in (("4-7,0-3", "0-3"), ("0-3,3", "3"), ("0-3,2-9", "2-9")):
        doc["cpus"] = cpus
        with pytest.raises(RecordError, match=f"{element} does not come after CPU"):
            decode_allocation(json.dumps(doc))
    doc["cpus"] = "0-3,4-7,9"  # the kernel's own form (adjacent ranges unmerged) is fine
    assert decode_allocation(json.dumps(doc)).cpus == "0-3,4-7,9"


def test_an_annotation_larger_than_kubernetes_allows_is_refused_before_it_is_parsed():
    doc = allocation_to_json(Allocation("n", (0,), None, ()))
    doc["node"] = "n" * MAX_RECORD_BYTES
    raised, elapsed, peak = _measured(lambda: decode_allocation(json.dumps(doc)))
    assert isinstance(raised, RecordError)
    assert f"larger than the {MAX_RECORD_BYTES} bytes" in str(raised)
    assert elapsed < 0.1 and peak < 1 << 20, (elapsed, peak)
