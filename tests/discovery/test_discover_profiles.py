"""Discovering a profile's fake sysfs tree gives exactly the profile's in-memory topology."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from railyard.allocation.allocator import allocate
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import parse_request_spec
from railyard.discovery.discover import discover
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import DGX_H100, GENERIC, PROFILES, build_topology
from railyard.records.allocation import decode_allocation, encode_allocation
from railyard.records.topology import topology_from_json, topology_to_json


@pytest.mark.parametrize("vfs_per_pf", [0, 1, 8])
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_discovering_a_profile_tree_equals_the_profile_built_in_memory(
    tree_dir: Path, name: str, vfs_per_pf: int
) -> None:
    spec = PROFILES[name]
    found = discover(write_fixture(spec, tree_dir / "root", vfs_per_pf))
    assert found.warnings == ()
    assert found.topology == build_topology(spec, vfs_per_pf, rails=False)


@pytest.mark.slow
def test_over_a_thousand_vfs_are_discovered_exactly(tree_dir: Path) -> None:
    found = discover(write_fixture(DGX_H100, tree_dir / "root", 127))
    assert found.topology == build_topology(DGX_H100, 127, rails=False)
    assert sum(len(n.vfs) for n in found.topology.nics) == 8 * 127


def test_a_node_behind_an_intel_vmd_domain_is_discovered_allocated_and_recorded(
        tree_dir: Path) -> None:
    # VMD puts the devices behind it in PCI domain 10000 (5 hex digits). Discovery, the
    # allocator and the CNI take such addresses; the records must too, or an allocation on
    # the node is written but never decoded.
    spec = replace(GENERIC, roots=tuple(
        replace(r, domain=0x10000) if r.bus == 0x10 else r for r in GENERIC.roots))
    t = build_topology(spec, 2, rails=False)
    assert discover(write_fixture(spec, tree_dir / "root", 2)).topology == t
    assert topology_from_json(topology_to_json(t)) == t
    a = allocate(t, Ledger(t), parse_request_spec("gpus=1,vfs=1"))
    assert a.pairs[0].nic.pci_address == "10000:13:00.1"
    assert decode_allocation(encode_allocation(a)) == a


def test_node_name_given_to_the_writer_is_the_discovered_node(tree_dir: Path) -> None:
    found = discover(write_fixture(DGX_H100, tree_dir / "root", 1, node="gpu-node-17"))
    assert found.topology == build_topology(DGX_H100, 1, node="gpu-node-17", rails=False)


def _snapshot(root: Path) -> dict[str, str]:
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                out[rel] = path.read_text()
            else:
                out[rel] = "/"
    return out


def test_the_same_profile_writes_the_same_tree_byte_for_byte(tree_dir: Path) -> None:
    a = write_fixture(PROFILES["dgx-a100"], tree_dir / "a", 2)
    b = write_fixture(PROFILES["dgx-a100"], tree_dir / "b", 2)
    assert _snapshot(a) == _snapshot(b)


def test_every_symlink_is_relative_and_resolves_inside_the_tree(h100: Path) -> None:
    for rel, value in _snapshot(h100).items():
        if value.startswith("-> "):
            assert not value[3:].startswith("/"), rel
            assert os.path.realpath(h100 / rel).startswith(str(h100.resolve())), rel
            assert os.path.exists(h100 / rel), f"dangling: {rel}"


def test_tree_has_the_kernel_layout(h100: Path) -> None:
    pf = h100 / "sys/bus/pci/devices/0000:18:00.0"
    assert os.path.realpath(pf) == str(
        h100 / "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0")
    assert os.readlink(pf / "driver") == "../../../../../../bus/pci/drivers/mlx5_core"
    assert os.readlink(pf / "virtfn1") == "../0000:18:00.2"
    assert os.readlink(h100 / "sys/bus/pci/devices/0000:18:00.2/physfn") == "../0000:18:00.0"
    assert (pf / "class").read_text() == "0x020700\n"
    port = h100 / "sys/class/infiniband/mlx5_0/ports/1"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "link_layer").read_text() == "InfiniBand\n"
    assert (h100 / "sys/class/infiniband_verbs/uverbs0/ibdev").read_text() == "mlx5_0\n"
    assert (h100 / "sys/class/net/ibp24s0/device").resolve() == pf.resolve()
    assert "GPU UUID" in (h100 / "proc/driver/nvidia/gpus/0000:1b:00.0/information").read_text()
    assert (h100 / "sys/devices/system/node/node1/cpulist").read_text() == "56-111,168-223\n"
    assert "eno1\t00000000" in (h100 / "proc/net/route").read_text()
    assert (h100 / "proc/sys/kernel/hostname").read_text() == "dgx-h100\n"


def test_writer_refuses_a_folder_that_is_not_empty(tree_dir: Path) -> None:
    (tree_dir / "x").mkdir()
    (tree_dir / "x" / "keep").write_text("")
    with pytest.raises(FileExistsError, match="not an empty folder"):
        write_fixture(DGX_H100, tree_dir / "x")


def test_plain_ethernet_without_rdma_is_not_a_nic(h100: Path) -> None:
    nics = discover(h100).topology.nics
    assert "eno1" not in {n.netdev for n in nics}
    assert os.path.exists(h100 / "sys/class/net/eno1")
