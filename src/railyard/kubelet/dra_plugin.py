"""The DRA kubelet plugin: kubelet's plugin-watcher registration and the `dra` v1 service.

Two unix sockets, as kubelet v1.36 expects of a DRA driver: the registration socket in
`<kubelet>/plugins_registry/` (kubelet finds it, calls `GetInfo`: type "DRAPlugin", the driver
name, the service socket, supported "v1.DRAPlugin"; then `NotifyRegistrationStatus`), and the
service socket in `<kubelet>/plugins/<driver>/`, where kubelet calls NodePrepareResources and
NodeUnprepareResources with the claims of one pod (and opens the device health stream,
`kubelet.dra_health`). The servicer is thin: each claim goes to
`ClaimPreparer`, and an error becomes that claim's error string, never a failed call.

`DraPlugin.start()/stop()` (or `serve_dra_plugin`, until cancelled) is what the agent runs
beside, or instead of, its device plugins. At start it also prepares again, once, the claims
kubelet holds prepared (PodResources) for pods the node has no record of
(`ClaimPreparer.restore`): kubelet never asks twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence, Sized

import grpc

from railyard.kubelet.api import dra_health_pb2_grpc as health_grpc
from railyard.kubelet.api import dra_pb2 as dra
from railyard.kubelet.api import dra_pb2_grpc as dra_grpc
from railyard.kubelet.api import pluginregistration_pb2 as reg_pb
from railyard.kubelet.api import pluginregistration_pb2_grpc as reg_grpc
from railyard.kubelet.dra_claim import ClaimRef
from railyard.kubelet.dra_health import DraHealth, DraHealthServicer
from railyard.kubelet.dra_prepare import ClaimPreparer
from railyard.kubelet.plugin import (
    MAX_SOCKET_PATH,
    Context,
    KubeletPaths,
    PluginError,
    WatcherRegistration,
)
from railyard.kubelet.podresources import AssignedPod, PodResourcesClient, unix_target
from railyard.records.fields import clipped

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"  # k8s.io/kubelet pluginregistration/v1 constants
SERVICE_V1 = "v1.DRAPlugin"  # k8s.io/kubelet dra/v1 DRAPluginService: "<package>.<service>"
CHECK_INTERVAL_S = 1.0  # how often the plugin looks that both its sockets are still there
MAX_CLAIMS_PER_CALL = 256  # kubelet sends one pod's claims; more is not a kubelet


def claim_ref(c: dra.Claim) -> ClaimRef:
    return ClaimRef(c.namespace, c.uid, c.name)


class DraServicer(dra_grpc.DRAPluginServicer):
    def __init__(self, preparer: ClaimPreparer) -> None:
        self.preparer = preparer

    async def NodePrepareResources(
            self, request: dra.NodePrepareResourcesRequest,
            context: Context[dra.NodePrepareResourcesRequest, dra.NodePrepareResourcesResponse]
    ) -> dra.NodePrepareResourcesResponse:
        await _bounded(request.claims, context)
        out = dra.NodePrepareResourcesResponse()
        for c in request.claims:
            ref = claim_ref(c)
            try:
                devices = await self.preparer.prepare(ref)
            except Exception as e:  # this claim fails; kubelet retries it, the others stand
                log.warning("claim %s not prepared: %s", ref, e)
                out.claims[c.uid].error = _message(e)
                continue
            answer = out.claims[c.uid]
            for d in devices:
                answer.devices.append(dra.Device(request_names=[d.request], pool_name=d.pool,
                                                 device_name=d.device,
                                                 cdi_device_ids=list(d.cdi_ids)))
        return out

    async def NodeUnprepareResources(
            self, request: dra.NodeUnprepareResourcesRequest,
            context: Context[dra.NodeUnprepareResourcesRequest,
                             dra.NodeUnprepareResourcesResponse]
    ) -> dra.NodeUnprepareResourcesResponse:
        await _bounded(request.claims, context)
        out = dra.NodeUnprepareResourcesResponse()
        for c in request.claims:
            ref = claim_ref(c)
            try:
                await self.preparer.unprepare(ref)
            except Exception as e:
                log.warning("claim %s not unprepared: %s", ref, e)
                out.claims[c.uid].error = _message(e)
                continue
            out.claims[c.uid].SetInParent()  # every claim asked has an entry, even if empty
        return out


async def _bounded(claims: Sized, context: Context) -> None:
    if len(claims) > MAX_CLAIMS_PER_CALL:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"{len(claims)} claims in one call; at most {MAX_CLAIMS_PER_CALL}")


def _message(e: Exception) -> str:
    return clipped(str(e) or type(e).__name__)


class DraRegistration(WatcherRegistration):
    """The plugin watcher's side, as for a device plugin, but kubelet's DRA manager reads it:
    the type, the driver's name and the gRPC services it serves as "versions"."""

    async def GetInfo(self, request: reg_pb.InfoRequest,
                      context: Context[reg_pb.InfoRequest, reg_pb.PluginInfo]
                      ) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(type=PLUGIN_TYPE, name=self.resource, endpoint=self.endpoint,
                                 supported_versions=[SERVICE_V1])


class DraPlugin:
    """Serves the DRA service and its registration; serves again if a socket is removed."""

    def __init__(self, preparer: ClaimPreparer, paths: KubeletPaths,
                 health: DraHealth | None = None,
                 assigned: Callable[[], Awaitable[Sequence[AssignedPod]]] | None = None
                 ) -> None:
        self.preparer = preparer
        # What kubelet holds prepared, for the claims to prepare again at start (PodResources).
        self.assigned = assigned or PodResourcesClient(paths.pod_resources_socket).list
        self.driver = preparer.driver
        # The agent's health scan calls `health.update`; the pool is the node's (our slices').
        self.health = health if health is not None else DraHealth(preparer.devices,
                                                                  preparer.topology.node)
        self.service_socket = os.path.join(paths.kubelet_dir, "plugins", self.driver,
                                           "dra.sock")
        self.registration_socket = os.path.join(paths.plugins_registry,
                                                f"{self.driver}-reg.sock")
        self.registration = DraRegistration(self.driver, os.path.abspath(self.service_socket))
        self._service: grpc.aio.Server | None = None
        self._registrar: grpc.aio.Server | None = None
        self._watch: asyncio.Task[None] | None = None
        self._restore: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Serve the service first, then the registration kubelet will find."""
        async with self._lock:
            await self._ensure()
        loop = asyncio.get_running_loop()
        self._watch = loop.create_task(self._keep_serving())
        self._restore = loop.create_task(self._restore_prepared())

    async def _restore_prepared(self) -> None:
        """Once at start: the claims kubelet holds prepared whose pods the node has no
        record of (its state folder lost) prepared again (`ClaimPreparer.restore`)."""
        try:
            restored = await self.preparer.restore(self.assigned)
        except Exception as e:  # kubelet not there yet, or restarting: nothing to restore
            log.info("DRA driver %s: prepared claims not compared with kubelet's (%s)",
                     self.driver, e)
            return
        if restored:
            log.warning("DRA driver %s: %d claims prepared again: %s", self.driver,
                        len(restored), ", ".join(map(str, restored)))

    async def _ensure(self) -> None:
        if self._service is None or not os.path.exists(self.service_socket):
            self._service = await _serve(self._service, self.service_socket, self._add_service)
            log.info("DRA driver %s: serving on %s", self.driver, self.service_socket)
        if self._registrar is None or not os.path.exists(self.registration_socket):
            self._registrar = await _serve(self._registrar, self.registration_socket, lambda s:
                                           reg_grpc.add_RegistrationServicer_to_server(
                                               self.registration, s))
            log.info("DRA driver %s: registration socket %s", self.driver,
                     self.registration_socket)

    def _add_service(self, server: grpc.aio.Server) -> None:
        dra_grpc.add_DRAPluginServicer_to_server(DraServicer(self.preparer), server)
        health_grpc.add_DRAResourceHealthServicer_to_server(
            DraHealthServicer(self.health, self.preparer.devices), server)

    async def _keep_serving(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                async with self._lock:
                    await self._ensure()
            except Exception:
                log.exception("DRA driver %s: serving again failed", self.driver)

    async def stop(self) -> None:
        """Stop both servers and remove the sockets: kubelet deregisters the driver."""
        for task in (self._watch, self._restore):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._watch = self._restore = None
        async with self._lock:
            for server, path in ((self._registrar, self.registration_socket),
                                 (self._service, self.service_socket)):
                if server is not None:
                    await server.stop(0)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            self._registrar = self._service = None


async def _serve(old: grpc.aio.Server | None, path: str,
                 add: Callable[[grpc.aio.Server], None]) -> grpc.aio.Server:
    """A gRPC server on a unix socket at `path` (the old one stopped first: gRPC unlinks its
    socket path on shutdown, which would delete the new one)."""
    if old is not None:
        await old.stop(0)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    if len(os.path.abspath(path).encode()) > MAX_SOCKET_PATH:
        raise PluginError(f"{path}: a unix socket path may have at most {MAX_SOCKET_PATH} "
                          "bytes; use a shorter --kubelet-dir")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a socket left by a process that died
    server = grpc.aio.server()
    add(server)
    try:
        server.add_insecure_port(unix_target(path))
    except RuntimeError as e:  # gRPC says only "failed to bind"
        raise PluginError(f"{path}: cannot serve a unix socket there ({e})") from None
    await server.start()
    return server


async def serve_dra_plugin(preparer: ClaimPreparer, paths: KubeletPaths) -> None:
    """Run the DRA kubelet plugin until cancelled (the agent's one entry point)."""
    plugin = DraPlugin(preparer, paths)
    await plugin.start()
    try:
        await asyncio.Event().wait()
    finally:
        await plugin.stop()
