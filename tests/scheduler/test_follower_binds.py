"""A bind on a replica that does not hold the Lease is refused with an error (kube-scheduler
retries the pod) and holds nothing; filter answers on every replica (decision 0074)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from scheduler_helpers import pod, served

from railyard.scheduler.cluster_api import ClusterSync, NotLeader, PodBinder
from railyard.scheduler.cluster_file import BoundPod, cluster_from_spec
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState
from railyard.scheduler.wire import ExtenderBindingArgs, pod_facts


class Lease:
    def __init__(self, leads: bool, holder: str = "") -> None:
        self.leads, self.holder = leads, holder

    def is_leader(self) -> bool:
        return self.leads


class Recorder:
    def __init__(self) -> None:
        self.bound: list[BoundPod] = []

    async def bind(self, p: BoundPod) -> None:
        self.bound.append(p)


def bind(ext: Extender, uid: str = "u1") -> str:
    ext.pods.put(pod_facts(pod(uid, gpus=2, vfs=2)))
    return asyncio.run(ext.bind_pod(
        ExtenderBindingArgs(f"pod-{uid}", "default", uid, "dgx-h100-000")))


def test_a_follower_refuses_a_bind_writes_nothing_and_holds_nothing():
    writer = Recorder()
    ext = Extender(ClusterState(cluster_from_spec("dgx-h100:1")), writer,
                   leader=Lease(False, "railyard-0_42"))
    error = bind(ext)
    assert "not the leader" in error and "railyard-0_42" in error and "retry" in error
    assert writer.bound == [] and ext.state.pod_count() == 0
    assert b'reason="not_leader"' in ext.metrics.render()


def test_a_followers_refused_bind_closes_the_connection_so_the_retry_can_reach_the_leader():
    """kube-proxy picks a Service endpoint per connection: kept alive, kube-scheduler's
    connection would carry every retry to this follower again."""
    ext = Extender(ClusterState(cluster_from_spec("dgx-h100:1")), Recorder(),
                   leader=Lease(False, "railyard-0_42"))
    ext.pods.put(pod_facts(pod("u1", gpus=2, vfs=2)))
    body = json.dumps({"PodName": "pod-u1", "PodNamespace": "default", "PodUID": "u1",
                       "Node": "dgx-h100-000"}).encode()

    async def go() -> list[tuple[str, str | None]]:
        async with served(ext) as url, aiohttp.ClientSession() as s:
            answers = []
            for path in ("/filter", "/bind"):
                sent = body if path == "/bind" else json.dumps({
                    "Pod": pod("u1", gpus=2, vfs=2), "NodeNames": ["dgx-h100-000"]}).encode()
                async with s.post(url + path, data=sent,
                                  headers={"Content-Type": "application/json"}) as r:
                    answers.append(((await r.json()).get("Error") or "",
                                    r.headers.get("Connection")))
            return answers

    (filter_error, filter_connection), (bind_error, bind_connection) = asyncio.run(go())
    assert filter_error == "" and filter_connection != "close"  # filter keeps its connection
    assert "not the leader" in bind_error and bind_connection == "close"


def test_the_same_replica_binds_once_it_leads():
    writer, lease = Recorder(), Lease(False)
    ext = Extender(ClusterState(cluster_from_spec("dgx-h100:1")), writer, leader=lease)
    assert "nobody yet" in bind(ext)
    lease.leads = True
    assert bind(ext) == ""
    assert [p.uid for p in writer.bound] == ["u1"] and ext.state.pod_count() == 1


def test_a_follower_still_answers_filter():
    ext = Extender(ClusterState(cluster_from_spec("dgx-h100:1")), Recorder(),
                   leader=Lease(False))
    facts = pod_facts(pod("u1", gpus=2, vfs=2))
    assert ext.state.filter(facts.request, ["dgx-h100-000"], uid="u1").fits == ["dgx-h100-000"]


def test_the_binder_writes_nothing_once_the_fence_is_down():
    # The client is never touched: the fence is checked before the first write.
    state = ClusterState(cluster_from_spec("dgx-h100:1"))
    binder = PodBinder(None, ClusterSync(state), fence=lambda: False)  # type: ignore[arg-type]
    with pytest.raises(NotLeader):
        asyncio.run(binder.bind(BoundPod("default", "p", "u1", "dgx-h100-000", None)))
    assert binder.sync.recording == set() and binder.sync.written == set()
