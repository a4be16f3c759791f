"""The pure topology model: what a node's GPUs, NICs, PCIe tree and NUMA nodes look like."""

from railyard.topology.cpus import format_cpulist, parse_cpulist
from railyard.topology.model import (
    GDR_LIMIT,
    Distance,
    Gpu,
    Nic,
    NodeTopology,
    NumaNode,
    PciePath,
    Vf,
    distances_for,
    pcie_distance,
)

__all__ = [
    "GDR_LIMIT",
    "Distance",
    "Gpu",
    "Nic",
    "NodeTopology",
    "NumaNode",
    "PciePath",
    "Vf",
    "distances_for",
    "format_cpulist",
    "parse_cpulist",
    "pcie_distance",
]
