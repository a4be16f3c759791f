"""The pair map in every form a workload reads, for one container, from the one Allocation.

Pure: `container_pairs` takes what the container holds of the pod's record (as this node names
its devices) and the functions below write it out as NCCL, UCX, NVSHMEM and vLLM read it, and
as the JSON pair file the agent mounts at `/run/railyard/pairs.json`. Every form lists the
container's pairs in pair order and nothing the container was not given. docs/pair-map.md
shows each form; decision 0084 says why vLLM's selection names a variable of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from railyard.allocation.types import Allocation, GpuRef, NicRef
from railyard.node.ifnames import DEFAULT_POD_IFNAME, SEQUENTIAL, allocation_ifnames
from railyard.topology.model import Distance

PAIRS_FILE = "/run/railyard/pairs.json"  # where the container finds its pair file
PAIRS_FILE_VERSION = 1
RDMA_PORT = 1  # a VF has one port; Railyard hands out PFs per port-1 function
VLLM_MAPPING = "VLLM_GPU_NIC_PCIE_MAPPING"
VLLM_SELECTION = "VLLM_NIC_SELECTION_VARS"
# vLLM prepends each worker's NIC to the variables VLLM_NIC_SELECTION_VARS names; this one is
# Railyard's own and set by nobody else, so the worker gets exactly its NIC in it and nothing
# Railyard sets pod-wide (the exact NCCL_IB_HCA above all) is touched (decision 0084).
WORKER_HCA = "RAILYARD_WORKER_HCA"
NCCL_AFFINITY = "NCCL_GPU_NIC_AFFINITY"


@dataclass(frozen=True, slots=True)
class PairMapOptions:
    """The node's choices for the forms: the opt-in NCCL_GPU_NIC_AFFINITY, and how the CNI
    names the pod's interfaces (`railyard.node.ifnames`): the scheme, and under `sequential`
    the interface name of the pod's Railyard attachment the names derive from."""

    nccl_gpu_nic_affinity: bool = False
    pod_ifname: str = DEFAULT_POD_IFNAME
    pod_ifname_scheme: str = SEQUENTIAL


DEFAULT_PAIR_MAP = PairMapOptions()


@dataclass(frozen=True, slots=True)
class HeldPair:
    index: int  # the pair's position in the pod's Allocation
    gpu: GpuRef
    nic: NicRef
    distance: Distance
    rail: int | None = None  # the NIC's fabric rail as the record says (docs/rails.md)


@dataclass(frozen=True, slots=True)
class ContainerPairs:
    """What one container holds of its pod's Allocation.

    `pairs`: the pairs whose GPU and NIC are both the container's, in pair order; `nics`:
    every NIC of the container, paired ones in pair order, then the others; `gpus` likewise.
    """

    allocation: Allocation
    pairs: tuple[HeldPair, ...]
    nics: tuple[NicRef, ...]
    gpus: tuple[GpuRef, ...]

    @property
    def unpaired_nics(self) -> tuple[NicRef, ...]:
        paired = {p.nic.pci_address for p in self.pairs}
        return tuple(n for n in self.nics if n.pci_address not in paired)

    @property
    def unpaired_gpus(self) -> tuple[GpuRef, ...]:
        paired = {p.gpu.device_id for p in self.pairs}
        return tuple(g for g in self.gpus if g.device_id not in paired)


def container_pairs(alloc: Allocation, gpus: Iterable[str], nics: Iterable[str],
                    named: Mapping[str, NicRef] | None = None) -> ContainerPairs:
    """The container's share of `alloc`, given its GPU IDs and NIC PCI addresses.

    `named` is this node's own view of a NIC by PCI address (its discovery names the RDMA
    device; the record only fills a gap), the same view the NIC plugin's answer uses.
    """
    g_ids, n_ids = set(gpus), set(nics)
    named = named or {}

    def nic(n: NicRef) -> NicRef:
        return named.get(n.pci_address, n)

    pairs = tuple(HeldPair(i, p.gpu, nic(p.nic), p.distance, p.rail)
                  for i, p in enumerate(alloc.pairs)
                  if p.gpu.device_id in g_ids and p.nic.pci_address in n_ids)
    held_nics = {p.nic.pci_address: p.nic for p in pairs}
    for n in alloc.all_nics:
        if n.pci_address in n_ids:
            held_nics.setdefault(n.pci_address, nic(n))
    held_gpus = {p.gpu.device_id: p.gpu for p in pairs}
    for g in alloc.all_gpus:
        if g.device_id in g_ids:
            held_gpus.setdefault(g.device_id, g)
    return ContainerPairs(alloc, pairs, tuple(held_nics.values()), tuple(held_gpus.values()))


# ----------------------------------------------------------------------- the forms


def hcas(nics: Iterable[NicRef]) -> list[str]:
    """The distinct RDMA devices of `nics`, in their order (a NIC without one is left out)."""
    return list(dict.fromkeys(n.rdma_device for n in nics if n.rdma_device))


def ib_devices(devices: Iterable[str]) -> str:
    """`mlx5_3:1,mlx5_5:1`: UCX_NET_DEVICES' and NVSHMEM_HCA_LIST's form, device:port."""
    return ",".join(f"{d}:{RDMA_PORT}" for d in devices)


def nccl_ib_hca(devices: Iterable[str]) -> str:
    """`=mlx5_3:1,mlx5_5:1`: the leading `=` asks NCCL for exact names, not prefixes (a bare
    `mlx5_1` would also match mlx5_10…mlx5_17)."""
    return "=" + ib_devices(devices)


def cuda_ordinals(gpus: Iterable[GpuRef]) -> dict[str, int]:
    """GPU ID → its CUDA ordinal in the container: CUDA numbers the GPUs a container sees by
    PCI bus ID under `CUDA_DEVICE_ORDER=PCI_BUS_ID` (which the affinity form sets), whatever
    order NVIDIA_VISIBLE_DEVICES lists them in."""
    ordered = sorted(dict.fromkeys(gpus), key=lambda g: g.pci_address)
    return {g.device_id: i for i, g in enumerate(ordered)}


def vllm_mapping(held: ContainerPairs) -> str | None:
    """`<GPU BDF>=<NIC BDF>,…` for vLLM, or None when vLLM could not act on it.

    vLLM looks up the GPU of every worker in the mapping and refuses to start when one is
    missing, and resolves each NIC's BDF through `/sys/class/infiniband/*/device`: so the
    mapping is set only when every GPU of the container has its NIC there, each with an RDMA
    device. The NIC's BDF is its own (the VF's, not its PF's): that is what
    `/sys/class/infiniband/<dev>/device` resolves to.
    """
    if not held.pairs or held.unpaired_gpus:
        return None
    if any(not p.nic.rdma_device for p in held.pairs):
        return None
    return ",".join(f"{p.gpu.pci_address}={p.nic.pci_address}" for p in held.pairs)


def nccl_gpu_nic_affinity(held: ContainerPairs) -> str | None:
    """`cuda:<ordinal>=<rdma device>,…` in pair order (NCCL's proposed variable), or None."""
    ordinals = cuda_ordinals(held.gpus)
    entries = [f"cuda:{ordinals[p.gpu.device_id]}={p.nic.rdma_device}"
               for p in held.pairs if p.nic.rdma_device]
    return ",".join(entries) or None


def pair_map_envs(held: ContainerPairs, options: PairMapOptions = DEFAULT_PAIR_MAP
                  ) -> dict[str, str]:
    """The variables the container's last plugin sets besides NCCL_IB_HCA and RAILYARD_PAIRS
    (those two keep their own homes: `response.nic_grant`, `response.pairs_json`)."""
    envs: dict[str, str] = {}
    devices = hcas(held.nics)
    if devices:
        envs["UCX_NET_DEVICES"] = ib_devices(devices)
        envs["NVSHMEM_HCA_LIST"] = ib_devices(devices)
    mapping = vllm_mapping(held)
    if mapping is not None:  # vLLM refuses to start with one of the two and not the other
        envs[VLLM_MAPPING] = mapping
        envs[VLLM_SELECTION] = f"{WORKER_HCA}:{RDMA_PORT}"
    if options.nccl_gpu_nic_affinity:
        affinity = nccl_gpu_nic_affinity(held)
        if affinity is not None:
            envs[NCCL_AFFINITY] = affinity
            envs["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the ordinals above are bus order
    return envs


def pair_file_json(held: ContainerPairs, *, namespace: str, pod: str, uid: str,
                   container: str, options: PairMapOptions = DEFAULT_PAIR_MAP) -> str:
    """The pair file: one entry per pair the container holds, then its unpaired devices.

    `podNetdev` is the name the CNI gives the NIC in the pod (`railyard.node.ifnames`, by the
    scheme the node is configured with, from the NIC's place among all the pod's NICs, as the
    CNI counts them); `rail` is the pair's rail as the record says, null when the node does
    not know its NICs' rails (docs/rails.md).
    """
    netdevs = allocation_ifnames(held.allocation, options.pod_ifname_scheme, options.pod_ifname)
    ordinals = cuda_ordinals(held.gpus)

    def gpu(g: GpuRef) -> dict[str, Any]:
        return {"index": g.index, "pciAddress": g.pci_address, "uuid": g.uuid,
                "cudaOrdinal": ordinals.get(g.device_id)}

    def nic(n: NicRef) -> dict[str, Any]:
        return {"kind": n.kind, "pciAddress": n.pci_address, "pfPciAddress": n.pf_pci_address,
                "rdmaDevice": n.rdma_device, "podNetdev": netdevs.get(n.pci_address)}

    doc = {
        "version": PAIRS_FILE_VERSION,
        "pod": {"namespace": namespace, "name": pod, "uid": uid},
        "container": container,
        "node": held.allocation.node,
        "decidedBy": held.allocation.decided_by,
        "pairs": [{"index": p.index, "gpu": gpu(p.gpu), "nic": nic(p.nic),
                   "distance": p.distance.name, "rail": p.rail} for p in held.pairs],
        "nics": [nic(n) for n in held.unpaired_nics],
        "gpus": [gpu(g) for g in held.unpaired_gpus],
    }
    return json.dumps(doc, indent=2) + "\n"
