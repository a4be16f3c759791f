"""Railyard's reflector (railyard.kube.reflector) against the box's real kube-apiserver: it
lists, sees adds, updates and deletes in order, lists again when the connection drops (cut by
a TCP relay between it and the server) or a line is over its limit, and after a 410 Gone from
an apiserver that restarted (drill box); and the extender's pod watch, whose field selector
the API server applies."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable

import msgspec
import pytest

from railyard.kube.client import Client
from railyard.kube.config import load_kubeconfig
from railyard.kube.objects import ObjectMeta, Pod, Status
from railyard.kube.reflector import Backoff, Change, Reflector, key_of
from railyard.scheduler.cluster_api import HOLDING_PODS
from support.box import namespace, pod

pytestmark = [pytest.mark.root, pytest.mark.box]


class ConfigMap(msgspec.Struct):
    metadata: ObjectMeta
    data: dict[str, str] = {}


def client_for(box, server: str | None = None) -> Client:
    config = load_kubeconfig(box.layout.admin_kubeconfig)
    if server:
        config = dataclasses.replace(config, server=server)
    return Client(config)


async def eventually(what: str, check: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


class Relay:
    """A TCP relay on 127.0.0.1 (in the API server's certificate) to the API server, whose
    connections the test can cut."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"https://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(self.host, self.port)
        self.writers |= {down_w, up_w}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(down_r, up_w), pipe(up_r, down_w))

    def cut(self) -> int:
        """Reset every connection now open; new ones still go through."""
        cut = len(self.writers)
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()
        return cut

    async def stop(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


async def stop(task: asyncio.Task[None], client: Client) -> None:
    """End a reflector's run and close its client."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await client.close()


async def with_reflector(client: Client, path: str,
                         body: Callable[[Reflector[ConfigMap], list[Change[ConfigMap]]],
                                        Awaitable[None]], **options) -> None:
    changes: list[Change[ConfigMap]] = []
    reflector = Reflector(client, path, ConfigMap, on_change=changes.append,
                          backoff=Backoff(0.05, 0.5), **options)
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.synced.wait(), 30)
        await body(reflector, changes)
    finally:
        await stop(task, client)


def summary(changes: list[Change[ConfigMap]]) -> list[tuple[str, str, str]]:
    return [(c.type, c.object.metadata.name, c.object.data.get("v", ""))
            for c in changes if c.object.metadata.name != "kube-root-ca.crt"]


async def configmaps_of_a_new_namespace(client: Client) -> str:
    """The path of the ConfigMaps of a fresh namespace: each test watches its own."""
    ns = await client.create("/api/v1/namespaces", {"metadata": {"generateName": "refl-"}},
                             ConfigMap)
    return f"/api/v1/namespaces/{ns.metadata.name}/configmaps"


def cm(name: str, value: str) -> dict:
    return {"metadata": {"name": name}, "data": {"v": value}}


def test_the_reflector_lists_then_sees_adds_updates_and_deletes_in_order(box):
    async def scenario() -> None:
        client = client_for(box)
        base = await configmaps_of_a_new_namespace(client)
        await client.create(base, cm("a", "1"), ConfigMap)
        await client.create(base, cm("b", "1"), ConfigMap)

        async def body(reflector, changes) -> None:
            assert summary(changes) == [("ADDED", "a", "1"), ("ADDED", "b", "1")]
            await client.create(base, cm("c", "1"), ConfigMap)
            await client.patch(f"{base}/a", {"data": {"v": "2"}}, ConfigMap)
            await client.delete(f"{base}/b")
            await client.patch(f"{base}/a", {"data": {"v": "3"}}, ConfigMap)
            await eventually("four changes", lambda: len(summary(changes)) == 6)
            assert summary(changes)[2:] == [("ADDED", "c", "1"), ("MODIFIED", "a", "2"),
                                            ("DELETED", "b", "1"), ("MODIFIED", "a", "3")]
            modified = [c for c in changes if c.type == "MODIFIED"]
            assert modified[0].old is not None and modified[0].old.data == {"v": "1"}
            assert sorted(k.split("/")[1] for k in reflector.store
                          if not k.endswith("kube-root-ca.crt")) == ["a", "c"]
            assert reflector.lists == 1

        await with_reflector(client, base, body)

    asyncio.run(scenario())


def test_a_dropped_connection_lists_again_and_delivers_what_changed_meanwhile(box):
    async def scenario() -> None:
        admin = client_for(box)
        base = await configmaps_of_a_new_namespace(admin)
        await admin.create(base, cm("a", "1"), ConfigMap)
        host, port = box.layout.node_ip, 6443
        relay = Relay(host, port)
        client = client_for(box, await relay.start())

        async def body(reflector, changes) -> None:
            await eventually("a connection through the relay", lambda: len(relay.writers) >= 2)
            await asyncio.sleep(1.0)  # the watch follows the list at once
            reflector.backoff = Backoff(2.0, 2.0)  # long enough to change things meanwhile
            assert relay.cut() >= 2
            await admin.patch(f"{base}/a", {"data": {"v": "2"}}, ConfigMap)
            await admin.create(base, cm("b", "1"), ConfigMap)
            await eventually("the changes made while cut", lambda: len(summary(changes)) == 3)
            assert summary(changes) == [("ADDED", "a", "1"), ("MODIFIED", "a", "2"),
                                        ("ADDED", "b", "1")]
            assert reflector.lists == 2 and reflector.relists["unavailable"] == 1
            # And it watches again after the re-list.
            await admin.delete(f"{base}/a")
            await eventually("the delete", lambda: summary(changes)[-1][:2] == ("DELETED", "a"))

        try:
            await with_reflector(client, base, body)
        finally:
            await relay.stop()
            await admin.close()

    asyncio.run(scenario())


def test_a_watch_line_over_the_limit_drops_the_stream_instead_of_buffering_it(box):
    async def scenario() -> None:
        admin = client_for(box)
        base = await configmaps_of_a_new_namespace(admin)
        client = client_for(box)

        async def body(reflector, changes) -> None:
            await admin.create(base, cm("big", "x" * 20_000), ConfigMap)
            await eventually("the big object, by a re-list",
                             lambda: any(k.endswith("/big") for k in reflector.store))
            assert reflector.relists["unavailable"] >= 1
            assert summary(changes) == [("ADDED", "big", "x" * 20_000)]

        try:
            await with_reflector(client, base, body, max_line_bytes=8_000)
        finally:
            await admin.close()

    asyncio.run(scenario())


def test_a_resumed_reflector_lists_again_after_410_from_a_restarted_apiserver(drill_box):
    """A reflector stopped and run again watches from its resourceVersion; the restarted
    apiserver's watch cache starts after it and answers 410 Gone, so it lists again and
    delivers what changed while it was away."""

    async def scenario() -> None:
        client = client_for(drill_box)
        base = await configmaps_of_a_new_namespace(client)
        await client.create(base, cm("before", "1"), ConfigMap)
        changes: list[Change[ConfigMap]] = []
        reflector = Reflector(client, base, ConfigMap, on_change=changes.append,
                              backoff=Backoff(0.05, 0.5))
        task = asyncio.create_task(reflector.run())
        await asyncio.wait_for(reflector.synced.wait(), 30)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()

        await asyncio.to_thread(drill_box.restart, "kube-apiserver")
        await client.create(base, cm("after", "1"), ConfigMap)
        await client.delete(f"{base}/before")
        task = asyncio.create_task(reflector.run())
        try:
            await eventually("the changes made while it was stopped",
                             lambda: len(summary(changes)) == 3, timeout_s=60)
            assert summary(changes) == [("ADDED", "before", "1"), ("ADDED", "after", "1"),
                                        ("DELETED", "before", "1")]
            assert reflector.relists["gone"] == 1 and reflector.lists == 2
        finally:
            await stop(task, client)

    asyncio.run(scenario())


def test_the_extenders_pod_watch_delivers_only_pods_that_can_hold_devices(box):
    """`cluster_api.HOLDING_PODS` as the real API server applies it: a pending pod is never
    delivered, its Binding brings it as ADDED, and when it finishes it leaves as DELETED (the
    node does not exist, so no kubelet runs it: its phase is the test's to write)."""
    ns = namespace(box)
    base = f"/api/v1/namespaces/{ns}/pods"

    async def scenario() -> None:
        client = client_for(box)
        changes: list[Change[Pod]] = []
        reflector = Reflector(client, base, Pod, params=HOLDING_PODS,
                              on_change=changes.append, backoff=Backoff(0.05, 0.5))
        await client.create(base, pod("bound-early", ["true"], nodeName="refl-no-node"), Pod)
        await client.create(base, pod("waiting", ["true"], schedulerName="nobody"), Pod)
        task = asyncio.create_task(reflector.run())

        def seen() -> list[tuple[str, str]]:
            return [(c.type, c.object.metadata.name) for c in changes]
        try:
            await asyncio.wait_for(reflector.synced.wait(), 30)
            assert seen() == [("ADDED", "bound-early")]
            await client.create(base, pod("pending-late", ["true"], schedulerName="nobody"),
                                Pod)
            await client.create(f"{base}/waiting/binding", {
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "waiting"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "refl-no-node"}}, Status)
            await eventually("the bound pod", lambda: len(seen()) == 2)
            await client.patch(f"{base}/bound-early/status", {"status": {"phase": "Succeeded"}},
                               Pod)
            await eventually("the finished pod to leave", lambda: len(seen()) == 3)
            await client.delete(f"{base}/pending-late")
            await client.patch(f"{base}/waiting", {"metadata": {"labels": {"k": "v"}}}, Pod)
            await eventually("the label change", lambda: len(seen()) == 4)
            assert seen() == [("ADDED", "bound-early"), ("ADDED", "waiting"),
                              ("DELETED", "bound-early"), ("MODIFIED", "waiting")]
            # The API server's DELETED for a pod that left the selector carries the pod as it
            # last matched (phase Pending here): ClusterSync frees on the type, not the phase.
            assert changes[2].object.status.phase == "Pending"
            assert set(reflector.store) == {key_of(changes[1].object.metadata)}
        finally:
            await stop(task, client)
    asyncio.run(scenario())
