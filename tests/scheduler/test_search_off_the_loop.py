"""A search never blocks the extender (docs/decisions/0077): the allocator runs in a worker
thread, outside the node locks, so `/healthz` and the loop's own work go on meanwhile; a
bind holds devices only on the node as it is when it commits; a spent budget is never kept
as a group's answer, and one call's searches are capped in all."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import pytest
from scheduler_helpers import args, pod, served

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible
from railyard.scheduler.cluster_file import BoundPod, cluster_from_spec
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState, NeedsSearch
from railyard.scheduler.wire import pod_facts
from railyard.topology.model import NodeTopology

HOSTILE = {"maxDistance": "PIX", "pairing": "one-to-one"}  # with 2 GPUs, 32 VFs, 1 whole PF


class SlowAllocator:
    """The real allocator, but `allocate` first waits for `go` (at most `wait_s`) and may run
    `during` in another thread meanwhile, as the event loop would."""

    def __init__(self, wait_s: float = 0.0) -> None:
        self.inner = Allocator()
        self.go = threading.Event()
        self.wait_s = wait_s
        self.started = threading.Event()
        self.during: list = []  # callables, run once each, in the first searches
        self.calls = 0

    def allocate(self, topology: NodeTopology, ledger: Ledger, request: Request):
        self.calls += 1
        self.started.set()
        if self.during:
            t = threading.Thread(target=self.during.pop(0))
            t.start()
            t.join(2.0)
            assert not t.is_alive(), "the other change waited for this search"
        self.go.wait(self.wait_s)
        return self.inner.allocate(topology, ledger, request)

    def node_score(self, topology, ledger, request):
        return self.inner.node_score(topology, ledger, request)

    def group_key(self, topology, ledger):
        return self.inner.group_key(topology, ledger)


def test_healthz_and_metrics_answer_within_a_second_while_a_search_is_in_flight():
    slow = SlowAllocator(wait_s=5.0)
    ext = Extender(ClusterState(cluster_from_spec("dgx-h100:2"), slow))

    async def scenario():
        async with served(ext) as url, aiohttp.ClientSession() as s:
            body = args(pod("u1", gpus=2, vfs=2), ["dgx-h100-000", "dgx-h100-001"])
            filtering = asyncio.ensure_future(s.post(f"{url}/filter", json=body))
            while not slow.started.is_set():
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            timeout = aiohttp.ClientTimeout(total=1.0)
            async with s.get(f"{url}/healthz", timeout=timeout) as r:
                health = (r.status, await r.text(), time.monotonic() - t0)
            async with s.get(f"{url}/metrics", timeout=timeout) as r:
                metrics = r.status
            assert not filtering.done()  # the search is still waiting
            slow.go.set()
            async with await filtering as r:
                return health, metrics, r.status, await r.json()

    health, metrics, status, body = asyncio.run(scenario())
    assert health[:2] == (200, "ok") and health[2] < 1.0
    assert metrics == 200
    assert status == 200 and body["NodeNames"] == ["dgx-h100-000", "dgx-h100-001"]


def test_a_hostile_pod_is_refused_on_every_node_and_healthz_answers_meanwhile():
    ext = Extender(ClusterState(cluster_from_spec("dgx-h100:3")))
    names = ext.state.node_names()

    async def scenario():
        async with served(ext) as url, aiohttp.ClientSession() as s:
            hostile = pod("evil", gpus=2, vfs=32, pfs=1, hints=HOSTILE)
            t0 = time.monotonic()
            filtering = asyncio.ensure_future(s.post(f"{url}/filter", json=args(hostile, names)))
            await asyncio.sleep(0.05)
            slowest = 0.0
            while not filtering.done():
                t = time.monotonic()
                async with s.get(f"{url}/healthz",
                                 timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                    assert r.status == 200
                slowest = max(slowest, time.monotonic() - t)
                await asyncio.sleep(0.05)
            async with await filtering as r:
                first = (await r.json(), time.monotonic() - t0)
            t0 = time.monotonic()
            async with s.post(f"{url}/filter", json=args(hostile, names)) as r:
                again = (await r.json(), time.monotonic() - t0)
            return first, again, slowest

    (body, took), (body2, took2), slowest = asyncio.run(scenario())
    assert slowest < 1.0
    assert body["Error"] == "" and body["NodeNames"] == []
    assert set(body["FailedAndUnresolvableNodes"]) == set(names)
    assert all(reason.startswith("search budget spent:")
               for reason in body["FailedAndUnresolvableNodes"].values())
    # One search for the three idle nodes (one group); asked again, the allocator knows
    # the budget was spent without searching.
    assert body2 == body and took2 < took


def test_a_release_during_a_binds_search_is_not_waited_for_and_not_lost():
    slow = SlowAllocator()
    state = ClusterState(cluster_from_spec("dgx-h100:1"), slow)
    node = "dgx-h100-000"
    other = state.bind("other", "ml", "other", node, Request(gpus=4, vfs=4))
    assert isinstance(other, Allocation)
    slow.calls = 0
    slow.during.append(lambda: state.release("other"))
    got = state.bind("new", "ml", "new", node, Request(gpus=8, vfs=8))
    # The first search saw 4 GPUs held (no room), the release came meanwhile: the bind
    # answered from the node as it was. kube-scheduler retries; the next bind fits.
    assert isinstance(got, Infeasible) and state.pod("other") is None
    got = state.bind("new", "ml", "new", node, Request(gpus=8, vfs=8))
    assert isinstance(got, Allocation) and len(got.pairs) == 8


def test_a_bind_committed_during_another_binds_search_makes_it_decide_again():
    slow = SlowAllocator()
    state = ClusterState(cluster_from_spec("dgx-h100:1"), slow)
    node = "dgx-h100-000"
    first: list = []
    slow.during.append(lambda: first.append(
        state.bind("b", "ml", "b", node, Request(gpus=4, vfs=4))))
    a = state.bind("a", "ml", "a", node, Request(gpus=4, vfs=4))
    assert isinstance(a, Allocation) and isinstance(first[0], Allocation)
    b = first[0]
    # Both chose NUMA 0's four GPUs on the empty node; `a` saw `b` commit first, decided
    # again, and took the others: no device held twice.
    assert {p.gpu.index for p in b.pairs} == {0, 1, 2, 3}
    assert {p.gpu.index for p in a.pairs} == {4, 5, 6, 7}
    assert not {p.nic.pci_address for p in a.pairs} & {p.nic.pci_address for p in b.pairs}
    assert slow.calls == 3  # a, b, then a again
    assert {h for h, _ in state.ledger(node).holders()} == {"a", "b"}


def test_a_pod_restored_during_a_binds_search_is_kept():
    slow = SlowAllocator()
    state = ClusterState(cluster_from_spec("dgx-h100:1"), slow)
    node = "dgx-h100-000"
    recorded = Allocator().allocate(state.topology(node), Ledger(state.topology(node)),
                                    Request(gpus=4, vfs=4))
    assert isinstance(recorded, Allocation)
    slow.during.append(lambda: state.restore([BoundPod("ml", "seen", "seen", node, recorded)]))
    a = state.bind("a", "ml", "a", node, Request(gpus=4, vfs=4))
    assert isinstance(a, Allocation)
    assert {h for h, _ in state.ledger(node).holders()} == {"a", "seen"}
    assert not {p.gpu.index for p in a.pairs} & {p.gpu.index for p in recorded.pairs}


def test_a_spent_budget_is_not_kept_as_the_groups_answer():
    alloc = Allocator(search_budget=20)
    state = ClusterState(cluster_from_spec("dgx-h100:2"), alloc)
    request = Request(gpus=1, vfs=12, pfs=1)  # about a hundred states to the answer
    out = state.filter(request, state.node_names())
    assert out.fits == [] and not out.failed
    assert all(r.startswith("search budget spent:") for r in out.unresolvable.values())
    assert state.scores(request, state.node_names()) == {n: 0 for n in state.node_names()}
    alloc.search_budget = 10_000
    assert state.filter(request, state.node_names()).fits == state.node_names()
    assert set(state.scores(request, state.node_names()).values()) != {0}


def test_one_filter_call_searches_at_most_its_budget_then_defers_the_other_groups():
    alloc = Allocator(search_budget=None)
    state = ClusterState(cluster_from_spec("dgx-h100:6"), alloc, call_budget=100)
    names = state.node_names()
    for i, name in enumerate(names):  # six free states: six groups
        assert isinstance(state.bind(f"p{i}", "ml", f"p{i}", name, Request(vfs=i + 1)),
                          Allocation)
    alloc.search_budget = 50
    request = Request(gpus=1, vfs=12, pfs=1)
    seen = []
    for _ in range(len(names)):
        before = alloc.explored
        out = state.filter(request, names)
        assert alloc.explored - before <= 100 + 50 + 1_000
        assert not out.fits and set(out.unresolvable) == set(names)
        deferred = [n for n, r in out.unresolvable.items() if r.startswith("not decided")]
        seen.append(len(deferred))
        if not deferred:
            break
    assert seen[0] > 0 and seen[-1] == 0  # later calls go on from what was decided
    assert all(r.startswith("search budget spent:") for r in out.unresolvable.values())


def test_a_full_node_is_refused_for_its_count_when_the_empty_nodes_search_spends_the_budget():
    alloc = Allocator(search_budget=None)
    state = ClusterState(cluster_from_spec("dgx-h100:1"), alloc)
    node = "dgx-h100-000"
    assert isinstance(state.bind("all", "ml", "all", node, Request(gpus=8)), Allocation)
    alloc.search_budget = 20
    request = Request(gpus=1, vfs=12, pfs=1)
    out = state.filter(request, [node])
    assert out.failed == {node: "1 GPUs requested but only 0 of 8 free"}
    alloc.search_budget = None
    assert state.filter(request, [node]).failed == out.failed  # a fact: kept, still true


def test_a_filter_the_groups_already_answer_is_not_queued_behind_a_search():
    slow = SlowAllocator()
    ext = Extender(ClusterState(cluster_from_spec("dgx-h100:2"), slow))
    names = ext.state.node_names()
    warm_pod = pod("u2", gpus=1, vfs=1)
    ext.state.filter(pod_facts(warm_pod).request, names)  # the groups now hold this answer
    slow.wait_s = 5.0

    async def scenario():
        async with served(ext) as url, aiohttp.ClientSession() as s:
            cold = asyncio.ensure_future(
                s.post(f"{url}/filter", json=args(pod("u1", gpus=2, vfs=2), names)))
            while not slow.started.is_set():
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            async with s.post(f"{url}/filter", json=args(warm_pod, names),
                              timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                warm = (await r.json(), time.monotonic() - t0)
            assert not cold.done()
            slow.go.set()
            async with await cold as r:
                return warm, await r.json()

    (warm, took), cold = asyncio.run(scenario())
    assert warm["NodeNames"] == names and took < 1.0
    assert cold["NodeNames"] == names


def test_a_bind_without_search_holds_only_what_the_memo_knows():
    alloc = Allocator()
    state = ClusterState(cluster_from_spec("dgx-h100:1"), alloc)
    node = "dgx-h100-000"
    request = Request(gpus=2, vfs=2)
    with pytest.raises(NeedsSearch):
        state.bind("a", "ml", "a", node, request, search=False)
    assert state.pod("a") is None and alloc.explored == 0
    assert state.filter(request, [node]).fits == [node]  # filter decides, the memo keeps it
    explored = alloc.explored
    got = state.bind("a", "ml", "a", node, request, search=False)
    assert isinstance(got, Allocation) and state.pod("a") is not None
    assert alloc.explored == explored
