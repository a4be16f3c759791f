"""The API client's connections: requests share a bounded, reused pool (each new connection
is a TLS handshake the API server pays for), and watches never wait behind it."""

from __future__ import annotations

import asyncio

from aiohttp import web

from railyard.kube.client import Client, RequestTiming
from railyard.kube.config import KubeConfig
from railyard.kube.objects import Object
from support.http import serve_app


class CountingServer:
    """An HTTP API server stand-in that answers slowly and counts the connections made."""

    def __init__(self) -> None:
        self.peers: set[tuple[str, int]] = set()
        self.in_flight = self.most_in_flight = 0
        self.watching = asyncio.Event()
        self.done = asyncio.Event()  # ends the watches

    async def get(self, request: web.Request) -> web.StreamResponse:
        self.peers.add(request.transport.get_extra_info("peername"))
        if request.query.get("watch"):
            response = web.StreamResponse()
            await response.prepare(request)
            self.watching.set()
            await response.write(b'{"type":"BOOKMARK","object":{"metadata":{}}}\n')
            await self.done.wait()
            return response
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.02)
        self.in_flight -= 1
        return web.json_response({"metadata": {"name": "x"}})


async def serve(server: CountingServer) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/{tail:.*}", server.get)
    return await serve_app(app)


def test_a_burst_of_requests_shares_a_bounded_pool_and_watches_are_not_counted_in_it():
    async def main() -> None:
        server = CountingServer()
        runner, url = await serve(server)
        try:
            async with Client(KubeConfig(server=url), qps=10_000, burst=10_000,
                              connections=4) as client:
                watches = [asyncio.ensure_future(_drain(client, f"/w{i}")) for i in range(6)]
                await asyncio.wait_for(server.watching.wait(), 5)
                await asyncio.gather(*(client.get(f"/api/v1/x/{i}", Object)
                                       for i in range(200)))
                for w in watches:
                    w.cancel()
                await asyncio.gather(*watches, return_exceptions=True)
        finally:
            server.done.set()
            await runner.cleanup()
        assert server.most_in_flight == 4  # six watches open, yet requests had all four
        assert len(server.peers) <= 4 + 6, server.peers  # 200 requests, 4 connections

    asyncio.run(main())


async def _drain(client: Client, path: str) -> None:
    async for _ in client.watch_lines(path, {}):
        pass


def test_a_requests_timing_tells_the_rate_limit_the_pool_and_the_wire_apart():
    async def main() -> tuple[RequestTiming, RequestTiming, RequestTiming]:
        server = CountingServer()
        runner, url = await serve(server)
        first, second, third = RequestTiming(), RequestTiming(), RequestTiming()
        try:
            # One connection: the second request waits for it while the first is answered
            # (20 ms); the third's token comes 1 s after the burst of two is spent.
            async with Client(KubeConfig(server=url), qps=1, burst=2,
                              connections=1, timed=True) as client:
                await asyncio.gather(client.request("GET", "/a", timing=first),
                                     client.request("GET", "/b", timing=second))
                await client.request("GET", "/c", timing=third)
        finally:
            server.done.set()
            await runner.cleanup()
        return first, second, third

    first, second, third = asyncio.run(main())
    assert first.limit_s < 0.1 and second.limit_s < 0.1
    assert third.limit_s > 0.5  # waited for the bucket to refill
    assert first.wire_s >= 0.015 and second.wire_s >= 0.015  # the server's 20 ms
    # The second request waited for the first's connection; its own time on the wire does
    # not count that wait.
    assert second.connection_s >= 0.015
    assert second.connection_s > first.connection_s
    assert third.connection_s < 0.015  # the kept-alive connection was free


def test_an_untimed_client_counts_the_wait_for_a_connection_on_the_wire():
    async def main() -> RequestTiming:
        server = CountingServer()
        runner, url = await serve(server)
        second = RequestTiming()
        try:
            async with Client(KubeConfig(server=url), qps=100, burst=100,
                              connections=1) as client:  # no trace signals: not timed
                await asyncio.gather(client.request("GET", "/a"),
                                     client.request("GET", "/b", timing=second))
        finally:
            server.done.set()
            await runner.cleanup()
        return second

    second = asyncio.run(main())
    assert second.connection_s == 0.0
    assert second.wire_s >= 0.035  # its own 20 ms and the first request's, waited for
