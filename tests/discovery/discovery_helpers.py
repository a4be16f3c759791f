"""Helpers that break fake sysfs trees the way real machines break them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def device_dir(root: Path, address: str) -> Path:
    """The resolved device folder of a PCI function in a tree."""
    return Path(os.path.realpath(root / "sys/bus/pci/devices" / address))


def relink(link: Path, target: Path) -> None:
    """Point a symlink somewhere else, relatively, as sysfs does."""
    link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def move_into_pod(root: Path, address: str, rdma_too: bool = True) -> None:
    """What the host sees once a VF's netdev (and, in exclusive RDMA netns mode, its RDMA
    device) moved into a pod: the entries vanish from `net/`, `infiniband/` and sys/class."""
    folder = device_dir(root, address)
    for netdev in os.listdir(folder / "net"):
        shutil.rmtree(folder / "net" / netdev)
        (root / "sys/class/net" / netdev).unlink()
    if rdma_too:
        for rdma in os.listdir(folder / "infiniband"):
            shutil.rmtree(folder / "infiniband" / rdma)
            (root / "sys/class/infiniband" / rdma).unlink()
        for verbs in os.listdir(folder / "infiniband_verbs"):
            shutil.rmtree(folder / "infiniband_verbs" / verbs)
            (root / "sys/class/infiniband_verbs" / verbs).unlink()


def bind_to_vfio(root: Path, address: str) -> None:
    """Unbind a VF from its network driver and bind it to vfio-pci (DPDK, VM passthrough)."""
    folder = device_dir(root, address)
    move_into_pod(root, address)  # unbinding removes the netdev and the RDMA device alike
    shutil.rmtree(folder / "net")
    shutil.rmtree(folder / "infiniband")
    shutil.rmtree(folder / "infiniband_verbs")
    vfio = root / "sys/bus/pci/drivers/vfio-pci"
    vfio.mkdir(parents=True, exist_ok=True)
    relink(folder / "driver", vfio)


def rename_rdma(root: Path, address: str, new: str) -> None:
    """Give a function's RDMA device another name (`rocep24s0`, `mlx5_bond_0`)."""
    folder = device_dir(root, address)
    (old,) = os.listdir(folder / "infiniband")
    (folder / "infiniband" / old).rename(folder / "infiniband" / new)
    (root / "sys/class/infiniband" / old).unlink()
    (root / "sys/class/infiniband" / new).symlink_to(
        os.path.relpath(folder / "infiniband" / new, root / "sys/class/infiniband"))
    for verbs in os.listdir(folder / "infiniband_verbs"):
        (folder / "infiniband_verbs" / verbs / "ibdev").write_text(new + "\n")


def write(path: Path, text: str) -> None:
    path.write_text(text + "\n")
