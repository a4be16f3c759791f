"""A throwaway aiohttp app on a free loopback port: the stand-in API servers of the tests that
speak HTTP to something not worth a box (a few API paths, canned answers)."""

from __future__ import annotations

import socket

from aiohttp import web


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """Start `app` on 127.0.0.1 at a port the kernel picks; its runner (the caller cleans it
    up) and base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    return runner, f"http://127.0.0.1:{sock.getsockname()[1]}"
