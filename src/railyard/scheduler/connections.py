"""The extender's HTTP server sheds slow clients: deadlines per connection, a body limit.

aiohttp parses requests but has no deadline for a request's headers or body, so a client
that sends part of a request and stalls holds a connection (and a file descriptor) for as long
as it likes; enough of them reach the process's descriptor limit. Here, as Go's net/http does
with ReadHeaderTimeout and IdleTimeout: a connection that has started a request (or has just
been opened) must deliver the request's headers within `header_timeout_s`; one waiting idle
between requests is kept `idle_timeout_s`; a body must arrive within `body_timeout_s` and be
at most `max_body_bytes` (docs/decisions/0078).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

log = logging.getLogger("railyard.scheduler")

# The largest legitimate body is a /filter naming 5,000 nodes (kube-scheduler's supported
# cluster size) for the largest pod the API server stores: names of at most 253 characters
# (1.3 MB as a JSON list) plus a pod of at most 1.5 MiB (etcd's request limit) is 2.9 MB.
# A typical one (30-character names, a 10 kB pod) is 0.2 MB. 8 MiB leaves room for either.
MAX_BODY_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one client may cost the extender's HTTP server."""

    header_timeout_s: float = 10.0  # from a request's first byte (or the connection's opening)
    body_timeout_s: float = 10.0  # to read a whole body, once the handler asks for it
    # Between requests. Longer than the idle timeout of kube-scheduler's Go client (90 s), so
    # the client closes an idle connection first and never sends on one we are closing.
    idle_timeout_s: float = 120.0
    max_body_bytes: int = MAX_BODY_BYTES

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s", "max_body_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


# Why a client was shed, as the extender's metrics count it.
HEADER_TIMEOUT = "header_timeout"
BODY_TIMEOUT = "body_timeout"
BODY_TOO_LARGE = "body_too_large"
Shed = Callable[[str], None]  # told each time, with one of the reasons above


class BodyRefused(Exception):
    """A request body over the limit (413) or too slow to arrive (408)."""

    def __init__(self, status: int, reason: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.reason = reason
        self.text = text


async def read_body(request: web.Request, limits: HttpLimits) -> bytes:
    """The request's body within the limits; BodyRefused otherwise (`refusals` answers it)."""
    size = request.content_length
    limit = limits.max_body_bytes
    if size is not None and size > limit:
        raise BodyRefused(413, BODY_TOO_LARGE, _too_large(request.path, f"{size} bytes", limit))
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:  # no Content-Length: stopped at the limit
        raise BodyRefused(413, BODY_TOO_LARGE, _too_large(request.path, "more", limit)) from None
    except TimeoutError:
        raise BodyRefused(408, BODY_TIMEOUT, f"the request body for {request.path} did not "
                          f"arrive within {limits.body_timeout_s:g} s") from None


def _too_large(path: str, size: str, limit: int) -> str:
    return (f"request body for {path} is {size} than the extender's limit of {limit} bytes; "
            f"a /filter naming 5,000 nodes (nodeCacheCapable: true) is far below it")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def refusals(on_shed: Shed | None = None) -> Middleware:
    """The middleware that marks the connection busy while a request is handled (`Guard`),
    and answers a BodyRefused with its status, closing the connection (its unread rest is
    not worth reading)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        guard = _guard_of(request)
        if guard is not None:
            guard.request_started()
        try:
            return await handler(request)
        except BodyRefused as e:
            log.info("%s %s from %s: %s", request.method, request.path, request.remote, e.text)
            if on_shed is not None:
                on_shed(e.reason)
            response = web.Response(status=e.status, text=e.text)
            response.force_close()
            return response
        finally:
            if guard is not None:
                guard.request_done()

    return middleware


def _guard_of(request: web.Request) -> Guard | None:
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, Guard) else None


class Guard(asyncio.Protocol):
    """Stands between the transport and aiohttp's protocol for one connection and closes the
    connection when a request's headers are late: every call is passed on unchanged.

    The header clock starts when the connection opens, and when the first byte of a next
    request arrives on an idle one; it stops when the request reaches a handler (`refusals`
    says so). Bytes that arrive while a request is handled are its body, on its own clock.
    """

    def __init__(self, inner: asyncio.Protocol, limits: HttpLimits,
                 on_shed: Shed | None = None) -> None:
        self.inner = inner
        self.limits = limits
        self._on_shed = on_shed
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False

    # ------------------------------------------------------------------ clocks

    def _start_header_clock(self) -> None:
        if self._timer is None and self._transport is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.limits.header_timeout_s, self._late)

    def _stop_clock(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or self._busy:
            return
        peer = transport.get_extra_info("peername")
        log.info("closing a connection from %s: no complete request headers within %g s",
                 peer, self.limits.header_timeout_s)
        if self._on_shed is not None:
            self._on_shed(HEADER_TIMEOUT)
        transport.abort()

    def request_started(self) -> None:
        self._busy = True
        self._stop_clock()

    def request_done(self) -> None:
        self._busy = False  # idle now: aiohttp's keep-alive clock runs until the next byte

    # ------------------------------------------------------------------ protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self.inner.connection_made(transport)
        self._start_header_clock()

    def data_received(self, data: bytes) -> None:
        if not self._busy and data:
            self._start_header_clock()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_clock()
        self._transport = None
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections each go through a `Guard`; HTTPS with `tls`."""

    __slots__ = ("_host", "_limits", "_on_shed", "_port", "_tls")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: HttpLimits,
                 on_shed: Shed | None = None, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._limits = limits
        self._on_shed = on_shed
        self._tls = tls

    @property
    def name(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None  # the runner is set up before its sites start
        limits, on_shed = self._limits, self._on_shed
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Guard(server(), limits, on_shed), self._host, self._port,
            reuse_address=True, backlog=self._backlog, ssl=self._tls,
            # The handshake comes before the request's headers (whose clock starts once it
            # is done): a client that stalls in it is shed on the same deadline.
            ssl_handshake_timeout=limits.header_timeout_s if self._tls is not None else None)
