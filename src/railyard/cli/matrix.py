"""`railyard discover --format matrix`: the node as `nvidia-smi topo -m` prints it, so scripts
and eyes trained on that table read this one: a square matrix over GPUs then NICs, tab
separated, ` X ` on the diagonal, CPU and NUMA affinity for GPU rows, the legend, and the NIC
legend naming each NIC's RDMA device. Railyard's own details about each device follow.

GPU–NIC cells are the topology's distance table, the one the allocator reads; GPU–GPU and
NIC–NIC cells come from the same PCIe paths by the same rule (`pcie_distance`), which is why
the caller passes the paths its source measured. NVLink is not read: where nvidia-smi prints
NV# between two GPUs, this prints their PCIe class and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from railyard.topology.model import pcie_distance

if TYPE_CHECKING:
    from railyard.topology.model import NodeTopology, PciePath

    # A GPU's or PF's PCIe path and the NUMA node its distances are measured with.
    Placement = tuple[PciePath, int | None]

SELF = " X "  # nvidia-smi pads the diagonal so it stands out between the tabs

# In nvidia-smi's order, farthest first; the codes are `Distance`'s names.
LEGEND = (
    ("X", "the device itself"),
    ("SYS", "across the interconnect between NUMA nodes (sockets, e.g. UPI or xGMI)"),
    ("NODE", "between PCIe host bridges (root complexes) of one NUMA node"),
    ("PHB", "through a PCIe host bridge (one root complex, typically the CPU)"),
    ("PXB", "through several PCIe switches, without a host bridge"),
    ("PIX", "through at most one PCIe switch"),
)
NVLINK_NOTE = ("NV#  = not shown: GPU-GPU cells give the PCIe class; Railyard does not read "
               "NVLink")


def labels(t: NodeTopology) -> list[str]:
    """Row and column names: GPU<index> for each GPU, then NIC<i> in the topology's NIC order."""
    return [f"GPU{g.index}" for g in t.gpus] + [f"NIC{i}" for i in range(len(t.nics))]


def relation_grid(t: NodeTopology, paths: Mapping[str, Placement]) -> list[list[str]]:
    """The square matrix of relation codes, rows and columns in `labels` order."""
    addresses = [g.pci_address for g in t.gpus] + [n.pci_address for n in t.nics]
    gpus = {g.pci_address for g in t.gpus}

    def cell(a: str, b: str) -> str:
        if a == b:
            return SELF
        if a in gpus and b not in gpus:
            return t.distance[a][b].name
        if b in gpus and a not in gpus:
            return t.distance[b][a].name
        (pa, na), (pb, nb) = paths[a], paths[b]
        return pcie_distance(pa, pb, na, nb).name

    return [[cell(a, b) for b in addresses] for a in addresses]


def format_matrix(t: NodeTopology, paths: Mapping[str, Placement]) -> str:
    names = labels(t)
    cpus_of = {n.id: n.cpus for n in t.numa_nodes}
    lines: list[str] = []
    if names:
        lines.append("\t" + "\t".join([*names, "CPU Affinity", "NUMA Affinity"]))
        for i, (name, row) in enumerate(zip(names, relation_grid(t, paths), strict=True)):
            cells = [name, *row]
            if i < len(t.gpus):  # NIC rows end at the matrix, as in nvidia-smi
                gpu = t.gpus[i]
                # Where the firmware names no node (numa_node -1, common in VMs), nvidia-smi
                # gives the node the GPU's local CPUs lie in: so does the placement.
                numa = gpu.numa_node if gpu.numa_node is not None else (
                    paths[gpu.pci_address][1] if gpu.pci_address in paths else None)
                cpus = cpus_of.get(numa, "") if numa is not None else ""
                cells += [cpus or "N/A", "N/A" if numa is None else str(numa)]
            lines.append("\t".join(cells))
        lines += ["", "Legend:", ""]
        lines += [f"  {code:<4} = {meaning}" for code, meaning in LEGEND]
        if len(t.gpus) > 1:
            lines.append(f"  {NVLINK_NOTE}")
        if t.nics:
            lines += ["", "NIC Legend:", ""]
            lines += [f"  NIC{i}: {n.rdma_device or n.pci_address}" for i, n in enumerate(t.nics)]
        lines.append("")
    lines.append(f"Node {t.node}: {len(t.gpus)} GPUs, {len(t.nics)} RDMA NICs, "
                 f"{sum(len(n.vfs) for n in t.nics)} VFs, {len(t.numa_nodes)} NUMA nodes")
    lines += [f"  GPU{g.index}: {g.pci_address}  {g.vendor}:{g.device}  {g.uuid or 'no UUID'}"
              for g in t.gpus]
    for i, n in enumerate(t.nics):
        lines.append(
            f"  NIC{i}: {n.rdma_device or '-'}  {n.pci_address}  {n.netdev or '-'}"
            f"  {n.link_layer or '-'} {n.port_state or '-'}  {len(n.vfs)}/{n.total_vfs} VFs"
            + ("  default route" if n.default_route else "")
            + (f"  rail {n.rail}" if n.rail is not None else "")
            + (f"  Data Direct {n.data_direct} (GPU cells measured through it)"
               if n.data_direct else ""))
    return "\n".join(lines) + "\n"
