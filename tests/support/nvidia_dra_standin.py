"""A stand-in for NVIDIA's GPU DRA kubelet plugin (driver `gpu.nvidia.com`), for an agent in
DRA mode that leaves the GPUs to it (`dra.publishGpus: false`, `gpuPlugin: false`): the
ResourceSlice in the real driver's form, kubelet's plugin-watcher registration and the `dra`
v1 service over the real wire protocol (Railyard's generated protos), CDI specs as the driver
names them. It never reads Railyard's record or slices. Run it as a script, on the node:

    python3 tests/support/nvidia_dra_standin.py --sysfs-root ROOT --node-name NODE \\
        --kubeconfig KUBECONFIG --cdi-dir /var/run/cdi [--kubelet-dir /var/lib/kubelet]

What the real driver does, read in kubernetes-sigs/dra-driver-nvidia-gpu (formerly
NVIDIA/k8s-dra-driver-gpu), cmd/gpu-kubelet-plugin/:

- deviceinfo.go `GpuInfo.GetDevice`: one device per full GPU named `gpu-<minor>`; attributes
  in the driver's domain, written unqualified: `type` "gpu", `uuid`, `productName`, `brand`,
  `architecture` (strings), `cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`
  (versions); the standard `resource.kubernetes.io/pciBusID` (deviceattribute.
  GetPCIBusIDAttribute) and `pcieRoot` (GetPCIeRootAttributeByPCIBusID, from sysfs), and
  `numaNode`; capacity `memory` (bytes, BinarySI). Earlier releases wrote the address as their
  own `pcieBusID` and had no `numaNode`; none of today's has `index` or `minor` attributes.
- the pool is the node's name, the slice's `nodeName` the node (the kubeletplugin helper's
  slice controller, generated name `<node>-gpu.nvidia.com-`); the chart's DeviceClass
  `gpu.nvidia.com` selects `device.driver == 'gpu.nvidia.com' &&
  device.attributes['gpu.nvidia.com'].type == 'gpu'`.
- cdi.go and device_state.go: prepare answers each of the claim's results of its driver with
  its request, pool, device and one CDI device ID `k8s.gpu.nvidia.com/claim=<claim
  uid>-<device>`, defined in one transient spec per claim (`k8s.gpu.nvidia.com-claim_<uid>`
  in /var/run/cdi); unprepare deletes it.

Stand-in choices (no GPU here): the devices come from Railyard's discovery of the node's tree
(PCI address, UUID, NUMA node; the minor is the discovery index; `pcieRoot` is the value
discovery computes, the one Railyard's own slices carry: what the kernel's sysfs would give
both drivers); product, versions and memory are an H100's; a device's CDI edits are one
variable naming it, and the spec sets `NVIDIA_VISIBLE_DEVICES` to the claim's GPU UUIDs in
result order, where the real spec mounts device nodes and driver libraries; no health stream.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import grpc

from railyard.kubelet.api import dra_pb2 as dra
from railyard.kubelet.api import dra_pb2_grpc as dra_grpc
from railyard.kubelet.api import pluginregistration_pb2 as reg
from railyard.kubelet.api import pluginregistration_pb2_grpc as reg_grpc
from railyard.topology.model import Gpu, NodeTopology

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = DRIVER  # the chart's DeviceClass has the driver's name
CDI_KIND = f"k8s.{DRIVER}/claim"
STANDARD = "resource.kubernetes.io"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
POLL_S = 1.0
H100 = {"productName": "NVIDIA H100 80GB HBM3", "brand": "Nvidia", "architecture": "Hopper",
        "cudaComputeCapability": "9.0.0", "driverVersion": "550.54.15",
        "cudaDriverVersion": "12.4.0", "memory": "81559Mi"}
log = logging.getLogger("nvidia-dra-standin")


# ------------------------------------------------------------------ what it publishes


def device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.index}"


def uuid_of(gpu: Gpu) -> str:
    """The GPU's UUID (NVML's); a fixture GPU without one gets a made-up one, as every real
    NVIDIA GPU has one."""
    return gpu.uuid or f"GPU-standin-{gpu.pci_address.replace(':', '-').replace('.', '-')}"


def slice_device(gpu: Gpu) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "type": {"string": "gpu"}, "uuid": {"string": uuid_of(gpu)},
        **{k: {"string": H100[k]} for k in ("productName", "brand", "architecture")},
        **{k: {"version": H100[k]} for k in ("cudaComputeCapability", "driverVersion",
                                             "cudaDriverVersion")},
        f"{STANDARD}/pciBusID": {"string": gpu.pci_address},
        f"{STANDARD}/pcieRoot": {"string": gpu.pcie_root},
    }
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs[f"{STANDARD}/numaNode"] = {"int": gpu.numa_node}
    return {"name": device_name(gpu), "attributes": attrs,
            "capacity": {"memory": {"value": H100["memory"]}}}


def resource_slice(topology: NodeTopology, owner_uid: str | None = None) -> dict[str, Any]:
    """The node's one ResourceSlice of the driver, its GPUs in index order."""
    meta: dict[str, Any] = {"generateName": f"{topology.node}-{DRIVER}-"}
    if owner_uid is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": topology.node,
                                    "uid": owner_uid, "controller": True}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta,
            "spec": {"driver": DRIVER, "nodeName": topology.node,
                     "pool": {"name": topology.node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [slice_device(g) for g in topology.gpus]}}


def device_class() -> dict[str, Any]:
    """The DeviceClass NVIDIA's chart installs."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression":
                f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"}}]}}


# ------------------------------------------------------------------ prepare


class PrepareError(Exception):
    """This claim cannot be prepared; the message is what kubelet shows."""


def claim_results(claim: Any, uid: str, node: str) -> list[dict[str, str]]:
    """The claim's results of this driver and node, in result order."""
    if not isinstance(claim, dict) or claim.get("metadata", {}).get("uid") != uid:
        raise PrepareError(f"claim {uid} is not the claim kubelet named")
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
               or {}).get("results") or []
    ours = [r for r in results if isinstance(r, dict) and r.get("driver") == DRIVER
            and r.get("pool") == node]
    if not ours:
        raise PrepareError(f"claim {uid} has no device of {DRIVER} in pool {node}")
    return ours


def cdi_id(claim_uid: str, device: str) -> str:
    return f"{CDI_KIND}={claim_uid}-{device}"


def cdi_spec(claim_uid: str, gpus: Iterable[tuple[str, Gpu]]) -> dict[str, Any]:
    named = list(gpus)
    return {"cdiVersion": "0.5.0", "kind": CDI_KIND,
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES="
                                       + ",".join(uuid_of(g) for _, g in named)]},
            "devices": [{"name": f"{claim_uid}-{name}", "containerEdits": {"env": [
                f"NVIDIA_DRA_STANDIN_{name.upper().replace('-', '_')}={uuid_of(g)}"]}}
                for name, g in named]}


def spec_path(cdi_dir: str, claim_uid: str) -> str:
    if not claim_uid or "/" in claim_uid or claim_uid in (".", ".."):
        raise PrepareError(f"{claim_uid!r} is not a claim UID")
    return os.path.join(cdi_dir, f"k8s.{DRIVER}-claim_{claim_uid}.json")


class StandIn(dra_grpc.DRAPluginServicer):
    def __init__(self, topology: NodeTopology, client: Any, cdi_dir: str) -> None:
        self.topology = topology
        self.gpus = {device_name(g): g for g in topology.gpus}
        self.client = client
        self.cdi_dir = cdi_dir

    async def _prepare(self, c: dra.Claim) -> list[dra.Device]:
        body = await self.client.request(
            "GET", f"/apis/resource.k8s.io/v1/namespaces/{c.namespace}/resourceclaims/{c.name}")
        results = claim_results(json.loads(body), c.uid, self.topology.node)
        unknown = [r["device"] for r in results if r.get("device") not in self.gpus]
        if unknown:
            raise PrepareError(f"devices {unknown} are not GPUs of this node")
        named = [(r["device"], self.gpus[r["device"]]) for r in results]
        os.makedirs(self.cdi_dir, exist_ok=True)
        path = spec_path(self.cdi_dir, c.uid)
        with open(path + ".tmp", "w") as f:
            json.dump(cdi_spec(c.uid, named), f)
        os.replace(path + ".tmp", path)
        log.info("prepared claim %s/%s (%s): %s", c.namespace, c.name, c.uid,
                 [f"{n}={uuid_of(g)}" for n, g in named])
        return [dra.Device(request_names=[r["request"]], pool_name=r["pool"],
                           device_name=r["device"], cdi_device_ids=[cdi_id(c.uid, r["device"])])
                for r in results]

    async def NodePrepareResources(self, request: dra.NodePrepareResourcesRequest,
                                   context: Any) -> dra.NodePrepareResourcesResponse:
        out = dra.NodePrepareResourcesResponse()
        for c in request.claims:
            try:
                devices = await self._prepare(c)
            except Exception as e:  # the claim fails alone; kubelet retries it
                log.warning("claim %s not prepared: %s", c.uid, e)
                out.claims[c.uid].error = str(e) or type(e).__name__
                continue
            out.claims[c.uid].devices.extend(devices)
        return out

    async def NodeUnprepareResources(self, request: dra.NodeUnprepareResourcesRequest,
                                     context: Any) -> dra.NodeUnprepareResourcesResponse:
        out = dra.NodeUnprepareResourcesResponse()
        for c in request.claims:
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(spec_path(self.cdi_dir, c.uid))
            except PrepareError as e:
                out.claims[c.uid].error = str(e)
                continue
            log.info("unprepared claim %s/%s (%s)", c.namespace, c.name, c.uid)
            out.claims[c.uid].SetInParent()
        return out


# ------------------------------------------------------------------ kubelet and the API server


class Registration(reg_grpc.RegistrationServicer):
    """The plugin watcher's side: kubelet reads the type, the name and the service's socket."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=self.endpoint,
                              supported_versions=["v1.DRAPlugin"])

    async def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,
                                       context: Any) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("%s: registered with kubelet", DRIVER)
        else:
            log.warning("%s: kubelet refused the registration: %s", DRIVER, request.error)
        return reg.RegistrationStatusResponse()


async def serve(path: str, add: Callable[[grpc.aio.Server], None]) -> grpc.aio.Server:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = grpc.aio.server()
    add(server)
    server.add_insecure_port("unix://" + os.path.abspath(path))
    await server.start()
    return server


async def publish(client: Any, topology: NodeTopology) -> None:
    """The node's slice, created when the API server has none of this driver for the node
    (kubelet deletes a driver's slices when its plugin has been gone a while)."""
    selector = {"fieldSelector": f"spec.nodeName={topology.node},spec.driver={DRIVER}"}
    listed = json.loads(await client.request("GET", SLICES, params=selector))
    if listed.get("items"):
        return
    node = json.loads(await client.request("GET", f"/api/v1/nodes/{topology.node}"))
    await client.request("POST", SLICES, body=resource_slice(topology, node["metadata"]["uid"]))
    log.info("published the ResourceSlice of %d GPUs", len(topology.gpus))


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    from railyard.discovery.discover import discover
    from railyard.kube.client import Client
    from railyard.kube.config import load_kubeconfig

    topology = replace(discover(args.sysfs_root).topology, node=args.node_name)
    service = os.path.join(args.kubelet_dir, "plugins", DRIVER, "dra.sock")
    registration = os.path.join(args.kubelet_dir, "plugins_registry", f"{DRIVER}-reg.sock")
    async with Client(load_kubeconfig(args.kubeconfig), user_agent="nvidia-dra-standin") as client:
        standin = StandIn(topology, client, args.cdi_dir)
        log.info("serving %d GPUs: %s", len(topology.gpus),
                 [f"{device_name(g)}={g.pci_address}" for g in topology.gpus])
        servers: dict[str, grpc.aio.Server] = {}
        adders = {service: lambda s: dra_grpc.add_DRAPluginServicer_to_server(standin, s),
                  registration: lambda s: reg_grpc.add_RegistrationServicer_to_server(
                      Registration(os.path.abspath(service)), s)}
        while not stop.is_set():
            for path, add in adders.items():  # the service first, then what kubelet finds
                if path not in servers or not os.path.exists(path):
                    if path in servers:
                        await servers[path].stop(0)
                    servers[path] = await serve(path, add)
            try:
                await publish(client, topology)
            except Exception as e:  # the API server or the Node not there yet: next round
                log.info("slice not published yet: %s", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)
        for path, server in servers.items():
            await server.stop(0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def main() -> None:
    # Run as a script, its own folder (tests/support) leads sys.path, and its http.py would
    # shadow the standard library's for the API client imported in `run`.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sysfs-root", required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--cdi-dir", default="/var/run/cdi")
    parser.add_argument("--kubelet-dir", default="/var/lib/kubelet")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    async def until_signalled() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(args, stop)

    asyncio.run(until_signalled())


if __name__ == "__main__":
    main()
