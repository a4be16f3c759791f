"""Device health for kubelet's DRA health stream (v1alpha1 `NodeWatchResources`).

Kubelet opens the stream on our service socket and shows each prepared device's health in
the pod's status (`allocatedResourcesStatus`); a device it hears nothing of for its timeout
turns Unknown. So the whole list is sent at once, again on every change, and again every
RESEND_S, well inside kubelet's default 30 s. What is unhealthy is the agent's word
(`DraHealth.update`, from the same health scan the device plugins use), by PCI address.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Collection

from railyard.kubelet.api import dra_health_pb2 as health_pb
from railyard.kubelet.api import dra_health_pb2_grpc as health_grpc
from railyard.kubelet.dra_claim import DeviceNames
from railyard.kubelet.plugin import Context

RESEND_S = 10.0
TIMEOUT_S = 30  # what we tell kubelet: three missed resends before it says Unknown


class DraHealth:
    """Our devices' health by slice device name; wakes the streams on a change only."""

    def __init__(self, devices: DeviceNames, pool: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self.clock = clock
        self._pci = {name: g.pci_address for name, g in devices.gpus.items()}
        self._pci |= {name: n.pci_address for name, n in devices.nics.items()}
        self._unhealthy: frozenset[str] = frozenset()
        self.version = 0
        self._changed = asyncio.Condition()

    async def update(self, unhealthy: Collection[str]) -> bool:
        """The PCI addresses now unhealthy (a PF's VFs go with it); True if that changed."""
        bad = frozenset(unhealthy)
        if bad == self._unhealthy:
            return False
        self._unhealthy = bad
        self.version += 1
        async with self._changed:
            self._changed.notify_all()
        return True

    def _is_unhealthy(self, pci: str, pf: str | None) -> bool:
        return pci in self._unhealthy or (pf is not None and pf in self._unhealthy)

    def response(self, pfs: dict[str, str]) -> health_pb.NodeWatchResourcesResponse:
        now = int(self.clock())
        return health_pb.NodeWatchResourcesResponse(devices=[
            health_pb.DeviceHealth(
                device=health_pb.DeviceIdentifier(pool_name=self.pool, device_name=name),
                health=(health_pb.UNHEALTHY if self._is_unhealthy(pci, pfs.get(pci))
                        else health_pb.HEALTHY),
                last_updated_time=now, health_check_timeout_seconds=TIMEOUT_S)
            for name, pci in sorted(self._pci.items())])

    async def wait_newer(self, version: int, timeout_s: float) -> int:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(lambda: self.version != version)
        return self.version


class DraHealthServicer(health_grpc.DRAResourceHealthServicer):
    def __init__(self, health: DraHealth, devices: DeviceNames) -> None:
        self.health = health
        self._pfs = {n.pci_address: n.pf_pci_address for n in devices.nics.values()
                     if n.kind == "vf"}

    async def NodeWatchResources(
            self, request: health_pb.NodeWatchResourcesRequest,
            context: Context[health_pb.NodeWatchResourcesRequest,
                             health_pb.NodeWatchResourcesResponse]
    ) -> AsyncIterator[health_pb.NodeWatchResourcesResponse]:
        version = self.health.version
        while True:
            yield self.health.response(self._pfs)
            version = await self.health.wait_newer(version, RESEND_S)
