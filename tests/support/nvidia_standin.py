"""A stand-in for NVIDIA's device plugin: `nvidia.com/gpu` over the real kubelet v1beta1 wire
protocol, for an agent running with `gpuPlugin: false` (decision 0090).

It advertises the node's GPUs by the IDs Railyard's discovery gives them (their UUIDs, as
NVIDIA's plugin does), never reads a pod's record, and answers `Allocate` with
NVIDIA_VISIBLE_DEVICES for whatever kubelet asked. `--prefer last` makes it steer kubelet to
the highest IDs it is offered (NVIDIA's plugin prefers by its own NVLink topology): a way to
make kubelet choose other GPUs than the scheduler recorded. Run it as a script:

    python3 tests/support/nvidia_standin.py --sysfs-root ROOT --kubelet-dir /var/lib/kubelet

It serves `<kubelet-dir>/device-plugins/nvidia-standin.sock`, registers with kubelet.sock,
and serves and registers again whenever its socket goes (a kubelet restart deletes it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Sequence

import grpc

from railyard.kubelet.api import deviceplugin_pb2 as pb
from railyard.kubelet.api import deviceplugin_pb2_grpc as pb_grpc

RESOURCE = "nvidia.com/gpu"
SOCKET = "nvidia-standin.sock"
POLL_S = 1.0
log = logging.getLogger("nvidia-standin")


def gpu_ids(sysfs_root: str) -> list[tuple[str, int | None]]:
    """The node's GPUs as (device ID, NUMA node), from Railyard's discovery of the tree."""
    from railyard.discovery.discover import discover

    return [(g.device_id, g.numa_node) for g in discover(sysfs_root).topology.gpus]


def preferred(available: Sequence[str], must: Sequence[str], size: int, prefer: str) -> list[str]:
    """kubelet's must-includes, then the rest of what it offers: highest IDs first under
    `last`, lowest under `first`."""
    rest = sorted((i for i in available if i not in must), reverse=prefer == "last")
    return [*must, *rest][:size]


class StandIn(pb_grpc.DevicePluginServicer):
    def __init__(self, devices: list[tuple[str, int | None]], prefer: str) -> None:
        self.devices = devices
        self.prefer = prefer
        self.allocated: list[list[str]] = []

    async def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions(get_preferred_allocation_available=self.prefer != "none")

    async def ListAndWatch(self, request, context) -> AsyncIterator[pb.ListAndWatchResponse]:
        def device(i: str, numa: int | None) -> pb.Device:
            topology = (pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)])
                        if numa is not None else None)
            return pb.Device(ID=i, health="Healthy", topology=topology)

        yield pb.ListAndWatchResponse(devices=[device(i, n) for i, n in self.devices])
        await asyncio.Event().wait()  # the list never changes

    async def GetPreferredAllocation(self, request, context):
        out = pb.PreferredAllocationResponse()
        for c in request.container_requests:
            ids = preferred(list(c.available_deviceIDs), list(c.must_include_deviceIDs),
                            c.allocation_size, self.prefer)
            out.container_responses.append(pb.ContainerPreferredAllocationResponse(
                deviceIDs=ids))
        return out

    async def Allocate(self, request, context):
        out = pb.AllocateResponse()
        for c in request.container_requests:
            ids = list(c.devices_ids)
            self.allocated.append(ids)
            log.info("Allocate %s", ids)
            out.container_responses.append(pb.ContainerAllocateResponse(
                envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)}))
        return out

    async def PreStartContainer(self, request, context):
        return pb.PreStartContainerResponse()


async def serve(socket_path: str, servicer: StandIn) -> grpc.aio.Server:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(servicer, server)
    server.add_insecure_port("unix://" + os.path.abspath(socket_path))
    await server.start()
    return server


async def register(kubelet_socket: str, endpoint: str, prefer: str) -> bool:
    try:
        async with grpc.aio.insecure_channel("unix://" + os.path.abspath(kubelet_socket)) as ch:
            await pb_grpc.RegistrationStub(ch).Register(pb.RegisterRequest(
                version="v1beta1", endpoint=endpoint, resource_name=RESOURCE,
                options=pb.DevicePluginOptions(
                    get_preferred_allocation_available=prefer != "none")), timeout=5)
    except grpc.aio.AioRpcError as e:
        log.warning("Register: %s", e.details())
        return False
    log.info("registered %s with kubelet", RESOURCE)
    return True


async def run(sysfs_root: str, kubelet_dir: str, prefer: str, stop: asyncio.Event) -> None:
    folder = os.path.join(kubelet_dir, "device-plugins")
    os.makedirs(folder, exist_ok=True)
    socket_path = os.path.join(folder, SOCKET)
    servicer = StandIn(gpu_ids(sysfs_root), prefer)
    log.info("serving %d GPUs: %s", len(servicer.devices), [i for i, _ in servicer.devices])
    server: grpc.aio.Server | None = None
    registered = False
    while not stop.is_set():
        if server is None or not os.path.exists(socket_path):
            if server is not None:
                await server.stop(0)
            server = await serve(socket_path, servicer)
            registered = False
        if not registered:
            registered = await register(os.path.join(folder, "kubelet.sock"), SOCKET, prefer)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_S)
    if server is not None:
        await server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sysfs-root", required=True)
    parser.add_argument("--kubelet-dir", default="/var/lib/kubelet")
    parser.add_argument("--prefer", choices=("last", "first", "none"), default="last")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    async def until_signalled() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(args.sysfs_root, args.kubelet_dir, args.prefer, stop)

    asyncio.run(until_signalled())


if __name__ == "__main__":
    main()
