"""One device plugin per resource: the v1beta1 DevicePlugin service on its own unix socket.

The servicer is thin: it turns protobuf into calls on an `AdmissionHandler` (the pod
resolver and response builder behind it) and back. `PluginEndpoint` owns the socket's life:
serve first, then `Register` with kubelet (or, when kubelet's `plugins_registry/` folder
exists, serve the plugin watcher's `Registration` service on a socket there instead — one or
the other, never both), and serve again when kubelet's restart deletes the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from railyard.kubelet.api import deviceplugin_pb2 as pb
from railyard.kubelet.api import deviceplugin_pb2_grpc as pb_grpc
from railyard.kubelet.api import pluginregistration_pb2 as reg_pb
from railyard.kubelet.api import pluginregistration_pb2_grpc as reg_grpc
from railyard.kubelet.inventory import HEALTHY, UNHEALTHY, PluginDevice
from railyard.kubelet.metrics import ALLOCATE, PREFERRED, AgentMetrics
from railyard.kubelet.outcome import REFUSED
from railyard.kubelet.podresources import unix_target
from railyard.kubelet.response import ContainerGrant
from railyard.records.logline import decision_line

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT_S = 5.0
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL
Context = grpc.aio.ServicerContext  # [request type, response type]


class PluginError(Exception):
    """A plugin that cannot serve (its socket cannot be made); the message says why."""


# Awaited in kubelet's PreStartContainer, which kubelet calls (before creating each container
# holding this plugin's devices) only for a plugin that registers with `pre_start_required`:
# the agent's last look at PodResources when GPUs are another plugin's (decision 0090).
BeforeStart = Callable[[str, Sequence[str]], Awaitable[None]]


class AdmissionHandler(Protocol):
    """What the plugin asks of the agent. `allocate` is called on the event loop and must not
    block long; `preferred` from a worker thread (it may search)."""

    def preferred(self, resource: str, available: Sequence[str], must_include: Sequence[str],
                  size: int) -> list[str]: ...

    def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerGrant: ...

    async def catch_up(self, resource: str, size: int) -> None:
        """Called before either: bring the pods up to date when no pod asks for this."""
        ...


class DeviceList:
    """The devices a plugin advertises and their health; wakes ListAndWatch on change only."""

    def __init__(self, devices: Sequence[PluginDevice] = ()) -> None:
        self._devices = tuple(devices)
        self._unhealthy: frozenset[str] = frozenset()
        self.version = 0
        self._changed = asyncio.Condition()

    @property
    def devices(self) -> tuple[PluginDevice, ...]:
        return self._devices

    @property
    def unhealthy(self) -> frozenset[str]:
        return self._unhealthy

    def ids(self) -> frozenset[str]:
        return frozenset(d.id for d in self._devices)

    async def update(self, devices: Sequence[PluginDevice] | None = None,
                     unhealthy: frozenset[str] | None = None) -> bool:
        """Replace the list and/or health; True (and a wake-up) only if something changed."""
        new_devices = self._devices if devices is None else tuple(devices)
        new_bad = self._unhealthy if unhealthy is None else frozenset(unhealthy)
        new_bad &= frozenset(d.id for d in new_devices)
        if new_devices == self._devices and new_bad == self._unhealthy:
            return False
        self._devices, self._unhealthy = new_devices, new_bad
        self.version += 1
        async with self._changed:
            self._changed.notify_all()
        return True

    async def wait_newer(self, version: int) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self.version != version)
        return self.version

    def response(self) -> pb.ListAndWatchResponse:
        return pb.ListAndWatchResponse(devices=[
            pb.Device(
                ID=d.id,
                health=UNHEALTHY if d.id in self._unhealthy else HEALTHY,
                topology=(pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa_node)])
                          if d.numa_node is not None else None),
            )
            for d in self._devices
        ])


def grant_to_pb(g: ContainerGrant) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=g.envs,
        devices=[pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path,
                               permissions=d.permissions) for d in g.devices],
        annotations=g.annotations,
        mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path,
                         read_only=m.read_only) for m in g.mounts],
    )


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(self, resource: str, devices: DeviceList, handler: AdmissionHandler,
                 metrics: AgentMetrics | None = None,
                 before_start: BeforeStart | None = None) -> None:
        self.resource = resource
        self.devices = devices
        self.handler = handler
        self.metrics = metrics
        self.before_start = before_start

    async def GetDevicePluginOptions(self, request: pb.Empty,
                                     context: Context[pb.Empty, pb.DevicePluginOptions]
                                     ) -> pb.DevicePluginOptions:
        return plugin_options(self.before_start is not None)

    async def ListAndWatch(self, request: pb.Empty,
                           context: Context[pb.Empty, pb.ListAndWatchResponse]
                           ) -> AsyncIterator[pb.ListAndWatchResponse]:
        version = self.devices.version
        yield self.devices.response()
        while True:
            version = await self.devices.wait_newer(version)
            yield self.devices.response()

    async def GetPreferredAllocation(
            self, request: pb.PreferredAllocationRequest,
            context: Context[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse]
    ) -> pb.PreferredAllocationResponse:
        out = pb.PreferredAllocationResponse()
        t0 = time.perf_counter()
        for c in request.container_requests:
            try:
                await self.handler.catch_up(self.resource, c.allocation_size)
                # In a worker thread: planning a pod without a record searches, up to the
                # allocator's budget (docs/decisions/0077); the loop goes on serving the
                # other plugins, ListAndWatch and registration meanwhile.
                ids = await asyncio.to_thread(
                    self.handler.preferred, self.resource, list(c.available_deviceIDs),
                    list(c.must_include_deviceIDs), c.allocation_size)
            except Exception:  # advisory: never fail admission over a preference
                log.exception("%s: GetPreferredAllocation failed; no preference given",
                              self.resource)
                ids = list(c.must_include_deviceIDs)
            out.container_responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        if self.metrics is not None:
            self.metrics.observe(PREFERRED, self.resource, time.perf_counter() - t0)
        return out

    async def Allocate(self, request: pb.AllocateRequest,
                       context: Context[pb.AllocateRequest, pb.AllocateResponse]
                       ) -> pb.AllocateResponse:
        out = pb.AllocateResponse()
        known = self.devices.ids()
        t0 = time.perf_counter()
        for c in request.container_requests:
            ids = list(c.devices_ids)
            unknown = [i for i in ids if i not in known]
            if unknown:
                why = f"{self.resource}: unknown device IDs {unknown}"
                self._refused(ids, why)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
            await self.handler.catch_up(self.resource, len(set(ids)))
            try:
                grant = self.handler.allocate(self.resource, ids)
            except Exception as e:
                self._refused(ids, f"{type(e).__name__}: {e}")
                raise
            out.container_responses.append(grant_to_pb(grant))
        if self.metrics is not None:
            self.metrics.observe(ALLOCATE, self.resource, time.perf_counter() - t0)
        return out

    def _refused(self, ids: list[str], why: str) -> None:
        """A refused Allocate's one line (docs/observability.md) and its count."""
        log.info("%s", decision_line("admit", outcome=REFUSED, resource=self.resource,
                                     devices=",".join(ids), why=why))
        if self.metrics is not None:
            self.metrics.refused(self.resource)

    async def PreStartContainer(
            self, request: pb.PreStartContainerRequest,
            context: Context[pb.PreStartContainerRequest, pb.PreStartContainerResponse]
    ) -> pb.PreStartContainerResponse:
        if self.before_start is not None:
            try:
                await self.before_start(self.resource, list(request.devices_ids))
            except Exception:  # an error here would fail the container's start
                log.exception("%s: PreStartContainer for %s failed; the container starts "
                              "as it is", self.resource, list(request.devices_ids))
        return pb.PreStartContainerResponse()


def plugin_options(pre_start: bool) -> pb.DevicePluginOptions:
    return pb.DevicePluginOptions(pre_start_required=pre_start,
                                  get_preferred_allocation_available=True)


class WatcherRegistration(reg_grpc.RegistrationServicer):
    """The plugin watcher's side: kubelet asks who we are, then tells us how it went."""

    def __init__(self, resource: str, endpoint: str) -> None:
        self.resource = resource
        self.endpoint = endpoint
        self.registered = asyncio.Event()
        self.error: str | None = None

    async def GetInfo(self, request: reg_pb.InfoRequest,
                      context: Context[reg_pb.InfoRequest, reg_pb.PluginInfo]
                      ) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(type="DevicePlugin", name=self.resource,
                                 endpoint=self.endpoint, supported_versions=[API_VERSION])

    async def NotifyRegistrationStatus(
            self, request: reg_pb.RegistrationStatus,
            context: Context[reg_pb.RegistrationStatus, reg_pb.RegistrationStatusResponse]
    ) -> reg_pb.RegistrationStatusResponse:
        if request.plugin_registered:
            self.error = None
            self.registered.set()
            log.info("%s: registered through the plugin watcher", self.resource)
        else:
            self.error = request.error
            log.warning("%s: plugin watcher registration failed: %s", self.resource,
                        request.error)
        return reg_pb.RegistrationStatusResponse()


def socket_name(resource: str) -> str:
    """`railyard.dev/vf` → `railyard.dev_vf.sock` (one file per resource)."""
    return resource.replace("/", "_") + ".sock"


@dataclass(frozen=True, slots=True)
class KubeletPaths:
    kubelet_dir: str

    @property
    def device_plugins(self) -> str:
        return os.path.join(self.kubelet_dir, "device-plugins")

    @property
    def plugins_registry(self) -> str:
        return os.path.join(self.kubelet_dir, "plugins_registry")

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.device_plugins, KUBELET_SOCKET)

    @property
    def pod_resources_socket(self) -> str:
        return os.path.join(self.kubelet_dir, "pod-resources", KUBELET_SOCKET)

    @property
    def watcher_mode(self) -> bool:
        return os.path.isdir(self.plugins_registry)


class PluginEndpoint:
    """Serves one resource's plugin and keeps it registered across kubelet restarts."""

    def __init__(self, resource: str, devices: DeviceList, handler: AdmissionHandler,
                 paths: KubeletPaths, metrics: AgentMetrics | None = None,
                 before_start: BeforeStart | None = None) -> None:
        self.resource = resource
        self.before_start = before_start
        self.metrics = metrics
        self.devices = devices
        self.handler = handler
        self.paths = paths
        self.watcher_mode = paths.watcher_mode
        folder = paths.plugins_registry if self.watcher_mode else paths.device_plugins
        self.socket_path = os.path.join(folder, socket_name(resource))
        self._server: grpc.aio.Server | None = None
        self._registration: WatcherRegistration | None = None
        self.registrations = 0  # successful Register calls (device-plugins mode)
        self.registered = False  # kubelet knows this socket (watcher mode: kubelet finds it)
        self._failing = False
        self._lock = asyncio.Lock()

    @property
    def folder(self) -> str:
        return os.path.dirname(self.socket_path)

    async def _serve(self) -> None:
        """(Re)start the gRPC server on the socket; the old one is stopped first because
        gRPC unlinks its socket path on shutdown, which would delete a new socket there."""
        if self._server is not None:
            old, self._server = self._server, None
            await old.stop(0)
        os.makedirs(self.folder, exist_ok=True)
        if len(os.path.abspath(self.socket_path).encode()) > MAX_SOCKET_PATH:
            raise PluginError(f"{self.socket_path}: a unix socket path may have at most "
                              f"{MAX_SOCKET_PATH} bytes; use a shorter --kubelet-dir")
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(
            DevicePluginServicer(self.resource, self.devices, self.handler, self.metrics,
                                 self.before_start),
            server)
        if self.watcher_mode:
            self._registration = WatcherRegistration(self.resource, self.socket_path)
            reg_grpc.add_RegistrationServicer_to_server(self._registration, server)
        try:
            server.add_insecure_port(unix_target(self.socket_path))
        except RuntimeError as e:  # gRPC says only "failed to bind"
            raise PluginError(f"{self.socket_path}: cannot serve a unix socket there "
                              f"({e})") from None
        await server.start()
        self._server = server
        log.info("%s: serving on %s", self.resource, self.socket_path)

    async def _register(self) -> bool:
        """Register with kubelet.sock; False when kubelet is not there (yet)."""
        try:
            async with grpc.aio.insecure_channel(unix_target(self.paths.kubelet_socket)) as ch:
                await pb_grpc.RegistrationStub(ch).Register(
                    pb.RegisterRequest(
                        version=API_VERSION,
                        endpoint=os.path.basename(self.socket_path),
                        resource_name=self.resource,
                        options=plugin_options(self.before_start is not None),
                    ),
                    timeout=REGISTER_TIMEOUT_S,
                )
        except grpc.aio.AioRpcError as e:
            # Once per outage: a kubelet that is down is retried every half second.
            (log.debug if self._failing else log.warning)(
                "%s: Register with %s failed: %s", self.resource, self.paths.kubelet_socket,
                e.details())
            self._failing = True
            return False
        self._failing = False
        self.registrations += 1
        log.info("%s: registered with kubelet", self.resource)
        return True

    async def serve(self) -> None:
        """Serve (again) if not serving or our socket is gone; does not register."""
        async with self._lock:
            if self._server is None or not os.path.exists(self.socket_path):
                await self._serve()
                self.registered = self.watcher_mode

    async def ensure(self, *, register_again: bool = False) -> bool:
        """Serve if our socket is gone, then register unless already registered; True when
        kubelet knows us. `register_again`: kubelet restarted, register even if we had."""
        async with self._lock:
            if self._server is None or not os.path.exists(self.socket_path):
                await self._serve()
                self.registered = self.watcher_mode
            if register_again and not self.watcher_mode:
                self.registered = False
            if not self.registered:
                self.registered = await self._register()
            return self.registered

    async def stop(self) -> None:
        async with self._lock:
            if self._server is not None:
                server, self._server = self._server, None
                await server.stop(0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
