"""Distance classes as nvidia-smi topo -m names them, on paths and on real server shapes."""

from __future__ import annotations

import pytest

from railyard.discovery.profiles import DGX_A100, DGX_H100, GENERIC, HGX_H100_4NIC, build_topology
from railyard.topology.model import Distance, PciePath, pcie_distance

RC = "pci0000:10"
PORT1, PORT2 = "0000:10:01.0", "0000:10:02.0"


def path(*bridges: str, root: str = RC) -> PciePath:
    return PciePath(root, bridges)


def test_two_functions_under_one_switch_downstream_port_are_pix() -> None:
    a = path(PORT1, "0000:11:00.0", "0000:12:00.0")
    assert pcie_distance(a, a, 0, 0) == Distance.PIX


def test_two_downstream_ports_of_one_switch_are_pix() -> None:
    a = path(PORT1, "0000:11:00.0", "0000:12:00.0")
    b = path(PORT1, "0000:11:00.0", "0000:12:01.0")
    assert pcie_distance(a, b, 0, 0) == Distance.PIX
    assert a.nearest_switch == b.nearest_switch == "0000:11:00.0"


def test_nested_switches_below_a_shared_switch_are_pxb() -> None:
    top = (PORT1, "0000:02:00.0")
    a = path(*top, "0000:03:00.0", "0000:04:00.0", "0000:05:00.0")
    b = path(*top, "0000:03:01.0", "0000:09:00.0", "0000:0a:00.0")
    assert pcie_distance(a, b, 0, 0) == Distance.PXB


def test_function_on_an_upper_switch_and_one_below_a_nested_switch_are_pxb() -> None:
    top = (PORT1, "0000:02:00.0")
    direct = path(*top, "0000:03:00.0")
    nested = path(*top, "0000:03:01.0", "0000:04:00.0", "0000:05:00.0")
    assert pcie_distance(direct, nested, 0, 0) == Distance.PXB


def test_different_root_ports_of_one_root_complex_are_phb() -> None:
    assert pcie_distance(path(PORT1), path(PORT2), 0, 0) == Distance.PHB


def test_different_root_complexes_on_one_numa_node_are_node() -> None:
    other = path("0000:20:01.0", root="pci0000:20")
    assert pcie_distance(path(PORT1), other, 0, 0) == Distance.NODE


def test_different_numa_nodes_are_sys() -> None:
    other = path("0000:20:01.0", root="pci0000:20")
    assert pcie_distance(path(PORT1), other, 0, 1) == Distance.SYS


@pytest.mark.parametrize("numa", [(None, 0), (0, None), (None, None)])
def test_unknown_numa_across_root_complexes_is_sys(numa) -> None:
    other = path("0000:20:01.0", root="pci0000:20")
    assert pcie_distance(path(PORT1), other, *numa) == Distance.SYS


def test_distance_class_names_parse_case_insensitively_and_reject_others() -> None:
    assert Distance.parse("pxb") is Distance.PXB
    with pytest.raises(ValueError, match=r"PIX\|PXB"):
        Distance.parse("NV12")


# ------------------------------------------------------------------- server shapes

# hardware.md: GPU bus -> its own NIC's bus on a DGX H100.
H100_PAIRS = {0x1B: 0x18, 0x43: 0x40, 0x52: 0x4F, 0x61: 0x5E,
              0x9D: 0x9A, 0xC3: 0xC0, 0xD1: 0xCE, 0xDF: 0xDC}


def _bus(address: str) -> int:
    return int(address.split(":")[1], 16)


def test_dgx_h100_each_gpu_is_pix_with_its_own_nic_node_on_its_socket_sys_across() -> None:
    t = build_topology(DGX_H100)
    compute = {n.pci_address for n in t.nics if n.total_vfs}
    for g in t.gpus:
        own = f"0000:{H100_PAIRS[_bus(g.pci_address)]:02x}:00.0"
        for n in t.nics:
            d = t.distance[g.pci_address][n.pci_address]
            if n.pci_address == own:
                assert d == Distance.PIX
            elif n.numa_node != g.numa_node:
                assert d == Distance.SYS
            elif n.pci_address in compute:
                assert d == Distance.NODE, (g.pci_address, n.pci_address)
            else:  # storage cards share the switches of GPU0 and GPU4
                assert d in (Distance.PIX, Distance.NODE)
        assert t.nic(own).switch == g.switch


def test_dgx_h100_rdma_numbering_skips_the_storage_cards() -> None:
    t = build_topology(DGX_H100)
    best = {g.index: next(n.rdma_device for n in t.nics
                          if t.distance[g.pci_address][n.pci_address] == Distance.PIX
                          and n.total_vfs)
            for g in t.gpus}
    assert best == {0: "mlx5_0", 1: "mlx5_3", 2: "mlx5_4", 3: "mlx5_5",
                    4: "mlx5_6", 5: "mlx5_9", 6: "mlx5_10", 7: "mlx5_11"}


def test_dgx_a100_is_pxb_within_a_switch_group_and_sys_elsewhere() -> None:
    t = build_topology(DGX_A100)
    groups = {3: {"mlx5_0", "mlx5_1"}, 1: {"mlx5_2", "mlx5_3"},
              7: {"mlx5_6", "mlx5_7"}, 5: {"mlx5_8", "mlx5_9"}}
    for g in t.gpus:
        for n in t.nics:
            d = t.distance[g.pci_address][n.pci_address]
            expected = Distance.PXB if n.rdma_device in groups[g.numa_node] else Distance.SYS
            assert d == expected, (g.index, n.rdma_device)
    assert [g.numa_node for g in t.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert t.gpus[0].pci_address == "0000:07:00.0"
    assert t.nic("0000:0c:00.0").rdma_device == "mlx5_0"


def test_hgx_4nic_odd_gpus_have_no_pix_nic_and_their_best_is_node() -> None:
    t = build_topology(HGX_H100_4NIC)
    for g in t.gpus:
        best = min(t.distance[g.pci_address].values())
        assert best == (Distance.PIX if g.index % 2 == 0 else Distance.NODE)


def test_generic_gpu_and_nic_on_separate_root_ports_are_phb() -> None:
    t = build_topology(GENERIC)
    assert t.distance["0000:41:00.0"]["0000:42:00.0"] == Distance.PHB
    assert t.distance["0000:14:00.0"]["0000:13:00.0"] == Distance.PIX
    assert t.gpus[1].switch is None


def test_pcie_root_is_the_root_complex_folder_name() -> None:
    t = build_topology(DGX_H100)
    assert t.gpus[0].pcie_root == "pci0000:15"
    assert t.gpus[0].switch == "0000:16:00.0"
