"""What one container gets from `Allocate`: device nodes, environment, device-info files.

Pure: the servicer turns a `ContainerGrant` into protobuf and the agent writes the device-info
files. Every variable's guarantee is documented in docs/agent.md; in short, everything is in
pair order (GPU i ↔ NIC i), and only the devices kubelet passed appear.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from railyard.allocation.types import Allocation, GpuRef, NicRef
from railyard.kubelet.pairmap import nccl_ib_hca
from railyard.kubelet.resolver import Kind

RDMA_CM = "/dev/infiniband/rdma_cm"
DEV_INFINIBAND = "/dev/infiniband"
DEVINFO_VERSION = "1.1.0"  # Multus / NPWG device-info spec
PAIRS_ENV = "RAILYARD_PAIRS"


@dataclass(frozen=True, slots=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class PairFile:
    """A container's pair file (`pairmap.pair_file_json`), for the agent to write on the node
    and mount at `pairmap.PAIRS_FILE`."""

    uid: str
    container: str
    body: str


@dataclass(slots=True)
class ContainerGrant:
    envs: dict[str, str] = field(default_factory=dict)
    devices: list[DeviceNode] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    devinfo: dict[str, str] = field(default_factory=dict)  # file name -> JSON content
    mounts: list[Mount] = field(default_factory=list)
    pair_file: PairFile | None = None  # set by the container's last plugin of ours


def pcidevice_env(resource: str) -> str:
    """sriov-dp's variable name: `PCIDEVICE_` + resource, upper-cased, `.` and `/` → `_`."""
    return "PCIDEVICE_" + resource.upper().replace(".", "_").replace("/", "_")


def devinfo_file_name(resource: str, device_id: str) -> str:
    """The file Multus looks for: `<resource, / → ->-<device ID, / → ->-device.json`."""
    return f"{resource.replace('/', '-')}-{device_id.replace('/', '-')}-device.json"


def devinfo_json(nic: NicRef) -> str:
    pci: dict[str, str] = {"pci-address": nic.pci_address}
    if nic.rdma_device:
        pci["rdma-device"] = nic.rdma_device
    return json.dumps({"type": "pci", "version": DEVINFO_VERSION, "pci": pci})


def pairs_json(alloc: Allocation, gpus: Iterable[str] = (), nics: Iterable[str] = ()) -> str:
    """RAILYARD_PAIRS for a container given `gpus` (IDs) and `nics` (PCI addresses): the
    pairs of two given devices, in pair order, then the given unpaired NICs (`gpu: null`) and
    unpaired GPUs (`nic: null`). A device the container was not given never appears."""
    g_ids, n_ids = set(gpus), set(nics)

    def gpu(g: GpuRef) -> dict:
        return {"uuid": g.uuid, "pciAddress": g.pci_address}

    def nic(n: NicRef) -> dict:
        return {"kind": n.kind, "pciAddress": n.pci_address, "rdmaDevice": n.rdma_device,
                "netdev": n.netdev}

    out: list[dict[str, Any]] = [
        {"gpu": gpu(p.gpu), "nic": nic(p.nic), "distance": p.distance.name}
        for p in alloc.pairs if p.gpu.device_id in g_ids and p.nic.pci_address in n_ids]
    out += [{"gpu": None, "nic": nic(n), "distance": None}
            for n in alloc.nics if n.pci_address in n_ids]
    out += [{"gpu": gpu(g), "nic": None, "distance": None}
            for g in alloc.gpus if g.device_id in g_ids]
    return json.dumps(out, separators=(",", ":"))


def in_pair_order(ids: Iterable[str], alloc: Allocation | None, kind: Kind) -> list[str]:
    """Kubelet's IDs reordered as the Allocation pairs them (unknown ones last, as given)."""
    ids = list(dict.fromkeys(ids))
    if alloc is None:
        return ids
    if kind == "gpu":
        order = [g.device_id for g in alloc.all_gpus]
    else:
        order = [n.pci_address for n in alloc.all_nics]
    pos = {x: i for i, x in enumerate(order)}
    return sorted(ids, key=lambda x: (pos.get(x, len(pos)), ids.index(x)))


def nic_grant(resource: str, nics: list[NicRef], uverbs: dict[str, str | None]) -> ContainerGrant:
    """VFs or PFs, in the order given (pair order): verbs nodes, NCCL_IB_HCA, sriov-dp envs."""
    g = ContainerGrant()
    info: dict[str, dict] = {}
    hcas: list[str] = []
    for n in nics:
        rdma: dict[str, str] = {}
        verbs = uverbs.get(n.pci_address)
        if verbs:
            path = f"{DEV_INFINIBAND}/{verbs}"
            g.devices.append(DeviceNode(path, path))
            rdma = {"uverbs": path, "rdma_cm": RDMA_CM}
        if n.rdma_device:
            rdma["rdma_dev"] = n.rdma_device
            if n.rdma_device not in hcas:
                hcas.append(n.rdma_device)
        info[n.pci_address] = {"generic": {"deviceID": n.pci_address}, "rdma": rdma}
        g.devinfo[devinfo_file_name(resource, n.pci_address)] = devinfo_json(n)
    if nics:
        g.devices.append(DeviceNode(RDMA_CM, RDMA_CM))
    if hcas:
        g.envs["NCCL_IB_HCA"] = nccl_ib_hca(hcas)
    env = pcidevice_env(resource)
    g.envs[env] = ",".join(n.pci_address for n in nics)
    g.envs[env + "_INFO"] = json.dumps(info, separators=(",", ":"))
    return g


def gpu_grant(gpus: list[GpuRef]) -> ContainerGrant:
    """GPUs in pair order: NVIDIA_VISIBLE_DEVICES (UUIDs, PCI address when there is none)."""
    g = ContainerGrant()
    g.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(x.device_id for x in gpus)
    return g
