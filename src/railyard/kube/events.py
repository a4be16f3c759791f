"""Kubernetes Events, the one home for both services: the body of a core v1 Event, and a
sender that writes them off the caller's path with a bound on how many are in flight.

Events are notes for people. Losing one loses no record, so a write that fails is logged and
forgotten, and past `MAX_PENDING_EVENTS` in flight a new one is dropped and counted rather than
queued ahead of the writes that matter (binds, NodeTopology status) for the client's QPS.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

from railyard.kube.client import Client

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"
# Events in flight at once; past this a new one is dropped (and counted).
MAX_PENDING_EVENTS = 256
# events.k8s.io/v1 refuses a note over 1 KiB; core v1 Events are kept to the same.
MAX_MESSAGE_BYTES = 1024


def event_time(now: datetime | None = None) -> str:
    """An Event's first/last timestamp: RFC 3339 to the second, UTC."""
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(involved: Mapping[str, str], namespace: str, reason: str, message: str, *,
               type_: str = NORMAL, component: str, instance: str, now: str,
               host: str | None = None) -> dict[str, Any]:
    """A core v1 Event about `involved` (its apiVersion, kind, name and, where known,
    namespace and uid), written in `namespace`: the object's own, or `default` for a
    cluster-scoped object such as a Node (as kubelet does). `count` 1: each is its own."""
    source = {"component": component} | ({"host": host} if host else {})
    return {
        "apiVersion": "v1", "kind": "Event",
        # The object's name and a random suffix, as client-go's recorder names them.
        "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:16]}",
                     "namespace": namespace},
        "involvedObject": dict(involved),
        "reason": reason, "message": _cut(message, MAX_MESSAGE_BYTES), "type": type_,
        "source": source, "reportingComponent": component, "reportingInstance": instance,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


def _cut(text: str, limit: int) -> str:
    """`text` in at most `limit` bytes of UTF-8, never splitting a character."""
    return text.encode()[:limit].decode(errors="ignore")


class EventSender:
    """Writes Events in the background, at most `max_pending` at once (`pending` holds
    those in flight; `dropped` counts those refused for it). Never raises to the caller."""

    def __init__(self, client: Client, max_pending: int = MAX_PENDING_EVENTS) -> None:
        self.client = client
        self.max_pending = max_pending
        self.pending: set[asyncio.Task[None]] = set()
        self.dropped = 0

    def send(self, body: dict[str, Any], *,
             fill: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> bool:
        """Write `body` in the background; False when it was dropped. `fill`, when given,
        is awaited first, in the background too, to add what needs a request to learn (the
        Node's uid); its failure is logged and the Event is written without it."""
        if len(self.pending) >= self.max_pending:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("%d Event(s) dropped: %d already being sent", self.dropped,
                            self.max_pending)
            return False
        involved = body["involvedObject"]
        where = f"{involved['namespace']}/" if involved.get("namespace") else ""
        about = f"{involved['kind']} {where}{involved['name']}"
        path = f"/api/v1/namespaces/{body['metadata']['namespace']}/events"

        async def write() -> None:
            if fill is not None:
                try:
                    await fill(body)
                except Exception as e:
                    log.info("event %s on %s: %s", body["reason"], about, e)
            try:
                await self.client.create(path, body, msgspec.Raw)
            except Exception as e:
                log.warning("event %s on %s not written: %s", body["reason"], about, e)

        task = asyncio.ensure_future(write())
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
        return True

    async def drain(self) -> None:
        """Wait for the Events in flight (a test, or a service stopping cleanly)."""
        while self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)

    def cancel(self) -> None:
        for task in self.pending:
            task.cancel()
