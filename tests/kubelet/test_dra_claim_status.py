"""After railyard-cni's ADD of a DRA pod, the agent writes its claim's status.devices
(kubelet.dra_status, decision 0113): a server-side apply of the status subresource as
railyard-agent without force, only the claims prepared here for that pod and only their
devices; a busy API server is tried again a few times, a refusal is told and never raised, a
claim deleted meanwhile is let be. The API server is a stand-in that records what it is sent;
the real one keeps the entries on the box (tests/box/test_dra_network_data_box.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry

from railyard.kube.client import Client
from railyard.kube.config import KubeConfig
from railyard.kubelet.dra_claim import ClaimRef
from railyard.kubelet.dra_prepared import PreparedClaim, PreparedClaims, PreparedDevice
from railyard.kubelet.dra_status import FAILED, GONE, WRITTEN, ClaimStatusWriter
from railyard.node.state import PodKey
from railyard.records.dra_names import device_name
from support.agent import async_test
from support.http import serve_app

NODE = "node-a"
POD = PodKey("6f1c2d4e-0a1b-4c3d-9e8f-7a6b5c4d3e2f", "team", "train")
CLAIM = ClaimRef("team", "2b0c6e3e-8c7a-4f2e-9a51-3f1d2a7e4b10", "train-pairs")
VF0, VF1, GPU0 = "0000:18:00.2", "0000:2a:00.2", "0000:19:00.0"
STATUS_PATH = f"/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/{CLAIM.name}/status"


@dataclass(frozen=True)
class Interface:  # what railyard-cni's ADD tells (railyard.cni.context.PodInterface)
    pci: str
    name: str
    mac: str
    ips: tuple[str, ...] = ()


ADDED = (Interface(VF0, "net1", "02:00:00:00:00:01", ("10.56.0.2/16",)),
         Interface(VF1, "net1-1", "02:00:00:00:00:02", ("10.56.0.3/16",)))


class StatusApi:
    """Records each PATCH of a claim's status; answers `answers` in turn (then 200)."""

    def __init__(self, *answers: int) -> None:
        self.answers = list(answers)
        self.calls: list[dict] = []

    async def patch(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        self.calls.append({"path": request.path, "type": request.content_type,
                           "query": dict(request.query), "body": body})
        status = self.answers.pop(0) if self.answers else 200
        if status != 200:
            return web.json_response({"kind": "Status", "status": "Failure", "code": status,
                                      "reason": "Invalid" if status == 422 else "Failure",
                                      "message": f"answered {status}"}, status=status)
        return web.json_response(body)


def prepare(state_dir, devices=(VF0, GPU0, VF1), pod: PodKey = POD,
            claim: ClaimRef = CLAIM) -> None:
    PreparedClaims(state_dir).put(PreparedClaim(claim, pod, tuple(
        PreparedDevice(f"r{i}", NODE, device_name(pci), (f"railyard.dev/claim={claim.uid}-x",))
        for i, pci in enumerate(devices))))


async def writer_for(api: StatusApi, state_dir, told: list) -> tuple[ClaimStatusWriter, object]:
    app = web.Application()
    app.router.add_patch("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status",
                         api.patch)
    runner, url = await serve_app(app)
    writer = ClaimStatusWriter(Client(KubeConfig(server=url)), str(state_dir),
                               asyncio.get_running_loop(), node=NODE,
                               registry=CollectorRegistry(), retry_s=0.01,
                               not_written=lambda pod, why: told.append((pod, why)))
    return writer, runner


@async_test
async def test_an_add_applies_each_nics_network_data_to_its_claims_status(tmp_path):
    prepare(tmp_path)
    api, told = StatusApi(), []
    writer, runner = await writer_for(api, tmp_path, told)
    try:
        assert await writer.write(POD.uid, ADDED) == [WRITTEN]
    finally:
        await writer.client.close()
        await runner.cleanup()
    [call] = api.calls
    assert call["path"] == STATUS_PATH
    assert call["type"] == "application/apply-patch+yaml"
    assert call["query"] == {"fieldManager": "railyard-agent", "force": "false"}
    assert call["body"]["metadata"] == {"namespace": "team", "name": CLAIM.name,
                                        "uid": CLAIM.uid}
    assert call["body"]["status"]["devices"] == [
        {"driver": "railyard.dev", "pool": NODE, "device": device_name(VF0),
         "networkData": {"interfaceName": "net1", "ips": ["10.56.0.2/16"],
                         "hardwareAddress": "02:00:00:00:00:01"}},
        {"driver": "railyard.dev", "pool": NODE, "device": device_name(VF1),
         "networkData": {"interfaceName": "net1-1", "ips": ["10.56.0.3/16"],
                         "hardwareAddress": "02:00:00:00:00:02"}}]
    assert told == []


@async_test
async def test_only_the_claims_devices_and_only_claims_prepared_for_the_pod_are_written(
        tmp_path):
    prepare(tmp_path, devices=(VF0, GPU0))  # VF1 moved, but not this claim's (never ours)
    other = ClaimRef("team", "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a", "other-pairs")
    prepare(tmp_path, devices=(VF1,), claim=other,
            pod=PodKey("11111111-2222-4333-8444-555555555555", "team", "other"))
    api, told = StatusApi(), []
    writer, runner = await writer_for(api, tmp_path, told)
    try:
        assert await writer.write(POD.uid, ADDED) == [WRITTEN]
        assert await writer.write("00000000-0000-4000-8000-000000000000", ADDED) == []
    finally:
        await writer.client.close()
        await runner.cleanup()
    [call] = api.calls
    assert [d["device"] for d in call["body"]["status"]["devices"]] == [device_name(VF0)]


@async_test
async def test_a_busy_api_server_is_tried_again_and_a_refusal_is_told_not_raised(tmp_path):
    prepare(tmp_path)
    api, told = StatusApi(503, 429), []
    writer, runner = await writer_for(api, tmp_path, told)
    try:
        assert await writer.write(POD.uid, ADDED) == [WRITTEN]
        assert len(api.calls) == 3 and told == []
        api.calls.clear()
        api.answers = [422]  # refused (a rule, or RBAC's resourceclaims/driver): no retry
        assert await writer.write(POD.uid, ADDED) == [FAILED]
        assert len(api.calls) == 1
        [(pod, why)] = told
        assert pod == POD and "answered 422" in why and "keeps its NICs" in why
        api.answers = [503] * 4  # busy every time: bounded, then told
        assert await writer.write(POD.uid, ADDED) == [FAILED]
        assert len(api.calls) == 1 + 4 and len(told) == 2
    finally:
        await writer.client.close()
        await runner.cleanup()
    counted = {s.labels["outcome"]: s.value
               for m in writer._writes.collect() for s in m.samples
               if s.name.endswith("_total")}
    assert counted == {WRITTEN: 1, FAILED: 2}


@async_test
async def test_a_claim_deleted_meanwhile_is_let_be(tmp_path):
    prepare(tmp_path)
    api, told = StatusApi(404), []
    writer, runner = await writer_for(api, tmp_path, told)
    try:
        assert await writer.write(POD.uid, ADDED) == [GONE]
    finally:
        await writer.client.close()
        await runner.cleanup()
    assert len(api.calls) == 1 and told == []


@async_test
async def test_the_cni_thread_hands_the_write_to_the_loop_without_waiting(tmp_path):
    prepare(tmp_path)
    api, told = StatusApi(), []
    writer, runner = await writer_for(api, tmp_path, told)
    try:
        future = await asyncio.to_thread(writer.interfaces_added, POD.uid, ADDED)  # as ADD
        assert writer.interfaces_added(None, ADDED) is None  # no pod UID: nothing to look up
        assert future is not None and await asyncio.wrap_future(future) == [WRITTEN]
    finally:
        await writer.client.close()
        await runner.cleanup()
    assert len(api.calls) == 1
