"""The NVIDIA GPU DRA driver stand-in's pure parts, without root: its slice is in the real
driver's form and Railyard's kubelet plugin places its GPUs from it; its prepare answers the
driver's CDI IDs and writes the spec unprepare removes (tests/box/test_dra_nvidia_box.py runs
it on the real kubelet)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from railyard.discovery.profiles import PROFILES, build_topology
from railyard.kubelet.api import dra_pb2 as dra
from railyard.kubelet.dra_claim import ResultDevice
from railyard.kubelet.dra_prepare import slice_gpus
from railyard.records.dra_claims import NVIDIA_GPU_CLASS
from railyard.records.dra_names import PCIE_ROOT, device_name
from railyard.records.dra_slices import node_slices
from support.nvidia_dra_standin import (
    DRIVER,
    PrepareError,
    StandIn,
    claim_results,
    device_class,
    resource_slice,
    spec_path,
    uuid_of,
)

TOPO = build_topology(PROFILES["dgx-h100"], 2)


def test_its_slice_is_nvidias_form_and_railyard_places_every_gpu_by_it():
    s = resource_slice(TOPO, owner_uid="node-uid")
    assert (s["spec"]["driver"], s["spec"]["pool"]["name"], s["spec"]["nodeName"]) == \
        (DRIVER, TOPO.node, TOPO.node)
    devices = s["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(len(TOPO.gpus))]
    assert set(devices[0]["attributes"]) == {
        "type", "uuid", "productName", "brand", "architecture", "cudaComputeCapability",
        "driverVersion", "cudaDriverVersion", "resource.kubernetes.io/pciBusID",
        "resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/numaNode"}
    assert set(devices[0]["capacity"]) == {"memory"}
    # The DeviceClass `claim-template --gpus nvidia` names is the one NVIDIA's chart installs.
    assert device_class()["metadata"]["name"] == NVIDIA_GPU_CLASS
    # The pcieRoot Railyard's own slice gives the same GPU: one value, from discovery.
    own = {d["name"]: d["attributes"] for sl in node_slices(TOPO, publish_gpus=True)
           for d in sl["spec"].get("devices", [])}
    lookup = slice_gpus([s], TOPO)
    for g, d in zip(TOPO.gpus, devices, strict=True):
        assert d["attributes"][PCIE_ROOT] == own[device_name(g.pci_address)][PCIE_ROOT]
        found = lookup(ResultDevice("gpu-0", DRIVER, TOPO.node, d["name"]))
        assert found is not None and found.pci_address == g.pci_address


class Claims:
    """The API server's answer to the one GET the stand-in makes: the claim."""

    def __init__(self, claim: dict) -> None:
        self.claim = claim

    async def request(self, method: str, path: str, **_: Any) -> bytes:
        assert (method, path.rsplit("/", 1)[-1]) == ("GET", self.claim["metadata"]["name"])
        return json.dumps(self.claim).encode()


def claim(uid: str, devices: list[str]) -> dict:
    results = [{"request": "nic-0/root", "driver": "railyard.dev", "pool": TOPO.node,
                "device": "pci-0000-18-00-2"}]
    results += [{"request": f"gpu-{k}", "driver": DRIVER, "pool": TOPO.node, "device": d}
                for k, d in enumerate(devices)]
    return {"metadata": {"uid": uid, "name": "c", "namespace": "ns"},
            "status": {"allocation": {"devices": {"results": results}}}}


def test_prepare_answers_the_drivers_cdi_ids_and_unprepare_removes_its_spec(tmp_path: Path):
    uid = "0f0e0d0c-0000-4000-8000-000000000001"
    standin = StandIn(TOPO, Claims(claim(uid, ["gpu-3", "gpu-1"])), str(tmp_path))
    ref = dra.Claim(namespace="ns", name="c", uid=uid)
    answer = asyncio.run(standin.NodePrepareResources(
        dra.NodePrepareResourcesRequest(claims=[ref]), None)).claims[uid]
    assert not answer.error
    assert [(list(d.request_names), d.device_name, list(d.cdi_device_ids))
            for d in answer.devices] == [
        (["gpu-0"], "gpu-3", [f"k8s.gpu.nvidia.com/claim={uid}-gpu-3"]),
        (["gpu-1"], "gpu-1", [f"k8s.gpu.nvidia.com/claim={uid}-gpu-1"])]
    spec = json.loads(Path(spec_path(str(tmp_path), uid)).read_text())
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert spec["containerEdits"]["env"] == [
        "NVIDIA_VISIBLE_DEVICES=" + ",".join(uuid_of(TOPO.gpus[i]) for i in (3, 1))]
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-3", f"{uid}-gpu-1"]

    for _ in range(2):  # again is fine
        done = asyncio.run(standin.NodeUnprepareResources(
            dra.NodeUnprepareResourcesRequest(claims=[ref]), None)).claims
        assert uid in done and not done[uid].error
    assert not list(tmp_path.iterdir())


def test_a_claim_not_the_one_named_or_without_its_gpus_is_not_prepared():
    with pytest.raises(PrepareError, match="not the claim"):
        claim_results(claim("other", ["gpu-0"]), "asked", TOPO.node)
    with pytest.raises(PrepareError, match=r"no device of gpu\.nvidia\.com"):
        claim_results(claim("u", []), "u", TOPO.node)
