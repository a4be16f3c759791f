"""Ranking rides on filter (decision 0104): filter answers exactly the fitting nodes that
prioritize would score best, so kube-scheduler needs one call before the bind; nodes that do
not fit are refused as before (preemption sees the same answer); a bind after that filter
decides on the loop from the answer filter left, with no search; `Allocated` Events can be
turned off, and go on a client of their own, never ahead of a Binding."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from scheduler_helpers import args, calls, pod

from railyard.allocation.allocator import Allocator
from railyard.allocation.request import Request
from railyard.scheduler.cluster_api import ClusterSync, PodBinder
from railyard.scheduler.cluster_file import BoundPod, cluster_from_spec
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState

SPEC = "dgx-h100:3,dgx-a100:2,xe8640:2,generic:2"


def _extender(filter_ranks: bool, spec: str = SPEC) -> Extender:
    return Extender(ClusterState(cluster_from_spec(spec)), filter_ranks=filter_ranks)


def _bind(uid: str, node: str) -> dict[str, str]:
    return {"PodName": f"pod-{uid}", "PodNamespace": "default", "PodUID": uid, "Node": node}


def _random_pod(rng: random.Random, uid: str) -> dict[str, Any]:
    gpus = rng.choice([0, 1, 2, 4, 8])
    vfs = gpus if gpus else rng.choice([1, 2])
    return pod(uid, gpus=gpus, vfs=vfs)


@pytest.mark.parametrize("seed", range(6))
def test_ranked_filter_answers_exactly_the_best_scored_of_the_nodes_that_fit(seed):
    """Both extenders see the same pods bound to the same nodes; after each, the ranked
    answer is the unranked one cut to its top score, ties all kept, refusals unchanged."""
    rng = random.Random(seed)
    ranked, unranked = _extender(True), _extender(False)
    names = ranked.state.node_names()
    compared = 0
    for i in range(40):
        p = _random_pod(rng, f"u{i}")
        got, plain, scores = calls(ranked, [("filter", args(p, names))]) + calls(
            unranked, [("filter", args(p, names)), ("prioritize", args(p, names))])
        score_of = {h["Host"]: h["Score"] for h in scores}
        fits = plain["NodeNames"]
        best = max((score_of[n] for n in fits), default=None)
        assert got["NodeNames"] == [n for n in fits if score_of[n] == best]
        assert got["FailedNodes"] == plain["FailedNodes"]
        assert got.get("FailedAndUnresolvableNodes") == plain.get("FailedAndUnresolvableNodes")
        if not fits:
            continue
        compared += len(fits) > len(got["NodeNames"])
        node = rng.choice(got["NodeNames"])
        for ext in (ranked, unranked):
            assert calls(ext, [("bind", _bind(f"u{i}", node))]) == [{"Error": ""}]
    assert compared > 0  # the ranking did cut some answers short


def test_ties_are_all_kept_and_a_pod_that_fits_nowhere_is_refused_as_before():
    ranked = _extender(True, "dgx-h100:3")
    names = ranked.state.node_names()
    (tied,) = calls(ranked, [("filter", args(pod("u1", gpus=2, vfs=2), names))])
    assert sorted(tied["NodeNames"]) == sorted(names)  # three empty, identical nodes
    (nowhere,) = calls(ranked, [("filter", args(pod("u2", gpus=9, vfs=9), names))])
    assert nowhere["NodeNames"] == []
    assert set(nowhere["FailedAndUnresolvableNodes"]) == set(names)


def test_the_lower_ranked_node_is_answered_once_it_is_the_only_one_that_fits():
    ranked = _extender(True, "dgx-h100:1,dgx-a100:1")
    names = ranked.state.node_names()
    first = calls(ranked, [("filter", args(pod("u1", gpus=8, vfs=8), names))])[0]["NodeNames"]
    assert first == ["dgx-h100-000"]  # PIX pairs there, farther ones on the dgx-a100
    calls(ranked, [("bind", _bind("u1", "dgx-h100-000"))])
    (second,) = calls(ranked, [("filter", args(pod("u2", gpus=8, vfs=8), names))])
    assert second["NodeNames"] == ["dgx-a100-000"]


class CountingAllocator(Allocator):
    """The real allocator, counting its searches (the memo answers without one)."""

    searches = 0

    def _search(self, *args: Any, **kwargs: Any) -> Any:
        self.searches += 1
        return super()._search(*args, **kwargs)


def test_a_bind_after_the_ranked_filter_does_no_search_and_stays_on_the_loop():
    counting = CountingAllocator()
    ext = Extender(ClusterState(cluster_from_spec("dgx-h100:2,generic:1"), counting))
    names = ext.state.node_names()
    p = pod("u1", gpus=4, vfs=4)
    (fits,) = calls(ext, [("filter", args(p, names))])
    after_filter = counting.searches
    assert after_filter > 0

    def no_worker(*_: Any) -> Any:
        raise AssertionError("the bind went to the search worker")
    ext._in_worker = no_worker  # type: ignore[method-assign]
    assert calls(ext, [("bind", _bind("u1", fits["NodeNames"][0]))]) == [{"Error": ""}]
    assert counting.searches == after_filter
    assert ext.state.pod("u1") is not None


class EventClient:
    """Takes the Binding, keeps the Events."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def create(self, path: str, body: Any, type_: object, **_: Any) -> None:
        if body.get("kind") == "Event":
            self.events.append(body)


@pytest.mark.parametrize("allocated_events", [True, False])
def test_allocated_events_are_sent_only_when_asked(allocated_events):
    state = ClusterState(cluster_from_spec("dgx-h100:1"))
    alloc = state.bind("u1", "ml", "p1", "dgx-h100-000", Request(gpus=2, vfs=2))

    async def main() -> list[dict[str, Any]]:
        client = EventClient()
        binder = PodBinder(client, ClusterSync(state),  # type: ignore[arg-type]
                           allocated_events=allocated_events)
        await binder.bind(BoundPod("ml", "p1", "u1", "dgx-h100-000", alloc))  # type: ignore[arg-type]
        await binder.events.drain()
        return client.events

    reasons = [e["reason"] for e in asyncio.run(main())]
    assert reasons == (["Allocated"] if allocated_events else [])


def test_events_go_on_their_own_client_and_the_binding_on_the_binders():
    state = ClusterState(cluster_from_spec("dgx-h100:1"))
    alloc = state.bind("u1", "ml", "p1", "dgx-h100-000", Request(gpus=2, vfs=2))

    class Recording(EventClient):
        def __init__(self) -> None:
            super().__init__()
            self.paths: list[str] = []

        async def create(self, path: str, body: Any, type_: object, **kw: Any) -> None:
            self.paths.append(path)
            await super().create(path, body, type_, **kw)

    binds, events = Recording(), Recording()

    async def main() -> None:
        binder = PodBinder(binds, ClusterSync(state),  # type: ignore[arg-type]
                           allocated_events=True, events_client=events)  # type: ignore[arg-type]
        await binder.bind(BoundPod("ml", "p1", "u1", "dgx-h100-000", alloc))  # type: ignore[arg-type]
        await binder.events.drain()

    asyncio.run(main())
    assert binds.paths == ["/api/v1/namespaces/ml/pods/p1/binding"] and binds.events == []
    assert [e["reason"] for e in events.events] == ["Allocated"]
