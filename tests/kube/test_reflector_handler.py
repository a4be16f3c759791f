"""A Reflector's change handler that raises does not stop the watch (kube.reflector._emit):
the error is logged and counted, and the next change is handed over as before."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from railyard.kube.objects import ObjectMeta, Pod
from railyard.kube.reflector import Change, Reflector


def test_a_handler_that_raises_is_logged_and_the_next_change_still_comes(
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def handler(change: Change[Pod]) -> None:
        if change.key == "ml/bad":
            raise ValueError("a record the handler did not expect")
        seen.append(change.key)

    client: Any = None  # _emit never talks to the API server
    r = Reflector(client, "/api/v1/pods", Pod, on_change=handler)
    with caplog.at_level(logging.ERROR, logger="railyard.kube.reflector"):
        r._replace({"ml/bad": Pod(ObjectMeta(name="bad", namespace="ml")),
                    "ml/ok": Pod(ObjectMeta(name="ok", namespace="ml"))})
    assert seen == ["ml/ok"] and r.handler_errors == 1
    assert "ml/bad" in caplog.text and "a record the handler did not expect" in caplog.text
