"""An Allocation in Koordinator's `scheduling.koordinator.sh/device-allocated` form.

For clusters that also run Koordinator (its deviceshare plugin and koordlet): its GPU and RDMA
lists are independent, so the pairing is lost in this form; Railyard's own record keeps it.
Koordinator numbers an RDMA device by the N of its PF's `mlx5_N` name (-1 for any other
driver, as koordlet does) and a GPU by its minor, which here is the GPU index. Railyard
itself never depends on either number.
"""

from __future__ import annotations

import json
import re
from typing import Any

from railyard.allocation.types import Allocation, NicRef
from railyard.records.allocation import RecordError
from railyard.topology.model import NodeTopology

GPU_CORE = "koordinator.sh/gpu-core"
GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
RDMA = "koordinator.sh/rdma"
# Koordinator's resource is percent-like: 100 is one whole device; a VF is counted as 1
# (its `RequestsAsCount` strategy).
WHOLE_DEVICE = "100"
ONE_VF = "1"

_MLX5 = re.compile(r"mlx5_([0-9]{1,9})", re.ASCII)  # fullmatch; ASCII digits, int() cannot fail


def rdma_minor(rdma_device: str | None) -> int:
    """N of `mlx5_N`, else -1 (Koordinator skips other vendors' numbering)."""
    m = _MLX5.fullmatch(rdma_device or "")
    return int(m.group(1)) if m else -1


def _rdma_entry(nic: NicRef, topology: NodeTopology, where: str) -> dict[str, Any]:
    """One RDMA entry, under the PF the topology says the device belongs to."""
    try:
        pf = topology.nic(nic.pf_pci_address)
    except KeyError:
        raise RecordError(f"{where}.pfPciAddress",
                          f"PF {nic.pf_pci_address} is not on {topology.node}") from None
    if nic.kind == "vf" and not any(v.pci_address == nic.pci_address for v in pf.vfs):
        try:
            owner = f"a VF of {topology.vf(nic.pci_address)[0].pci_address}"
        except KeyError:
            owner = "not on the node"
        raise RecordError(f"{where}.pciAddress", f"VF {nic.pci_address} is not a VF of "
                          f"{pf.pci_address} on {topology.node} ({owner})")
    entry: dict[str, Any] = {"minor": rdma_minor(pf.rdma_device), "id": pf.pci_address}
    if nic.kind == "pf":
        entry["resources"] = {RDMA: WHOLE_DEVICE}
    else:
        # koordlet reports VF minors as -1; the bus ID is what Multus and the runtime use.
        entry["resources"] = {RDMA: ONE_VF}
        entry["extension"] = {"vfs": [{"minor": -1, "busID": nic.pci_address}]}
    return entry


def _nic_field(a: Allocation, nic: NicRef) -> str:
    """Where `nic` first appears in the record, for error messages."""
    for i, p in enumerate(a.pairs):
        if p.nic.pci_address == nic.pci_address:
            return f"allocation.pairs[{i}].nic"
    return f"allocation.nics[{a.nics.index(nic)}]"


def device_allocated_to_json(a: Allocation, topology: NodeTopology) -> dict[str, Any]:
    """`{"gpu": [...], "rdma": [...]}`: GPUs in pair order, then NICs in pair order, one
    entry per VF (Koordinator holds one VF per PF entry) or whole PF.

    Raises RecordError naming the field when a device is not on `topology`, or a VF is
    recorded under a PF it does not belong to.
    """
    if a.node != topology.node:
        raise RecordError("allocation.node", f"{a.node!r} is not {topology.node!r}")
    gpus = []
    for i, g in enumerate(a.all_gpus):
        try:
            gpu = topology.gpu(g.pci_address)
        except KeyError:
            where = (f"allocation.pairs[{i}].gpu" if i < len(a.pairs)
                     else f"allocation.gpus[{i - len(a.pairs)}]")
            raise RecordError(f"{where}.pciAddress",
                              f"GPU {g.pci_address} is not on {topology.node}") from None
        gpus.append({
            "minor": gpu.index,
            "id": gpu.uuid or gpu.pci_address,
            "resources": {GPU_CORE: WHOLE_DEVICE, GPU_MEMORY_RATIO: WHOLE_DEVICE},
        })
    rdma = [_rdma_entry(n, topology, _nic_field(a, n)) for n in a.all_nics]
    out: dict[str, Any] = {}
    if gpus:
        out["gpu"] = gpus
    if rdma:
        out["rdma"] = rdma
    return out


def encode_device_allocated(a: Allocation, topology: NodeTopology) -> str:
    """Compact JSON for the `scheduling.koordinator.sh/device-allocated` annotation."""
    return json.dumps(device_allocated_to_json(a, topology), separators=(",", ":"))
