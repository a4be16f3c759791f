"""A node's Koordinator `Device` CR from its NodeTopology (records.koordinator_device,
decision 0095), checked against koordlet's facts in reference/koordinator.md."""

from __future__ import annotations

from dataclasses import replace

from railyard.discovery.profiles import build_topology, profile
from railyard.records.koordinator_device import device_resource, device_spec

H100 = build_topology(profile("dgx-h100"), vfs_per_pf=2, node="node-a")


def test_the_object_is_a_cluster_scoped_device_named_after_the_node_and_labelled_ours():
    obj = device_resource(H100)
    assert obj["apiVersion"] == "scheduling.koordinator.sh/v1alpha1"
    assert obj["kind"] == "Device"
    assert obj["metadata"]["name"] == "node-a"
    assert "namespace" not in obj["metadata"]
    assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "railyard"}


def test_gpus_are_listed_by_uuid_and_minor_with_koordlets_topology_fields():
    gpus = [d for d in device_spec(H100)["devices"] if d["type"] == "gpu"]
    assert [d["id"] for d in gpus] == [g.uuid for g in H100.gpus]
    assert [d["minor"] for d in gpus] == list(range(8))
    first = gpus[0]
    assert first["health"] is True
    assert first["resources"] == {"koordinator.sh/gpu-core": "100",
                                  "koordinator.sh/gpu-memory-ratio": "100"}
    # koordlet: socket -1, the root bus (not the switch) as pcieID, the device as busID.
    assert first["topology"] == {"socketID": -1, "nodeID": 0, "pcieID": "pci0000:15",
                                 "busID": "0000:1b:00.0"}
    assert gpus[7]["topology"]["nodeID"] == 1


def test_rdma_pfs_carry_the_mlx5_minor_a_whole_device_each_and_their_vfs_in_one_group():
    rdma = [d for d in device_spec(H100)["devices"] if d["type"] == "rdma"]
    assert [d["id"] for d in rdma] == [n.pci_address for n in H100.nics]
    assert [d["minor"] for d in rdma] == list(range(12))  # mlx5_0 .. mlx5_11
    assert all(d["resources"] == {"koordinator.sh/rdma": "100"} for d in rdma)
    first = rdma[0]
    assert first["topology"] == {"socketID": -1, "nodeID": 0, "pcieID": "pci0000:15",
                                 "busID": "0000:18:00.0"}
    assert first["vfGroups"] == [{"vfs": [{"minor": -1, "busID": "0000:18:00.1"},
                                          {"minor": -1, "busID": "0000:18:00.2"}]}]
    assert "vfGroups" not in rdma[1]  # 0000:19:00.0 has no VFs


def test_unhealthy_devices_are_reported_unhealthy_and_the_rest_healthy():
    gpu, pf = H100.gpus[2], H100.nics[3]
    devices = device_spec(H100, {gpu.device_id, pf.pci_address})["devices"]
    health = {d["id"]: d["health"] for d in devices}
    assert health[gpu.uuid] is False and health[pf.pci_address] is False
    assert sum(not h for h in health.values()) == 2


def test_the_default_route_pf_and_a_nic_without_rdma_are_never_offered_to_koordinator():
    nics = list(H100.nics)
    nics[1] = replace(nics[1], default_route=True)
    nics[2] = replace(nics[2], rdma_device=None)
    ids = {d["id"] for d in device_spec(replace(H100, nics=tuple(nics)))["devices"]}
    assert nics[1].pci_address not in ids and nics[2].pci_address not in ids
    assert nics[0].pci_address in ids


def test_numa_unknown_reads_as_node_zero_as_koordlet_does():
    gpus = (replace(H100.gpus[4], numa_node=None), *H100.gpus[5:])
    [first] = [d for d in device_spec(replace(H100, gpus=gpus))["devices"]
               if d["id"] == H100.gpus[4].uuid]
    assert first["topology"]["nodeID"] == 0
