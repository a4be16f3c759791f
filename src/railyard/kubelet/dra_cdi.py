"""CDI specs for prepared claims: one spec file per claim, which the runtime reads at create.

A claim's spec carries, at spec level (applied once to any container given one of its devices),
the pair map in every form the device plugins set (`kubelet.response`, `kubelet.pairmap`: the
same functions, not a copy) and the pair file's mount; each NIC's own device lists its RDMA
verbs node and `rdma_cm`. Device names start with the claim UID so two claims never define
one CDI name (CDI refuses a name two spec files give). Specs go in `/var/run/cdi`, the
runtime's dynamic folder, written temp + rename so the runtime never reads half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from railyard.allocation.names import ResourceNames
from railyard.allocation.types import Allocation, GpuRef, NicRef
from railyard.kubelet.pairing import DeviceIndex
from railyard.kubelet.pairmap import (
    PAIRS_FILE,
    PairMapOptions,
    container_pairs,
    hcas,
    nccl_ib_hca,
    pair_map_envs,
)
from railyard.kubelet.resolver import kind_of_nic
from railyard.kubelet.response import PAIRS_ENV, gpu_grant, nic_grant, pairs_json
from railyard.node.errors import StateError
from railyard.node.files import fsync_dir, write_atomic
from railyard.node.state import is_pod_uid

CDI_DIR = "/var/run/cdi"
CDI_VERSION = "0.5.0"  # device nodes with a hostPath need 0.5.0 (CDI's version rules)
VENDOR = "railyard.dev"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"


def cdi_name(claim_uid: str, device: str) -> str:
    """The CDI device name of one of a claim's devices (unique across claims)."""
    return f"{claim_uid}-{device}"


def cdi_id(claim_uid: str, device: str) -> str:
    """The fully qualified CDI device ID kubelet passes to the runtime."""
    return f"{KIND}={cdi_name(claim_uid, device)}"


def spec_file_name(claim_uid: str) -> str:
    return f"{VENDOR}-{CLASS}_{claim_uid}.json"


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One of our devices in a claim, by its slice name, as this node knows it."""

    name: str
    device: GpuRef | NicRef


def resource_of(names: ResourceNames, nic: NicRef) -> str:
    """The resource name whose `PCIDEVICE_*` variable lists this NIC (as the plugins do)."""
    kind = kind_of_nic(nic)
    return names.pf if kind == "pf" else names.resource_of_pool(None if kind == "vf" else kind)


def claim_envs(alloc: Allocation, index: DeviceIndex, names: ResourceNames,
               options: PairMapOptions, own_gpus: Sequence[GpuRef] = ()) -> dict[str, str]:
    """Every variable a container of the claim's pod gets, as the plugins would set them for
    one container holding all of the claim's devices. `NVIDIA_VISIBLE_DEVICES` names only
    `own_gpus` (ours): another driver's GPUs are made visible by that driver's own CDI spec."""
    nics = list(alloc.all_nics)
    envs: dict[str, str] = {}
    by_resource: dict[str, list[NicRef]] = {}
    for n in nics:
        by_resource.setdefault(resource_of(names, n), []).append(n)
    for resource, group in by_resource.items():
        envs.update(nic_grant(resource, group, {n.pci_address: index.uverbs.get(n.pci_address)
                                                for n in group}).envs)
    devices = hcas(nics)
    if devices:  # over every NIC kind, in pair order (one value, as the last plugin sets it)
        envs["NCCL_IB_HCA"] = nccl_ib_hca(devices)
    if own_gpus:
        envs.update(gpu_grant(list(own_gpus)).envs)
    gpu_ids = [g.device_id for g in alloc.all_gpus]
    nic_ids = [n.pci_address for n in nics]
    envs[PAIRS_ENV] = pairs_json(alloc, gpus=gpu_ids, nics=nic_ids)
    envs.update(pair_map_envs(container_pairs(alloc, gpu_ids, nic_ids), options))
    return envs


def claim_spec(claim_uid: str, devices: Sequence[ClaimDevice], envs: Mapping[str, str],
               index: DeviceIndex, names: ResourceNames, pair_file: str | None) -> dict[str, Any]:
    """The claim's CDI spec (JSON value): spec-level variables and pair-file mount, one
    device per claim device (a NIC's with its verbs node and rdma_cm)."""
    edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(envs.items())]}
    if pair_file is not None:
        edits["mounts"] = [{"hostPath": pair_file, "containerPath": PAIRS_FILE,
                            "options": ["ro", "nosuid", "nodev", "bind"]}]
    out = []
    for d in devices:
        nodes: list[dict[str, str]] = []
        if isinstance(d.device, NicRef):
            nic = d.device
            grant = nic_grant(resource_of(names, nic), [nic],
                              {nic.pci_address: index.uverbs.get(nic.pci_address)})
            nodes = [{"path": n.container_path, "hostPath": n.host_path,
                      "permissions": n.permissions} for n in grant.devices]
        out.append({"name": cdi_name(claim_uid, d.name), "containerEdits": {"deviceNodes": nodes}
                    if nodes else {"env": [f"RAILYARD_DRA_DEVICE_{_env_key(d.name)}=1"]}})
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": out, "containerEdits": edits}


def _env_key(name: str) -> str:
    # CDI wants each device to edit something; a GPU of ours names itself in one variable.
    return name.upper().replace("-", "_").replace(".", "_")


class CdiSpecs:
    """The claim spec files in one folder (`/var/run/cdi`)."""

    def __init__(self, folder: str | os.PathLike[str] = CDI_DIR) -> None:
        self.folder = Path(folder)

    def path(self, claim_uid: str) -> Path:
        if not is_pod_uid(claim_uid):  # one path component, whatever a caller passes
            raise StateError(str(self.folder), f"{claim_uid!r} is not a claim UID")
        return self.folder / spec_file_name(claim_uid)

    def write(self, claim_uid: str, spec: Mapping[str, Any]) -> Path:
        """Write (or replace) the claim's spec, durably: a prepared claim outlives a crash."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(claim_uid)
        write_atomic(path, json.dumps(spec, indent=1).encode(), mode=0o644, fsync=True)
        fsync_dir(self.folder)
        return path

    def remove(self, claim_uid: str) -> bool:
        with contextlib.suppress(FileNotFoundError):
            self.path(claim_uid).unlink()
            return True
        return False
