"""Distance classes at the edges of the PCIe tree, and which VFs serve RDMA."""

from railyard.topology.model import Distance, PciePath, Vf, pcie_distance


def test_two_devices_directly_on_a_root_bus_meet_at_the_host_bridge():
    a = PciePath("pci0000:00", ())
    b = PciePath("pci0000:00", ())
    assert pcie_distance(a, b, 0, 0) is Distance.PHB


def test_unbound_and_vfio_vfs_are_not_rdma_vfs():
    assert not Vf("0000:18:00.1", 0, None, None, None, None).is_rdma
    assert not Vf("0000:18:00.1", 0, None, None, "vfio-pci", None).is_rdma
    assert not Vf("0000:18:00.1", 0, "mlx5_12", None, "vfio-pci", None).is_rdma
    # Inside a pod: netdev and RDMA device gone from the host view, driver still bound.
    assert Vf("0000:18:00.1", 0, None, None, "mlx5_core", None).is_rdma
