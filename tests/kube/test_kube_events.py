"""Events' one home (`kube.events`): the core v1 body, and the sender that writes in the
background, bounded, and never raises — a failing API costs a log line, not the caller."""

from __future__ import annotations

import asyncio
import logging

from railyard.kube.events import (
    MAX_MESSAGE_BYTES,
    WARNING,
    EventSender,
    event_body,
    event_time,
)

NODE = {"apiVersion": "v1", "kind": "Node", "name": "box-node", "uid": "u-1"}


def _body(message: str = "link down", **involved: str) -> dict:
    return event_body(NODE | involved, "default", "RailyardDeviceUnhealthy", message,
                      type_=WARNING, component="railyard-agent", instance="box-node",
                      host="box-node", now="2026-01-01T00:00:00Z")


class RecordingClient:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.created: list[tuple[str, dict]] = []

    async def create(self, path: str, body: dict, type_: object) -> None:
        if self.fail:
            raise ConnectionError("API server down")
        self.created.append((path, body))


def test_an_event_body_is_a_core_v1_event_about_the_object_in_the_namespace_given():
    body = _body()
    assert body["apiVersion"] == "v1" and body["kind"] == "Event"
    assert body["metadata"]["namespace"] == "default"
    assert body["metadata"]["name"].startswith("box-node.")
    assert body["involvedObject"] == NODE
    assert (body["type"], body["reason"], body["message"]) == (
        "Warning", "RailyardDeviceUnhealthy", "link down")
    assert body["source"] == {"component": "railyard-agent", "host": "box-node"}
    assert (body["reportingComponent"], body["reportingInstance"]) == ("railyard-agent",
                                                                       "box-node")
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-01-01T00:00:00Z"
    assert body["count"] == 1
    assert _body()["metadata"]["name"] != body["metadata"]["name"]  # each its own


def test_a_long_message_is_cut_to_a_kibibyte_without_splitting_a_character():
    message = _body("↔" * 1000)["message"]
    assert len(message.encode()) <= MAX_MESSAGE_BYTES
    assert set(message) == {"↔"}


def test_event_time_is_rfc3339_to_the_second_in_utc():
    stamp = event_time()
    assert len(stamp) == 20 and stamp.endswith("Z") and stamp[10] == "T"


def test_the_sender_writes_in_the_background_to_the_events_of_the_namespace():
    async def main() -> list[tuple[str, dict]]:
        client = RecordingClient()
        sender = EventSender(client)  # type: ignore[arg-type]
        body = _body()
        assert sender.send(body)
        assert client.created == []  # not on the caller's path
        await sender.drain()
        return client.created

    ((path, body),) = asyncio.run(main())
    assert path == "/api/v1/namespaces/default/events"
    assert body["reason"] == "RailyardDeviceUnhealthy"


def test_a_failing_api_is_logged_and_never_raised_to_the_caller(caplog):
    async def main() -> EventSender:
        sender = EventSender(RecordingClient(fail=True))  # type: ignore[arg-type]
        assert sender.send(_body())
        await sender.drain()
        return sender

    with caplog.at_level(logging.WARNING, "railyard.kube.events"):
        sender = asyncio.run(main())
    assert not sender.pending and sender.dropped == 0
    assert "RailyardDeviceUnhealthy on Node box-node not written: API server down" in caplog.text


def test_a_failing_fill_still_writes_the_event_without_what_it_would_add():
    async def main() -> list[tuple[str, dict]]:
        client = RecordingClient()
        sender = EventSender(client)  # type: ignore[arg-type]

        async def fill(body: dict) -> None:
            raise ConnectionError("no node")

        body = _body()
        del body["involvedObject"]["uid"]
        sender.send(body, fill=fill)
        await sender.drain()
        return client.created

    ((_, body),) = asyncio.run(main())
    assert "uid" not in body["involvedObject"]


def test_past_the_bound_new_events_are_dropped_and_counted():
    async def main() -> tuple[int, int, int]:
        release = asyncio.Event()
        client = RecordingClient()

        async def stalled(path: str, body: dict, type_: object) -> None:
            await release.wait()
            client.created.append((path, body))

        client.create = stalled  # type: ignore[method-assign]
        sender = EventSender(client, max_pending=3)  # type: ignore[arg-type]
        accepted = sum(sender.send(_body()) for _ in range(5))
        release.set()
        await sender.drain()
        return accepted, len(client.created), sender.dropped

    assert asyncio.run(main()) == (3, 3, 2)
