"""Hardware without a NIC under a GPU's switch: a ConnectX-8 Data Direct node (gb300-dd) and a
Dell XE8640-like node, written as fake sysfs trees by the fixture generator users get
(`railyard fixture --profile …`) and discovered, allocated and recorded (decision 0086)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from railyard.allocation.allocator import allocate
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import parse_request_spec
from railyard.allocation.types import Allocation
from railyard.cli.main import app
from railyard.discovery.discover import discover
from railyard.discovery.fixture import vpd_bytes
from railyard.discovery.profiles import GB300_DD, XE8640, build_topology
from railyard.discovery.sysfs import parse_vpd_keyword
from railyard.records.allocation import decode_allocation, encode_allocation
from railyard.records.topology import topology_from_json, topology_to_json
from railyard.topology.model import GDR_LIMIT, Distance

runner = CliRunner()


def fixture_tree(tree_dir: Path, name: str, vfs: int = 2) -> Path:
    root = tree_dir / name
    result = runner.invoke(app, ["fixture", str(root), "--profile", name, "--vfs-per-pf",
                                 str(vfs)])
    assert result.exit_code == 0, result.output
    return root


def data_direct_functions(root: Path) -> list[Path]:
    bus = root / "sys/bus/pci/devices"
    return sorted(bus / a for a in os.listdir(bus)
                  if (bus / a / "device").read_text().strip() == "0x2100")


def test_each_gb300_nic_is_found_with_its_data_direct_function_and_reaches_its_gpu_in_pxb(
        tree_dir: Path) -> None:
    found = discover(fixture_tree(tree_dir, "gb300-dd"))
    assert found.warnings == ()
    t = found.topology
    assert t == build_topology(GB300_DD, 2, rails=False)
    functions = data_direct_functions(tree_dir / "gb300-dd")
    assert [n.data_direct for n in t.nics] == [f.name for f in functions]
    for g, n in zip(t.gpus, t.nics, strict=True):
        # The PF sits on another PCI segment than the GPU: alone it would be NODE.
        assert n.pcie_root != g.pcie_root and g.numa_node == n.numa_node
        assert t.distance[g.pci_address][n.pci_address] is Distance.PXB
    # The Data Direct function is no NIC, no GPU, and its path is not a NIC's.
    listed = {g.pci_address for g in t.gpus} | {n.pci_address for n in t.nics}
    assert listed.isdisjoint(f.name for f in functions)
    assert set(found.paths) == listed


def test_without_readable_vpd_the_data_direct_function_is_left_out_with_a_warning(
        tree_dir: Path) -> None:
    root = fixture_tree(tree_dir, "gb300-dd", 0)
    first = data_direct_functions(root)[0]
    (first / "vpd").unlink()
    found = discover(root)
    assert [str(w.path) for w in found.warnings] == [os.path.realpath(first) + "/vpd"]
    assert "the NIC it serves is unknown" in found.warnings[0].reason
    t = found.topology
    assert t.nics[0].data_direct is None and t.nics[1].data_direct is not None
    # The honest class of the PF alone: across root complexes of one NUMA node.
    assert t.distance[t.gpus[0].pci_address][t.nics[0].pci_address] is Distance.NODE
    assert t.distance[t.gpus[1].pci_address][t.nics[1].pci_address] is Distance.PXB


def test_a_data_direct_function_that_matches_no_pf_is_reported(tree_dir: Path) -> None:
    root = fixture_tree(tree_dir, "gb300-dd", 0)
    first = data_direct_functions(root)[0]
    (first / "vpd").write_bytes(vpd_bytes("ConnectX-8 Data Direct", {"V3": "no-such-card"}))
    found = discover(root)
    assert len(found.warnings) == 1
    assert "matches no RDMA PF" in found.warnings[0].reason
    assert found.topology.nics[0].data_direct is None


def test_xe8640_has_one_gpu_sharing_a_switch_with_a_nic_and_no_data_direct(
        tree_dir: Path) -> None:
    found = discover(fixture_tree(tree_dir, "xe8640"))
    assert found.warnings == ()
    t = found.topology
    assert t == build_topology(XE8640, 2, rails=False)
    best = [min(row.values()) for row in (t.distance[g.pci_address] for g in t.gpus)]
    assert best == [Distance.PIX, Distance.NODE, Distance.NODE, Distance.NODE]
    assert all(n.data_direct is None for n in t.nics)


def _pairs(a: Allocation | object) -> list[tuple[int, str, Distance]]:
    assert isinstance(a, Allocation), a
    return [(p.gpu.index, p.nic.pf_pci_address or p.nic.pci_address, p.distance)
            for p in a.pairs]


def test_the_allocator_gives_a_data_direct_node_gdr_capable_pairs_and_records_the_level(
        tree_dir: Path) -> None:
    t = discover(fixture_tree(tree_dir, "gb300-dd")).topology
    # The existing allocator, unchanged: a hard limit of PXB (GPUDirect RDMA) is met.
    a = allocate(t, Ledger(t), parse_request_spec("gpus=4,vfs=4", '{"maxDistance": "PXB"}'))
    pairs = _pairs(a)
    assert [(g, n) for g, n, _ in pairs] == [(i, t.nics[i].pci_address) for i in range(4)]
    assert all(d is Distance.PXB and d <= GDR_LIMIT for _, _, d in pairs)
    # The level is on the record, in a class every reader of today's records knows.
    assert isinstance(a, Allocation)
    record = encode_allocation(a)
    assert [p["distance"] for p in json.loads(record)["pairs"]] == ["PXB"] * 4
    assert decode_allocation(record) == a
    # Without the Data Direct function, the same node could only offer NODE.
    pf_only = topology_from_json({**topology_to_json(t), "distance": {
        g.pci_address: {n.pci_address: "NODE" if n.numa_node == g.numa_node else "SYS"
                        for n in t.nics} for g in t.gpus}})
    refused = allocate(pf_only, Ledger(pf_only),
                       parse_request_spec("gpus=1,vfs=1", '{"maxDistance": "PXB"}'))
    assert not isinstance(refused, Allocation)


def test_the_xe8640_node_gives_its_one_switch_pair_pix_and_the_rest_node(tree_dir: Path) -> None:
    t = discover(fixture_tree(tree_dir, "xe8640")).topology
    a = allocate(t, Ledger(t), parse_request_spec("gpus=1,vfs=1", '{"maxDistance": "PXB"}'))
    assert _pairs(a) == [(0, t.nics[0].pci_address, Distance.PIX)]
    four = _pairs(allocate(t, Ledger(t), parse_request_spec("gpus=4,vfs=4")))
    assert sorted(d for _, _, d in four) == [Distance.PIX, Distance.NODE, Distance.NODE,
                                             Distance.NODE]


def test_the_document_names_the_data_direct_function_and_old_documents_still_read(
        tree_dir: Path) -> None:
    t = build_topology(GB300_DD, 1)
    doc = topology_to_json(t)
    assert [n["dataDirect"] for n in doc["nics"]] == [n.data_direct for n in t.nics]
    assert topology_from_json(doc) == t
    # Distances keep the classes every reader knows; a reader that ignores the new key (an
    # older agent or extender) gets the same table and allocates the same pairs.
    assert {d for row in doc["distance"].values() for d in row.values()} <= {
        d.name for d in Distance}
    for n in doc["nics"]:
        del n["dataDirect"]
    older = topology_from_json(doc)
    assert older.distance == t.distance and all(n.data_direct is None for n in older.nics)
    # Documents of nodes without one stay as they were: no key at all.
    assert all("dataDirect" not in n for n in topology_to_json(build_topology(XE8640, 1))["nics"])


def test_discover_shows_the_data_direct_function_in_json_and_in_the_matrix(
        tree_dir: Path) -> None:
    root = fixture_tree(tree_dir, "gb300-dd", 1)
    t = build_topology(GB300_DD, 1)
    as_json = runner.invoke(app, ["discover", "--sysfs-root", str(root)])
    assert as_json.exit_code == 0, as_json.output
    assert [n.get("dataDirect") for n in json.loads(as_json.stdout)["nics"]] == [
        n.data_direct for n in t.nics]
    matrix = runner.invoke(app, ["discover", "--sysfs-root", str(root), "--format", "matrix"])
    assert matrix.exit_code == 0, matrix.output
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in matrix.stdout.splitlines()
            if line.startswith(("GPU", "NIC")) and "\t" in line}
    header = matrix.stdout.splitlines()[0].split("\t")[1:]
    assert rows["GPU0"][header.index("NIC0")] == "PXB"
    assert rows["GPU0"][header.index("NIC1")] == "NODE"
    for i, n in enumerate(t.nics):
        assert f"Data Direct {n.data_direct}" in next(
            line for line in matrix.stdout.splitlines() if line.startswith(f"  NIC{i}: mlx5_{i}  "))


@given(st.binary(max_size=300))
def test_the_vpd_parser_takes_any_bytes(data: bytes) -> None:
    v = parse_vpd_keyword(data, "V3")
    assert v is None or (v.isascii() and v)


@given(st.text(alphabet="0123456789abcdef", min_size=1, max_size=64),
       st.text(alphabet="ABCDEFGHIJ XYZ", min_size=1, max_size=40))
def test_the_vpd_parser_reads_what_the_fixture_writes(v3: str, name: str) -> None:
    data = vpd_bytes(name, {"PN": "MCX-TEST", "V3": v3, "VU": "0000"})
    assert parse_vpd_keyword(data, "V3") == v3
    assert parse_vpd_keyword(data, "VU") == "0000"
    assert parse_vpd_keyword(data, "SN") is None
    assert sum(data[:-1]) % 256 == 0  # the RV checksum makes every byte up to it sum to 0
    assert parse_vpd_keyword(data[:len(data) // 2], "V3") in (None, v3)
