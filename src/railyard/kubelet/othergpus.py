"""GPUs that another plugin hands out (NVIDIA's, with `gpuPlugin: false`) or a DRA driver
serves: what Railyard can still make right, as values (docs/decisions/0090).

NVIDIA's plugin does not read our record, and kubelet allocates a container's resources in no
fixed order, so the GPUs a container really gets are known for certain only from PodResources
once kubelet has admitted the pod. `Correction` is what the agent does about a record that
named other GPUs (or NICs): the node's truth, the container's pair file made again from it,
and the Event that says so. `gpu_drivers` reads ResourceSlices for DRA drivers serving GPUs.
Pure: no I/O here; the agent writes the files and sends the Events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from railyard.allocation.types import Allocation
from railyard.kubelet.pairmap import NCCL_AFFINITY, VLLM_MAPPING, VLLM_SELECTION
from railyard.kubelet.response import PAIRS_ENV, PairFile

# Points at the pair file: with GPUs from another plugin, the file is the pair map's form
# that is right when the container starts (it is written again before then).
PAIRS_FILE_ENV = "RAILYARD_PAIRS_FILE"
# The variables that name the container's GPUs. Kubelet fixes a container's variables at
# Allocate, and our Allocate may come before NVIDIA's (Go map order): so when GPUs are not
# ours they are left out rather than guessed from the record (a missing variable is better
# than a wrong one: vLLM refuses a worker whose GPU the mapping lacks).
GPU_NAMING_ENVS = (PAIRS_ENV, VLLM_MAPPING, VLLM_SELECTION, NCCL_AFFINITY, "CUDA_DEVICE_ORDER")

CORRECTED_EVENT = "RailyardRecordCorrected"  # Warning on the Pod
DRA_EVENT = "RailyardGpusAlsoServedByDra"  # Warning on the Node
# DRA drivers known to serve GPUs; any driver whose name has a `gpu` label counts too
# (gpu.nvidia.com, gpu.amd.com, gpu.intel.com, a site's own gpu.example.com).
KNOWN_GPU_DRIVERS = frozenset({"gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com",
                               "gpu.resource.nvidia.com"})


@dataclass(frozen=True, slots=True)
class Correction:
    """The PodResources check found kubelet gave a pod other devices than its record named.

    `allocation`: the node's truth now (`decidedBy: node`); `gpus`: the GPU IDs kubelet
    gave each container; `files`: each container's pair file made again from the truth
    (only containers kubelet is done with); `previous`: the record before.
    """

    namespace: str
    name: str
    uid: str
    previous: Allocation | None
    allocation: Allocation
    gpus: Mapping[str, tuple[str, ...]]
    files: tuple[PairFile, ...]
    gpu_resource: str

    @property
    def gpus_changed(self) -> bool:
        before = {g.device_id for g in self.previous.all_gpus} if self.previous else set()
        return before != {g.device_id for g in self.allocation.all_gpus}

    def message(self) -> str:
        """The Event's text: what kubelet gave, what the record said, what now pairs."""
        before = (sorted(g.device_id for g in self.previous.all_gpus)
                  if self.previous is not None else [])
        given = sorted({i for ids in self.gpus.values() for i in ids})
        pairs = ", ".join(f"{p.gpu.device_id}={p.nic.pci_address}"
                          for p in self.allocation.pairs) or "none"
        text = (f"kubelet's assignment to {self.namespace}/{self.name} differs from its "
                f"record; the node's record now holds what kubelet gave (decidedBy: node)")
        if self.gpus_changed:
            text += (f": {self.gpu_resource} {given}, not the recorded {before}; NICs "
                     f"paired again with the GPUs received")
        else:
            text += ": GPUs paired again with the NICs of their own container"
        text += f"; pairs {pairs}"
        if self.files:
            written = ", ".join(f.container for f in self.files)
            text += f"; pair file written again for {written}"
        return text


def gpu_drivers(slices: Iterable[Mapping[str, Any]], node: str) -> list[str]:
    """The DRA drivers with a ResourceSlice for `node` that serve GPUs, sorted.

    A slice is the node's when `spec.nodeName` names it (a slice for a node selector or for
    all nodes is not looked at: it says nothing about this node's PCI devices).
    """
    found = set()
    for s in slices:
        spec = s.get("spec") if isinstance(s, Mapping) else None
        if not isinstance(spec, Mapping) or spec.get("nodeName") != node:
            continue
        driver = spec.get("driver")
        if isinstance(driver, str) and is_gpu_driver(driver):
            found.add(driver)
    return sorted(found)


def is_gpu_driver(driver: str) -> bool:
    """A DRA driver that serves GPUs: a known one, or one whose name has a `gpu` label."""
    return driver in KNOWN_GPU_DRIVERS or "gpu" in driver.lower().split(".")


def dra_message(drivers: Iterable[str], gpu_resource: str, gpu_plugin: bool) -> str:
    names = ", ".join(drivers)
    who = "Railyard's GPU plugin" if gpu_plugin else "another device plugin"
    return (f"GPUs on this node are also served by DRA ({names}): a pod that claims GPUs "
            f"through a ResourceClaim gets them outside {gpu_resource}, which Railyard "
            f"neither pairs nor accounts ({who} serves {gpu_resource}); give a node's GPUs "
            "to one of the two")
