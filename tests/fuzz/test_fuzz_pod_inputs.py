"""Fuzz sweep, what a pod author writes: a precise error, no state change, bounded cost.

Covered (each fed mutations of a valid input and raw text or bytes):
- `allocation.request.request_from_pod` (resources of containers, sidecars and init
  containers; the request annotation) → `Request` or `RequestError`;
- the request hints: `hints_from_annotations` (the `railyard.dev/request` text) and
  `parse_hints` (its decoded object) → hints or `RequestError`;
- `records.allocation.decode_allocation` (the `railyard.dev/allocation` text or bytes) and
  `allocation_from_json` → `Allocation` or `RecordError`;
- `kubelet.pods.pod_view` → `PodView` (a bad record or request kept as its error string) or
  `PodError`;
- the agent's pods file (`kubelet.pods.PodsFile`): never raises; a file it cannot use keeps
  the last good list;
- `topology.cpus.parse_cpulist` (kernel cpulists; a record's `cpus` reaches it through
  `Fields.cpulist`) → CPU ids or `ValueError` naming the element.

The codecs a pod author controls (the Allocation annotation, the hints, cpulists) are also
held to a `tracemalloc` peak.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fuzz_strategies import (
    FUZZ,
    call,
    documents,
    materialise,
    names_a_field,
    raw_bytes,
    raw_text,
    to_json,
    values,
)
from hypothesis import given
from hypothesis import strategies as st

from railyard.allocation.names import ALLOCATION_ANNOTATION, REQUEST_ANNOTATION
from railyard.allocation.request import (
    Request,
    RequestError,
    hints_from_annotations,
    parse_hints,
    request_from_pod,
)
from railyard.kubelet.pods import PodError, PodsFile, PodView, pod_view
from railyard.records.allocation import (
    MAX_RECORD_BYTES,
    RecordError,
    allocation_from_json,
    allocation_to_json,
    decode_allocation,
    encode_allocation,
)
from railyard.topology.cpus import MAX_CPU, parse_cpulist
from support.allocations import allocation, h100, vf
from support.pods import pod

MiB = 1 << 20
INT64 = (1 << 63) - 1

TOPOLOGY = h100(vfs_per_pf=2)
ALLOCATION = dataclasses.replace(
    allocation(TOPOLOGY, [(0, vf(TOPOLOGY, 0, 0)), (1, vf(TOPOLOGY, 3, 0))],
               nics=[vf(TOPOLOGY, 4, 1)], numa_nodes=(0, 1)),
    cpus="0-3,8,112-119", memory_bytes=((0, 16 << 30), (1, 1 << 30)))
RECORD = allocation_to_json(ALLOCATION)
HINTS = {"maxDistance": "PXB", "numa": "single", "pairing": "one-to-one"}


def _valid_pod() -> dict:
    p = pod("6f1c0a3e-0000-4000-8000-000000000001",
            {"main": {"nvidia.com/gpu": 2, "railyard.dev/vf": 2, "cpu": "8", "memory": "16Gi"},
             "side": {"railyard.dev/pf": 1, "cpu": "500m", "memory": "1Gi"}},
            name="trainer-0", node=TOPOLOGY.node, phase="Pending",
            created="2026-12-01T10:00:00Z", alloc=ALLOCATION, hints=HINTS)
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "8", "memory": "16Gi"}
    p["spec"]["initContainers"] = [
        {"name": "proxy", "restartPolicy": "Always",
         "resources": {"limits": {"cpu": "1", "memory": "256Mi", "railyard.dev/vf": "1"}}},
        {"name": "fetch", "resources": {"requests": {"nvidia.com/gpu": "4"},
                                        "limits": {"cpu": "2", "memory": "1Gi"}}},
    ]
    return p


POD = _valid_pod()
# The pod with its annotations as decoded objects, so that mutations reach inside them too;
# `_encoded` writes them back as the JSON strings they are on a real pod.
POD_OPEN = json.loads(json.dumps(POD))
POD_OPEN["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: RECORD, REQUEST_ANNOTATION: HINTS}


def _encoded(p: object) -> object:
    """`p` with its two annotations, where they are objects, as JSON strings (a copy)."""
    meta = p.get("metadata") if isinstance(p, dict) else None
    notes = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(notes, dict):
        return p
    notes = {k: to_json(v) if k in (ALLOCATION_ANNOTATION, REQUEST_ANNOTATION)
             and isinstance(v, dict) else v for k, v in notes.items()}
    return {**p, "metadata": {**meta, "annotations": notes}}


def _decoded(p: dict) -> dict:
    notes = p["metadata"]["annotations"]
    return {**p, "metadata": {**p["metadata"], "annotations": {
        k: json.loads(v) for k, v in notes.items()}}}


pod_documents = st.one_of(documents(POD), documents(POD_OPEN).map(_encoded))
pods = pod_documents.map(materialise)


def test_the_valid_inputs_are_taken_whole():
    # The mutations start from inputs that parse, so most examples get past the first checks.
    r = request_from_pod(POD)
    assert (r.gpus, r.vfs, r.pfs, r.numa, r.pairing) == (4, 3, 1, "single", "one-to-one")
    view = pod_view(POD)
    assert view.allocation == ALLOCATION and view.request is not None
    assert view.allocation_error is None and view.request_error is None
    assert decode_allocation(encode_allocation(ALLOCATION)) == ALLOCATION
    assert _decoded(_encoded(json.loads(json.dumps(POD_OPEN)))) == _decoded(POD)


# ----------------------------------------------------------------------- the request


@FUZZ
@given(pods)
def test_a_pods_request_is_a_request_or_a_request_error_naming_the_field(p):
    out = call(lambda: request_from_pod(p), RequestError, says=lambda e: bool(e.field),
               peak_bytes=8 * MiB)
    if not out.refused:
        r: Request = out.value
        assert all(0 <= n <= INT64 for n in (r.gpus, r.vfs, r.pfs, r.exclusive_cpus,
                                              r.memory_bytes))


@FUZZ
@given(st.one_of(raw_text(HINTS), st.text(max_size=60)))
def test_the_request_annotation_is_hints_or_a_request_error_in_bounded_memory(text):
    call(lambda: hints_from_annotations({REQUEST_ANNOTATION: text}), RequestError,
         says=lambda e: e.field.startswith(f"metadata.annotations[{REQUEST_ANNOTATION}]"),
         peak_bytes=2 * MiB + 16 * len(text))


@FUZZ
@given(values(HINTS))
def test_decoded_hints_are_hints_or_a_request_error_naming_the_key(data):
    call(lambda: parse_hints(data), RequestError, says=lambda e: e.field.startswith("hints"),
         peak_bytes=2 * MiB)


# ----------------------------------------------------------------------- the record

# A `cpus` list as long as an annotation may be, that would expand to billions of ids if
# ranges were expanded before they are checked (issue 19, class 1).
repeated_ranges = st.builds(
    lambda element, times: ",".join([element] * times),
    st.sampled_from(("0-65535", "0", "1-2", "65535", "3-3", "0-4000000000")),
    st.sampled_from((1, 2, 500, 29_000)))


def _with_cpus(cpus: str) -> str:
    return json.dumps({**RECORD, "cpus": cpus})


records_text = st.one_of(raw_text(RECORD), repeated_ranges.map(_with_cpus))


def _record_peak(size: int) -> int:
    # What json.loads builds for a record of this size, plus what decoding it keeps: a
    # 256 KiB record of small objects holds about 10 MiB of dicts while it is read.
    return 4 * MiB + 48 * size


@FUZZ
@given(st.one_of(records_text, raw_bytes(RECORD)))
def test_an_allocation_annotation_is_an_allocation_or_a_record_error_in_bounded_memory(text):
    out = call(lambda: decode_allocation(text, ALLOCATION_ANNOTATION), RecordError,
               says=lambda e: e.path.startswith(ALLOCATION_ANNOTATION) and bool(e.reason),
               peak_bytes=_record_peak(len(text)))
    if len(text) > MAX_RECORD_BYTES:
        assert out.refused


@FUZZ
@given(values(RECORD))
def test_a_decoded_record_is_an_allocation_or_a_record_error_naming_the_field(doc):
    call(lambda: allocation_from_json(doc), RecordError,
         says=lambda e: e.path.startswith("allocation") and bool(e.reason),
         peak_bytes=4 * MiB)


# ----------------------------------------------------------------------- the agent's view


@FUZZ
@given(pods)
def test_a_pod_is_a_view_or_a_pod_error_and_a_bad_record_stays_the_pods_own(p):
    out = call(lambda: pod_view(p), PodError, says=names_a_field, peak_bytes=8 * MiB)
    if not out.refused:
        view: PodView = out.value
        assert (view.request is None) != (view.request_error is None)
        for error in (view.allocation_error, view.request_error, *view.problems):
            assert error is None or 0 < len(error) <= 2000
        if view.allocation_error is not None:
            assert view.allocation is None and ALLOCATION_ANNOTATION in view.allocation_error


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ry-fuzz-pods-") as d:
        yield Path(d)


GOOD_LIST = json.dumps([POD]).encode()


def _write(path: Path, data: bytes, mtime_ns: int) -> None:
    path.write_bytes(data)
    # The reader notices a change by (mtime, size, inode): set the time, so two writes in
    # one clock tick are two versions.
    os.utime(path, ns=(mtime_ns, mtime_ns))


@FUZZ
@given(st.one_of(raw_bytes([POD]), raw_bytes({"kind": "PodList", "items": [POD_OPEN]}),
                 pod_documents.map(lambda p: to_json([p]).encode("utf-8", "surrogatepass"))))
def test_the_pods_file_keeps_its_last_good_list_whatever_is_written_over_it(folder, data):
    path = folder / "pods.json"
    _write(path, GOOD_LIST, 1_000_000_000_000_000_000)
    source = PodsFile(path)
    good = source.pods()
    assert [v.uid for v in good] == [POD["metadata"]["uid"]] and source.generation == 1
    _write(path, data, 2_000_000_000_000_000_000)
    out = call(source.pods, ())  # never raises: kubelet's Allocate must be answered
    if source.generation == 1:  # not taken: the last good list, unchanged
        assert out.value is good and [v.uid for v in out.value] == [POD["metadata"]["uid"]]
    else:
        assert source.generation == 2 and all(isinstance(v, PodView) for v in out.value)
    assert source.loaded


# ----------------------------------------------------------------------- cpulists

cpulists = st.one_of(
    st.text(st.sampled_from("0123456789-,"), max_size=40),
    st.text(st.sampled_from("0123456789-, \n٣１x"), max_size=20),
    repeated_ranges,
    st.lists(st.tuples(st.integers(0, 70_000), st.integers(0, 70_000)), max_size=50).map(
        lambda rs: ",".join(f"{a}-{b}" for a, b in rs)),
    st.sampled_from(("", "\n", "0-3\n", "0-3\n\n", "1" * 5_000, "0-" + "9" * 5_000, "-1",
                     "1-", ",", "0,,1", "3-1", f"0-{MAX_CPU + 1}", "0-65535" + ",0-65535" * 99)),
)


@FUZZ
@given(cpulists)
def test_a_cpulist_is_cpu_ids_or_a_value_error_naming_the_element(text):
    out = call(lambda: parse_cpulist(text), ValueError,
               says=lambda e: str(e).startswith("bad CPU list element"),
               peak_bytes=8 * MiB)  # MAX_CPU + 1 ids, or 29,000 ranges of a record
    if not out.refused:
        assert out.value == sorted(set(out.value)) and all(0 <= c <= MAX_CPU for c in out.value)

