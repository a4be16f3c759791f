"""The `koordinator` mode of benchmarks/scheduling.py (issue 28): Koordinator's own scheduler,
`koord-scheduler` v1.8.0 (`hack/box build koordinator`), on the same kwok nodes and the same
pod mix, in Koordinator's terms.

- Each node gets the `Device` CR Railyard's agent writes in koordlet's form
  (`railyard.records.koordinator_device`), and `koordinator.sh/rdma` on its Node (100 per
  PF, as koord-manager sets it).
- A pod asks `nvidia.com/gpu: N` (DeviceShare turns it into whole GPUs) and
  `koordinator.sh/rdma: 100 x VFs` with the hint `vfSelector: {}` (a VF of each of that many
  PFs); pods with GPUs ask joint allocation, `requiredScope: SamePCIe`. No `railyard.dev/vf`:
  that is Railyard's.
- koord-scheduler runs with its DeviceShare plugin added to kube-scheduler's defaults, on the
  box's admin identity (the box grants its own components no RBAC for Koordinator's CRDs),
  serving /metrics on 10259 as kube-scheduler does (which is stopped meanwhile).
- The switch-aligned share is read from its `scheduling.koordinator.sh/device-allocated`
  annotation: a pod with 2 GPUs or more counts when each of its GPUs shares a PCIe switch
  with one of its NICs, each NIC serving one GPU (Railyard's PIX pairs, counted on devices
  Koordinator does not pair).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from railyard.discovery.profiles import build_topology, profile
from railyard.kube.client import ApiError, Client
from railyard.kube.koordinator_device import publish_device
from railyard.kube.objects import Object
from railyard.records.koordinator_device import device_spec
from railyard.topology.model import NodeTopology
from scheduling import VFS_PER_PF, Bench, Mode, say
from scheduling import pod_body as railyard_pod_body

SCHEDULER_NAME = "koord-scheduler"
MODULE = "github.com/koordinator-sh/koordinator"
DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
JOINT_ALLOCATE = "scheduling.koordinator.sh/device-joint-allocate"
ALLOCATE_HINT = "scheduling.koordinator.sh/device-allocate-hint"
RDMA = "koordinator.sh/rdma"


def node_topology(name: str) -> NodeTopology:
    """The node's topology, as scheduling.py publishes it for Railyard."""
    return build_topology(profile("dgx-h100"), vfs_per_pf=VFS_PER_PF, node=name)


def pod_body(name: str, gpus: int, vfs: int) -> dict[str, Any]:
    """scheduling.py's pod, asked of Koordinator."""
    body = railyard_pod_body(name, gpus, vfs)
    container = body["spec"]["containers"][0]
    asked = {k: v for k, v in container["resources"]["limits"].items()
             if k != "railyard.dev/vf"} | {RDMA: str(100 * vfs)}
    container["resources"] = {"limits": asked, "requests": dict(asked)}
    annotations = {ALLOCATE_HINT: json.dumps({"rdma": {"vfSelector": {}}})}
    if gpus:
        annotations[JOINT_ALLOCATE] = json.dumps(
            {"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"})
    body["metadata"]["annotations"] = annotations
    body["spec"]["schedulerName"] = SCHEDULER_NAME
    return body


def scheduler_config(kubeconfig: Path) -> dict[str, Any]:
    """Koordinator's own profile (its config/manager/scheduler-config.yaml) cut to what joint
    GPU and RDMA allocation needs: DeviceShare, and Reservation, which DeviceShare reads
    (without it koord-scheduler v1.8.0 panics at Reserve: a nil reservation nominator)."""
    def enabled(*names: str) -> dict[str, Any]:
        return {"enabled": [{"name": n} for n in names]}
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 200, "burst": 400},
        "leaderElection": {"leaderElect": False},
        "profiles": [{
            "schedulerName": SCHEDULER_NAME,
            "plugins": {
                "preFilter": enabled("Reservation", "DeviceShare"),
                "filter": enabled("DeviceShare", "Reservation"),
                "postFilter": {"disabled": [{"name": "*"}],
                               **enabled("Reservation", "DefaultPreemption")},
                "preScore": enabled("Reservation"),
                "score": {"enabled": [{"name": "DeviceShare", "weight": 1},
                                      {"name": "Reservation", "weight": 5000}]},
                "reserve": enabled("DeviceShare"),
                "preBind": enabled("DeviceShare", "Reservation", "DefaultPreBind"),
                "bind": {"disabled": [{"name": "*"}],
                         **enabled("Reservation", "DefaultBinder")},
            },
        }],
    }


def switch_aligned(topology: NodeTopology, pods: list[dict[str, Any]]) -> dict[str, float]:
    """From Koordinator's device-allocated annotation: of the pods with 2 GPUs or more, the
    share whose GPUs and NICs can be paired one to one under shared PCIe switches, and
    their count."""
    switch_of = {g.pci_address: g.switch for g in topology.gpus}
    by_uuid = {g.uuid: g.pci_address for g in topology.gpus if g.uuid}
    nic_switch = {n.pci_address: n.switch for n in topology.nics}
    multi = aligned = 0
    for p in pods:
        raw = (p.get("metadata", {}).get("annotations") or {}).get(DEVICE_ALLOCATED)
        if raw is None:
            continue
        allocated = json.loads(raw)
        gpus = [switch_of.get(by_uuid.get(g["id"], g["id"])) for g in allocated.get("gpu", [])]
        if len(gpus) < 2:
            continue
        multi += 1
        nics = [nic_switch.get(r["id"]) for r in allocated.get("rdma", [])]
        aligned += _pairs_under_switches(gpus, nics)
    return {"switchAlignedShare": round(aligned / multi, 3) if multi else float("nan"),
            "switchAlignedPods": aligned}


def _pairs_under_switches(gpu_switches: list[Any], nic_switches: list[Any]) -> bool:
    """Each GPU has a NIC of its own under its switch."""
    left = list(nic_switches)
    for switch in gpu_switches:
        if switch is None or switch not in left:
            return False
        left.remove(switch)
    return True


class Koordinator:
    """What the mode starts, stops and sets up once."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        box = bench.box
        bins = bench.kubebox.built().get("koordinator")
        if bins is None:
            raise SystemExit("mode koordinator needs koord-scheduler: run "
                             "`python3 hack/box build koordinator` (cold: tens of minutes)")
        self.binary = bins / "koord-scheduler"
        admin = box.layout.admin_kubeconfig
        self.config_path = box.layout.dir / "config" / "koord-scheduler.yaml"
        self.config_path.write_text(yaml.safe_dump(scheduler_config(admin)))
        self.argv = [str(self.binary), "--config", str(self.config_path),
                     "--authentication-kubeconfig", str(admin),
                     "--authorization-kubeconfig", str(admin), "--bind-address", "0.0.0.0"]

    async def setup(self, names: list[str]) -> None:
        """Koordinator's CRDs; per node its Device and `koordinator.sh/rdma`."""
        family = self.bench.kubebox.FAMILIES["koordinator"]
        crds = self.bench.kubebox._module_dir(family, MODULE) / "config/crd/bases"
        for crd in sorted(crds.glob("*.yaml")):
            # create, not apply: the last-applied annotation would not fit the large ones
            self.bench.box.kubectl("create", "-f", str(crd), check=False)
        self.bench.box.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                               "crd/devices.scheduling.koordinator.sh")
        base = node_topology("x")
        rdma = str(100 * sum(1 for d in device_spec(base)["devices"] if d["type"] == "rdma"))
        gate = asyncio.Semaphore(16)
        async with Client(self.bench.config, qps=1000, burst=1000) as client:
            async def one(name: str) -> None:
                async with gate:
                    await publish_device(client, dataclasses.replace(base, node=name))
                    await client.patch(f"/api/v1/nodes/{name}/status", {"status": {
                        "capacity": {RDMA: rdma}, "allocatable": {RDMA: rdma}}}, Object)
            try:
                await asyncio.gather(*(one(n) for n in names))
            except ApiError as e:
                raise SystemExit(f"mode koordinator: setting up the nodes failed: {e}") from e
        say(f"koordinator: {len(names)} Device CRs and {RDMA}={rdma} per node")

    def start(self) -> None:
        """Started, and serving /healthz (it has no /readyz; its informers synced before)."""
        box = self.bench.box
        box.start(SCHEDULER_NAME, self.argv)
        box.wait(SCHEDULER_NAME, lambda: box._https_ok(
            f"https://{box.layout.node_ip}:10259/healthz", client=None), timeout=120)

    def stop(self) -> None:
        if self.bench.running(SCHEDULER_NAME):
            self.bench.box.stop(SCHEDULER_NAME)


def mode(bench: Bench) -> Mode:
    k = Koordinator(bench)
    topology = node_topology("x")
    return Mode("koordinator", start=k.start, stop=k.stop, pod_body=pod_body,
                processes=(SCHEDULER_NAME,), scheduler_metrics=bench.kube_scheduler_metrics,
                setup=k.setup, report=lambda pods: switch_aligned(topology, pods))
