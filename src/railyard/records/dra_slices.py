"""The node's `resource.k8s.io/v1` ResourceSlices of driver `railyard.dev`, and the three
DeviceClasses that select their devices (decision 0111).

Pure: `node_slices(topology, unhealthy)` is the node's whole pool (pool = node name, one
generation): every RDMA VF and whole PF of its compute NICs, optionally its GPUs, with the
standard and Railyard attributes of `records.dra_names`. A PF and its own VFs are exclusive by
shared counters (KEP-4815): one counter per PF, as many as VFs are published (at least 1); a VF
takes 1, the PF takes all. An unhealthy device carries a NoSchedule taint rather than leaving
the slice (kubelet's health stream and the allocator both still know it). A pool the API
server would refuse is split into several slices, or refused with `SliceLimitError`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from railyard.records.dra_names import (
    DRIVER,
    KIND,
    KIND_GPU,
    KIND_PF,
    KIND_VF,
    KINDS,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    PCIE_SWITCH,
    PF,
    RAIL,
    RDMA_DEVICE,
    UNHEALTHY_TAINT,
    device_class,
    device_name,
    distance_to_gpu,
)
from railyard.topology.model import Distance, Gpu, Nic, NodeTopology, Vf

API_VERSION = "resource.k8s.io/v1"

# The API server's limits (k8s.io/api@v0.36.3 resource/v1/types.go, enforced by
# pkg/apis/resource/validation in kubernetes v1.36.3).
MAX_DEVICES = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures: with counters or taints
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets, per slice
MAX_COUNTERS = 32  # ResourceSliceMaxCountersPerCounterSet
MAX_ATTRIBUTES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_VALUE = 64  # DeviceAttributeMaxValueLength: a string attribute
MAX_NAME = 253  # metadata.name and pool.name: DNS subdomains
MAX_LABEL = 63  # a device name, a counter set's and a counter's name: DNS labels

# A label on every slice we write, beside the field selectors that find them (spec.driver,
# spec.nodeName): `kubectl get resourceslices -l` finds them too.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "railyard"
COUNTER_SET_PREFIX = "pfs"  # counter sets `pfs-0`, `pfs-1`, …: 32 PFs each


class SliceLimitError(ValueError):
    """A node whose slices the API server would refuse, with the limit named."""


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of the pool before it is placed in a slice."""

    name: str
    kind: str
    pci_address: str
    body: dict[str, Any]  # the slice's device entry


def compute_nics(topology: NodeTopology) -> tuple[Nic, ...]:
    """The NICs whose VFs and whole PF the slices publish: all but the one carrying the
    node's default route (never handed to a pod), in PCI order."""
    return tuple(sorted((n for n in topology.nics if not n.default_route),
                        key=lambda n: n.pci_address))


def published_vfs(nic: Nic) -> tuple[Vf, ...]:
    """A NIC's RDMA VFs (`Vf.is_rdma`: VFs a pod holds included, VFIO ones not), by index."""
    return tuple(sorted((v for v in nic.vfs if v.is_rdma), key=lambda v: v.vf_index))


def slice_name(node: str, index: int) -> str:
    """The name of slice `index` of the node's pool: `<node>-railyard-dev-<index>`."""
    return f"{node}-{DRIVER.replace('.', '-')}-{index}"


def dma_switch(topology: NodeTopology, nic: Nic) -> str | None:
    """The PCIe switch a NIC's DMA enters: its own, or for a NIC with a Data Direct function
    the switch of the GPUs it reaches at PIX through it (`distances_for` measures a GPU's
    class as the nearer of the PF's and the Data Direct function's; the topology keeps that
    function's address, not its switch)."""
    if nic.data_direct is None:
        return nic.switch
    through = {g.switch for g in topology.gpus if g.switch is not None
               and topology.distance.get(g.pci_address, {}).get(nic.pci_address) == Distance.PIX}
    through.discard(nic.switch)
    return sorted(through)[0] if len(through) == 1 else nic.switch


def _string(name: str, value: str, device: str) -> dict[str, str]:
    if len(value) > MAX_VALUE:
        raise SliceLimitError(f"device {device}: attribute {name} is {len(value)} characters "
                              f"({value[:40]!r}…); the API server takes at most {MAX_VALUE}")
    return {"string": value}


def _common(name: str, kind: str, pci: str, root: str, numa: int | None,
            switch: str | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        KIND: {"string": kind},
        PCI_BUS_ID: _string(PCI_BUS_ID, pci, name),
        PCIE_ROOT: _string(PCIE_ROOT, root, name),
    }
    if numa is not None and numa >= 0:
        attrs[NUMA_NODE] = {"int": numa}
    if switch is not None:
        attrs[PCIE_SWITCH] = _string(PCIE_SWITCH, switch, name)
    return attrs


def _nic_attributes(topology: NodeTopology, nic: Nic, name: str, kind: str, pci: str,
                    rdma: str | None) -> dict[str, Any]:
    attrs = _common(name, kind, pci, nic.pcie_root, nic.numa_node, dma_switch(topology, nic))
    attrs[PF] = {"string": device_name(nic.pci_address)}
    if nic.rail is not None:
        attrs[RAIL] = {"int": nic.rail}
    if rdma is not None:
        attrs[RDMA_DEVICE] = _string(RDMA_DEVICE, rdma, name)
    # One attribute per GPU, where all of them fit (a constraint compares them one GPU at a
    # time; half a table would read as "far" for the GPUs left out).
    row = [(g.index, topology.distance.get(g.pci_address, {}).get(nic.pci_address))
           for g in topology.gpus]
    if len(attrs) + len(row) <= MAX_ATTRIBUTES and all(d is not None for _, d in row):
        attrs.update({distance_to_gpu(i): {"int": int(d)} for i, d in row if d is not None})
    return attrs


def _taints(pci: str, pf: str | None, unhealthy: Collection[str]) -> list[dict[str, str]]:
    """A NoSchedule taint on a device the health scan finds unhealthy (a sick PF takes its
    VFs, as in kubelet's health stream, `kubelet.dra_health`)."""
    if pci in unhealthy or (pf is not None and pf in unhealthy):
        return [{"key": UNHEALTHY_TAINT, "effect": "NoSchedule"}]
    return []


def _counter_set(pf_index: int) -> str:
    return f"{COUNTER_SET_PREFIX}-{pf_index // MAX_COUNTERS}"


def pool_devices(topology: NodeTopology, unhealthy: Collection[str] = (), *,
                 publish_gpus: bool = False, offered: Collection[str] | None = None
                 ) -> tuple[list[SliceDevice], list[dict[str, Any]]]:
    """Every device of the node's pool, and its counter sets (each as a slice writes it).
    `offered`: the PCI addresses of the VFs and PFs to publish (the agent's pools and
    `pfPlugin`); None: every one."""
    devices: list[SliceDevice] = []
    if publish_gpus:
        for g in sorted(topology.gpus, key=lambda g: g.pci_address):
            devices.append(_gpu_device(g, unhealthy))

    def wanted(pci: str) -> bool:
        return offered is None or pci in offered

    sets: dict[str, dict[str, Any]] = {}
    nics = [(n, tuple(v for v in published_vfs(n) if wanted(v.pci_address)))
            for n in compute_nics(topology)]
    nics = [(n, vfs) for n, vfs in nics if vfs or wanted(n.pci_address)]
    for j, (nic, vfs) in enumerate(nics):
        counter = device_name(nic.pci_address)
        cset = _counter_set(j)
        size = max(1, len(vfs))
        sets.setdefault(cset, {})[counter] = {"value": str(size)}
        for v in vfs:
            name = device_name(v.pci_address)
            devices.append(_device(name, KIND_VF, v.pci_address,
                                   _nic_attributes(topology, nic, name, KIND_VF,
                                                   v.pci_address, v.rdma_device),
                                   {cset: {counter: 1}},
                                   _taints(v.pci_address, nic.pci_address, unhealthy)))
        if not wanted(nic.pci_address):
            continue
        name = device_name(nic.pci_address)
        devices.append(_device(name, KIND_PF, nic.pci_address,
                               _nic_attributes(topology, nic, name, KIND_PF, nic.pci_address,
                                               nic.rdma_device),
                               {cset: {counter: size}},
                               _taints(nic.pci_address, None, unhealthy)))
    counter_sets = [{"name": n, "counters": {c: {"value": v["value"]} for c, v in cs.items()}}
                    for n, cs in sets.items()]
    return devices, counter_sets


def _gpu_device(g: Gpu, unhealthy: Collection[str]) -> SliceDevice:
    name = device_name(g.pci_address)
    attrs = _common(name, KIND_GPU, g.pci_address, g.pcie_root, g.numa_node, g.switch)
    return _device(name, KIND_GPU, g.pci_address, attrs, {}, _taints(g.pci_address, None,
                                                                      unhealthy))


def _device(name: str, kind: str, pci: str, attrs: dict[str, Any],
            consumes: dict[str, dict[str, int]], taints: list[dict[str, str]]) -> SliceDevice:
    if len(name) > MAX_LABEL:
        raise SliceLimitError(f"device name {name!r} is longer than {MAX_LABEL} characters")
    body: dict[str, Any] = {"name": name, "attributes": attrs}
    if consumes:
        body["consumesCounters"] = [
            {"counterSet": s, "counters": {c: {"value": str(n)} for c, n in cs.items()}}
            for s, cs in consumes.items()]
    if taints:
        body["taints"] = taints
    return SliceDevice(name, kind, pci, body)


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def node_slices(topology: NodeTopology, unhealthy: Collection[str] = (), *,
                publish_gpus: bool = False, generation: int = 1,
                offered: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The node's ResourceSlices: the counter slices first (8 counter sets of 32 PFs each at
    most; v1 allows counters and devices in one slice only apart), then the device slices
    (64 devices each at most), all of one pool and generation with the right
    `resourceSliceCount`. `unhealthy`: PCI addresses the agent's health scan finds bad;
    `offered`: the VFs and PFs to publish by PCI address (None: all; `pool_devices`)."""
    node = topology.node
    if len(slice_name(node, 999)) > MAX_NAME:
        raise SliceLimitError(f"node name {node[:40]!r}… is too long for slice names "
                              f"({MAX_NAME} characters at most)")
    devices, counter_sets = pool_devices(
        topology, frozenset(unhealthy), publish_gpus=publish_gpus,
        offered=None if offered is None else frozenset(offered))
    specs: list[dict[str, Any]] = [{"sharedCounters": c}
                                   for c in _chunks(counter_sets, MAX_COUNTER_SETS)]
    specs += [{"devices": [d.body for d in c]} for c in _chunks(devices, MAX_DEVICES)]
    if not specs:
        specs = [{"devices": []}]  # a pool of no devices still says so: one empty slice
    return [{
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, i), "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": generation,
                          "resourceSliceCount": len(specs)},
                 **spec},
    } for i, spec in enumerate(specs)]


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses `railyard-gpu`, `railyard-vf`, `railyard-pf`: our driver's devices of
    one kind each (what the claim template's requests name)."""
    return [{
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": device_class(kind), "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {"selectors": [{"cel": {"expression":
            f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].{KIND} == "{kind}"'
        }}]},
    } for kind in KINDS]
