"""The node topology: NUMA nodes, the PCIe tree, GPUs and RDMA NICs with their VFs.

Pure values, no I/O. Discovery builds them from sysfs, profiles build them in memory, and
the allocator, the extender, the device plugin and the simulator all read the same shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import IntEnum

from railyard.topology.cpus import parse_cpulist

# A PCI function address as the kernel writes it: domain (4 hex digits, up to 8: Intel VMD
# domains have 5), bus, device.function, lower case. Every reader of addresses uses this one;
# \Z, not $, which would also pass a trailing newline.
PCI_ADDRESS_RE = re.compile(r"\A[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z", re.ASCII)
# vfio-pci and its vendor variants (mlx5_vfio_pci, hisi_acc_vfio_pci, pds_vfio_pci, …).
_VFIO_DRIVER_RE = re.compile(r"(?:[a-z0-9_]+_)?vfio[-_]pci", re.ASCII)  # fullmatch


def is_vfio_driver(driver: str | None) -> bool:
    """A VFIO driver hands the whole function to a VM or user space: no netdev, no RDMA."""
    return driver is not None and _VFIO_DRIVER_RE.fullmatch(driver) is not None


class Distance(IntEnum):
    """PCIe distance classes as `nvidia-smi topo -m` and NCCL name them, nearest first.

    The integer value is the cost the allocator sums (PIX = 0 … SYS = 4).
    """

    PIX = 0  # at most one PCIe switch between the two devices
    PXB = 1  # several switches, no host bridge
    PHB = 2  # through one root complex (host bridge)
    NODE = 3  # different root complexes on one NUMA node
    SYS = 4  # across the socket interconnect

    @classmethod
    def parse(cls, text: str) -> Distance:
        try:
            return cls[text.upper()]
        except KeyError:
            names = "|".join(d.name for d in cls)
            # Quoted short: the text may be a peer's document, the error goes to logs.
            shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}… ({len(text)} characters)"
            raise ValueError(f"unknown distance class {shown}: expected {names}") from None


# Within PXB, NCCL uses GPUDirect RDMA by default (NCCL_NET_GDR_LEVEL).
GDR_LIMIT = Distance.PXB


@dataclass(frozen=True, slots=True)
class PciePath:
    """Where a PCI function hangs: its root complex and the bridges from the root port down.

    `bridges` runs from the root port to the function's parent bridge. Below a root port,
    bridges alternate switch upstream port / switch downstream port, because every PCIe
    link ends in an upstream port and every switch's internal bus holds its downstream ports.
    """

    root_complex: str  # "pci0000:15"
    bridges: tuple[str, ...]  # ("0000:15:01.0", "0000:16:00.0", "0000:17:00.0")

    @property
    def switches(self) -> tuple[str, ...]:
        """Switch identities from the top down: the address of each switch's upstream port."""
        return self.bridges[1::2]

    @property
    def nearest_switch(self) -> str | None:
        return self.switches[-1] if self.switches else None

    @property
    def parent(self) -> str:
        return self.bridges[-1] if self.bridges else self.root_complex


def pcie_distance(a: PciePath, b: PciePath, numa_a: int | None, numa_b: int | None) -> Distance:
    """Distance class between two PCI functions, counting switches as NVIDIA does.

    `numa_a`/`numa_b` are the NUMA nodes used for placement (None when unknown); an unknown
    NUMA node across root complexes is the conservative class, SYS.
    """
    if a.root_complex != b.root_complex:
        if numa_a is not None and numa_a == numa_b:
            return Distance.NODE
        return Distance.SYS
    if a.parent == b.parent:
        # Functions of one device, or siblings under one bridge; two devices hanging
        # directly on a root bus meet only at the host bridge.
        return Distance.PIX if a.bridges else Distance.PHB
    sa, sb = a.switches, b.switches
    shared = 0
    for x, y in zip(sa, sb, strict=False):
        if x != y:
            break
        shared += 1
    if shared == 0:
        return Distance.PHB
    crossed = (len(sa) - shared) + (len(sb) - shared) + 1
    return Distance.PIX if crossed == 1 else Distance.PXB


@dataclass(frozen=True, slots=True)
class NumaNode:
    id: int
    cpus: str  # kernel cpulist, e.g. "0-55,112-167"
    memory_bytes: int

    @property
    def cpu_ids(self) -> frozenset[int]:
        return frozenset(parse_cpulist(self.cpus))


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int  # order by PCI address (CUDA's PCI_BUS_ID order)
    pci_address: str
    numa_node: int | None
    uuid: str | None
    vendor: str
    device: str
    pcie_root: str
    switch: str | None

    @property
    def device_id(self) -> str:
        """The ID the device plugin advertises: the UUID, else the PCI address."""
        return self.uuid or self.pci_address


@dataclass(frozen=True, slots=True)
class Vf:
    pci_address: str
    vf_index: int
    rdma_device: str | None
    netdev: str | None
    driver: str | None
    uverbs: str | None
    # The VF pool (its resource name) the node's agent offers it in; None: the default pool
    # (`railyard.dev/vf` unless configured otherwise). Pools are resource names, so the
    # topology needs no name table (docs/decisions/0085).
    pool: str | None = None

    @property
    def is_rdma(self) -> bool:
        """An RDMA VF has an RDMA device, or is bound to a driver while out of the host view.

        A VF whose netdev and RDMA device have both left the host has moved into a pod, which
        only happens to RDMA VFs we handed out (docs/allocation.md, "What is offered"). A VF
        whose netdev is still on the host but which has no RDMA device (an iavf VF of an
        E810, an mlx5 VF with RDMA disabled) serves no RDMA; neither does one bound to a VFIO
        driver (a VM or DPDK holds it) or to no driver at all.
        """
        if is_vfio_driver(self.driver):
            return False
        if self.rdma_device is not None:
            return True
        return self.netdev is None and self.driver is not None


@dataclass(frozen=True, slots=True)
class Nic:
    """An RDMA-capable physical function (PF) and its virtual functions."""

    pci_address: str
    rdma_device: str | None
    netdev: str | None
    numa_node: int | None
    link_layer: str | None
    port_state: str | None
    rate: str | None
    driver: str | None
    pcie_root: str
    switch: str | None
    total_vfs: int
    vfs: tuple[Vf, ...] = ()
    uverbs: str | None = None
    # A PF whose netdev carries the node's default route is never handed to a pod.
    default_route: bool = False
    # The PCI address of the Data Direct function this NIC's DMA goes through (ConnectX-8
    # "Data Direct", 15b3:2100), which sits elsewhere in the PCIe tree than the PF itself,
    # typically beside a GPU; None for a NIC without one. Its GPU distances are measured from
    # that function as well (`distances_for`; docs/decisions/0086).
    data_direct: str | None = None
    # The fabric rail this NIC's port is cabled to (rail-optimised fabrics: NIC i of every
    # node on leaf i); None: not known. From the agent's `rails` config; profiles number
    # their compute NICs 0, 1, … in PCI order (docs/rails.md, docs/decisions/0089).
    rail: int | None = None


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """Everything the allocator needs to know about one node's hardware."""

    node: str
    numa_nodes: tuple[NumaNode, ...]
    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...]
    # distance[gpu pci address][nic pci address]; VFs share their PF's class.
    distance: dict[str, dict[str, Distance]] = field(hash=False, compare=True)
    version: int = 1

    def gpu(self, pci_address: str) -> Gpu:
        for g in self.gpus:
            if g.pci_address == pci_address:
                return g
        raise KeyError(pci_address)

    def nic(self, pci_address: str) -> Nic:
        for n in self.nics:
            if n.pci_address == pci_address:
                return n
        raise KeyError(pci_address)

    def vf(self, pci_address: str) -> tuple[Nic, Vf]:
        for n in self.nics:
            for v in n.vfs:
                if v.pci_address == pci_address:
                    return n, v
        raise KeyError(pci_address)

    def gpu_nic_distance(self, gpu_pci: str, nic_pci: str) -> Distance:
        return self.distance[gpu_pci][nic_pci]

    @property
    def shape_key(self) -> tuple:
        """A hashable identity of the hardware shape, equal for identical machines.

        Node names are excluded so that thousands of identical nodes share one key; every
        field that decides whether a device can be offered (driver, port state, default
        route, whether a VF is still visible on the host) is in.
        """
        return (
            tuple((n.id, n.cpus, n.memory_bytes) for n in self.numa_nodes),
            tuple((g.pci_address, g.numa_node) for g in self.gpus),
            tuple(
                (n.pci_address, n.numa_node, n.port_state, n.driver, n.default_route, n.rail,
                 tuple((v.pci_address, v.driver, v.rdma_device is not None, v.netdev is not None,
                        v.pool) for v in n.vfs))
                for n in self.nics
            ),
            tuple(
                (g, tuple(sorted((k, int(v)) for k, v in row.items())))
                for g, row in sorted(self.distance.items())
            ),
        )


def distances_for(
    gpus: dict[str, tuple[PciePath, int | None]],
    nics: dict[str, tuple[PciePath, int | None]],
    data_direct: dict[str, tuple[PciePath, int | None]] | None = None,
) -> dict[str, dict[str, Distance]]:
    """The GPU × NIC distance table from each function's PCIe path and placement NUMA node.

    `data_direct` maps a NIC (PF address) to the path of its Data Direct function: the NIC's
    DMA to and from GPU memory enters the PCIe tree there, so a GPU's class to that NIC is the
    nearer of the PF's and the Data Direct function's. NCCL does the same: it lists such a NIC
    with the Data Direct function's sysfs path as its PCI path (`<dev>_dma`, NCCL_IB_DATA_DIRECT).
    """
    via = data_direct or {}

    def nearest(gp: PciePath, gn: int | None, n: str, np_: PciePath, nn: int | None) -> Distance:
        d = pcie_distance(gp, np_, gn, nn)
        if n in via:
            dp, dn = via[n]
            d = min(d, pcie_distance(gp, dp, gn, dn))
        return d

    return {
        g: {n: nearest(gp, gn, n, np_, nn) for n, (np_, nn) in nics.items()}
        for g, (gp, gn) in gpus.items()
    }
