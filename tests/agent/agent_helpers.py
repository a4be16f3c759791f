"""Helpers for agent and kubelet tests: allocations built from real profile topologies."""

from __future__ import annotations

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.discovery.profiles import build_topology, profile
from railyard.topology.model import NodeTopology


def h100(vfs_per_pf: int = 4, node: str = "node-a") -> NodeTopology:
    return build_topology(profile("dgx-h100"), vfs_per_pf=vfs_per_pf, node=node)


def paired_allocation(topo: NodeTopology, gpu_indices: list[int], vf_index: int = 0,
                      decided_at: str = "2026-01-01T00:00:00Z",
                      decided_by: str = "scheduler") -> Allocation:
    """GPU i paired with VF `vf_index` of its nearest compute PF."""
    pairs = []
    for i in gpu_indices:
        g = topo.gpus[i]
        row = topo.distance[g.pci_address]
        nic = min((n for n in topo.nics if n.vfs), key=lambda n: (row[n.pci_address],
                                                                 n.pci_address))
        pairs.append(Pair(GpuRef.of(g), NicRef.of_vf(nic, nic.vfs[vf_index]),
                          row[nic.pci_address]))
    numa = sorted({topo.gpus[i].numa_node for i in gpu_indices})
    return Allocation(node=topo.node, numa_nodes=tuple(numa), cpus=None, memory_bytes=(),
                      pairs=tuple(pairs), decided_by=decided_by,  # type: ignore[arg-type]
                      decided_at=decided_at)
