"""PodResources v1 client: what kubelet really assigned, per pod, container and resource.

Used after `Allocate` to check the resolver's guess. `Get` sits behind a feature gate on
older kubelets, so a pod is looked up with `Get` first and `List` when kubelet answers
UNIMPLEMENTED.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

from railyard.kubelet.api import podresources_pb2 as pb
from railyard.kubelet.api import podresources_pb2_grpc as pb_grpc

TIMEOUT_S = 5.0


def unix_target(path: str) -> str:
    """gRPC's address of a unix socket. The path is made absolute: in `unix://kd/x.sock` gRPC
    would read `kd` as an authority, and a relative --kubelet-dir failed to bind."""
    return "unix://" + os.path.abspath(path)


@dataclass(frozen=True, slots=True)
class AssignedClaim:
    """A DRA claim kubelet holds prepared for one of the pod's containers, and the drivers
    of its devices there."""

    namespace: str
    name: str
    drivers: frozenset[str]


@dataclass(frozen=True, slots=True)
class AssignedPod:
    namespace: str
    name: str
    # container -> resource -> device IDs, in kubelet's order: built from a Go map, so it may
    # differ between calls; nothing may read pair order from it
    containers: dict[str, dict[str, tuple[str, ...]]]
    claims: tuple[AssignedClaim, ...] = ()  # each once, over all containers

    def ids(self, resource: str) -> tuple[str, ...]:
        return tuple(i for c in self.containers.values() for i in c.get(resource, ()))

    def has(self, resource: str) -> bool:
        return any(resource in c for c in self.containers.values())


def _assigned(p: pb.PodResources) -> AssignedPod:
    containers: dict[str, dict[str, tuple[str, ...]]] = {}
    claims: dict[tuple[str, str], set[str]] = {}
    for c in p.containers:
        per: dict[str, list[str]] = {}
        for d in c.devices:
            per.setdefault(d.resource_name, []).extend(d.device_ids)
        containers[c.name] = {r: tuple(ids) for r, ids in per.items()}
        for dr in c.dynamic_resources:
            claims.setdefault((dr.claim_namespace, dr.claim_name), set()).update(
                r.driver_name for r in dr.claim_resources)
    return AssignedPod(p.namespace, p.name, containers,
                       tuple(AssignedClaim(ns, name, frozenset(drivers))
                             for (ns, name), drivers in claims.items()))


class PodResourcesClient:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._get_unimplemented = False

    async def list(self) -> list[AssignedPod]:
        async with grpc.aio.insecure_channel(unix_target(self.socket_path)) as ch:
            resp = await pb_grpc.PodResourcesListerStub(ch).List(
                pb.ListPodResourcesRequest(), timeout=TIMEOUT_S)
        return [_assigned(p) for p in resp.pod_resources]

    async def get(self, namespace: str, name: str) -> AssignedPod | None:
        """One pod's assignment; None when kubelet does not know the pod."""
        if not self._get_unimplemented:
            try:
                async with grpc.aio.insecure_channel(unix_target(self.socket_path)) as ch:
                    resp = await pb_grpc.PodResourcesListerStub(ch).Get(
                        pb.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace),
                        timeout=TIMEOUT_S)
                return _assigned(resp.pod_resources)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self._get_unimplemented = True  # an older kubelet: List from now on
        for p in await self.list():
            if p.namespace == namespace and p.name == name:
                return p
        return None
