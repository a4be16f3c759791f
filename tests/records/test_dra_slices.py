"""The node's ResourceSlices (records.dra_slices, decision 0111): every device once, its
attributes from the topology, a PF exclusive of its own VFs by counters, unhealthy devices
tainted, the API server's limits kept by splitting the pool or refused by name."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.discovery.profiles import PROFILES, build_topology
from railyard.kubelet.dra_claim import DeviceNames
from railyard.kubelet.pairing import DeviceIndex
from railyard.records.dra_names import (
    DRIVER,
    KIND,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    PCIE_SWITCH,
    PF,
    RAIL,
    RDMA_DEVICE,
    UNHEALTHY_TAINT,
    device_name,
    distance_to_gpu,
)
from railyard.records.dra_slices import (
    MAX_ATTRIBUTES,
    MAX_COUNTER_SETS,
    MAX_COUNTERS,
    MAX_DEVICES,
    SliceLimitError,
    device_classes,
    dma_switch,
    node_slices,
)
from railyard.topology.model import Nic, Vf

DGX = build_topology(PROFILES["dgx-h100"], 2, node="node-a")


def devices_of(slices: list[dict]) -> list[dict]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def counters_of(slices: list[dict]) -> dict[str, dict[str, int]]:
    return {c["name"]: {k: int(v["value"]) for k, v in c["counters"].items()}
            for s in slices for c in s["spec"].get("sharedCounters", [])}


def by_name(slices: list[dict]) -> dict[str, dict]:
    return {d["name"]: d for d in devices_of(slices)}


def value(device: dict, attribute: str):
    [v] = device["attributes"][attribute].values()
    return v


def with_vfs(nic: Nic, count: int) -> Nic:
    """`nic` with `count` RDMA VFs at made-up addresses on buses of its own."""
    bus = int(nic.pci_address[5:7], 16)
    vfs = tuple(Vf(f"{nic.pci_address[:4]}:{(bus + 1 + i // 8) % 256:02x}:"
                   f"00.{i % 8}", i, f"mlx5_v{i}", f"v{i}", "mlx5_core",
                   None)
                for i in range(count))
    return replace(nic, vfs=vfs, total_vfs=count)


def test_every_vf_and_pf_of_the_compute_nics_is_one_device_and_gpus_only_when_asked():
    slices = node_slices(DGX)
    names = [d["name"] for d in devices_of(slices)]
    assert len(names) == len(set(names))
    nics = [n for n in DGX.nics if not n.default_route]
    expected = {device_name(n.pci_address) for n in nics}
    expected |= {device_name(v.pci_address) for n in nics for v in n.vfs}
    assert set(names) == expected
    with_gpus = {d["name"] for d in devices_of(node_slices(DGX, publish_gpus=True))}
    assert with_gpus == expected | {device_name(g.pci_address) for g in DGX.gpus}


def test_every_published_name_is_one_the_kubelet_plugin_resolves():
    names = DeviceNames(DeviceIndex(DGX))
    for d in devices_of(node_slices(DGX, publish_gpus=True)):
        assert names.device(d["name"]) is not None, d["name"]


def test_the_default_route_pf_and_vfio_vfs_are_not_published():
    nic = DGX.nics[0]
    vfio = replace(nic.vfs[0], driver="vfio-pci", rdma_device=None, netdev=None)
    topo = replace(DGX, nics=(replace(nic, vfs=(vfio, *nic.vfs[1:])),
                              replace(DGX.nics[1], default_route=True), *DGX.nics[2:]))
    names = set(by_name(node_slices(topo)))
    assert device_name(vfio.pci_address) not in names
    assert device_name(DGX.nics[1].pci_address) not in names
    assert device_name(nic.pci_address) in names


def test_a_vf_carries_the_standard_attributes_its_pf_switch_rail_rdma_device_and_distances():
    nic = next(n for n in DGX.nics if n.vfs and n.rail is not None)
    vf = nic.vfs[1]
    d = by_name(node_slices(DGX))[device_name(vf.pci_address)]
    assert value(d, KIND) == "vf"
    assert value(d, PCI_BUS_ID) == vf.pci_address
    assert value(d, PCIE_ROOT) == nic.pcie_root
    assert value(d, NUMA_NODE) == nic.numa_node
    assert value(d, PCIE_SWITCH) == nic.switch
    assert value(d, PF) == device_name(nic.pci_address)
    assert value(d, RAIL) == nic.rail
    assert value(d, RDMA_DEVICE) == vf.rdma_device
    for g in DGX.gpus:
        assert value(d, distance_to_gpu(g.index)) == int(DGX.distance[g.pci_address][
            nic.pci_address])
    pf = by_name(node_slices(DGX))[device_name(nic.pci_address)]
    assert value(pf, KIND) == "pf" and value(pf, PF) == device_name(nic.pci_address)
    assert value(pf, RDMA_DEVICE) == nic.rdma_device


def test_a_gpu_carries_its_switch_root_and_numa_node_and_no_pf():
    g = DGX.gpus[3]
    d = by_name(node_slices(DGX, publish_gpus=True))[device_name(g.pci_address)]
    assert value(d, KIND) == "gpu" and value(d, PCIE_SWITCH) == g.switch
    assert value(d, PCIE_ROOT) == g.pcie_root and value(d, NUMA_NODE) == g.numa_node
    assert PF not in d["attributes"]


def test_no_switch_no_rail_and_no_numa_node_leave_their_attributes_out():
    nic = replace(DGX.nics[0], switch=None, rail=None, numa_node=None)
    topo = replace(DGX, nics=(nic, *DGX.nics[1:]))
    d = by_name(node_slices(topo))[device_name(nic.vfs[0].pci_address)]
    assert not {PCIE_SWITCH, RAIL, NUMA_NODE} & set(d["attributes"])


def test_a_data_direct_nic_takes_the_switch_of_the_gpu_it_reaches_at_pix():
    nic = DGX.nics[0]
    gpu = next(g for g in DGX.gpus if DGX.distance[g.pci_address][nic.pci_address] > 0)
    far = replace(nic, data_direct="0000:99:00.0")
    distance = {g: dict(row) for g, row in DGX.distance.items()}
    distance[gpu.pci_address][nic.pci_address] = 0  # PIX through the Data Direct function
    for g in DGX.gpus:  # the PF's own neighbour is farther than PIX now
        if g.switch == nic.switch:
            distance[g.pci_address][nic.pci_address] = max(
                distance[g.pci_address][nic.pci_address], 1)
    topo = replace(DGX, nics=(far, *DGX.nics[1:]), distance=distance)
    assert dma_switch(topo, far) == gpu.switch
    assert dma_switch(DGX, nic) == nic.switch


def test_a_pf_and_its_own_vfs_share_one_counter_the_vfs_one_each_the_pf_all():
    slices = node_slices(DGX)
    counters = counters_of(slices)
    devices = by_name(slices)
    for n in (n for n in DGX.nics if not n.default_route):
        name = device_name(n.pci_address)
        [consumed] = devices[name]["consumesCounters"]
        size = counters[consumed["counterSet"]][name]
        assert size == max(1, len(n.vfs))
        assert consumed["counters"] == {name: {"value": str(size)}}
        for v in n.vfs:
            [c] = devices[device_name(v.pci_address)]["consumesCounters"]
            assert c == {"counterSet": consumed["counterSet"],
                         "counters": {name: {"value": "1"}}}


def test_counters_and_devices_are_never_in_one_slice_and_the_pool_counts_its_slices():
    slices = node_slices(DGX, publish_gpus=True, generation=7)
    assert all(not ("devices" in s["spec"] and "sharedCounters" in s["spec"]) for s in slices)
    pools = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"],
              s["spec"]["pool"]["resourceSliceCount"]) for s in slices}
    assert pools == {("node-a", 7, len(slices))}
    assert all(s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == "node-a"
               for s in slices)
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)


def test_unhealthy_devices_are_tainted_noschedule_and_a_sick_pf_takes_its_vfs():
    nic, other = [n for n in DGX.nics if n.vfs][:2]
    gpu = DGX.gpus[1]
    devices = by_name(node_slices(DGX, {nic.pci_address, other.vfs[0].pci_address,
                                        gpu.pci_address}, publish_gpus=True))
    taint = [{"key": UNHEALTHY_TAINT, "effect": "NoSchedule"}]
    tainted = {n for n, d in devices.items() if d.get("taints") == taint}
    assert tainted == {device_name(a) for a in (nic.pci_address, *[v.pci_address for v in
                                                                    nic.vfs],
                                                 other.vfs[0].pci_address, gpu.pci_address)}
    assert all("taints" not in d for n, d in devices.items() if n not in tainted)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 127), min_size=1, max_size=40))
def test_big_pools_split_within_every_api_limit_and_keep_every_device(vf_counts):
    base = DGX.nics[0]
    nics = tuple(with_vfs(replace(base, pci_address=f"{i + 1:04x}:10:00.0",
                                  rdma_device=f"mlx5_{i}"), n)
                 for i, n in enumerate(vf_counts))
    topo = replace(DGX, nics=nics, distance={g: {n.pci_address: d for n in nics
                                                 for d in [row[base.pci_address]]}
                                             for g, row in DGX.distance.items()})
    slices = node_slices(topo, publish_gpus=True)
    assert len(devices_of(slices)) == len(DGX.gpus) + sum(vf_counts) + len(vf_counts)
    for s in slices:
        spec = s["spec"]
        assert len(spec.get("devices", [])) <= MAX_DEVICES
        assert len(spec.get("sharedCounters", [])) <= MAX_COUNTER_SETS
        assert all(len(c["counters"]) <= MAX_COUNTERS for c in spec.get("sharedCounters", []))
        assert all(len(d["attributes"]) <= MAX_ATTRIBUTES for d in spec.get("devices", []))
        assert spec["pool"]["resourceSliceCount"] == len(slices)
    counters = counters_of(slices)
    assert sum(len(c) for c in counters.values()) == len(vf_counts)
    for d in devices_of(slices):  # every counter a device consumes exists in the pool
        for c in d.get("consumesCounters", []):
            assert set(c["counters"]) <= set(counters[c["counterSet"]])


def test_too_many_gpus_for_one_attribute_each_leave_the_distances_out():
    gpus = tuple(replace(DGX.gpus[0], index=i, pci_address=f"0000:{0x80 + i:02x}:00.0")
                 for i in range(30))
    nic = DGX.nics[0]
    topo = replace(DGX, gpus=gpus, nics=(nic,),
                   distance={g.pci_address: {nic.pci_address: DGX.distance[
                       DGX.gpus[0].pci_address][nic.pci_address]} for g in gpus})
    d = by_name(node_slices(topo))[device_name(nic.vfs[0].pci_address)]
    assert not any(a.startswith("distanceGpu") for a in d["attributes"])
    assert len(d["attributes"]) <= MAX_ATTRIBUTES


def test_what_the_api_server_would_refuse_is_refused_by_name():
    with pytest.raises(SliceLimitError, match="node name"):
        node_slices(replace(DGX, node="n" * 250))
    nic = replace(DGX.nics[0], rdma_device="r" * 70)
    with pytest.raises(SliceLimitError, match=r"rdmaDevice.*at most 64"):
        node_slices(replace(DGX, nics=(nic,)))


def test_the_device_classes_select_our_driver_and_one_kind_each():
    classes = {c["metadata"]["name"]: c["spec"]["selectors"][0]["cel"]["expression"]
               for c in device_classes()}
    assert classes == {
        f"railyard-{k}": f'device.driver == "railyard.dev" && '
                         f'device.attributes["railyard.dev"].kind == "{k}"'
        for k in ("gpu", "vf", "pf")}


def test_only_the_offered_vfs_and_pfs_are_published_and_counters_still_bind_them():
    nic, other = [n for n in DGX.nics if n.vfs][:2]
    offered = {nic.pci_address, other.vfs[0].pci_address}
    devices = by_name(node_slices(DGX, offered=offered))
    assert set(devices) == {device_name(nic.pci_address), device_name(other.vfs[0].pci_address)}
    counters = counters_of(node_slices(DGX, offered=offered))
    # The PF published alone still takes every VF it has published (none here: 1).
    assert sorted(c for cs in counters.values() for c in cs) == sorted(
        [device_name(nic.pci_address), device_name(other.pci_address)])
    assert counters["pfs-0"][device_name(other.pci_address)] == 1
    assert devices[device_name(other.vfs[0].pci_address)]["consumesCounters"][0][
        "counters"] == {device_name(other.pci_address): {"value": "1"}}
    assert devices_of(node_slices(DGX, offered=())) == []
