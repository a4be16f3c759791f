"""A NIC's rail in the NodeTopology document (docs/rails.md): optional, so documents written
before rails still decode (rail unknown) and a reader that ignores it keeps working."""

from __future__ import annotations

import pytest

from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.records.topology import TopologyFormatError, topology_from_json, topology_to_json
from railyard.topology.rails import assign_rails, pci_order_rails


def test_profiles_number_compute_nics_by_pci_order_and_the_document_round_trips():
    t = build_topology(DGX_H100, 1)
    compute = [n for n in t.nics if n.total_vfs]
    assert [n.rail for n in compute] == list(range(8))
    assert all(n.rail is None for n in t.nics if not n.total_vfs)  # storage NICs
    doc = topology_to_json(t)
    assert [n.get("rail") for n in doc["nics"] if n["totalVfs"]] == list(range(8))
    assert topology_from_json(doc) == t


def test_a_document_without_rails_reads_as_rails_unknown():
    t = build_topology(DGX_H100, 1, rails=False)
    doc = topology_to_json(t)
    assert all("rail" not in n for n in doc["nics"])
    assert all(n.rail is None for n in topology_from_json(doc).nics)


@pytest.mark.parametrize("bad", [-1, 1024, "3", True, 2.0])
def test_a_bad_rail_is_refused_naming_the_field(bad):
    doc = topology_to_json(build_topology(DGX_H100, 1))
    doc["nics"][3]["rail"] = bad
    with pytest.raises(TopologyFormatError) as e:
        topology_from_json(doc)
    assert e.value.path == "nics[3].rail"


def test_the_config_map_names_nics_by_address_netdev_or_rdma_device():
    t = build_topology(DGX_H100, 0, rails=False)
    railed, unknown = assign_rails(t, {"0000:18:00.0": 3, "ibp64s0": 4, "mlx5_4": 5,
                                       "nope0": 1})
    assert unknown == ["nope0"]
    got = {n.pci_address: n.rail for n in railed.nics if n.rail is not None}
    assert got == {"0000:18:00.0": 3, "0000:40:00.0": 4, "0000:4f:00.0": 5}


def test_pci_order_numbers_every_pf_without_the_default_route():
    t = build_topology(DGX_H100, 0, rails=False)
    railed, unknown = assign_rails(t, "pci-order")
    assert unknown == []
    assert {n.pci_address: n.rail for n in railed.nics} == pci_order_rails(t.nics)
    assert sorted(r for r in pci_order_rails(t.nics).values()) == list(range(len(t.nics)))
