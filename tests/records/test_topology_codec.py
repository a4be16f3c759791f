"""The NodeTopology JSON codec: round trips, the documented shape, and field-naming errors."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.discovery.profiles import DGX_H100, GENERIC, PROFILES, build_topology
from railyard.records.topology import TopologyFormatError, topology_from_json, topology_to_json
from railyard.topology.model import Distance, Gpu, Nic, NodeTopology, NumaNode, Vf


@pytest.mark.parametrize("vfs", [0, 3])
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_round_trips_through_json_text(name: str, vfs: int) -> None:
    t = build_topology(PROFILES[name], vfs)
    assert topology_from_json(json.loads(json.dumps(topology_to_json(t)))) == t


addresses = st.builds(lambda b, d, f: f"0000:{b:02x}:{d:02x}.{f:x}",
                      st.integers(0, 255), st.integers(0, 31), st.integers(0, 7))
names = st.none() | st.text(min_size=1, max_size=12)
numa = st.none() | st.integers(0, 7)


@st.composite
def topologies(draw) -> NodeTopology:
    # Every GPU, PF and VF is its own PCI function: the decoder refuses shared addresses.
    pool = iter(draw(st.lists(addresses, unique=True, min_size=20, max_size=20)))
    gpu_addrs = [next(pool) for _ in range(draw(st.integers(0, 4)))]
    nic_addrs = [next(pool) for _ in range(draw(st.integers(0, 4)))]
    gpus = tuple(
        Gpu(index=i, pci_address=a, numa_node=draw(numa), uuid=draw(names),
            vendor="0x10de", device=draw(st.sampled_from(["0x2330", "0x20b2"])),
            pcie_root=draw(st.sampled_from(["pci0000:15", "pci0000:97"])), switch=draw(names))
        for i, a in enumerate(gpu_addrs)
    )
    nics = tuple(
        Nic(pci_address=a, rdma_device=draw(names), netdev=draw(names), numa_node=draw(numa),
            link_layer=draw(st.sampled_from([None, "InfiniBand", "Ethernet"])),
            port_state=draw(st.sampled_from([None, "ACTIVE", "DOWN"])), rate=draw(names),
            driver=draw(names), pcie_root="pci0000:15", switch=draw(names),
            total_vfs=draw(st.integers(0, 127)),
            vfs=tuple(Vf(pci_address=next(pool), vf_index=i, rdma_device=draw(names),
                         netdev=draw(names), driver=draw(names), uverbs=draw(names))
                      for i in range(draw(st.integers(0, 3)))),
            uverbs=draw(names), default_route=draw(st.booleans()))
        for a in nic_addrs
    )
    distance = {g: {n: draw(st.sampled_from(list(Distance))) for n in nic_addrs}
                for g in gpu_addrs}
    cpus = st.sampled_from(["", "0-3", "0-55,112-167"])
    numa_nodes = tuple(NumaNode(i, draw(cpus), draw(st.integers(0, 2**41)))
                       for i in range(draw(st.integers(0, 3))))
    return NodeTopology(draw(st.text(max_size=20)), numa_nodes, gpus, nics, distance)


@given(topologies())
def test_any_topology_round_trips(t: NodeTopology) -> None:
    assert topology_from_json(json.loads(json.dumps(topology_to_json(t)))) == t


def test_document_has_the_documented_camel_case_shape() -> None:
    d = topology_to_json(build_topology(DGX_H100, 1))
    assert list(d) == ["version", "node", "numaNodes", "gpus", "nics", "distance"]
    assert d["numaNodes"][0] == {"id": 0, "cpus": "0-55,112-167", "memoryBytes": 1 << 40}
    gpu = d["gpus"][0]
    assert gpu["pciAddress"] == "0000:1b:00.0" and gpu["pcieRoot"] == "pci0000:15"
    assert gpu["switch"] == "0000:16:00.0" and gpu["uuid"].startswith("GPU-")
    nic = d["nics"][0]
    assert {k: nic[k] for k in ("pciAddress", "rdmaDevice", "netdev", "linkLayer", "portState",
                                "rate", "totalVfs", "uverbs", "defaultRoute")} == {
        "pciAddress": "0000:18:00.0", "rdmaDevice": "mlx5_0", "netdev": "ibp24s0",
        "linkLayer": "InfiniBand", "portState": "ACTIVE", "rate": "400 Gb/sec (4X NDR)",
        "totalVfs": 127, "uverbs": "uverbs0", "defaultRoute": False}
    assert nic["vfs"][0] == {"pciAddress": "0000:18:00.1", "vfIndex": 0, "rdmaDevice": "mlx5_12",
                             "netdev": "ibp24s0v0", "driver": "mlx5_core", "uverbs": "uverbs12"}
    assert d["distance"]["0000:1b:00.0"]["0000:18:00.0"] == "PIX"


def _doc() -> dict:
    return topology_to_json(build_topology(DGX_H100, 1))


def _break(path: list, value) -> dict:
    d = copy.deepcopy(_doc())
    target = d
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return d


@pytest.mark.parametrize("path, value, message", [
    (["nics", 3, "vfs", 0, "pciAddress"], 5, "nics[3].vfs[0].pciAddress: expected a string"),
    (["gpus", 0, "numaNode"], "0", "gpus[0].numaNode: expected an integer"),
    (["gpus", 2, "index"], -1, "gpus[2].index: expected an integer ≥ 0"),
    (["numaNodes", 1, "memoryBytes"], KeyError, "numaNodes[1].memoryBytes: missing"),
    (["nics", 0, "defaultRoute"], "no", "nics[0].defaultRoute: expected true or false"),
    (["nics", 0, "vfs"], {}, "nics[0].vfs: expected a list"),
    (["nics", 1], [], "nics[1]: expected an object"),
    (["version"], 2, "version: unsupported version 2"),
    (["node"], None, "node: expected a string"),
    (["distance", "0000:1b:00.0", "0000:18:00.0"], "NV18",
     'distance["0000:1b:00.0"]["0000:18:00.0"]: unknown distance class'),
    (["distance", "0000:1b:00.0", "0000:18:00.0"], KeyError,
     'distance["0000:1b:00.0"]["0000:18:00.0"]: missing'),
    (["distance", "0000:1b:00.0", "0000:99:00.0"], "PIX",
     'distance["0000:1b:00.0"]["0000:99:00.0"]: not the address of a listed NIC'),
    (["distance", "0000:43:00.0"], KeyError, 'distance["0000:43:00.0"]: missing row'),
    (["nics", 1, "pciAddress"], "0000:18:00.0", "nics[1].pciAddress: duplicate address"),
])
def test_bad_field_is_named_in_the_error(path: list, value, message: str) -> None:
    with pytest.raises(TopologyFormatError) as err:
        topology_from_json(_break(path, value))
    assert str(err.value).startswith(message)
    assert message.startswith(err.value.path + ": ")


def _generic_doc() -> dict:
    return topology_to_json(build_topology(GENERIC, 2))  # nics[0] 0000:13:00.0, gpus[0] 14:00.0


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["numaNodes"][0].update(cpus="zero"),
     "numaNodes[0].cpus: bad CPU list element 'zero'"),
    (lambda d: d["numaNodes"][0].update(cpus="0-9_9999"),
     "numaNodes[0].cpus: bad CPU list element"),
    (lambda d: d["numaNodes"][0].update(cpus="0-4000000000"),
     "numaNodes[0].cpus: bad CPU list element '0-4000000000' in '0-4000000000': CPU ids end"),
    (lambda d: d["numaNodes"].append(dict(d["numaNodes"][0], cpus="")),
     "numaNodes[1].id: duplicate NUMA node 0"),
    (lambda d: d["nics"][1]["vfs"].append(dict(d["nics"][0]["vfs"][0])),
     "nics[1].vfs[2].pciAddress: duplicate address 0000:13:00.1 (also nics[0].vfs[0]"),
    (lambda d: d["nics"][1]["vfs"][0].update(pciAddress=d["nics"][0]["pciAddress"]),
     "nics[1].vfs[0].pciAddress: duplicate address 0000:13:00.0 (also nics[0].pciAddress)"),
    (lambda d: d["nics"][1]["vfs"][0].update(pciAddress=d["gpus"][0]["pciAddress"]),
     "nics[1].vfs[0].pciAddress: duplicate address 0000:14:00.0 (also gpus[0].pciAddress)"),
    (lambda d: d["nics"][0].update(pciAddress=d["gpus"][0]["pciAddress"]),
     "nics[0].pciAddress: duplicate address 0000:14:00.0 (also gpus[0].pciAddress)"),
    (lambda d: d["gpus"][0].update(pciAddress="eth0"),
     "gpus[0].pciAddress: not a PCI address"),
    (lambda d: d["nics"][0].update(pciAddress="0000:13:00.0\n"),
     "nics[0].pciAddress: not a PCI address"),
    (lambda d: d["nics"][0]["vfs"][0].update(pciAddress="0000:13:00.0-vf0"),
     "nics[0].vfs[0].pciAddress: not a PCI address"),
], ids=["word-cpulist", "underscore-cpulist", "huge-cpulist", "numa-id-twice",
        "vf-under-two-pfs", "vf-aliases-pf", "vf-aliases-gpu", "pf-aliases-gpu", "non-pci-gpu",
        "newline-pf", "non-pci-vf"])
def test_document_the_core_cannot_use_is_a_format_error_naming_the_field(edit,
                                                                         message: str) -> None:
    # Each of these decoded before and broke the core later: the extender's Ledger raised a
    # bare ValueError on the cpulist; a VF with a PF's address let the allocator grant that
    # PF as a "VF" while another VF of the same PF went to the same pod.
    d = _generic_doc()
    edit(d)
    with pytest.raises(TopologyFormatError) as err:
        topology_from_json(d)
    assert str(err.value).startswith(message)


def test_non_object_document_is_rejected() -> None:
    with pytest.raises(TopologyFormatError, match="expected an object, got a list"):
        topology_from_json([])


def test_unknown_keys_are_ignored_for_forward_compatibility() -> None:
    d = _doc()
    d["gpus"][0]["nvlink"] = "NV18"
    d["future"] = {}
    assert topology_from_json(d) == build_topology(DGX_H100, 1)


def test_missing_default_route_means_false() -> None:
    d = _doc()
    del d["nics"][0]["defaultRoute"]
    assert topology_from_json(d).nics[0].default_route is False
