"""The `dra` mode of benchmarks/scheduling.py (issue 29): kube-scheduler's own DRA allocator,
no extender, on the same kwok nodes and the same pod mix, in DRA's terms.

- Each node carries the ResourceSlices Railyard's agent publishes in DRA mode with its GPUs
  (`records.dra_slices.node_slices(..., publish_gpus=True)`, written by
  `kube.resourceslices.publish_slices` as the agent writes them), and the cluster the
  DeviceClasses `railyard dra device-classes` prints.
- A pod with N GPUs asks, instead of `nvidia.com/gpu` and `railyard.dev/vf`, a claim from
  the template `railyard dra claim-template --pairs N --level switch --gpus railyard`
  prints (`records.dra_claims`): each pair's GPU and VF under one PCIe switch, or no
  allocation. A VF-only pod asks a claim of N VFs of `railyard-vf`. One template per shape,
  in each round's namespace.
- kube-scheduler runs as the box configures it (DRA is GA in v1.36: the box's plain
  configuration is DRA's), no extender; kube-controller-manager's resourceclaim controller
  makes each pod's claim from its template, before the scheduler starts (scheduler_perf's
  method: what a pod needs exists before the scheduler runs).
- The switch-aligned share is read from each claim's `status.allocation.devices.results`: a
  claim with 2 GPUs or more counts when every pair — the k-th GPU result with the k-th NIC
  result, as the kubelet plugin pairs them (decision 0109) — has both devices under one
  PCIe switch (the slices' `pcieSwitch`): Railyard's PIX pairs, as for its own record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable
from typing import Any

import msgspec

from railyard.discovery.profiles import build_topology, profile
from railyard.kube.client import ApiError, Client
from railyard.kube.resourceslices import publish_slices
from railyard.records.dra_claims import API_VERSION, PairRequest, claim_template
from railyard.records.dra_names import DRIVER, KIND, KIND_GPU, KIND_VF, PCIE_SWITCH, device_class
from railyard.records.dra_slices import device_classes, node_slices
from railyard.topology.model import NodeTopology
from scheduling import MIX, VFS_PER_PF, Bench, Mode, say
from scheduling import pod_body as railyard_pod_body

LEVEL = "switch"  # a pair's GPU and VF under one PCIe switch, or the claim is not allocated
CLAIM = "devices"  # the pod's name for its claim
CLAIMS_WAIT_S = 300.0  # for kube-controller-manager to make every pod's claim
RESOURCE_API = "/apis/resource.k8s.io/v1"


def node_topology(name: str) -> NodeTopology:
    """The node's topology, as scheduling.py publishes it for Railyard."""
    return build_topology(profile("dgx-h100"), vfs_per_pf=VFS_PER_PF, node=name)


def template_name(gpus: int, vfs: int) -> str:
    """The template a pod of this shape names: `pairs-<N>`, or `vfs-<N>` without GPUs."""
    if gpus and gpus != vfs:
        raise ValueError(f"a pod of {gpus} GPUs asks as many VFs, not {vfs}: the mix is pairs")
    return f"pairs-{gpus}" if gpus else f"vfs-{vfs}"


def vf_template(name: str, vfs: int, namespace: str | None = None) -> dict[str, Any]:
    """A claim of `vfs` VFs of `railyard-vf`, nothing more (the VF-only pods)."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": API_VERSION, "kind": "ResourceClaimTemplate", "metadata": metadata,
            "spec": {"spec": {"devices": {"requests": [
                {"name": "vfs", "exactly": {"deviceClassName": device_class(KIND_VF),
                                            "count": vfs}}]}}}}


def claim_templates(shapes: Iterable[tuple[int, int]],
                    namespace: str | None = None) -> list[dict[str, Any]]:
    """One template per (GPUs, VFs) shape: the pair template of `--pairs N --level switch
    --gpus railyard` for N GPUs, else a claim of N VFs."""
    out = []
    for gpus, vfs in dict.fromkeys(shapes):
        name = template_name(gpus, vfs)
        if gpus:
            out.append(claim_template(PairRequest(name, gpus, level=LEVEL, gpus="railyard",
                                                  namespace=namespace)))
        else:
            out.append(vf_template(name, vfs, namespace))
    return out


def pod_body(name: str, gpus: int, vfs: int) -> dict[str, Any]:
    """scheduling.py's pod, its GPUs and VFs asked by one claim from its shape's template."""
    body = railyard_pod_body(name, gpus, vfs)
    container = body["spec"]["containers"][0]
    asked = {k: v for k, v in container["resources"]["limits"].items()
             if k not in ("railyard.dev/vf", "nvidia.com/gpu")}
    container["resources"] = {"limits": asked, "requests": dict(asked),
                              "claims": [{"name": CLAIM}]}
    body["spec"]["resourceClaims"] = [{"name": CLAIM,
                                       "resourceClaimTemplateName": template_name(gpus, vfs)}]
    return body


def device_facts(slices: Iterable[dict[str, Any]]) -> dict[str, tuple[str, str | None]]:
    """Our slices' devices by name: (kind, PCIe switch or None)."""
    out = {}
    for s in slices:
        for d in s.get("spec", {}).get("devices") or []:
            attrs = d.get("attributes") or {}
            switch = (attrs.get(PCIE_SWITCH) or {}).get("string")
            out[d["name"]] = ((attrs.get(KIND) or {}).get("string", ""), switch)
    return out


def claim_pairs(claim: dict[str, Any], facts: dict[str, tuple[str, str | None]]
                ) -> tuple[list[tuple[str, str | None]], int]:
    """The claim's pairs as (GPU, NIC) device names, the k-th GPU result with the k-th NIC
    result of our driver (decision 0109; None: a GPU without a NIC of its own), and its GPU
    count. An unallocated claim has none."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
               ).get("results") or []
    gpus: list[str] = []
    nics: list[str] = []
    for r in results:
        if r.get("driver") != DRIVER:
            continue
        kind = facts.get(r["device"], ("", None))[0]
        (gpus if kind == KIND_GPU else nics).append(r["device"])
    pairs = [(g, nics[k] if k < len(nics) else None) for k, g in enumerate(gpus)]
    return pairs, len(gpus)


def switch_aligned(facts: dict[str, tuple[str, str | None]],
                   claims: list[dict[str, Any]]) -> dict[str, float]:
    """Of the allocated claims with 2 GPUs or more, the share whose every pair's GPU and NIC
    sit under one PCIe switch, and their count."""
    multi = aligned = 0
    for claim in claims:
        pairs, gpus = claim_pairs(claim, facts)
        if gpus < 2:
            continue
        multi += 1
        aligned += all(nic is not None and facts[gpu][1] is not None
                       and facts[gpu][1] == facts.get(nic, ("", None))[1]
                       for gpu, nic in pairs)
    return {"switchAlignedShare": round(aligned / multi, 3) if multi else float("nan"),
            "switchAlignedPods": aligned}


def unallocated(claims: list[dict[str, Any]]) -> dict[str, float]:
    """The claims left unallocated, by the GPUs they ask (`unallocatedGpu8`: the pods of 8
    GPUs kube-scheduler did not place; `unallocatedGpu0`: VF-only pods)."""
    out: dict[str, float] = {}
    for claim in claims:
        if ((claim.get("status") or {}).get("allocation")) is not None:
            continue
        asked = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
        gpus = sum(1 for r in asked if r.get("name", "").startswith("gpu-"))
        out[f"unallocatedGpu{gpus}"] = out.get(f"unallocatedGpu{gpus}", 0) + 1
    return dict(sorted(out.items()))


class Dra:
    """What the mode sets up once and in each round's namespace."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench

    async def setup(self, names: list[str]) -> None:
        """The DeviceClasses, and per node its ResourceSlices as the agent publishes them."""
        async with Client(self.bench.config, qps=1000, burst=1000) as client:
            try:
                await client.request("GET", RESOURCE_API)
            except ApiError as e:
                raise SystemExit(f"mode dra: the box's API server does not serve "
                                 f"resource.k8s.io/v1 ({e})") from None
            for cls in device_classes():
                path = f"{RESOURCE_API}/deviceclasses"
                try:
                    await client.request("POST", path, body=cls)
                except ApiError as e:
                    if not e.conflict:  # already there from an earlier setup of this box
                        raise
            base = node_topology("x")
            gate = asyncio.Semaphore(16)
            started = time.monotonic()

            async def one(name: str) -> None:
                async with gate:
                    await publish_slices(client, name, node_slices(
                        dataclasses.replace(base, node=name), publish_gpus=True))
            try:
                await asyncio.gather(*(one(n) for n in names))
            except ApiError as e:
                raise SystemExit(f"mode dra: publishing the slices failed: {e}") from e
        say(f"dra: {len(names)} nodes' ResourceSlices ({len(node_slices(base, publish_gpus=True))}"
            f" each) in {time.monotonic() - started:.1f} s")

    async def in_namespace(self, client: Client, ns: str) -> None:
        """The round's claim templates, one per shape of the mix."""
        for t in claim_templates(((g, v) for _, g, v in MIX), ns):
            await client.request("POST", f"{RESOURCE_API}/namespaces/{ns}/resourceclaimtemplates",
                                 body=t)

    async def pods_created(self, client: Client, ns: str) -> None:
        """Until kube-controller-manager made every pod's claim from its template."""
        deadline = time.monotonic() + CLAIMS_WAIT_S
        while True:
            listed = msgspec.json.decode(await client.request(
                "GET", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims"))
            made = len(listed.get("items") or [])
            if made >= self.bench.args.pods:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"mode dra: {made} of {self.bench.args.pods} claims made "
                                   f"after {CLAIMS_WAIT_S:.0f} s")
            await asyncio.sleep(1.0)


def mode(bench: Bench) -> Mode:
    d = Dra(bench)
    facts = device_facts(node_slices(node_topology("x"), publish_gpus=True))
    return Mode("dra", start=lambda: bench.start_kube_scheduler(bench.plain),
                stop=bench.stop_kube_scheduler, pod_body=pod_body,
                processes=("kube-controller-manager",),
                scheduler_metrics=bench.kube_scheduler_metrics, setup=d.setup,
                in_namespace=d.in_namespace, pods_created=d.pods_created,
                report_list=f"{RESOURCE_API}/namespaces/{{ns}}/resourceclaims",
                report=lambda claims: {**switch_aligned(facts, claims), **unallocated(claims)})
