"""A fake kubelet speaking the real v1beta1 and PodResources v1 gRPC over unix sockets.

- `FakeKubelet`: the `Registration` service on `<dir>/device-plugins/kubelet.sock`. Like
  kubelet, it dials the plugin's endpoint and calls `GetDevicePluginOptions` before it
  accepts a registration, and `restart()` deletes every socket in the folder first.
- `PluginClient`: calls one plugin as kubelet does (ListAndWatch kept open, then
  GetPreferredAllocation and Allocate at admission).
- `FakePodResources`: `List` (and optionally `Get`) from assignments the test records.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field

import grpc

from railyard.kubelet.api import deviceplugin_pb2 as pb
from railyard.kubelet.api import deviceplugin_pb2_grpc as pb_grpc
from railyard.kubelet.api import pluginregistration_pb2 as reg_pb
from railyard.kubelet.api import pluginregistration_pb2_grpc as reg_grpc
from railyard.kubelet.api import podresources_pb2 as pr_pb
from railyard.kubelet.api import podresources_pb2_grpc as pr_grpc


@dataclass
class Registered:
    resource: str
    endpoint: str
    version: str
    options: pb.DevicePluginOptions


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request, context):
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version")
        path = os.path.join(self.kubelet.device_plugins, request.endpoint)
        try:  # kubelet dials the endpoint before accepting: the plugin must already serve
            async with grpc.aio.insecure_channel("unix://" + path) as ch:
                await pb_grpc.DevicePluginStub(ch).GetDevicePluginOptions(pb.Empty(), timeout=2)
        except grpc.aio.AioRpcError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"cannot dial {path}: {e.details()}")
        reg = Registered(request.resource_name, request.endpoint, request.version,
                         request.options)
        self.kubelet.registrations.append(reg)
        self.kubelet.registered.set()
        return pb.Empty()


class FakeKubelet:
    def __init__(self, kubelet_dir: str) -> None:
        self.kubelet_dir = kubelet_dir
        self.device_plugins = os.path.join(kubelet_dir, "device-plugins")
        self.socket = os.path.join(self.device_plugins, "kubelet.sock")
        self.registrations: list[Registered] = []
        self.registered = asyncio.Event()
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        os.makedirs(self.device_plugins, exist_ok=True)
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port("unix://" + self.socket)
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    async def restart(self) -> None:
        """As kubelet starts: every socket in device-plugins/ is deleted, then kubelet.sock
        comes back."""
        await self.stop()
        for name in os.listdir(self.device_plugins):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.device_plugins, name))
        self.registered.clear()
        await self.start()

    def resources(self) -> list[str]:
        return [r.resource for r in self.registrations]

    async def wait_registered(self, resource: str, count: int = 1, timeout_s: float = 5) -> None:
        async def until() -> None:
            while sum(r.resource == resource for r in self.registrations) < count:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(until(), timeout_s)

    def client(self, resource: str) -> PluginClient:
        reg = [r for r in self.registrations if r.resource == resource][-1]
        return PluginClient(os.path.join(self.device_plugins, reg.endpoint))


class PluginClient:
    """Kubelet's side of one device plugin."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.channel = grpc.aio.insecure_channel("unix://" + socket_path)
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        self.updates: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self.devices: dict[str, str] = {}
        self.topology: dict[str, list[int]] = {}
        self._watch: asyncio.Task | None = None

    async def options(self) -> pb.DevicePluginOptions:
        return await self.stub.GetDevicePluginOptions(pb.Empty(), timeout=2)

    async def watch(self) -> dict[str, str]:
        """Open ListAndWatch; returns the first list (ID → health)."""
        self._watch = asyncio.create_task(self._run_watch())
        return await asyncio.wait_for(self.updates.get(), 5)

    async def _run_watch(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for resp in self.stub.ListAndWatch(pb.Empty()):
                self.devices = {d.ID: d.health for d in resp.devices}
                self.topology = {d.ID: [n.ID for n in d.topology.nodes] for d in resp.devices}
                self.updates.put_nowait(dict(self.devices))

    async def next_update(self, timeout_s: float = 5) -> dict[str, str]:
        return await asyncio.wait_for(self.updates.get(), timeout_s)

    async def preferred(self, available: list[str], size: int,
                        must_include: list[str] | None = None) -> list[str]:
        resp = await self.stub.GetPreferredAllocation(pb.PreferredAllocationRequest(
            container_requests=[pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must_include or [],
                allocation_size=size)]), timeout=5)
        return list(resp.container_responses[0].deviceIDs)

    async def allocate(self, ids: list[str]) -> pb.ContainerAllocateResponse:
        resp = await self.stub.Allocate(pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=5)
        return resp.container_responses[0]

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.channel.close()


async def watcher_info(socket_path: str) -> reg_pb.PluginInfo:
    """The plugin watcher's first call on a socket in plugins_registry/."""
    async with grpc.aio.insecure_channel("unix://" + socket_path) as ch:
        stub = reg_grpc.RegistrationStub(ch)
        info = await stub.GetInfo(reg_pb.InfoRequest(), timeout=2)
        await stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=True),
                                            timeout=2)
        return info


# --------------------------------------------------------------------- PodResources


@dataclass
class FakePodResourcesState:
    # (namespace, name) -> container -> resource -> ids
    pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = field(default_factory=dict)
    get_implemented: bool = True

    def assign(self, namespace: str, name: str, container: str, resource: str,
               ids: list[str]) -> None:
        self.pods.setdefault((namespace, name), {}).setdefault(container, {})[resource] = ids

    def to_pb(self, key: tuple[str, str]) -> pr_pb.PodResources:
        containers = self.pods[key]
        return pr_pb.PodResources(namespace=key[0], name=key[1], containers=[
            pr_pb.ContainerResources(name=c, devices=[
                pr_pb.ContainerDevices(resource_name=r, device_ids=ids)
                for r, ids in per.items()])
            for c, per in containers.items()])


class _Lister(pr_grpc.PodResourcesListerServicer):
    def __init__(self, state: FakePodResourcesState) -> None:
        self.state = state

    async def List(self, request, context):
        return pr_pb.ListPodResourcesResponse(
            pod_resources=[self.state.to_pb(k) for k in self.state.pods])

    async def Get(self, request, context):
        if not self.state.get_implemented:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "KubeletPodResourcesGet is off")
        key = (request.pod_namespace, request.pod_name)
        if key not in self.state.pods:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such pod")
        return pr_pb.GetPodResourcesResponse(pod_resources=self.state.to_pb(key))


class FakePodResources:
    def __init__(self, kubelet_dir: str) -> None:
        self.socket = os.path.join(kubelet_dir, "pod-resources", "kubelet.sock")
        self.state = FakePodResourcesState()
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        os.makedirs(os.path.dirname(self.socket), exist_ok=True)
        server = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(_Lister(self.state), server)
        server.add_insecure_port("unix://" + self.socket)
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
