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
    """`vf` names the default VF pool; `vf_pools` the node's other VF pools, each its own
    resource (docs/decisions/0085). A VF's pool in records is its resource name, absent for
    the default pool."""

    gpu: str = "nvidia.com/gpu"
    vf: str = "railyard.dev/vf"
    pf: str = "railyard.dev/pf"
    vf_pools: tuple[str, ...] = ()  # other VF pools' resource names, sorted

    @property
    def managed(self) -> tuple[str, ...]:
        return (self.gpu, self.vf, *self.vf_pools, self.pf)

    @property
    def vf_resources(self) -> tuple[str, ...]:
        """Every VF pool's resource name, the default pool's first."""
        return (self.vf, *self.vf_pools)

    def pool_of(self, resource: str) -> str | None:
        """The pool of a VF resource as records name it: None for the default pool."""
        return None if resource == self.vf else resource

    def resource_of_pool(self, pool: str | None) -> str:
        return self.vf if pool is None else pool


DEFAULT_RESOURCES = ResourceNames()
