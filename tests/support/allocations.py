"""The one Allocation builder for tests: hand-written fixture data on real profile topologies,
not an allocator's answer."""

from __future__ import annotations

from collections.abc import Sequence

from railyard.allocation.types import Allocation, DecidedBy, GpuRef, NicRef, Pair
from railyard.discovery.profiles import build_topology, profile
from railyard.topology.model import NodeTopology


def h100(vfs_per_pf: int = 4, node: str = "node-a") -> NodeTopology:
    return build_topology(profile("dgx-h100"), vfs_per_pf=vfs_per_pf, node=node)


def nic_ref(topo: NodeTopology, pci: str) -> NicRef:
    """The VF, or the whole PF, at this PCI address."""
    for n in topo.nics:
        if n.pci_address == pci:
            return NicRef.of_pf(n)
        for v in n.vfs:
            if v.pci_address == pci:
                return NicRef.of_vf(n, v)
    raise KeyError(pci)


def vf(topo: NodeTopology, nic: int, vf_index: int) -> str:
    """The PCI address of VF `vf_index` of the node's NIC `nic` (by index)."""
    return topo.nics[nic].vfs[vf_index].pci_address


def nearest_vf(topo: NodeTopology, gpu: int, vf_index: int = 0) -> str:
    """VF `vf_index` of the PF with VFs nearest to GPU `gpu` (lowest address on a tie)."""
    row = topo.distance[topo.gpus[gpu].pci_address]
    nic = min((n for n in topo.nics if n.vfs), key=lambda n: (row[n.pci_address],
                                                             n.pci_address))
    return nic.vfs[vf_index].pci_address


def allocation(topo: NodeTopology, pairs: Sequence[tuple[int, str]], *,
               nics: Sequence[str] = (), node: str | None = None,
               numa_nodes: tuple[int, ...] = (0,),
               decided_at: str | None = "2026-01-01T00:00:00Z",
               decided_by: DecidedBy = "scheduler") -> Allocation:
    """GPU index → NIC PCI address (a VF, or a PF for a whole PF) pairs, then unpaired NICs
    by PCI address; on `topo`'s node unless `node` says another."""
    out = []
    for gi, pci in pairs:
        g = topo.gpus[gi]
        ref = nic_ref(topo, pci)
        out.append(Pair(GpuRef.of(g), ref, topo.distance[g.pci_address][ref.pf_pci_address]))
    return Allocation(node=node or topo.node, numa_nodes=numa_nodes, cpus=None,
                      memory_bytes=(), pairs=tuple(out),
                      nics=tuple(nic_ref(topo, p) for p in nics),
                      decided_by=decided_by, decided_at=decided_at)
