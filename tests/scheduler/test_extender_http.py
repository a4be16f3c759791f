"""The extender over real HTTP, as kube-scheduler calls it."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import pytest
from scheduler_helpers import args, node_list, pod, served

from railyard.allocation.request import Request
from railyard.scheduler.access import AdminToken
from railyard.scheduler.cluster_file import BoundPod, cluster_from_spec
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState

NAMES = ["dgx-h100-000", "dgx-h100-001", "hgx-h100-4nic-000"]
TOKEN = "admin-token-for-the-tests"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}  # DELETE /pods/<uid> needs it (decision 0083)


def extender(writer=None, **kw) -> Extender:
    kw.setdefault("admin_token", AdminToken.of(TOKEN.encode()))
    return Extender(ClusterState(cluster_from_spec("dgx-h100:2,hgx-h100-4nic:1")), writer, **kw)


async def post(s: aiohttp.ClientSession, url: str, body,
               timeout_s: float | None = None) -> tuple[int, object]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
    async with s.post(url, data=data, headers={"Content-Type": "application/json"},
                      timeout=timeout) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except json.JSONDecodeError:
            return r.status, text


def run(scenario, ext: Extender):
    async def go():
        async with served(ext) as url, aiohttp.ClientSession() as s:
            return await scenario(s, url)
    return asyncio.run(go())


def pod_request(n: int) -> Request:
    return Request(gpus=n, vfs=n)


def bind_args(uid: str, node: str) -> dict:
    return {"PodName": f"pod-{uid}", "PodNamespace": "default", "PodUID": uid, "Node": node}


def test_filter_in_cache_mode_answers_names_with_capitalised_keys():
    ext = extender()
    ext.state.bind("big", "ml", "big", "dgx-h100-000", pod_request(8))

    async def scenario(s, url):
        return await post(s, f"{url}/filter", args(pod("u1", gpus=4, vfs=4), [*NAMES, "ghost"]))

    status, body = run(scenario, ext)
    assert status == 200
    assert set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes",
                         "Error"}
    assert body["Nodes"] is None and body["Error"] == ""
    assert body["NodeNames"] == ["dgx-h100-001", "hgx-h100-4nic-000"]
    assert list(body["FailedNodes"]) == ["dgx-h100-000"]
    assert list(body["FailedAndUnresolvableNodes"]) == ["ghost"]


def test_filter_with_a_node_list_answers_a_node_list_of_the_same_objects():
    ext = extender()

    async def scenario(s, url):
        nodes = node_list([*NAMES, "ghost"])
        return nodes, await post(s, f"{url}/filter",
                                 {"Pod": pod("u1", gpus=8, pfs=5), "Nodes": nodes,
                                  "NodeNames": None})

    nodes, (status, body) = run(scenario, ext)
    assert status == 200 and body["NodeNames"] is None and body["Error"] == ""
    assert body["Nodes"]["kind"] == "NodeList"
    assert body["Nodes"]["items"] == nodes["items"][:2]  # hgx has 4 PFs: unresolvable
    assert set(body["FailedAndUnresolvableNodes"]) == {"hgx-h100-4nic-000", "ghost"}


def test_pod_without_railyard_resources_passes_every_node():
    async def scenario(s, url):
        return await post(s, f"{url}/filter", args(pod("u1"), [*NAMES, "ghost"]))

    _, body = run(scenario, extender())
    assert body["NodeNames"] == [*NAMES, "ghost"] and not body["FailedAndUnresolvableNodes"]


def test_bad_filter_input_sets_error_and_changes_nothing():
    ext = extender()
    no_uid = pod("x", gpus=1, vfs=1)
    del no_uid["metadata"]["uid"]
    bad_hint = pod("y", gpus=1, vfs=1, hints={"numa": "sometimes"})

    async def scenario(s, url):
        return [await post(s, f"{url}/filter", body) for body in (
            b"{not json", args(no_uid, NAMES), args(bad_hint, NAMES),
            {"Pod": pod("z", gpus=1), "Nodes": None, "NodeNames": None},
            {"Pod": pod("z", gpus=1), "NodeNames": "dgx-h100-000"})]

    replies = run(scenario, ext)
    errors = [body["Error"] for status, body in replies]
    assert all(status == 200 for status, _ in replies)
    assert "malformed JSON" in errors[0]
    assert "Pod.metadata.uid: missing" in errors[1]
    assert "railyard.dev/request]" in errors[2] and "numa" in errors[2]
    assert "neither NodeNames nor Nodes" in errors[3]
    assert "$.NodeNames" in errors[4]
    assert all(body["NodeNames"] is None for _, body in replies)
    assert ext.state.pods() == [] and len(ext.pods) == 0


def test_deeply_nested_input_is_a_precise_error_not_a_500():
    # "[" * 5000 makes Python's json and msgspec raise RecursionError, not a decode error.
    ext = extender()

    def deep_annotation(uid: str) -> dict:
        p = pod(uid, gpus=1, vfs=1)  # the API server allows 256 KiB of annotations
        p["metadata"]["annotations"] = {"railyard.dev/request": "[" * 5000}
        return p

    deep_body = (b'{"Pod": {"metadata": {"uid": "d", "name": "d"}, "spec": '
                 + b"[" * 5000 + b"]" * 5000 + b'}, "NodeNames": []}')

    async def scenario(s, url):
        return (await post(s, f"{url}/filter", args(deep_annotation("a"), NAMES)),
                await post(s, f"{url}/prioritize", args(deep_annotation("b"), NAMES)),
                await post(s, f"{url}/preempt", {
                    "Pod": deep_annotation("c"), "NodeNameToMetaVictims": {}}),
                await post(s, f"{url}/filter", deep_body))

    (f_status, f_body), (p_status, p_body), (e_status, e_body), (d_status, d_body) = run(
        scenario, ext)
    assert f_status == 200
    assert "annotations[railyard.dev/request]: not valid JSON: nested too deeply" in (
        f_body["Error"])
    assert p_status == 400 and "nested too deeply" in p_body
    assert e_status == 400 and "nested too deeply" in e_body
    assert d_status == 200 and "ExtenderArgs: malformed JSON" in d_body["Error"]
    assert len(ext.pods) == 0


def test_prioritize_scores_every_name_and_refuses_bad_input_with_400():
    async def scenario(s, url):
        good = await post(s, f"{url}/prioritize", args(pod("u", gpus=2, vfs=2), NAMES))
        bad = await post(s, f"{url}/prioritize", b"{\"Pod\": ")
        return good, bad

    (status, body), (bad_status, bad_body) = run(scenario, extender())
    assert status == 200 and [h["Host"] for h in body] == NAMES
    assert all(set(h) == {"Host", "Score"} and 0 <= h["Score"] <= 10 for h in body)
    assert bad_status == 400 and "malformed JSON" in bad_body


def test_bind_after_filter_records_the_allocation_and_a_retry_is_harmless():
    ext = extender()

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(pod("u1", gpus=2, vfs=2), NAMES))
        first = await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-001"))
        again = await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-001"))
        elsewhere = await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000"))
        async with s.get(f"{url}/allocations") as r:
            listed = await r.json()
        return first, again, elsewhere, listed

    first, again, elsewhere, listed = run(scenario, ext)
    assert first == (200, {"Error": ""}) and again == (200, {"Error": ""})
    assert "already bound to 'dgx-h100-001'" in elsewhere[1]["Error"]
    (p,) = listed["pods"]
    assert (p["uid"], p["node"], p["namespace"], p["name"]) == (
        "u1", "dgx-h100-001", "default", "pod-u1")
    assert p["allocation"]["decidedBy"] == "scheduler" and len(p["allocation"]["pairs"]) == 2
    assert len(ext.state.ledger("dgx-h100-001")) == 1


def test_bind_of_an_unseen_pod_or_unknown_node_or_bad_body_is_an_error():
    ext = extender()

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(pod("seen", gpus=1, vfs=1), NAMES))
        return [await post(s, f"{url}/bind", b) for b in (
            bind_args("unseen", "dgx-h100-000"), bind_args("seen", "ghost"),
            {"PodName": "x"}, b"\x00")]

    replies = run(scenario, ext)
    errors = [body["Error"] for _, body in replies]
    assert "not seen in a filter call" in errors[0]
    assert "node 'ghost' is not known" in errors[1]
    assert "ExtenderBindingArgs" in errors[2] and "malformed JSON" in errors[3]
    assert ext.state.pods() == []


class FailingWriter:
    def __init__(self) -> None:
        self.fail = True
        self.bound: list[BoundPod] = []

    async def bind(self, p: BoundPod) -> None:
        if self.fail:
            raise OSError("API server unavailable")
        self.bound.append(p)


def test_failed_write_rolls_back_the_ledger_and_the_retry_succeeds():
    writer = FailingWriter()
    ext = extender(writer)

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(pod("u1", gpus=8, vfs=8), NAMES))
        failed = await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000"))
        held_after_failure = len(ext.state.ledger("dgx-h100-000"))
        writer.fail = False
        ok = await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000"))
        return failed, held_after_failure, ok

    failed, held, ok = run(scenario, ext)
    assert "API server unavailable" in failed[1]["Error"] and held == 0
    assert ok == (200, {"Error": ""})
    assert [p.uid for p in writer.bound] == ["u1"]


def test_pods_without_devices_are_bound_through_the_writer_without_an_allocation():
    writer = FailingWriter()
    writer.fail = False
    ext = extender(writer)

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(pod("plain"), NAMES))
        return await post(s, f"{url}/bind", bind_args("plain", "dgx-h100-000"))

    assert run(scenario, ext) == (200, {"Error": ""})
    assert writer.bound == [BoundPod("default", "pod-plain", "plain", "dgx-h100-000", None)]
    # Held by nothing but its node: the record that keeps it on one node (issue 19).
    assert ext.state.pods() == writer.bound
    assert all(len(ext.state.ledger(n)) == 0 for n in NAMES)


# kube-scheduler's side of preemption (pkg/scheduler/framework/preemption): its victims on
# a node come from SelectVictimsOnNode, which removes every lower-priority pod and then
# reprieves each one its own filters (CPU, memory, nvidia.com/gpu...) can spare, so every
# pod left in the list is needed by them. Evaluator.callExtenders then fails the whole
# preemption on any node an extender answers with no victims ("expected at least one
# victim pod on node") unless the extender is ignorable, which ours is not.


def test_preempt_answers_kube_schedulers_whole_victim_list_in_both_forms_or_leaves_the_node_out():
    ext = extender()
    for i in range(8):
        ext.state.bind(f"v{i}", "ml", f"v{i}", "dgx-h100-000", pod_request(1))
    victims = [f"v{i}" for i in range(8)]

    async def scenario(s, url):
        meta = await post(s, f"{url}/preempt", {
            "Pod": pod("u", gpus=2, vfs=2), "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                "dgx-h100-000": {"Pods": [{"UID": u} for u in victims], "NumPDBViolations": 1},
                "ghost": {"Pods": [{"UID": "v0"}], "NumPDBViolations": 0}}})
        full = await post(s, f"{url}/preempt", {
            "Pod": pod("u", gpus=2, vfs=2), "NodeNameToMetaVictims": None,
            "NodeNameToVictims": {"dgx-h100-000": {
                "Pods": [pod(u) for u in victims[:1]], "NumPDBViolations": 0}}})
        bad = await post(s, f"{url}/preempt", {"Pod": pod("u", gpus=1), "NodeNameToVictims": {
            "dgx-h100-000": {"Pods": [{"metadata": {}}]}}})
        return meta, full, bad

    (status, meta), (_, full), (bad_status, bad) = run(scenario, ext)
    assert status == 200 and meta == {"NodeNameToMetaVictims": {"dgx-h100-000": {
        "Pods": [{"UID": u} for u in victims], "NumPDBViolations": 1}}}
    assert full == {"NodeNameToMetaVictims": {}}  # one 1-GPU victim cannot make room for 2
    assert bad_status == 400 and "metadata.uid: missing" in bad
    assert len(ext.state.pods()) == 8  # preempt only answers; it evicts nothing


def test_preempt_never_answers_a_node_with_an_empty_victim_list():
    # "nic-only" holds 2 VFs and (kube-scheduler's reason for listing it) CPU the preemptor
    # needs. The preemptor's devices fit without evicting it; it must still be answered, and
    # a node listed with no victims at all is left out rather than answered empty.
    ext = extender()
    ext.state.bind("nic-only", "ml", "nic-only", "dgx-h100-000", Request(vfs=2))

    async def scenario(s, url):
        return await post(s, f"{url}/preempt", {
            "Pod": pod("u", gpus=1, vfs=1), "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                "dgx-h100-000": {"Pods": [{"UID": "nic-only"}], "NumPDBViolations": 0},
                "dgx-h100-001": {"Pods": [], "NumPDBViolations": 0}}})

    status, body = run(scenario, ext)
    assert status == 200
    assert body == {"NodeNameToMetaVictims": {"dgx-h100-000": {
        "Pods": [{"UID": "nic-only"}], "NumPDBViolations": 0}}}


def test_preempt_does_not_reprieve_victims_kube_scheduler_needs_for_its_own_filters():
    # 8 GPUs: "keep" (higher priority, not proposed) holds 4, "big" 4. "cpu-hog" holds one
    # VF and the CPU the preemptor needs. kube-scheduler proposes {big, cpu-hog}: answering
    # only "big" would leave the preemptor failing NodeResourcesFit(cpu) after the eviction,
    # and the next attempt would propose cpu-hog again: the pod would never land.
    ext = extender()
    ext.state.bind("keep", "ml", "keep", "dgx-h100-000", Request(gpus=4, vfs=4))
    ext.state.bind("big", "ml", "big", "dgx-h100-000", Request(gpus=4, vfs=4))
    ext.state.bind("cpu-hog", "ml", "cpu-hog", "dgx-h100-000", Request(vfs=1))

    async def scenario(s, url):
        return await post(s, f"{url}/preempt", {
            "Pod": pod("u", gpus=4, vfs=4), "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {"dgx-h100-000": {
                "Pods": [{"UID": "big"}, {"UID": "cpu-hog"}], "NumPDBViolations": 0}}})

    status, body = run(scenario, ext)
    assert status == 200
    answered = body["NodeNameToMetaVictims"].get("dgx-h100-000")
    assert answered is not None  # evicting both does make room for the paired request
    assert [p["UID"] for p in answered["Pods"]] == ["big", "cpu-hog"]


def test_delete_pod_frees_its_devices_and_health_and_metrics_answer():
    ext = extender()

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(pod("u1", gpus=8, vfs=8), NAMES))
        await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000"))
        await post(s, f"{url}/filter", args(pod("u2", gpus=1, vfs=1), ["ghost"]))
        async with s.delete(f"{url}/pods/u1", headers=ADMIN) as r:
            deleted = (r.status, await r.json())
        async with s.delete(f"{url}/pods/u1", headers=ADMIN) as r:
            again = r.status
        async with s.get(f"{url}/healthz") as r:
            health = (r.status, await r.text())
        async with s.get(f"{url}/metrics") as r:
            metrics = await r.text()
        return deleted, again, health, metrics

    deleted, again, health, metrics = run(scenario, ext)
    assert deleted[0] == 200 and deleted[1]["released"]["uid"] == "u1"
    assert again == 404 and health == (200, "ok")
    assert len(ext.state.ledger("dgx-h100-000")) == 0
    for verb in ("filter", "bind", "release"):
        assert f'railyard_extender_request_duration_seconds_count{{verb="{verb}"}}' in metrics
    assert "railyard_extender_allocations_total 1.0" in metrics
    assert 'railyard_extender_failures_total{reason="unknown_node",verb="filter"} 1.0' in metrics
    assert "railyard_extender_bound_pods 0.0" in metrics


class SlowWriter:
    def __init__(self) -> None:
        self.bound: list[BoundPod] = []

    async def bind(self, p: BoundPod) -> None:
        await asyncio.sleep(0.2)
        self.bound.append(p)


def test_a_retried_bind_while_the_first_is_recording_waits_and_allocates_once():
    writer = SlowWriter()
    ext = extender(writer)

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(pod("u1", gpus=2, vfs=2), NAMES))
        return await asyncio.gather(
            post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000")),
            post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000")),
            post(s, f"{url}/bind", bind_args("u1", "dgx-h100-001")))

    same, again, other = run(scenario, ext)
    assert same == again == (200, {"Error": ""})
    assert "already bound to 'dgx-h100-000'" in other[1]["Error"]
    assert len(writer.bound) == 1 and len(ext.state.ledger("dgx-h100-000")) == 1
    assert len(ext.state.ledger("dgx-h100-001")) == 0


class GatedWriter:
    """Records only when the test opens the gate; fails then if told to."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.gate = asyncio.Event()
        self.bound: list[BoundPod] = []

    async def bind(self, p: BoundPod) -> None:
        await self.gate.wait()
        if self.fail:
            raise OSError("API server unavailable")
        self.bound.append(p)


def test_a_pod_whose_bind_reply_kube_scheduler_missed_can_still_be_scheduled():
    # kube-scheduler gives up on a bind after httpTimeout (5 s: a slow fsync, a dropped
    # connection, a restart after the record landed), forgets the pod and schedules it again
    # from filter. Its own devices must not count against it there: only the node holding
    # them is offered (and scored highest), and the bind to it succeeds.
    writer = SlowWriter()
    ext = extender(writer)
    whole_node = pod("u1", gpus=8, vfs=8)
    names = ["dgx-h100-000", "dgx-h100-001"]

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(whole_node, names))
        with contextlib.suppress(TimeoutError):  # "failed bind with extender": requeued
            await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000"), timeout_s=0.05)
        await asyncio.sleep(0.4)  # the record lands meanwhile
        _, again = await post(s, f"{url}/filter", args(whole_node, names))
        _, scores = await post(s, f"{url}/prioritize", args(whole_node, names))
        binds = [await post(s, f"{url}/bind", bind_args("u1", n))
                 for n in again["NodeNames"] or []]
        return again, scores, binds

    again, scores, binds = run(scenario, ext)
    assert [p.uid for p in writer.bound] == ["u1"]  # the first bind did land
    assert again["NodeNames"] == ["dgx-h100-000"] and again["FailedNodes"] == {}
    assert again["FailedAndUnresolvableNodes"] == {
        "dgx-h100-001": "pod default/pod-u1 (u1) is already bound to 'dgx-h100-000'"}
    assert scores == [{"Host": "dgx-h100-000", "Score": 10},
                      {"Host": "dgx-h100-001", "Score": 0}]
    assert binds == [(200, {"Error": ""})]
    assert len(ext.state.pods()) == 1


@pytest.mark.parametrize("fail", [True, False])
def test_a_bind_whose_caller_goes_away_still_finishes_its_record_or_rolls_back(fail):
    # A handler cancelled mid-write (shutdown, or aiohttp's handler cancellation) must not
    # cut the record short: a failed write still frees the devices, a retry hears the outcome.
    writer = GatedWriter(fail)
    ext = extender(writer)
    from railyard.scheduler.wire import ExtenderBindingArgs, pod_facts

    async def go():
        ext.pods.put(pod_facts(pod("u1", gpus=2, vfs=2)))
        binding = ExtenderBindingArgs("pod-u1", "default", "u1", "dgx-h100-000")
        first = asyncio.create_task(ext.bind_pod(binding))
        await asyncio.sleep(0.01)
        retry = asyncio.create_task(ext.bind_pod(binding))
        await asyncio.sleep(0.01)
        first.cancel()
        await asyncio.sleep(0.01)
        writer.gate.set()
        return await asyncio.wait_for(retry, timeout=5)

    retried = asyncio.run(go())
    held = len(ext.state.ledger("dgx-h100-000"))
    if fail:
        assert "API server unavailable" in retried and held == 0
    else:
        assert retried == "" and held == 1 and [p.uid for p in writer.bound] == ["u1"]


def test_a_bind_naming_another_pod_than_filter_saw_for_the_uid_is_refused():
    ext = extender()

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(pod("u1", gpus=2, vfs=2), NAMES))
        other = {**bind_args("u1", "dgx-h100-000"), "PodName": "someone-else"}
        refused = await post(s, f"{url}/bind", other)
        right = await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000"))
        return refused, right

    refused, right = run(scenario, ext)
    assert "filter saw UID u1 as pod default/pod-u1" in refused[1]["Error"]
    assert right == (200, {"Error": ""})
    (held,) = ext.state.pods()
    assert (held.namespace, held.name) == ("default", "pod-u1")


class GatedReleases:
    """A state file whose release is recorded only when the test opens the gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.released: list[str] = []

    async def release(self, uid: str) -> None:
        await self.gate.wait()
        self.released.append(uid)


def test_a_bind_arriving_while_its_pods_release_is_recorded_waits_and_binds_afresh():
    # Before, the bind answered "bound" from the record about to go, and the release then
    # freed the devices under it: a bound pod holding nothing.
    releases = GatedReleases()
    ext = extender(state_file=releases)

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(pod("u1", gpus=2, vfs=2), NAMES))
        await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000"))
        delete = asyncio.ensure_future(s.delete(f"{url}/pods/u1", headers=ADMIN))
        await asyncio.sleep(0.05)
        rebind = asyncio.ensure_future(post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000")))
        await asyncio.sleep(0.05)
        waited = not rebind.done()
        releases.gate.set()
        async with await delete as r:
            deleted = r.status
        return waited, deleted, await rebind

    waited, deleted, rebound = run(scenario, ext)
    assert waited and deleted == 200 and releases.released == ["u1"]
    assert rebound == (200, {"Error": ""})
    assert ext.state.pod("u1") is not None and len(ext.state.ledger("dgx-h100-000")) == 1


def test_a_pod_asking_for_no_devices_is_bound_to_one_node_only():
    # Before, its bind recorded nothing: a second bind of the same UID to another node was
    # answered "bound" too (issue 19, class 7).
    ext = extender()

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(pod("u1"), NAMES))
        first = await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000"))
        retry = await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000"))
        other = await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-001"))
        filtered = await post(s, f"{url}/filter", args(pod("u1"), NAMES))
        return first, retry, other, filtered

    first, retry, other, (_, filtered) = run(scenario, ext)
    assert first == retry == (200, {"Error": ""})
    assert "already bound to 'dgx-h100-000'" in other[1]["Error"]
    assert filtered["NodeNames"] == ["dgx-h100-000"]  # as for a pod holding devices (0027)
    held = ext.state.pod("u1")
    assert held is not None and held.node == "dgx-h100-000" and held.allocation is None
    assert all(len(ext.state.ledger(n)) == 0 for n in NAMES)


def test_two_binds_of_a_pod_asking_for_no_devices_at_once_bind_it_once():
    writer = GatedWriter(fail=False)
    ext = extender(writer)

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(pod("u1"), NAMES))
        binds = [asyncio.ensure_future(post(s, f"{url}/bind", bind_args("u1", node)))
                 for node in ("dgx-h100-000", "dgx-h100-001")]
        await asyncio.sleep(0.05)
        writer.gate.set()
        return await asyncio.gather(*binds)

    results = run(scenario, ext)
    errors = [body["Error"] for _, body in results]
    assert errors[0] == "" and "already bound to 'dgx-h100-000'" in errors[1]
    assert [p.node for p in writer.bound] == ["dgx-h100-000"]


def test_a_failed_write_of_a_bind_without_devices_leaves_the_pod_unbound():
    class Failing:
        async def bind(self, pod: BoundPod) -> None:
            raise OSError("disk full")

    ext = extender(Failing())

    async def scenario(s, url):
        await post(s, f"{url}/filter", args(pod("u1"), NAMES))
        return await post(s, f"{url}/bind", bind_args("u1", "dgx-h100-000"))

    _, body = run(scenario, ext)
    assert "disk full" in body["Error"] and ext.state.pod("u1") is None

