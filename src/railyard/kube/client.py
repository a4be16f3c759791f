"""The few API verbs Railyard uses, over one aiohttp session and msgspec (decision 0071):
get, a paged list, create, patch, server-side apply, put, delete and a watch stream of raw
lines.

Every request takes a token from the client's rate limit (QPS/burst) and has a timeout; a
watch has a read timeout (the server sends a bookmark about once a minute, so a silent
connection is a dead one) and a limit on the size of one event line, so what the server
sends is bounded in both time and memory. Errors are `ApiError(status, reason, message)`
carrying the server's Status; a connection that fails is `ApiUnavailable`.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypeVar

import aiohttp
import msgspec

from railyard.kube.config import KubeConfig
from railyard.kube.objects import ObjectList, Status
from railyard.kube.ratelimit import RateLimit

T = TypeVar("T")

DEFAULT_QPS = 50.0
DEFAULT_BURST = 100
REQUEST_TIMEOUT_S = 30.0
# Connections to the API server for requests (watches have their own): past this, a request
# waits for one to come free. Each new connection is a TLS handshake that costs the API
# server about a millisecond of CPU; unbounded, a burst of slow binds opened 451 of them and
# tripled the API server's CPU per bound pod (docs/benchmarks.md, "Scheduling").
# client-go multiplexes HTTP/2 on one connection; aiohttp speaks HTTP/1.1 only. The
# extender's binds come in kube-scheduler's bursts and get 64 (decision 0115).
DEFAULT_CONNECTIONS = 16
# One watch event line (one object): 16 MiB is well above the 1.5 MiB etcd lets an object be.
MAX_LINE_BYTES = 16 << 20
WATCH_READ_TIMEOUT_S = 120.0
PAGE_SIZE = 500

_decode_status = msgspec.json.Decoder(Status).decode


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str, where: str) -> None:
        super().__init__(f"{where}: {status} {reason}: {message}" if message
                         else f"{where}: {status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def gone(self) -> bool:
        """410: the resourceVersion asked for is older than the server keeps."""
        return self.status == 410

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class ApiUnavailable(Exception):
    """The API server could not be reached, or the connection broke or timed out."""


class ApiUnreachable(ApiUnavailable):
    """No connection could be made at all (refused, no route): nothing was sent or lost."""


class WatchLineTooLong(ApiUnavailable):
    """A watch line longer than the client's limit: the stream is dropped, not buffered."""


def api_error(status: int, body: bytes, where: str) -> ApiError:
    try:
        s = _decode_status(body)
        return ApiError(status, s.reason or "Error", s.message, where)
    except msgspec.DecodeError:
        return ApiError(status, "Error", body[:200].decode("utf-8", "replace"), where)


@dataclass(slots=True)
class RequestTiming:
    """Where one request's time went on this side of the wire, for a caller that passes one
    (issue 28: Bindings took p99 0.3 s in the API server and 2.4-4.9 s at the extender)."""

    limit_s: float = 0.0  # waiting for the rate limit's token
    connection_s: float = 0.0  # waiting for a free connection of the pool, or making one
    wire_s: float = 0.0  # from a connection in hand to the answer read, loop delays included


async def _connection_wait_starts(_session: object, ctx: SimpleNamespace,
                                  _params: object) -> None:
    if isinstance(ctx.trace_request_ctx, RequestTiming):
        ctx.waiting_since = time.perf_counter()


async def _connection_wait_ends(_session: object, ctx: SimpleNamespace,
                                _params: object) -> None:
    timing = ctx.trace_request_ctx
    if isinstance(timing, RequestTiming):
        timing.connection_s += time.perf_counter() - ctx.waiting_since


def _connection_waits() -> aiohttp.TraceConfig:
    """aiohttp's trace signals for a connection: queued for one of the pool's, and making a
    new one (TCP, TLS); a request's `RequestTiming` sums both."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_queued_start.append(_connection_wait_starts)
    trace.on_connection_queued_end.append(_connection_wait_ends)
    trace.on_connection_create_start.append(_connection_wait_starts)
    trace.on_connection_create_end.append(_connection_wait_ends)
    return trace


PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",  # server-side apply; JSON is YAML
}


class Client:
    """One API server, one identity, one connection pool. Use as `async with`."""

    def __init__(self, config: KubeConfig, *, qps: float = DEFAULT_QPS,
                 burst: int = DEFAULT_BURST, timeout_s: float = REQUEST_TIMEOUT_S,
                 connections: int = DEFAULT_CONNECTIONS,
                 user_agent: str = "railyard", timed: bool = False) -> None:
        self.config = config
        self.limit = RateLimit(qps, burst)
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 10))
        self.connections = connections
        # aiohttp's trace signals, which time a request's wait for a connection, cost about
        # 0.1 ms a request (py-spy, issue 28): only a client whose callers read it has them.
        self.timed = timed
        self._ssl = config.ssl_context() if config.server.startswith("https:") else None
        self._user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None
        self._watch_session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for session in (self._session, self._watch_session):
            if session is not None:
                await session.close()
        self._session = self._watch_session = None

    def _new_session(self, connections: int, *, traced: bool = False
                     ) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False,
                                         limit=connections, enable_cleanup_closed=True)
        return aiohttp.ClientSession(
            connector=connector, timeout=self.timeout, skip_auto_headers=("User-Agent",),
            trace_configs=[_connection_waits()] if traced else None,
            headers={"User-Agent": self._user_agent, "Accept": "application/json"},
            json_serialize=lambda v: msgspec.json.encode(v).decode())

    def _open(self) -> aiohttp.ClientSession:
        """The requests' session: at most `connections` open, reused (keep-alive)."""
        if self._session is None:
            self._session = self._new_session(self.connections, traced=self.timed)
        return self._session

    def _open_watches(self) -> aiohttp.ClientSession:
        """The watches' session: each watch holds its connection for as long as it runs, so
        they never queue behind (or hold up) requests; their number is the caller's code's."""
        if self._watch_session is None:
            self._watch_session = self._new_session(0)
        return self._watch_session

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {}
        token = self.config.token.get() if self.config.token is not None else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                      body: Any = None, content_type: str = "application/json",
                      timeout_s: float | None = None,
                      before_send: Callable[[], float | None] | None = None,
                      server_deadline: bool = False,
                      timing: RequestTiming | None = None) -> bytes:
        """One request; the answer's body, or ApiError / ApiUnavailable (ApiUnreachable when
        no connection could be made). `before_send` is called once the rate limit lets the
        request go, right before it is sent: it may raise (nothing is sent), and the seconds
        it returns cap the request's timeout (None: no cap). `server_deadline` sends that
        timeout too, rounded up to the millisecond (the `timeout` query parameter): the API
        server then abandons the request when we do, so a write that failed here cannot
        start in storage later than that. `timing`, when given, is filled in (its
        `connection_s` only on a client made `timed`; else that wait is in `wire_s`)."""
        asked = time.perf_counter()
        await self.limit.wait()
        sent = time.perf_counter()
        if timing is not None:
            timing.limit_s = sent - asked
        if before_send is not None:
            cap = before_send()
            if cap is not None:
                timeout_s = max(min(timeout_s or self.timeout.total or cap, cap), 1e-3)
        deadline_s = timeout_s or self.timeout.total
        if server_deadline and deadline_s:
            params = {**(params or {}), "timeout": f"{math.ceil(1000 * deadline_s)}ms"}
        data = None if body is None else (
            body if isinstance(body, bytes) else msgspec.json.encode(body))
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        where = f"{method} {path}"
        try:
            async with self._open().request(
                    method, self.config.server + path, params=params, data=data,
                    headers=self._headers(content_type if data is not None else None),
                    timeout=timeout or self.timeout, trace_request_ctx=timing) as resp:
                content = await resp.read()
                if timing is not None:
                    timing.wire_s = time.perf_counter() - sent - timing.connection_s
                if resp.status >= 400:
                    raise api_error(resp.status, content, where)
                return content
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise ApiUnavailable(f"{where}: {type(e).__name__}: {e}") from e

    # ------------------------------------------------------------------ typed verbs

    async def get(self, path: str, type_: type[T],
                  params: Mapping[str, str] | None = None) -> T:
        return msgspec.json.decode(await self.request("GET", path, params=params), type=type_)

    async def list_page(self, path: str, type_: type[T], params: Mapping[str, str],
                        decoder: msgspec.json.Decoder[ObjectList[T]] | None = None
                        ) -> ObjectList[T]:
        body = await self.request("GET", path, params=params)
        if decoder is not None:
            return decoder.decode(body)
        return msgspec.json.decode(body, type=ObjectList[type_])  # type: ignore[valid-type]

    async def list(self, path: str, type_: type[T], *, params: Mapping[str, str] | None = None,
                   page_size: int = PAGE_SIZE) -> tuple[list[T], str]:
        """Every item, read in pages of `page_size` (bounded per response; the continue
        token keeps one snapshot), and the list's resourceVersion to watch from."""
        decoder: msgspec.json.Decoder[ObjectList[T]] = msgspec.json.Decoder(
            ObjectList[type_])  # type: ignore[valid-type]
        query = dict(params or {})
        query["limit"] = str(page_size)
        items: list[T] = []
        while True:
            page = await self.list_page(path, type_, query, decoder)
            items.extend(page.items)
            if not page.metadata.continue_:
                return items, page.metadata.resource_version
            query["continue"] = page.metadata.continue_

    async def create(self, path: str, body: Any, type_: type[T], *,
                     before_send: Callable[[], float | None] | None = None,
                     timeout_s: float | None = None, server_deadline: bool = False,
                     timing: RequestTiming | None = None) -> T:
        return msgspec.json.decode(
            await self.request("POST", path, body=body, before_send=before_send,
                               timeout_s=timeout_s, server_deadline=server_deadline,
                               timing=timing),
            type=type_)

    async def put(self, path: str, body: Any, type_: type[T]) -> T:
        return msgspec.json.decode(await self.request("PUT", path, body=body), type=type_)

    async def patch(self, path: str, body: Any, type_: type[T], *,
                    patch_type: str = "merge") -> T:
        raw = await self.request("PATCH", path, body=body,
                                 content_type=PATCH_TYPES[patch_type])
        return msgspec.json.decode(raw, type=type_)

    async def apply(self, path: str, body: Any, type_: type[T], *, field_manager: str,
                    force: bool = False) -> T:
        """Server-side apply of `body` as `field_manager`: the fields it names become that
        manager's, and a field another manager owns is a 409 conflict unless `force`."""
        raw = await self.request("PATCH", path, body=body, content_type=PATCH_TYPES["apply"],
                                 params={"fieldManager": field_manager,
                                         "force": "true" if force else "false"})
        return msgspec.json.decode(raw, type=type_)

    async def delete(self, path: str) -> None:
        await self.request("DELETE", path)

    # ------------------------------------------------------------------ watch

    async def watch_lines(self, path: str, params: Mapping[str, str], *,
                          read_timeout_s: float = WATCH_READ_TIMEOUT_S,
                          max_line_bytes: int = MAX_LINE_BYTES) -> AsyncIterator[bytes]:
        """The raw event lines of one watch request, until the server ends it. Raises
        ApiError when the server refuses it (410: too old), ApiUnavailable when the stream
        breaks, goes silent for `read_timeout_s`, or sends a line over `max_line_bytes`."""
        await self.limit.wait()
        where = f"WATCH {path}"
        query = dict(params)
        query["watch"] = "true"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout.sock_connect,
                                        sock_read=read_timeout_s)
        try:
            async with self._open_watches().get(self.config.server + path, params=query,
                                        headers=self._headers(), timeout=timeout) as resp:
                if resp.status >= 400:
                    raise api_error(resp.status, await resp.read(), where)
                buffer = bytearray()
                async for chunk in resp.content.iter_any():
                    start = 0
                    while (end := chunk.find(b"\n", start)) >= 0:
                        if buffer:
                            buffer += chunk[start:end]
                            line = bytes(buffer)
                            buffer.clear()
                        else:
                            line = chunk[start:end]
                        start = end + 1
                        if len(line) > max_line_bytes:
                            raise WatchLineTooLong(f"{where}: event line of {len(line)} "
                                                   f"bytes, over {max_line_bytes}")
                        if line:
                            yield line
                    buffer += chunk[start:]
                    if len(buffer) > max_line_bytes:
                        raise WatchLineTooLong(f"{where}: event line over "
                                               f"{max_line_bytes} bytes")
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise ApiUnavailable(f"{where}: {type(e).__name__}: {e}") from e
