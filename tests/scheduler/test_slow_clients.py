"""The extender's HTTP server sheds slow and oversized clients, over real sockets
(docs/decisions/0078): late headers close the connection, a late body is a 408, a body over
the limit a 413 that says what the limit is for; the largest legitimate /filter passes."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from scheduler_helpers import args, pod

from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.scheduler.connections import MAX_BODY_BYTES, HttpLimits
from railyard.scheduler.service import Extender, bound_port, start
from railyard.scheduler.state import ClusterState
from railyard.scheduler.wire import MAX_NODE_NAMES

FAST = HttpLimits(header_timeout_s=0.5, body_timeout_s=0.5, idle_timeout_s=30.0)


def extender(limits: HttpLimits = FAST) -> Extender:
    return Extender(ClusterState(cluster_from_spec("dgx-h100:2")), limits=limits)


async def serve(ext: Extender):
    runner = await start(ext, "127.0.0.1", 0)
    return runner, bound_port(runner)


async def closed_within(reader: asyncio.StreamReader, limit_s: float) -> float:
    """Seconds until the server closes the connection (reads to EOF)."""
    t0 = time.monotonic()
    async with asyncio.timeout(limit_s):
        while await reader.read(65536):
            pass
    return time.monotonic() - t0


async def healthz(port: int) -> tuple[int, float]:
    """Status of GET /healthz on a fresh connection, and how long it took."""
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head = await asyncio.wait_for(reader.readline(), 1.0)
    writer.close()
    return int(head.split()[1]), time.monotonic() - t0


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:]
                                                     if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers, body


async def post_filter(ext: Extender, body: bytes,
                      timeout_s: float) -> tuple[int, dict[str, str], bytes]:
    """One whole POST /filter on a fresh connection to a fresh server, and its answer."""
    runner, port = await serve(ext)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = await asyncio.wait_for(response(reader), timeout_s)
        writer.close()
        return got
    finally:
        await runner.cleanup()


def metric(ext: Extender, reason: str) -> float:
    text = ext.metrics.render().decode()
    key = f'railyard_extender_shed_clients_total{{reason="{reason}"}}'
    return next((float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith(key)), 0.0)


def test_a_client_that_stalls_in_its_headers_is_disconnected_and_others_are_served():
    ext = extender()

    async def scenario():
        runner, port = await serve(ext)
        try:
            stalled = []
            for _ in range(20):  # half-open requests: each stops mid-header
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Le")
                stalled.append((reader, writer))
            status, took = await healthz(port)
            waits = [await closed_within(r, 3.0) for r, _ in stalled]
            return status, took, waits
        finally:
            await runner.cleanup()

    status, took, waits = asyncio.run(scenario())
    assert status == 200 and took < 1.0
    assert all(w < 2.0 for w in waits)  # closed at the 0.5 s header deadline
    assert metric(ext, "header_timeout") == 20


def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline():
    ext = extender()

    async def scenario():
        runner, port = await serve(ext)
        try:
            reader, _ = await asyncio.open_connection("127.0.0.1", port)
            return await closed_within(reader, 3.0)
        finally:
            await runner.cleanup()

    assert 0.4 < asyncio.run(scenario()) < 2.0


def test_a_header_sent_one_byte_at_a_time_past_the_deadline_is_cut_off():
    ext = extender()

    async def scenario():
        runner, port = await serve(ext)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            t0 = time.monotonic()
            with pytest.raises((ConnectionError, AssertionError)):
                for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    assert not reader.at_eof()
            await closed_within(reader, 3.0)
            return time.monotonic() - t0
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) < 2.5


def test_a_kept_alive_connection_waits_idle_beyond_the_header_deadline():
    """Between requests the idle timeout applies (longer than kube-scheduler's client's),
    not the header deadline: kube-scheduler reuses its connections."""
    ext = extender()

    async def scenario():
        runner, port = await serve(ext)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            statuses = []
            for _ in range(2):
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                statuses.append((await response(reader))[0])
                await asyncio.sleep(1.0)  # twice the header deadline, idle
            writer.close()
            return statuses
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) == [200, 200]


def test_a_body_that_stalls_is_answered_408_and_the_connection_closed():
    ext = extender()

    async def scenario():
        runner, port = await serve(ext)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"Pod\": ")
            t0 = time.monotonic()
            status, headers, body = await asyncio.wait_for(response(reader), 3.0)
            took = time.monotonic() - t0
            await closed_within(reader, 3.0)
            health = await healthz(port)
            return status, headers, body.decode(), took, health
        finally:
            await runner.cleanup()

    status, headers, body, took, health = asyncio.run(scenario())
    assert status == 408 and took < 2.0 and health[0] == 200
    assert body == "the request body for /filter did not arrive within 0.5 s"
    assert headers.get("connection", "").lower() == "close"
    assert metric(ext, "body_timeout") == 1


def test_a_body_over_the_limit_is_refused_413_before_it_is_read():
    ext = extender()

    async def scenario():
        runner, port = await serve(ext)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 57000000\r\n\r\n")  # the attack's 57 MB, unsent
            t0 = time.monotonic()
            got = await asyncio.wait_for(response(reader), 2.0)
            writer.close()
            return got, time.monotonic() - t0
        finally:
            await runner.cleanup()

    (status, _, body), took = asyncio.run(scenario())
    assert status == 413 and took < 1.0
    assert body.decode() == (
        f"request body for /filter is 57000000 bytes than the extender's limit of "
        f"{MAX_BODY_BYTES} bytes; a /filter naming 5,000 nodes (nodeCacheCapable: true) is far "
        f"below it")
    assert metric(ext, "body_too_large") == 1


def test_a_chunked_body_over_the_limit_is_cut_off_at_the_limit():
    ext = extender(HttpLimits(header_timeout_s=5, body_timeout_s=5, max_body_bytes=1 << 20))

    async def scenario():
        runner, port = await serve(ext)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            chunk = b"x" * 65536
            sent = 0
            try:
                while sent < 4 << 20:  # four times the limit, unless cut off first
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    await writer.drain()
                    sent += len(chunk)
            except ConnectionError:
                pass
            got = await asyncio.wait_for(response(reader), 3.0)
            writer.close()
            return got
        finally:
            await runner.cleanup()

    status, _, body = asyncio.run(scenario())
    assert status == 413
    assert body.decode().startswith("request body for /filter is more than the extender's "
                                    "limit of 1048576 bytes")


def test_the_largest_legitimate_filter_passes_the_limit():
    """5,000 node names of 253 characters (the longest a name may be) and a pod near 1.5 MiB
    (the most the API server stores): 2.9 MB, under the 8 MiB limit with room to spare."""
    ext = extender(HttpLimits())
    names = [f"{i:05d}-" + "n" * 247 for i in range(5000)]
    big = pod("u1", gpus=1, vfs=1)
    big["spec"]["containers"][0]["env"] = [{"name": f"V{i}", "value": "v" * 1000}
                                           for i in range(1500)]
    body = json.dumps(args(big, names)).encode()
    assert 2_800_000 < len(body) < MAX_BODY_BYTES / 2

    status, _, reply = asyncio.run(post_filter(ext, body, 10.0))
    assert status == 200
    answer = json.loads(reply)
    assert answer["Error"] == "" and len(answer["FailedAndUnresolvableNodes"]) == 5000


@pytest.mark.parametrize("field", ["header_timeout_s", "body_timeout_s", "idle_timeout_s",
                                   "max_body_bytes"])
def test_limits_must_be_positive(field):
    with pytest.raises(ValueError, match=field):
        HttpLimits(**{field: 0})


def test_a_filter_naming_more_nodes_than_any_cluster_is_refused_before_any_search():
    ext = extender(HttpLimits())
    names = [f"n{i}" for i in range(MAX_NODE_NAMES + 1)]
    body = json.dumps(args(pod("u1", gpus=1, vfs=1), names)).encode()

    status, _, reply = asyncio.run(post_filter(ext, body, 5.0))
    answer = json.loads(reply)
    assert status == 200 and answer["NodeNames"] is None
    assert answer["Error"] == (f"ExtenderArgs: Expected `array` of length <= {MAX_NODE_NAMES}"
                               f" - at `$.NodeNames`")
    assert ext.state.allocator.explored == 0  # type: ignore[attr-defined]
