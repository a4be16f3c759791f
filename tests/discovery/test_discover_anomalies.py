"""Discovery survives what real machines do: VFs gone into pods, VFIO drivers, odd files."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from discovery_helpers import bind_to_vfio, device_dir, move_into_pod, relink, rename_rdma, write

from railyard.allocation.allocator import allocate
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import parse_request_spec
from railyard.allocation.shape import vf_allocatable, vf_held_in_pod
from railyard.discovery import sysfs as sysfs_module
from railyard.discovery.discover import discover
from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.discovery.sysfs import SysfsError
from railyard.topology.model import Distance

GPU0, NIC0, VF0, VF1 = "0000:1b:00.0", "0000:18:00.0", "0000:18:00.1", "0000:18:00.2"
NIC_NUMA0_OTHER_ROOT = "0000:40:00.0"  # mlx5_3, same socket as GPU0, other root complex


ROUTE_HEADER = ("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\t"
                "Window\tIRTT\n")


def _warning_paths(found) -> list[str]:
    return [w.path for w in found.warnings]


def _strip_rdma(root: Path, address: str) -> None:
    """A VF that never got an RDMA device (iavf VF of an E810, mlx5 VF with RDMA disabled or
    mlx5_ib not loaded): driver bound, netdev on the host, no infiniband/ folders."""
    folder = device_dir(root, address)
    for sub in ("infiniband", "infiniband_verbs"):
        for name in os.listdir(folder / sub):
            (root / "sys/class" / sub / name).unlink()
        shutil.rmtree(folder / sub)


def _add_ipoib_child(root: Path, address: str, parent: str, child: str) -> Path:
    """An IPoIB P_Key child (`ip link add … type ipoib pkey 0x8001`): rdma_init_netdev()
    parents it on the HCA's PCI function, beside its parent, with no lower_ link to it."""
    net = device_dir(root, address) / "net"
    shutil.copytree(net / parent, net / child, symlinks=True)
    (root / "sys/class/net" / child).symlink_to(
        os.path.relpath(net / child, root / "sys/class/net"))
    return net / child


# ------------------------------------------------------------------------------ NUMA


def test_numa_node_minus_one_is_null_but_placed_by_local_cpulist(h100: Path) -> None:
    write(device_dir(h100, GPU0) / "numa_node", "-1")
    found = discover(h100)
    gpu = found.topology.gpu(GPU0)
    assert gpu.numa_node is None
    # local_cpulist lies inside NUMA 0, so distances stay what the firmware would have said.
    assert found.topology.distance == build_topology(DGX_H100, 2, rails=False).distance
    assert found.warnings == ()


def test_numa_node_minus_one_with_cpus_of_both_sockets_is_sys_across_root_complexes(
    h100: Path,
) -> None:
    write(device_dir(h100, GPU0) / "numa_node", "-1")
    write(device_dir(h100, GPU0) / "local_cpulist", "0-223")
    t = discover(h100).topology
    assert t.gpu(GPU0).numa_node is None
    assert t.distance[GPU0][NIC0] == Distance.PIX  # same switch: NUMA does not matter
    assert t.distance[GPU0][NIC_NUMA0_OTHER_ROOT] == Distance.SYS  # conservative


def test_numa_node_minus_one_on_a_nic_is_null(h100: Path) -> None:
    write(device_dir(h100, NIC0) / "numa_node", "-1")
    assert discover(h100).topology.nic(NIC0).numa_node is None


# ------------------------------------------------------------------------------- VFs


def test_vf_bound_to_vfio_pci_is_listed_with_its_driver_and_not_as_rdma(h100: Path) -> None:
    bind_to_vfio(h100, VF1)
    found = discover(h100)
    _, vf = found.topology.vf(VF1)
    assert (vf.driver, vf.netdev, vf.rdma_device, vf.uverbs) == ("vfio-pci", None, None, None)
    assert not vf.is_rdma
    assert vf.vf_index == 1
    assert found.warnings == ()


def test_vf_bound_to_a_vfio_variant_driver_is_not_an_rdma_vf_held_in_a_pod(h100: Path) -> None:
    # mlx5_vfio_pci (ConnectX live-migration VFIO driver) is a VFIO driver like vfio-pci: no
    # netdev, no RDMA device, ever. Counted as an RDMA VF "held in some pod", it would keep
    # its PF from ever being taken whole.
    bind_to_vfio(h100, VF0)
    other = h100 / "sys/bus/pci/drivers/mlx5_vfio_pci"
    other.mkdir()
    relink(device_dir(h100, VF0) / "driver", other)
    _, vf = discover(h100).topology.vf(VF0)
    assert (vf.driver, vf.netdev, vf.rdma_device) == ("mlx5_vfio_pci", None, None)
    assert not vf.is_rdma
    assert not vf_held_in_pod(vf)


def test_vf_with_a_host_netdev_but_no_rdma_device_is_not_an_rdma_vf(h100: Path) -> None:
    # Its netdev is still in the host namespace, so it is not inside a pod: it simply has no
    # RDMA device, and a pod asking for RDMA VFs must not get it.
    _strip_rdma(h100, VF0)
    t = discover(h100).topology
    _, vf = t.vf(VF0)
    assert vf.netdev is not None and vf.rdma_device is None and vf.driver == "mlx5_core"
    assert not vf.is_rdma
    assert not vf_allocatable(vf) and not vf_held_in_pod(vf)
    a = allocate(t, Ledger(t), parse_request_spec("gpus=1,vfs=1"))
    assert a.pairs[0].nic.pci_address == VF1, "the RDMA VF beside it, never the plain one"


def test_vf_inside_a_pod_is_kept_by_pci_address(h100: Path) -> None:
    move_into_pod(h100, VF0)
    found = discover(h100)
    nic, vf = found.topology.vf(VF0)
    assert nic.pci_address == NIC0
    assert (vf.vf_index, vf.driver, vf.netdev, vf.rdma_device) == (0, "mlx5_core", None, None)
    assert found.warnings == ()


def test_vf_inside_a_pod_with_shared_rdma_keeps_its_rdma_device(h100: Path) -> None:
    move_into_pod(h100, VF0, rdma_too=False)
    _, vf = discover(h100).topology.vf(VF0)
    assert vf.netdev is None and vf.rdma_device is not None


def test_nic_whose_vfs_are_all_in_pods_is_still_a_nic(h100: Path) -> None:
    for vf in (VF0, VF1):
        move_into_pod(h100, vf)
    nic = discover(h100).topology.nic(NIC0)
    assert [v.pci_address for v in nic.vfs] == [VF0, VF1]


def test_pf_with_sriov_numvfs_zero_has_no_vfs_but_keeps_total(h100: Path) -> None:
    pf = device_dir(h100, NIC0)
    for i in (0, 1):
        vf = device_dir(h100, f"0000:18:00.{i + 1}")
        move_into_pod(h100, vf.name)
        (pf / f"virtfn{i}").unlink()
        (h100 / "sys/bus/pci/devices" / vf.name).unlink()
        shutil.rmtree(vf)
    write(pf / "sriov_numvfs", "0")
    found = discover(h100)
    nic = found.topology.nic(NIC0)
    assert (nic.vfs, nic.total_vfs) == ((), 127)
    assert found.warnings == ()


def test_duplicate_virtfn_link_lists_the_vf_once_and_warns(h100: Path) -> None:
    pf = device_dir(h100, NIC0)
    (pf / "virtfn5").symlink_to("../" + VF0)
    found = discover(h100)
    assert [v.pci_address for v in found.topology.nic(NIC0).vfs] == [VF0, VF1]
    assert str(pf / "virtfn5") in _warning_paths(found)
    assert "duplicate" in str(found.warnings[0])


def test_missing_virtfn_link_still_finds_the_vf_by_physfn(h100: Path) -> None:
    pf = device_dir(h100, NIC0)
    (pf / "virtfn1").unlink()
    found = discover(h100)
    assert found.topology.nic(NIC0) == build_topology(DGX_H100, 2, rails=False).nic(NIC0)
    assert str(pf) in _warning_paths(found)


def test_dangling_virtfn_link_skips_that_vf_and_warns(h100: Path) -> None:
    folder = device_dir(h100, VF1)
    move_into_pod(h100, VF1)
    shutil.rmtree(folder)
    found = discover(h100)
    assert [v.pci_address for v in found.topology.nic(NIC0).vfs] == [VF0]
    paths = _warning_paths(found)
    assert str(h100 / "sys/bus/pci/devices" / VF1) in paths
    assert any("dangling symlink" in str(w) for w in found.warnings)


def test_virtfn_link_vanishing_while_discovered_is_a_warning(h100: Path, monkeypatch) -> None:
    # The PF disables SR-IOV mid-discovery: after the PCI bus was listed and the PF's
    # virtfn1 link read, the VF's folder goes, then the link too, before discovery words
    # its warning about the dangling link.
    link = device_dir(h100, NIC0) / "virtfn1"
    folder = device_dir(h100, VF1)
    move_into_pod(h100, VF1)
    shutil.rmtree(folder)
    (h100 / "sys/bus/pci/devices" / VF1).unlink()
    real_isdir = os.path.isdir

    def isdir_then_vanish(path) -> bool:
        if str(path) == str(folder) and os.path.lexists(link):
            link.unlink()
        return real_isdir(path)

    monkeypatch.setattr(os.path, "isdir", isdir_then_vanish)
    found = discover(h100)
    monkeypatch.undo()
    assert [v.pci_address for v in found.topology.nic(NIC0).vfs] == [VF0]
    assert any(w.path == str(link) and "dangling symlink" in w.reason for w in found.warnings)


@pytest.mark.parametrize("rel", [
    "sys/devices/system/node/node\u00b2",
    "sys/bus/pci/devices/0000:18:00.0/virtfn\u00b2",
    "sys/bus/pci/devices/0000:18:00.0/infiniband/mlx5_0/ports/\u00b2",
    "sys/bus/pci/devices/0000:18:00.0/infiniband_verbs/uverbs\u00b2",
], ids=["node", "virtfn", "ports", "uverbs"])
def test_entry_names_with_non_ascii_digits_are_skipped_not_tracebacks(h100: Path,
                                                                      rel: str) -> None:
    # str.isdigit() is True for "²" but int("²") raises. Kernels never make such names, but
    # `railyard discover --sysfs-root` reads any tree a user points it at.
    (h100 / rel).mkdir()
    assert discover(h100).topology == build_topology(DGX_H100, 2, rails=False)


# ----------------------------------------------------------------------- RDMA names


def test_intel_rocep_names_are_rdma_devices(h100: Path) -> None:
    rename_rdma(h100, NIC0, "rocep24s0")
    rename_rdma(h100, VF0, "rocep24s0v0")
    t = discover(h100).topology
    assert t.nic(NIC0).rdma_device == "rocep24s0"
    assert t.vf(VF0)[1].rdma_device == "rocep24s0v0"


def test_bonded_device_is_one_nic_on_its_first_port(h100: Path) -> None:
    # RoCE LAG: the bond's RDMA device hangs on port 0's function; port 1 has none.
    rename_rdma(h100, "0000:19:00.0", "mlx5_bond_0")
    port1 = device_dir(h100, "0000:19:00.1")
    (rdma,) = os.listdir(port1 / "infiniband")
    shutil.rmtree(port1 / "infiniband")
    shutil.rmtree(port1 / "infiniband_verbs")
    (h100 / "sys/class/infiniband" / rdma).unlink()
    t = discover(h100).topology
    assert t.nic("0000:19:00.0").rdma_device == "mlx5_bond_0"
    with pytest.raises(KeyError):
        t.nic("0000:19:00.1")  # Ethernet without RDMA now


def test_port_down_is_reported_by_name(h100: Path) -> None:
    port = device_dir(h100, NIC0) / "infiniband/mlx5_0/ports/1"
    write(port / "state", "1: DOWN")
    write(port / "phys_state", "3: Disabled")
    assert discover(h100).topology.nic(NIC0).port_state == "DOWN"


# ------------------------------------------------------------------ unreadable input


def test_vanished_file_is_a_warning_naming_it_and_the_rest_is_discovered(h100: Path) -> None:
    rate = device_dir(h100, NIC0) / "infiniband/mlx5_0/ports/1/rate"
    rate.unlink()
    found = discover(h100)
    assert found.topology.nic(NIC0).rate is None
    assert _warning_paths(found) == [str(rate)]
    assert len(found.topology.gpus) == 8 and len(found.topology.nics) == 12


def test_function_without_class_is_skipped_with_a_warning(h100: Path) -> None:
    (device_dir(h100, "0000:c0:00.0") / "class").unlink()
    found = discover(h100)
    assert "0000:c0:00.0" not in {n.pci_address for n in found.topology.nics}
    assert len(found.topology.nics) == 11
    assert any(p.endswith("0000:c0:00.0/class") for p in _warning_paths(found))


def test_file_vanishing_mid_read_is_a_warning(h100: Path, monkeypatch) -> None:
    target = str(device_dir(h100, NIC0) / "infiniband/mlx5_0/ports/1/link_layer")
    real_open, real_read = os.open, os.read
    doomed: set[int] = set()

    def fake_open(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        if str(path) == target:
            doomed.add(fd)
        return fd

    def fake_read(fd, n):
        if fd in doomed:
            doomed.discard(fd)  # the number is reused by the next open
            raise OSError(errno.ENODEV, "No such device")
        return real_read(fd, n)

    monkeypatch.setattr(sysfs_module.os, "open", fake_open)
    monkeypatch.setattr(sysfs_module.os, "read", fake_read)
    found = discover(h100)
    monkeypatch.undo()
    assert found.topology.nic(NIC0).link_layer is None
    assert [str(w) for w in found.warnings] == [f"{target}: device vanished while reading"]


def test_dangling_device_link_skips_that_gpu_and_renumbers_the_rest(h100: Path) -> None:
    shutil.rmtree(device_dir(h100, "0000:43:00.0"))
    found = discover(h100)
    gpus = found.topology.gpus
    assert [g.index for g in gpus] == list(range(7))
    assert "0000:43:00.0" not in {g.pci_address for g in gpus}
    (w,) = found.warnings
    assert w.path == str(h100 / "sys/bus/pci/devices/0000:43:00.0")
    assert "dangling symlink" in w.reason


def test_unreadable_cpulist_and_meminfo_are_warnings(h100: Path) -> None:
    node0 = h100 / "sys/devices/system/node/node0"
    (node0 / "meminfo").unlink()
    write(node0 / "cpulist", "0-x")
    found = discover(h100)
    assert found.topology.numa_nodes[0].memory_bytes == 0
    assert sorted(_warning_paths(found)) == [str(node0 / "cpulist"), str(node0 / "meminfo")]


def test_missing_hostname_is_a_warning_not_this_machines_name(h100: Path) -> None:
    (h100 / "proc/sys/kernel/hostname").unlink()
    found = discover(h100)
    assert found.topology.node == "unknown"
    assert _warning_paths(found) == [str(h100 / "proc/sys/kernel/hostname")]


def test_missing_gpu_uuid_file_is_null_uuid_and_a_warning(h100: Path) -> None:
    info = h100 / "proc/driver/nvidia/gpus" / GPU0 / "information"
    info.unlink()
    found = discover(h100)
    assert found.topology.gpu(GPU0).uuid is None
    assert _warning_paths(found) == [str(info)]


def test_root_that_is_not_sysfs_is_a_sysfs_error_naming_it(tree_dir: Path) -> None:
    (tree_dir / "etc").mkdir()
    (tree_dir / "hosts").write_text("127.0.0.1 localhost\n")
    with pytest.raises(SysfsError) as err:
        discover(tree_dir)
    assert err.value.path == str(tree_dir)
    assert "not a sysfs tree" in str(err.value)


def test_missing_root_is_a_sysfs_error(tree_dir: Path) -> None:
    with pytest.raises(SysfsError, match="no such folder"):
        discover(tree_dir / "nowhere")


def test_sysfs_without_pci_bus_is_an_empty_inventory_with_a_warning(tree_dir: Path) -> None:
    (tree_dir / "sys/devices/system/node/node0").mkdir(parents=True)
    found = discover(tree_dir)
    assert found.topology.gpus == () and found.topology.nics == ()
    assert str(tree_dir / "sys/bus/pci/devices") in _warning_paths(found)


# ---------------------------------------------------------------------- default route


def test_nic_carrying_the_default_route_is_marked(h100: Path) -> None:
    write(h100 / "proc/net/route",
          "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
          "ibp64s0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0")
    t = discover(h100).topology
    assert [n.pci_address for n in t.nics if n.default_route] == [NIC_NUMA0_OTHER_ROOT]


def test_default_route_over_a_bond_marks_the_bonded_pfs(h100: Path) -> None:
    bond = h100 / "sys/devices/virtual/net/bond0"
    bond.mkdir(parents=True)
    for slave in ("enp25s0f0np0", "enp25s0f1np1"):
        relink_target = h100 / "sys/class/net" / slave
        (bond / f"lower_{slave}").symlink_to(os.path.relpath(relink_target, bond))
    (h100 / "sys/class/net/bond0").symlink_to("../../devices/virtual/net/bond0")
    write(h100 / "proc/net/route",
          "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
          "bond0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0")
    t = discover(h100).topology
    assert [n.pci_address for n in t.nics if n.default_route] == ["0000:19:00.0", "0000:19:00.1"]


def test_default_route_on_an_ipoib_child_interface_marks_its_pf(h100: Path) -> None:
    # The child sits in the PF's net/ folder with no lower_ link to ibp24s0; the PF is
    # reported with its first netdev, but the child's default route is on the same port.
    _add_ipoib_child(h100, NIC0, "ibp24s0", "ibp24s0.8001")
    write(h100 / "proc/net/route",
          ROUTE_HEADER + "ibp24s0.8001\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0")
    found = discover(h100)
    assert found.topology.nic(NIC0).netdev == "ibp24s0"
    assert [n.pci_address for n in found.topology.nics if n.default_route] == [NIC0]


def test_phys_port_name_the_driver_does_not_implement_is_no_warning(h100: Path,
                                                                    monkeypatch) -> None:
    # IPoIB and mlx4 netdevs have the attribute, but reading it fails with EOPNOTSUPP: no
    # name, like a missing file, not an unreadable one.
    child = _add_ipoib_child(h100, NIC0, "ibp24s0", "ibp24s0.8001")
    for net in (child.parent / "ibp24s0", child):
        write(net / "phys_port_name", "")
    real = sysfs_module.read_attribute

    def read_attribute(path: str) -> str:
        if path.endswith("/phys_port_name"):
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return real(path)

    monkeypatch.setattr(sysfs_module, "read_attribute", read_attribute)
    found = discover(h100)
    monkeypatch.undo()
    assert found.topology.nic(NIC0).netdev == "ibp24s0"
    assert found.warnings == ()


# ------------------------------------------------------------------------ other shapes


def test_gpu_sriov_vf_is_not_a_separate_gpu(tree_dir: Path) -> None:
    from railyard.discovery.fixture import write_fixture
    from railyard.discovery.profiles import MI300X

    root = write_fixture(MI300X, tree_dir / "root", 0)
    gpu = device_dir(root, "0000:0d:00.0")
    vf = gpu.parent / "0000:0d:00.1"
    shutil.copytree(gpu, vf, symlinks=True)
    (vf / "physfn").symlink_to("../0000:0d:00.0")
    (root / "sys/bus/pci/devices/0000:0d:00.1").symlink_to(
        os.path.relpath(vf, root / "sys/bus/pci/devices"))
    assert discover(root).topology == build_topology(MI300X, 0, rails=False)


def test_unbound_driver_is_null(h100: Path) -> None:
    (device_dir(h100, VF0) / "driver").unlink()
    assert discover(h100).topology.vf(VF0)[1].driver is None


def test_relinked_driver_reports_the_new_driver_name(h100: Path) -> None:
    other = h100 / "sys/bus/pci/drivers/mlx5_vfio_pci"
    other.mkdir()
    relink(device_dir(h100, VF0) / "driver", other)
    assert discover(h100).topology.vf(VF0)[1].driver == "mlx5_vfio_pci"
