"""A claim's allocation read for this node and turned into the node's record (pure parts)."""

from __future__ import annotations

import contextlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.discovery.profiles import PROFILES, build_topology
from railyard.kubelet.dra_claim import (
    ClaimError,
    ClaimRef,
    DeviceNames,
    claim_to_allocation,
    read_claim,
)
from railyard.kubelet.dra_prepare import slice_gpus
from railyard.kubelet.pairing import DeviceIndex
from railyard.records.dra_names import device_name
from railyard.topology.model import Distance

TOPO = build_topology(PROFILES["dgx-h100"], 2)
NAMES = DeviceNames(DeviceIndex(TOPO))
GPU = [g.pci_address for g in TOPO.gpus]
COMPUTE = [n for n in TOPO.nics if n.total_vfs]
REF = ClaimRef("ns", "c-1", "claim")


def doc(results: list[dict], **status: object) -> dict:
    return {"metadata": {"uid": REF.uid, "name": REF.name, "namespace": REF.namespace},
            "status": {"allocation": {"devices": {"results": results}},
                       "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
                       **status}}


def ours(request: str, pci: str) -> dict:
    return {"request": request, "driver": "railyard.dev", "pool": TOPO.node,
            "device": device_name(pci)}


def test_device_names_are_dns_labels_of_the_pci_address():
    assert device_name("0000:3B:00.2") == "pci-0000-3b-00-2"
    assert NAMES.device(device_name(COMPUTE[0].vfs[1].pci_address)).pci_address == \
        COMPUTE[0].vfs[1].pci_address


def test_first_available_subrequests_pair_under_their_request():
    vf = COMPUTE[0].vfs[0].pci_address
    claim = read_claim(doc([ours("gpu-0", GPU[0]), ours("nic-0/switch", vf)]), REF, TOPO.node)
    assert [r.base_request for r in claim.ours] == ["gpu-0", "nic-0"]
    alloc = claim_to_allocation(claim, NAMES, decided_at="t")
    (pair,) = alloc.pairs
    assert (pair.gpu.pci_address, pair.distance) == (GPU[0], Distance.PIX)


def test_nics_beyond_the_gpus_stay_unpaired_in_request_order():
    vfs = [COMPUTE[i].vfs[0].pci_address for i in range(3)]
    claim = read_claim(doc([ours("gpu-0", GPU[0])] + [ours(f"nic-{i}", v)
                                                     for i, v in enumerate(vfs)]),
                       REF, TOPO.node)
    alloc = claim_to_allocation(claim, NAMES, decided_at="t")
    assert [p.nic.pci_address for p in alloc.pairs] == vfs[:1]
    assert [n.pci_address for n in alloc.nics] == vfs[1:]


def test_admin_access_is_refused_by_name():
    result = {**ours("nic-0", COMPUTE[0].vfs[0].pci_address), "adminAccess": True}
    try:
        read_claim(doc([result]), REF, TOPO.node)
    except ClaimError as e:
        assert "adminAccess" in str(e)
    else:
        raise AssertionError("admin access was accepted")


def test_another_drivers_gpus_pair_by_their_slices_pci_bus_id():
    nvidia = {"request": "gpu-0", "driver": "gpu.nvidia.com", "pool": TOPO.node,
              "device": "gpu-3"}
    slices = [{"spec": {"driver": "gpu.nvidia.com", "pool": {"name": TOPO.node},
                        "devices": [{"name": "gpu-3", "attributes": {
                            "resource.kubernetes.io/pciBusID": {"string": GPU[3]}}}]}}]
    claim = read_claim(doc([nvidia, ours("nic-0", COMPUTE[3].vfs[0].pci_address)]),
                       REF, TOPO.node)
    alloc = claim_to_allocation(claim, NAMES, decided_at="t",
                                other_gpu=slice_gpus(slices, TOPO))
    assert [(p.gpu.pci_address, p.nic.pci_address, p.rail) for p in alloc.pairs] == \
        [(GPU[3], COMPUTE[3].vfs[0].pci_address, 3)]



def nvidia_slice(devices: dict[str, dict]) -> list[dict]:
    return [{"spec": {"driver": "gpu.nvidia.com", "pool": {"name": TOPO.node},
                      "devices": [{"name": n, "attributes": a} for n, a in devices.items()]}}]


def nvidia_result(request: str, device: str, driver: str = "gpu.nvidia.com") -> dict:
    return {"request": request, "driver": driver, "pool": TOPO.node, "device": device}


def test_nvidias_gpus_pair_with_our_nics_in_request_order_by_either_bus_id_attribute():
    # The standard attribute (NVIDIA's driver today) and its own `pcieBusID` (before it).
    slices = nvidia_slice({
        "gpu-5": {"resource.kubernetes.io/pciBusID": {"string": GPU[5].upper()}},
        "gpu-1": {"pcieBusID": {"string": GPU[1]}}})
    vfs = [COMPUTE[5].vfs[0].pci_address, COMPUTE[1].vfs[0].pci_address]
    claim = read_claim(doc([ours("nic-0/root", vfs[0]), nvidia_result("gpu-0", "gpu-5"),
                            ours("nic-1/root", vfs[1]), nvidia_result("gpu-1", "gpu-1")]),
                       REF, TOPO.node)
    alloc = claim_to_allocation(claim, NAMES, decided_at="t",
                                other_gpu=slice_gpus(slices, TOPO))
    assert [(p.gpu.pci_address, p.nic.pci_address) for p in alloc.pairs] == \
        [(GPU[5], vfs[0]), (GPU[1], vfs[1])]
    assert not alloc.gpus and not alloc.nics


def test_an_nvidia_gpu_its_slice_does_not_place_is_refused_rather_than_shifting_the_pairs():
    # gpu-9 has no PCI address of this node: skipping it would pair gpu-5 with nic-0's VF.
    slices = nvidia_slice({
        "gpu-9": {"uuid": {"string": "GPU-x"}},
        "gpu-5": {"resource.kubernetes.io/pciBusID": {"string": GPU[5]}}})
    claim = read_claim(doc([ours("nic-0", COMPUTE[0].vfs[0].pci_address),
                            nvidia_result("gpu-0", "gpu-9"),
                            ours("nic-1", COMPUTE[5].vfs[0].pci_address),
                            nvidia_result("gpu-1", "gpu-5")]), REF, TOPO.node)
    for lookup, words in ((slice_gpus(slices, TOPO), "gives it no PCI address"),
                          (None, "could not be read")):
        try:
            claim_to_allocation(claim, NAMES, decided_at="t", other_gpu=lookup)
        except ClaimError as e:
            assert "'gpu-9'" in str(e) and words in str(e), e
        else:
            raise AssertionError("a GPU the record cannot name was skipped")


def test_another_drivers_devices_that_are_not_gpus_are_not_paired():
    vf = COMPUTE[2].vfs[0].pci_address
    claim = read_claim(doc([ours("nic-0", vf), nvidia_result("extra", "eth9", "dra.net")]),
                       REF, TOPO.node)
    alloc = claim_to_allocation(claim, NAMES, decided_at="t", other_gpu=None)
    assert not alloc.pairs and [n.pci_address for n in alloc.nics] == [vf]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, JSON.map(lambda s: {"metadata": {"uid": REF.uid}, "status": s}),
                 JSON.map(lambda a: doc([], allocation=a)),
                 JSON.map(lambda r: doc([], reservedFor=r)),
                 st.lists(JSON, max_size=3).map(doc)))
def test_any_json_is_read_or_refused_with_a_claim_error(value):
    try:
        claim = read_claim(json.loads(json.dumps(value)), REF, TOPO.node)
    except ClaimError as e:
        assert str(e)
        return
    with contextlib.suppress(ClaimError):  # a device this node lacks: refused by name
        claim_to_allocation(claim, NAMES, decided_at="t")
