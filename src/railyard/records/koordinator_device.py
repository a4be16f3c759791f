"""A node's devices as Koordinator's `Device` CR (`scheduling.koordinator.sh/v1alpha1`), for a
cluster whose Koordinator scheduler should see what Railyard discovered (decision 0095).

Field for field what koordlet reports (/work/shared/reference/koordinator.md): a GPU by UUID
and minor, an RDMA device by its PF's PCI address and the N of `mlx5_N`, `koordinator.sh/rdma`
100 per PF, topology `{socketID: -1, nodeID, pcieID: root bus, busID}` and the VFs in one
group with minor -1. Pure: the agent's adapter (`kube.koordinator_device`) writes it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from railyard.records.koordinator import GPU_CORE, GPU_MEMORY_RATIO, RDMA, WHOLE_DEVICE, rdma_minor
from railyard.topology.model import NodeTopology

GROUP = "scheduling.koordinator.sh"
API_VERSION = f"{GROUP}/v1alpha1"
KIND = "Device"
PLURAL = "devices"
# Set on every Device the agent writes: it updates only objects that carry it, never one
# koordlet (or anyone else) wrote for the same node.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "railyard"


def _topology(pcie_root: str, numa_node: int | None, bus_id: str) -> dict[str, Any]:
    # koordlet's facts: -1 for the socket (it does not read it), the root bus (not the
    # switch) as the PCIe id, and NUMA -1 read as 0.
    return {"socketID": -1, "nodeID": numa_node if numa_node is not None and numa_node >= 0
            else 0, "pcieID": pcie_root, "busID": bus_id}


def device_spec(topology: NodeTopology, unhealthy: Collection[str] = ()) -> dict[str, Any]:
    """`spec` of the node's Device: every GPU, then every RDMA PF Railyard may hand out.

    `unhealthy` holds the device IDs the agent's health scan found bad (GPU device IDs, PF
    PCI addresses). A PF carrying the node's default route is left out: Railyard never gives
    it to a pod, so Koordinator must not either. So is a NIC with no RDMA device (koordlet
    skips those too).
    """
    bad = frozenset(unhealthy)
    devices: list[dict[str, Any]] = []
    for g in topology.gpus:
        devices.append({
            "type": "gpu",
            "id": g.uuid or g.pci_address,
            "minor": g.index,
            "health": g.device_id not in bad,
            "resources": {GPU_CORE: WHOLE_DEVICE, GPU_MEMORY_RATIO: WHOLE_DEVICE},
            "topology": _topology(g.pcie_root, g.numa_node, g.pci_address),
        })
    for n in topology.nics:
        if n.default_route or not n.rdma_device:
            continue
        entry: dict[str, Any] = {
            "type": "rdma",
            "id": n.pci_address,
            "minor": rdma_minor(n.rdma_device),
            "health": n.pci_address not in bad,
            "resources": {RDMA: WHOLE_DEVICE},
            "topology": _topology(n.pcie_root, n.numa_node, n.pci_address),
        }
        if n.vfs:
            entry["vfGroups"] = [{"vfs": [{"minor": -1, "busID": v.pci_address}
                                          for v in n.vfs]}]
        devices.append(entry)
    return {"devices": devices}


def device_resource(topology: NodeTopology, unhealthy: Collection[str] = ()) -> dict[str, Any]:
    """The whole object to create: cluster-scoped, named after the node, labelled as ours."""
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": topology.node, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
            "spec": device_spec(topology, unhealthy)}
