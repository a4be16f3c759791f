"""Which VFs are RDMA VFs (docs/allocation.md, "What is offered"), from what the host sees."""

from __future__ import annotations

import pytest

from railyard.topology.model import Vf, is_vfio_driver


def vf(driver: str | None, netdev: str | None, rdma: str | None) -> Vf:
    return Vf("0000:18:00.1", 0, rdma, netdev, driver, "uverbs12" if rdma else None)


@pytest.mark.parametrize(("v", "rdma"), [
    (vf("mlx5_core", "ibp24s0v0", "mlx5_12"), True),  # on the host, free
    (vf("mlx5_core", None, "mlx5_12"), True),  # in a pod, RDMA device shared with the host
    (vf("mlx5_core", None, None), True),  # in a pod: netdev and RDMA device both moved
    (vf("mlx5_core", "ibp24s0v0", None), False),  # on the host without RDMA (mlx5_ib absent)
    (vf("iavf", "ens1f0v0", None), False),  # E810 VF: a plain Ethernet VF
    (vf("vfio-pci", None, None), False),
    (vf("mlx5_vfio_pci", None, None), False),  # vendor VFIO variants as vfio-pci
    (vf("vfio-pci", None, "mlx5_12"), False),  # a stale RDMA name does not count
    (vf(None, None, None), False),  # no driver bound
], ids=["host", "pod-shared-rdma", "pod", "host-no-rdma", "iavf", "vfio-pci", "mlx5_vfio_pci",
        "vfio-stale-rdma", "unbound"])
def test_an_rdma_vf_has_an_rdma_device_or_left_the_host_with_its_driver(v: Vf,
                                                                        rdma: bool) -> None:
    assert v.is_rdma is rdma


@pytest.mark.parametrize(("driver", "vfio"), [
    ("vfio-pci", True), ("mlx5_vfio_pci", True), ("hisi_acc_vfio_pci", True),
    ("pds_vfio_pci", True), ("mlx5_core", False), ("vfio", False), ("novfio-pci", False),
    (None, False),
])
def test_vfio_drivers_are_vfio_pci_and_its_vendor_variants(driver: str | None,
                                                           vfio: bool) -> None:
    assert is_vfio_driver(driver) is vfio
