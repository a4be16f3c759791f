"""Koordinator's `device-allocated` read back (records.koordinator, decision 0095): the
devices it names found on one node, bounded before any work, every failure a RecordError
naming the field."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation
from railyard.discovery.profiles import build_topology, profile
from railyard.records.allocation import MAX_RECORD_BYTES, RecordError
from railyard.records.koordinator import (
    MAX_ENTRIES,
    KoordinatorDevices,
    KoordinatorGpu,
    KoordinatorRdma,
    decode_device_allocated,
    devices_on,
    encode_device_allocated,
)

H100 = build_topology(profile("dgx-h100"), vfs_per_pf=2, node="node-a")
A100 = build_topology(profile("dgx-a100"), vfs_per_pf=2, node="node-b")


def on_node(text: str, topology=H100):
    return devices_on(decode_device_allocated(text), topology)


def test_what_the_encoder_writes_reads_back_as_the_same_devices():
    a = Allocator().allocate(H100, Ledger(H100), Request(gpus=4, vfs=4))
    assert isinstance(a, Allocation)
    found = on_node(encode_device_allocated(a, H100))
    assert found.gpus == tuple(p.gpu for p in a.pairs)
    assert found.vfs == tuple(p.nic for p in a.pairs)
    assert found.pfs == ()


def test_koordlets_own_example_reads_as_one_gpu_and_one_vf():
    pf, vf = H100.nics[0], H100.nics[0].vfs[1]
    gpu = H100.gpus[0]
    text = json.dumps({
        "gpu": [{"minor": 0, "id": gpu.uuid, "resources": {"koordinator.sh/gpu-core": "100",
                                                           "koordinator.sh/gpu-memory-ratio":
                                                           "100"}}],
        "rdma": [{"minor": 0, "id": pf.pci_address, "resources": {"koordinator.sh/rdma": "1"},
                  "extension": {"vfs": [{"minor": -1, "busID": vf.pci_address}]}}],
        "fpga": [{"minor": 3}]})  # not Railyard's: left to its own plugin
    found = on_node(text)
    assert [g.pci_address for g in found.gpus] == [gpu.pci_address]
    assert [(n.pci_address, n.pf_pci_address, n.kind) for n in found.vfs] == [
        (vf.pci_address, pf.pci_address, "vf")]


def test_a_gpu_without_uuid_is_found_by_minor_and_the_uuid_wins_over_the_minor():
    found = on_node(json.dumps({"gpu": [{"minor": 5}]}))
    assert found.gpus[0].pci_address == H100.gpus[5].pci_address
    # koordlet reports NVML's minor, which need not be our PCI-order index.
    found = on_node(json.dumps({"gpu": [{"minor": 0, "id": H100.gpus[3].uuid}]}))
    assert found.gpus[0].pci_address == H100.gpus[3].pci_address


def test_an_entry_without_vfs_is_the_whole_pf():
    pf = H100.nics[4]
    found = on_node(json.dumps({"rdma": [{"minor": 4, "id": pf.pci_address,
                                          "resources": {"koordinator.sh/rdma": "100"}}]}))
    assert [(n.pci_address, n.kind) for n in found.pfs] == [(pf.pci_address, "pf")]
    assert found.vfs == ()


@pytest.mark.parametrize(("doc", "field", "says"), [
    ("not json", "deviceAllocated", "not valid JSON"),
    ("[1]", "deviceAllocated", "expected an object, got a list"),
    ('{"gpu": {"minor": 0}}', "deviceAllocated.gpu", "expected a list"),
    ('{"gpu": [{"minor": "0"}]}', "deviceAllocated.gpu[0].minor", "expected an integer"),
    ('{"gpu": [{"minor": -1}]}', "deviceAllocated.gpu[0].minor", "expected an integer 0.."),
    ('{"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "50"}}]}',
     "deviceAllocated.gpu[0].resources.koordinator.sh/gpu-core", "does not share"),
    ('{"rdma": [{"id": "mlx5_0"}]}', "deviceAllocated.rdma[0].id", "not a PCI address"),
    ('{"rdma": [{"id": "0000:18:00.0", "extension": {"vfs": [{"busID": 7}]}}]}',
     "deviceAllocated.rdma[0].extension.vfs[0].busID", "expected a string"),
    ('{"rdma": [{"id": "0000:18:00.0", "resources": {"koordinator.sh/rdma": "1"}}]}',
     "deviceAllocated.rdma[0].resources.koordinator.sh/rdma", "expected 100"),
    ('{"gpu": [], "gpu": [{"minor": 0}]}', "deviceAllocated", "appears twice"),
    ("[" * 100_000 + "]" * 100_000, "deviceAllocated", "nested too deeply"),
])
def test_a_malformed_record_is_refused_naming_the_field(doc, field, says):
    with pytest.raises(RecordError) as e:
        decode_device_allocated(doc)
    assert e.value.path == field, e.value
    assert says in e.value.reason


def test_an_oversized_record_is_refused_before_it_is_parsed():
    text = '{"gpu": [' + ",".join(['{"minor": 0}'] * 30_000) + "]}"
    assert len(text) > MAX_RECORD_BYTES
    with pytest.raises(RecordError, match="larger than the 262144 bytes"):
        decode_device_allocated(text)
    many = json.dumps({"gpu": [{"minor": 0}] * (MAX_ENTRIES + 1)})
    with pytest.raises(RecordError, match=f"more than the {MAX_ENTRIES}"):
        decode_device_allocated(many)


def test_devices_of_another_node_are_refused_naming_them():
    with pytest.raises(RecordError, match=re.escape(f"GPU {A100.gpus[0].uuid} is not on node-a")):
        on_node(json.dumps({"gpu": [{"minor": 0, "id": A100.gpus[0].uuid}]}))
    with pytest.raises(RecordError, match="GPU minor 8 is not on node-a"):
        on_node(json.dumps({"gpu": [{"minor": 8}]}))
    with pytest.raises(RecordError, match=re.escape("PF 0000:aa:00.0 is not on node-a")) as e:
        on_node(json.dumps({"rdma": [{"id": "0000:aa:00.0"}]}))
    assert e.value.path == "deviceAllocated.rdma[0].id"
    other_vf = H100.nics[3].vfs[0].pci_address  # a VF of another PF of this node
    with pytest.raises(RecordError, match=re.escape(f"{other_vf} is not a VF of 0000:18:00.0")):
        on_node(json.dumps({"rdma": [{"id": "0000:18:00.0",
                                      "extension": {"vfs": [{"busID": other_vf}]}}]}))


def test_a_device_named_twice_a_pf_with_its_own_vf_and_the_default_route_pf_are_refused():
    gpu = H100.gpus[0]
    with pytest.raises(RecordError, match="named twice"):
        on_node(json.dumps({"gpu": [{"minor": 0}, {"minor": 1, "id": gpu.uuid}]}))
    pf, vf = H100.nics[0].pci_address, H100.nics[0].vfs[0].pci_address
    with pytest.raises(RecordError, match="a PF given whole and a VF of it"):
        on_node(json.dumps({"rdma": [{"id": pf}, {"id": pf, "extension": {
            "vfs": [{"busID": vf}]}}]}))
    nics = (replace(H100.nics[0], default_route=True), *H100.nics[1:])
    with pytest.raises(RecordError, match="default route"):
        on_node(json.dumps({"rdma": [{"id": pf}]}), replace(H100, nics=nics))


def test_resolution_of_the_decoded_value_alone_is_the_same_check():
    devices = KoordinatorDevices((KoordinatorGpu(2, None),),
                                 (KoordinatorRdma(H100.nics[3].pci_address, ()),))
    found = devices_on(devices, H100)
    assert [g.index for g in found.gpus] == [2] and len(found.pfs) == 1


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(
                        st.sampled_from(["gpu", "rdma", "minor", "id", "resources",
                                         "extension", "vfs", "busID", "x"]), c, max_size=4),
                    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_json_is_read_or_refused_with_a_record_error_never_anything_else(doc):
    with contextlib.suppress(RecordError):
        on_node(json.dumps(doc))
