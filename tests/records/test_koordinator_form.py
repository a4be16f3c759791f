"""Allocations in Koordinator's `scheduling.koordinator.sh/device-allocated` form."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request, parse_request_spec
from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.discovery.profiles import build_topology, profile
from railyard.records.allocation import RecordError
from railyard.records.koordinator import (
    device_allocated_to_json,
    encode_device_allocated,
    rdma_minor,
)
from railyard.topology.model import Distance, NodeTopology

H100 = build_topology(profile("dgx-h100"))


def allocated(t: NodeTopology, r: Request) -> Allocation:
    a = Allocator().allocate(t, Ledger(t), r)
    assert isinstance(a, Allocation), a
    return a


def test_gpu_minor_is_the_index_and_rdma_minor_the_pf_mlx5_number():
    a = allocated(H100, Request(gpus=8, vfs=8))
    doc = device_allocated_to_json(a, H100)
    assert [g["minor"] for g in doc["gpu"]] == list(range(8))
    assert [g["id"] for g in doc["gpu"]] == [g.uuid for g in H100.gpus]
    # The compute NICs are mlx5_0,3,4,5,6,9,10,11: the storage cards take 1,2,7,8.
    assert [e["minor"] for e in doc["rdma"]] == [0, 3, 4, 5, 6, 9, 10, 11]
    assert all(e["resources"] == {"koordinator.sh/rdma": "1"} for e in doc["rdma"])
    assert [e["extension"]["vfs"][0]["busID"] for e in doc["rdma"]] == [
        p.nic.pci_address for p in a.pairs]


def test_each_vf_is_its_own_entry_and_a_whole_pf_counts_100():
    a = allocated(H100, Request(gpus=1, vfs=2))
    vfs = device_allocated_to_json(a, H100)["rdma"]
    assert len(vfs) == 2 and {e["id"] for e in vfs} == {"0000:18:00.0"}
    whole = device_allocated_to_json(allocated(H100, Request(gpus=1, pfs=1)), H100)["rdma"]
    assert whole == [{"minor": 0, "id": "0000:18:00.0",
                      "resources": {"koordinator.sh/rdma": "100"}}]


def test_shared_nic_appears_once():
    t = build_topology(profile("hgx-h100-4nic"))
    a = allocated(t, parse_request_spec("gpus=4,vfs=2"))
    doc = device_allocated_to_json(a, t)
    assert len(doc["gpu"]) == 4 and len(doc["rdma"]) == 2


def test_non_mlx5_rdma_names_get_minus_one():
    assert rdma_minor("mlx5_12") == 12
    assert rdma_minor("rocep152s0f0") == -1
    assert rdma_minor(None) == -1
    t = replace(H100, nics=tuple(replace(n, rdma_device=f"irdma{i}")
                                 for i, n in enumerate(H100.nics)))
    a = allocated(t, Request(gpus=1, vfs=1))
    assert device_allocated_to_json(a, t)["rdma"][0]["minor"] == -1


def test_vf_only_and_gpu_only_allocations_leave_the_other_list_out():
    assert set(device_allocated_to_json(allocated(H100, Request(vfs=1)), H100)) == {"rdma"}
    assert set(device_allocated_to_json(allocated(H100, Request(gpus=1)), H100)) == {"gpu"}


def test_encoded_form_is_compact_json():
    a = allocated(H100, Request(gpus=1, vfs=1))
    text = encode_device_allocated(a, H100)
    assert " " not in text and json.loads(text) == device_allocated_to_json(a, H100)


def test_allocation_of_another_node_is_refused_naming_the_field():
    a = allocated(H100, Request(gpus=1, vfs=1))
    other = build_topology(profile("dgx-h100"), node="elsewhere")
    with pytest.raises(RecordError, match=r"allocation\.node"):
        device_allocated_to_json(a, other)
    a100 = build_topology(profile("dgx-a100"), node=H100.node)
    with pytest.raises(RecordError, match=r"pairs\[0\]\.gpu\.pciAddress: GPU 0000:1b:00.0 is not"):
        device_allocated_to_json(a, a100)
    vf_only = allocated(H100, Request(vfs=1))
    with pytest.raises(RecordError, match=r"nics\[0\]\.pfPciAddress: PF 0000:18:00.0 is not"):
        device_allocated_to_json(vf_only, a100)


GENERIC2 = build_topology(profile("generic"), 2)  # PFs 0000:13:00.0 and 0000:42:00.0


def _with(nic: NicRef, paired: bool) -> Allocation:
    t = GENERIC2
    if paired:
        return Allocation(t.node, (0,), None, (),
                          pairs=(Pair(GpuRef.of(t.gpus[0]), nic, Distance.PIX),))
    return Allocation(t.node, (0,), None, (), nics=(nic,))


def test_a_vf_that_is_not_on_the_node_is_refused_naming_the_field():
    # Only the PF was looked up: a VF that does not exist still got an entry.
    ghost = NicRef("vf", "0000:99:00.1", GENERIC2.nics[0].pci_address, 0, None, None)
    with pytest.raises(RecordError, match=r"allocation\.pairs\[0\]\.nic\.pciAddress: VF "
                                          r"0000:99:00\.1 is not a VF of 0000:13:00\.0 .*"
                                          r"not on the node"):
        device_allocated_to_json(_with(ghost, paired=True), GENERIC2)


def test_a_vf_recorded_under_another_pf_is_refused_naming_the_field():
    # Koordinator would have counted pf1's VF against pf0.
    pf0, pf1 = GENERIC2.nics
    wrong = NicRef("vf", pf1.vfs[0].pci_address, pf0.pci_address, 0, None, None)
    with pytest.raises(RecordError, match=r"allocation\.nics\[0\]\.pciAddress: VF "
                                          r"0000:42:00\.1 is not a VF of 0000:13:00\.0 .*"
                                          r"a VF of 0000:42:00\.0"):
        device_allocated_to_json(_with(wrong, paired=False), GENERIC2)
    right = replace(wrong, pf_pci_address=pf1.pci_address)
    assert device_allocated_to_json(_with(right, paired=False), GENERIC2)["rdma"][0]["id"] == (
        pf1.pci_address)
