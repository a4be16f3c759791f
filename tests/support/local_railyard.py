"""Railyard's commands as local processes beside a box, and their HTTP endpoints on
127.0.0.1: what the box tests that run the chart's arguments with a service account's token
(not the image) share."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A port nothing listens on now, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(port: int, path: str, body: dict) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def get_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
        return json.loads(answer.read())


def start(argv: list[str], log: Path, **env: str) -> subprocess.Popen:
    """`railyard ARGV…` from this interpreter, its output appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "railyard.cli.main", *argv],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **env})


def stop(process: subprocess.Popen, log: Path) -> str:
    """SIGTERM (SIGKILL after 15 s) unless it has ended; what it wrote."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return log.read_text(errors="replace")
