"""A pod's `preferDistance` through the extender (decision 0091): prioritize ranks the nodes
that meet it first, filter never drops a node for it, bind records the affinity, counts the
pod by its worst pair, says it in the decision line, and an Event tells a pod that fell back."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from scheduler_helpers import args, calls, pod

from railyard.allocation.request import Request, parse_request_spec
from railyard.scheduler.cluster_api import (
    AFFINITY_FALLBACK,
    ClusterSync,
    PodBinder,
    fallback_text,
)
from railyard.scheduler.cluster_file import BoundPod, cluster_from_spec
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState

PIX_NODE, NODE_NODE, PHB_NODE = "dgx-h100-000", "xe8640-000", "generic-000"
LOGGER = "railyard.scheduler"


def _extender(spec: str = "dgx-h100:1,xe8640:1,generic:1", *,
              filter_ranks: bool = True) -> Extender:
    return Extender(ClusterState(cluster_from_spec(spec)), filter_ranks=filter_ranks)


def _pod(uid: str, gpus: int, prefer: str | None) -> dict:
    return pod(uid, gpus=gpus, vfs=gpus, name=uid, namespace="ml",
               hints={"preferDistance": prefer} if prefer else None)


def _request(gpus: int, prefer: str) -> Request:
    return parse_request_spec(f"gpus={gpus},vfs={gpus}", json.dumps({"preferDistance": prefer}))


def _bind(uid: str, node: str) -> dict:
    return {"PodName": uid, "PodNamespace": "ml", "PodUID": uid, "Node": node}


def _metric(ext: Extender, level: str, preference: str) -> float:
    value = ext.metrics.registry.get_sample_value(
        "railyard_extender_affinity_achieved_total", {"level": level, "preference": preference})
    return value or 0.0


def test_filter_keeps_every_node_that_fits_whatever_the_pod_prefers():
    # Unranked (--no-filter-ranks, for the configuration with prioritize): the preference
    # is a score, never a reason to fail a node.
    names = [PIX_NODE, NODE_NODE, PHB_NODE]
    plain, preferring = calls(_extender(filter_ranks=False), [
        ("filter", args(_pod("a", 2, None), names)),
        ("filter", args(_pod("b", 2, "PIX"), names))])
    assert sorted(preferring["NodeNames"]) == sorted(plain["NodeNames"]) == sorted(names)


def test_prioritize_ranks_nodes_meeting_a_phb_preference_above_those_beyond_it():
    names = [NODE_NODE, PHB_NODE]
    plain, preferring = calls(_extender(), [
        ("prioritize", args(_pod("a", 2, None), names)),
        ("prioritize", args(_pod("b", 2, "PHB"), names))])
    plain_of = {h["Host"]: h["Score"] for h in plain}
    pref_of = {h["Host"]: h["Score"] for h in preferring}
    assert plain_of[PHB_NODE] == plain_of[NODE_NODE]  # no preference: both beyond PXB, tied
    assert pref_of[PHB_NODE] > pref_of[NODE_NODE] > 0


def test_a_bind_that_falls_back_is_recorded_counted_and_logged(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    ext = _extender()
    p = _pod("t1", 4, "PIX")
    _, bound = calls(ext, [("filter", args(p, [NODE_NODE])), ("bind", _bind("t1", NODE_NODE))])
    assert bound["Error"] == ""
    held = ext.state.pod("t1")
    assert held is not None and held.allocation is not None
    affinity = held.allocation.affinity
    assert affinity is not None and (affinity.preferred.name, affinity.achieved.name) == (
        "PIX", "NODE")
    assert _metric(ext, "NODE", "fallback") == 1
    assert _metric(ext, "NODE", "met") == _metric(ext, "NODE", "none") == 0
    [line] = [r.getMessage() for r in caplog.records
              if r.name == LOGGER and r.getMessage().startswith("decision=bind ")]
    assert " worst=NODE " in line and " preferred=PIX achieved=NODE fallback=true" in line


def test_binds_without_a_preference_or_meeting_it_count_under_their_own_label():
    ext = _extender()
    calls(ext, [("filter", args(_pod("a", 2, None), [PIX_NODE])), ("bind", _bind("a", PIX_NODE)),
                ("filter", args(_pod("b", 2, "PXB"), [PIX_NODE])), ("bind", _bind("b", PIX_NODE))])
    assert _metric(ext, "PIX", "none") == 1 and _metric(ext, "PIX", "met") == 1
    assert "railyard_extender_affinity_achieved_total" in ext.metrics.render().decode()


def test_the_fallback_event_names_the_preference_what_was_achieved_and_the_short_pairs():
    ext = _extender()
    calls(ext, [("filter", args(_pod("t1", 4, "PIX"), [NODE_NODE])),
                ("bind", _bind("t1", NODE_NODE))])
    alloc = ext.state.pod("t1").allocation  # type: ignore[union-attr]
    assert alloc is not None
    text = fallback_text(alloc)
    assert text is not None
    assert text.startswith(f"preferDistance PIX not met: worst pair NODE on {NODE_NODE}")
    short = [p for p in alloc.pairs if p.distance.name != "PIX"]
    assert f"{len(short)} of {len(alloc.pairs)} pairs beyond PIX" in text


def test_the_binder_sends_the_fallback_event_only_for_a_pod_that_fell_back():
    class Client:
        def __init__(self) -> None:
            self.events: list[dict] = []

        async def create(self, path: str, body: Any, type_: object, **_: Any) -> None:
            if body.get("kind") == "Event":
                self.events.append(body)

    state = ClusterState(cluster_from_spec("xe8640:1,dgx-h100:1"))
    fell = state.bind("u1", "ml", "p1", NODE_NODE, _request(4, "PIX"))
    met = state.bind("u2", "ml", "p2", PIX_NODE, _request(2, "PIX"))

    async def main() -> list[dict]:
        client = Client()
        binder = PodBinder(client, ClusterSync(state),  # type: ignore[arg-type]
                           allocated_events=True)
        for uid, name, node, alloc in (("u1", "p1", NODE_NODE, fell), ("u2", "p2", PIX_NODE, met)):
            await binder.bind(BoundPod("ml", name, uid, node, alloc))  # type: ignore[arg-type]
        await binder.events.drain()
        return client.events

    events = asyncio.run(main())
    fallbacks = [e for e in events if e["reason"] == AFFINITY_FALLBACK]
    assert [e["involvedObject"]["uid"] for e in fallbacks] == ["u1"]
    assert fallbacks[0]["type"] == "Normal"
    assert sorted(e["involvedObject"]["uid"] for e in events if e["reason"] == "Allocated") == [
        "u1", "u2"]
