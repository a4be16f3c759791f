"""An Allocation in Koordinator's `scheduling.koordinator.sh/device-allocated` form, and that
form read back into the devices it names on one node (decision 0095).

For clusters that also run Koordinator (its deviceshare plugin and koordlet): its GPU and RDMA
lists are independent, so the pairing is lost in this form; Railyard's own record keeps it.
Koordinator numbers an RDMA device by the N of its PF's `mlx5_N` name (-1 for any other
driver, as koordlet does) and a GPU by its minor, which here is the GPU index. Railyard
itself never depends on either number.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from railyard.allocation.types import Allocation, GpuRef, NicRef
from railyard.records.allocation import MAX_RECORD_BYTES, RecordError, _one_value_per_key
from railyard.records.fields import Fields
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


# ----------------------------------------------------------------------- reading it back

# Bounds on what a record may list before any is looked up: far beyond a node (8 GPUs, a
# few dozen PFs, 127 VFs each), and each entry costs a dictionary look-up at most.
MAX_ENTRIES = 256  # per device type
MAX_VFS_PER_ENTRY = 256


@dataclass(frozen=True, slots=True)
class KoordinatorGpu:
    """A GPU as Koordinator names it: its minor (Railyard's GPU index) and, when written,
    its UUID."""

    minor: int
    id: str | None


@dataclass(frozen=True, slots=True)
class KoordinatorRdma:
    """An RDMA entry: the PF (PCI address) and either the VFs it gives (bus IDs) or, with
    none, the whole PF."""

    pf: str
    vfs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KoordinatorDevices:
    gpus: tuple[KoordinatorGpu, ...]
    rdma: tuple[KoordinatorRdma, ...]


def _whole(f: Fields, key: str, what: str) -> None:
    """A `resources` value that must be a whole device ("100"): Railyard shares no device."""
    v = f.get(key)
    if v is not None and v not in (WHOLE_DEVICE, 100):
        f.fail(key, f"expected {WHOLE_DEVICE} (a whole {what}; Railyard does not share one), "
                    f"got {str(v)[:20]!r}")


def _entries(f: Fields, key: str) -> list[Fields]:
    items = f.array(key, optional=True)
    if len(items) > MAX_ENTRIES:
        f.fail(key, f"{len(items)} entries, more than the {MAX_ENTRIES} a node can hold")
    return list(f.objects(key, optional=True))


def device_allocated_from_json(data: Any, where: str = "deviceAllocated") -> KoordinatorDevices:
    """The GPU and RDMA entries of a decoded record; other device types (fpga, …) are not
    Railyard's and are left to their own plugins. RecordError names the field."""
    doc = Fields(data, where, RecordError)
    gpus = []
    for g in _entries(doc, "gpu"):
        minor = g.integer("minor", 0, 1 << 20)
        gpu_id = g.string("id", nonempty=True) if g.get("id") is not None else None
        res = g.object("resources", optional=True)
        _whole(res, GPU_CORE, "GPU")
        _whole(res, GPU_MEMORY_RATIO, "GPU")
        gpus.append(KoordinatorGpu(minor, gpu_id))
    rdma = []
    for r in _entries(doc, "rdma"):
        r.integer("minor", -1, 1 << 20, default=-1)
        pf = r.pci_address("id").lower()
        ext = r.object("extension", optional=True)
        vfs = ext.array("vfs", optional=True)
        if len(vfs) > MAX_VFS_PER_ENTRY:
            ext.fail("vfs", f"{len(vfs)} VFs, more than {MAX_VFS_PER_ENTRY} in one entry")
        bus_ids = tuple(v.pci_address("busID").lower() for v in ext.objects("vfs", optional=True))
        if not bus_ids:
            _whole(r.object("resources", optional=True), RDMA, "PF")
        rdma.append(KoordinatorRdma(pf, bus_ids))
    return KoordinatorDevices(tuple(gpus), tuple(rdma))


def decode_device_allocated(text: str, where: str = "deviceAllocated") -> KoordinatorDevices:
    """Parse the annotation; its cost is bounded before any work (MAX_RECORD_BYTES, as our own
    record), RecordError naming the field on anything malformed."""
    if len(text) > MAX_RECORD_BYTES:
        raise RecordError(where, f"{len(text)} characters, larger than the {MAX_RECORD_BYTES} "
                                 "bytes Kubernetes allows for all of a pod's annotations")
    try:
        data = json.loads(text, object_pairs_hook=_one_value_per_key)
    except ValueError as e:
        raise RecordError(where, f"not valid JSON: {e}") from None
    except RecursionError:
        raise RecordError(where, "not valid JSON: nested too deeply") from None
    return device_allocated_from_json(data, where)


@dataclass(frozen=True, slots=True)
class DevicesOnNode:
    """The devices a Koordinator record gives, found on one node: GPUs, VFs, whole PFs."""

    gpus: tuple[GpuRef, ...]
    vfs: tuple[NicRef, ...]
    pfs: tuple[NicRef, ...]


def devices_on(devices: KoordinatorDevices, topology: NodeTopology,
               where: str = "deviceAllocated") -> DevicesOnNode:
    """Each device of the record on `topology`: a GPU by UUID, or by minor (Railyard's GPU
    index, as its Device CR reports it) when the entry has no UUID; a VF under the PF its
    entry names; a whole PF by address. The UUID wins over the minor: koordlet reports
    NVML's minor, which need not be the PCI-order index. RecordError when a device is not on
    this node, is named twice, a VF is not the PF's, or the PF carries the default route."""
    by_uuid = {g.uuid: g for g in topology.gpus if g.uuid}
    by_minor = {g.index: g for g in topology.gpus}
    gpus: list[GpuRef] = []
    for i, kg in enumerate(devices.gpus):
        at = f"{where}.gpu[{i}]"
        gpu = by_uuid.get(kg.id) if kg.id is not None else by_minor.get(kg.minor)
        if gpu is None:
            shown = kg.id if kg.id is not None else f"minor {kg.minor}"
            raise RecordError(at, f"GPU {shown[:80]} is not on {topology.node}")
        if any(g.pci_address == gpu.pci_address for g in gpus):
            raise RecordError(at, f"GPU {gpu.pci_address} is named twice")
        gpus.append(GpuRef.of(gpu))
    vfs: list[NicRef] = []
    pfs: list[NicRef] = []
    seen: set[str] = set()
    for i, kr in enumerate(devices.rdma):
        at = f"{where}.rdma[{i}]"
        try:
            pf = topology.nic(kr.pf)
        except KeyError:
            raise RecordError(f"{at}.id", f"PF {kr.pf} is not on {topology.node}") from None
        if not kr.vfs:
            if pf.default_route:
                raise RecordError(f"{at}.id", f"PF {kr.pf} carries {topology.node}'s default "
                                              "route: never given to a pod")
            if kr.pf in seen:
                raise RecordError(f"{at}.id", f"PF {kr.pf} is named twice")
            seen.add(kr.pf)
            pfs.append(NicRef.of_pf(pf))
            continue
        mine = {v.pci_address: v for v in pf.vfs}
        for j, bus_id in enumerate(kr.vfs):
            vf = mine.get(bus_id)
            if vf is None:
                raise RecordError(f"{at}.extension.vfs[{j}].busID",
                                  f"{bus_id} is not a VF of {kr.pf} on {topology.node}")
            if bus_id in seen:
                raise RecordError(f"{at}.extension.vfs[{j}].busID", f"VF {bus_id} is named twice")
            seen.add(bus_id)
            vfs.append(NicRef.of_vf(pf, vf))
    if any(n.pf_pci_address in seen for n in vfs):
        raise RecordError(f"{where}.rdma", "a PF given whole and a VF of it in one record")
    return DevicesOnNode(tuple(gpus), tuple(vfs), tuple(pfs))
