"""Resource names and annotation keys: the one home of every name Railyard puts on a pod.

Resource names are configuration (a cluster may call its GPUs something else); the
defaults here are what every component uses unless told otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

# Pod annotations.
REQUEST_ANNOTATION = "railyard.dev/request"  # optional hints (JSON), written by users
ALLOCATION_ANNOTATION = "railyard.dev/allocation"  # the decision (JSON), one codec in records
KOORDINATOR_DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"


@dataclass(frozen=True, slots=True)
class ResourceNames:
    gpu: str = "nvidia.com/gpu"
    vf: str = "railyard.dev/vf"
    pf: str = "railyard.dev/pf"

    @property
    def managed(self) -> tuple[str, str, str]:
        return (self.gpu, self.vf, self.pf)


DEFAULT_RESOURCES = ResourceNames()
