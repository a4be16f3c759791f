"""Leader election's fence at the moment a Binding is sent (decision 0074): the binder checks
the lease before a bind, but the client's rate limit may then hold the request for seconds.
The fence is checked again once the limit lets it go, and the create waits for its answer no
longer than the lease is still this replica's (`PodBinder.lease_left`)."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from railyard.kube.client import ApiUnavailable, Client
from railyard.kube.config import KubeConfig
from railyard.scheduler.cluster_api import ClusterSync, NotLeader, PodBinder
from railyard.scheduler.cluster_file import BoundPod
from railyard.scheduler.state import ClusterState
from support.http import serve_app


class Api:
    """Counts Bindings; each waits `delay` seconds before its answer."""

    def __init__(self, delay: float = 0.0) -> None:
        self.bindings = 0
        self.delay = delay
        self.timeouts: list[str | None] = []  # each Binding's `timeout` query parameter

    async def post(self, request: web.Request) -> web.Response:
        if request.path.endswith("/binding"):
            self.bindings += 1
            self.timeouts.append(request.query.get("timeout"))
            await asyncio.sleep(self.delay)
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)


async def serve(api: Api) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/{tail:.*}", api.post)
    return await serve_app(app)


def test_a_bind_that_waited_in_the_rate_limit_past_the_lease_is_not_sent():
    """Two binds at once, one token: the second passes the fence, waits about 0.5 s for the
    rate limit, and the lease is lost meanwhile. Once it was sent anyway, up to 30 s later,
    by a replica another one may have replaced; now it is refused with NotLeader."""
    async def main() -> int:
        api = Api()
        runner, url = await serve(api)
        leading = [True]
        try:
            async with Client(KubeConfig(server=url), qps=2, burst=1) as client:
                binder = PodBinder(client, ClusterSync(ClusterState(())),
                                   fence=lambda: leading[0])
                await binder.bind(BoundPod("ml", "p-1", "1", "a", None))
                second = asyncio.ensure_future(binder.bind(BoundPod("ml", "p-2", "2", "a",
                                                                    None)))
                await asyncio.sleep(0.1)  # in the rate limit now
                leading[0] = False
                with pytest.raises(NotLeader):
                    await second
                assert binder.sync.recording == set()
        finally:
            await runner.cleanup()
        return api.bindings

    assert asyncio.run(main()) == 1


def test_the_create_waits_no_longer_than_the_lease_is_left():
    async def main() -> float:
        api = Api(delay=1.5)
        runner, url = await serve(api)
        try:
            async with Client(KubeConfig(server=url)) as client:
                t0 = time.monotonic()
                with pytest.raises(ApiUnavailable):
                    await client.create("/api/v1/namespaces/ml/pods/p-1/binding", {}, dict,
                                        before_send=lambda: 0.3)
                return time.monotonic() - t0
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) < 1.2


def test_the_binder_caps_the_binding_to_what_is_left_of_the_lease():
    caps: list[float | None] = []

    class Client_:
        async def create(self, path: str, body: object, type_: object, *,
                         before_send: object = None, **_: object) -> None:
            assert callable(before_send)
            caps.append(before_send())

    binder = PodBinder(Client_(), ClusterSync(ClusterState(())),  # type: ignore[arg-type]
                       fence=lambda: True, lease_left=lambda: 4.5)
    asyncio.run(binder.bind(BoundPod("ml", "p-1", "1", "a", None)))
    assert caps == [4.5]
    binder.lease_left = lambda: 0.0
    with pytest.raises(NotLeader):
        asyncio.run(binder.bind(BoundPod("ml", "p-2", "2", "a", None)))


def test_the_api_server_is_told_the_bindings_timeout_capped_to_the_lease():
    """Decision 0101: the create's timeout goes to the API server too (its `timeout`
    parameter), so a Binding whose create failed here cannot be applied after it: the
    binder's own (BINDING_TIMEOUT_S) or, under a lease, what is left of the lease."""
    from railyard.scheduler.cluster_api import BINDING_TIMEOUT_S

    async def main() -> list[str | None]:
        api = Api()
        runner, url = await serve(api)
        try:
            async with Client(KubeConfig(server=url)) as client:
                sync = ClusterSync(ClusterState(()))
                await PodBinder(client, sync).bind(BoundPod("ml", "p-1", "1", "a", None))
                await PodBinder(client, sync, lease_left=lambda: 2.5).bind(
                    BoundPod("ml", "p-2", "2", "a", None))
                await client.create("/api/v1/namespaces/ml/pods/p-3/binding", {}, dict)
        finally:
            await runner.cleanup()
        return api.timeouts

    assert asyncio.run(main()) == [f"{round(1000 * BINDING_TIMEOUT_S)}ms", "2500ms", None]
