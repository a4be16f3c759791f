"""A job's pods get one rail sequence through the extender (docs/rails.md): the first pod of a
job picks freely, each later one is filtered, scored and bound with the sequence the records
of the job's pods already bound give — on nodes whose free GPUs would otherwise send it onto
other rails."""

from __future__ import annotations

import asyncio
import json
import random

import aiohttp
import pytest
from scheduler_helpers import args, hand_allocation, served

from railyard.allocation.jobs import JOBSET_LABEL
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation
from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.scheduler.cluster_file import BoundPod
from railyard.scheduler.service import Extender
from railyard.scheduler.state import ClusterState
from support.allocations import allocation, nearest_vf
from support.pods import asking
from support.searching import SearchingEmpty

NODES = ["n1", "n2", "n3", "n4"]


def cluster() -> ClusterState:
    """Four dgx-h100 nodes where other pods (no job) hold different GPUs, so a 2-GPU pod placed
    by packing alone lands on different rails on each: n1 GPUs 0-1 held (it would take 2-3),
    n2 none (0-1), n3 GPUs 4-7 (0-1), n4 GPU 0 (not 2-3 either)."""
    topologies = [build_topology(DGX_H100, 4, node=n) for n in NODES]
    state = ClusterState(topologies)
    t3 = topologies[2]
    state.restore([BoundPod("default", "other-n3", "n3-other", "n3",
                            allocation(t3, [(g, nearest_vf(t3, g)) for g in (4, 5, 6, 7)]))])
    for node, gpus in (("n1", 2), ("n4", 1)):
        got = state.bind(f"{node}-other", "default", "other", node, Request(gpus=gpus, vfs=gpus))
        assert isinstance(got, Allocation)
    return state


def job_pod(uid: str, hints: dict | None = None) -> dict:
    p = asking(uid, gpus=2, vfs=2, namespace="ml", hints=hints)
    p["metadata"]["labels"] = {JOBSET_LABEL: "llama"}
    return p


async def place(ext: Extender, pods: list[tuple[dict, str]]) -> list[dict]:
    """Filter, prioritize (every node, as with --no-filter-ranks) and bind each pod in turn,
    onto the node given for it."""
    out = []
    async with served(ext) as url, aiohttp.ClientSession() as s:
        async def post(path: str, body: dict) -> dict:
            async with s.post(f"{url}{path}", data=json.dumps(body).encode(),
                              headers={"Content-Type": "application/json"}) as r:
                return await r.json()

        for p, node in pods:
            f = await post("/filter", args(p, NODES))
            scores = await post("/prioritize", args(p, NODES))
            meta = p["metadata"]
            b = await post("/bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                     "PodUID": meta["uid"], "Node": node})
            assert b["Error"] == "", b
            out.append({"filter": f, "scores": {h["Host"]: h["Score"] for h in scores}})
    return out


def rails_of(state: ClusterState, uid: str) -> tuple[int | None, ...]:
    pod = state.pod(uid)
    assert pod is not None and pod.allocation is not None
    return pod.allocation.rails


def test_four_pods_of_a_job_on_four_nodes_get_one_rail_sequence():
    # Without a job, each node's packing gives a 2-GPU pod other rails than n1's first pod.
    alone = cluster()
    natural = [rails_of_bound(alone, n) for n in NODES]
    assert natural[0] == (2, 3) and all(r != (2, 3) for r in natural[1:]), natural
    state = cluster()
    ext = Extender(state)
    calls = asyncio.run(place(ext, [(job_pod(f"j{i}"), n) for i, n in enumerate(NODES)]))
    assert [rails_of(state, f"j{i}") for i in range(4)] == [(2, 3)] * 4
    assert state.job_rails("ml/jobset:llama") == (2, 3)
    # Once the sequence is known the score steers: n1, whose rails 2-3 are taken by the
    # first pod, ranks below n3, where they are free at PIX beside the pods there.
    assert calls[1]["scores"]["n1"] < calls[1]["scores"]["n3"] == max(
        calls[1]["scores"].values())
    # Ranked, filter answers just the best of them (decision 0104).
    best = [n for n, score in calls[1]["scores"].items() if score == calls[1]["scores"]["n3"]]
    assert sorted(calls[1]["filter"]["NodeNames"]) == sorted(best)


def rails_of_bound(state: ClusterState, node: str) -> tuple[int | None, ...]:
    got = state.bind(f"probe-{node}", "default", "probe", node, Request(gpus=2, vfs=2))
    assert isinstance(got, Allocation)
    return got.rails


def test_required_rails_hold_even_where_packing_would_choose_other_gpus():
    state = cluster()
    ext = Extender(state)
    hints = {"rails": "required"}
    # n1's first pod holds GPUs 2-3: on n1 itself the second pod reaches rails 2-3 only
    # through farther GPUs, which `preferred` would not take and `required` must.
    asyncio.run(place(ext, [(job_pod("j0", hints), "n1"), (job_pod("j1", hints), "n1")]))
    assert rails_of(state, "j1") == rails_of(state, "j0") == (2, 3)
    got = state.pod("j1")
    assert got is not None and got.allocation is not None
    assert got.allocation.worst_distance is not None and got.allocation.worst_distance > 0


def test_a_pod_without_a_job_is_placed_as_before_rails():
    state, plain = cluster(), cluster()
    ext = Extender(state)
    p = asking("solo", gpus=2, vfs=2)
    asyncio.run(place(ext, [(p, "n3")]))
    again = plain.bind("solo", "default", "pod-solo", "n3", Request(gpus=2, vfs=2))
    pod = state.pod("solo")
    assert isinstance(again, Allocation) and pod is not None and pod.job is None
    assert pod.allocation is not None and pod.allocation.pairs == again.pairs


@pytest.mark.parametrize("policy", ["preferred", "required"])
@pytest.mark.parametrize("seed", range(6))
def test_rail_scores_rank_the_exact_best_first(policy, seed):
    """Prioritize with a job's sequence scores exactly only the groups that might win
    (docs/rails.md, "Cost"), yet its best score is the best the exact scoring of every
    node gives, every node it scores best is one of those, and every node it does not score
    exactly ranks below them. A preferred sequence never changes what fits."""
    from railyard.allocation.allocator import Allocator

    rng = random.Random(seed)
    names = [f"m{i}" for i in range(14)]
    topologies = [build_topology(DGX_H100, 2, node=n) for n in names]
    state = ClusterState(topologies, Allocator())
    for n in names[:12]:  # a random number of GPUs held on each
        for k in range(rng.randint(1, 7)):
            got = state.bind(f"{n}-{k}", "default", "other", n,
                             Request(gpus=1, vfs=1))
            assert isinstance(got, Allocation) or k > 0
    gpus = rng.choice([1, 2, 4])
    rails = tuple(rng.sample(range(8), gpus))
    plain = Request(gpus=gpus, vfs=gpus)
    railed = Request(gpus=gpus, vfs=gpus, rails=rails, rail_policy=policy)
    fits = state.filter(railed, names).fits
    if policy == "preferred":
        assert fits == state.filter(plain, names).fits
    if not fits:
        return
    scores = state.scores(railed, fits)
    exact = {n: Allocator().node_score(state.topology(n), state.ledger(n), railed)
             for n in fits}
    best = max(scores.values())
    assert best == max(exact.values())
    # Every node scored best is exactly best (a node that only ties it may be capped).
    assert all(exact[n] == best for n in fits if scores[n] == best)
    assert all(scores[n] < best for n in fits if scores[n] != exact[n])
    winner = max(fits, key=lambda n: scores[n])
    got = state.bind("job-pod", "default", "job-pod", winner, railed)
    assert isinstance(got, Allocation)


@pytest.mark.parametrize("policy", ["preferred", "required"])
@pytest.mark.parametrize("seed", range(4))
def test_rail_answers_are_those_of_the_searching_allocator(policy, seed):
    """Random clusters of three shapes with jobs arriving: filter (fits, reasons) and
    prioritize with a job's sequence say exactly what they say with an allocator that
    never spares a search (`SearchingEmpty`) and answers a required sequence with
    `Allocator.fits` only (no `rail_fits_known`): the counts per request, the empty node's
    count per shape and the proofs that spare the empty node's search change no answer."""
    from railyard.allocation.allocator import Allocator
    from railyard.discovery.profiles import DGX_A100, HGX_H100_4NIC

    class FitsOnly:
        """An allocator without `rail_fits_known` (nor its batch): filter asks `fits` of
        every group."""

        coarse_rail_bound = staticmethod(Allocator.coarse_rail_bound)

        def __init__(self) -> None:
            self.inner = SearchingEmpty()

        def __getattr__(self, name: str) -> object:
            if name.startswith("rail_fits_known"):
                raise AttributeError(name)
            return getattr(self.inner, name)

    rng = random.Random(seed)
    profiles = [DGX_H100, DGX_A100, HGX_H100_4NIC]
    topologies = [build_topology(profiles[i % 3], 2, node=f"m{i}") for i in range(24)]
    states = [ClusterState(topologies, Allocator()), ClusterState(topologies, FitsOnly())]
    names = states[0].node_names()
    for i in range(40):  # pods without a job: about half the GPUs
        node, gpus = rng.choice(names), rng.choice([1, 1, 2, 4])
        got = [s.bind(f"f{i}", "default", "f", node, Request(gpus=gpus, vfs=gpus))
               for s in states]
        assert isinstance(got[0], Allocation) == isinstance(got[1], Allocation)
    for j in range(8):
        gpus = rng.choice([1, 2, 4, 8])
        for k in range(rng.randint(2, 4)):
            uid, job = f"j{j}-{k}", f"default/job:j{j}"
            asked = [s.job_request(Request(gpus=gpus, vfs=gpus, rail_policy=policy), job)
                     for s in states]
            assert asked[0] == asked[1]
            out = [s.filter(a, names, uid=uid) for s, a in zip(states, asked, strict=True)]
            assert (out[0].fits, out[0].failed, out[0].unresolvable) == (
                out[1].fits, out[1].failed, out[1].unresolvable)
            if not out[0].fits:
                continue
            scores = [s.scores(a, out[0].fits, uid=uid)
                      for s, a in zip(states, asked, strict=True)]
            assert scores[0] == scores[1]
            best = max(out[0].fits, key=lambda n: scores[0][n])
            for s, a in zip(states, asked, strict=True):
                assert isinstance(s.bind(uid, "default", uid, best, a, job=job), Allocation)


def test_a_required_answer_is_kept_on_its_group_only_from_that_groups_own_state():
    """Filter answers a required sequence per group from the group's answer without the
    sequence and its rail outlook, and keeps the answer on the group. When another thread
    frees the node filter asked about between those two steps, the node has left the group:
    the outlook of where it is now must not be mixed into the group's kept answer (it used
    to be, and every node of the group then kept a wrong fit or refusal)."""
    topologies = {n: build_topology(DGX_H100, 2, node=n) for n in ("a", "b")}
    state = ClusterState(topologies.values())
    # Both VFs of NIC 0 (rail 0) held on each node: a pod wanting rail 0 fits neither.
    state.restore([BoundPod("ml", f"h-{n}", f"h-{n}", n,
                            hand_allocation(t, [(0, 0, 0), (1, 0, 1)]))
                   for n, t in topologies.items()])
    rail = topologies["a"].nics[0].rail
    assert rail is not None
    request = Request(gpus=1, vfs=1, rails=(rail,), rail_policy="required")
    asked = state._answer

    def answer_then_release(g, member, req, shape, score, search=True):  # type: ignore[no-untyped-def]
        out = asked(g, member, req, shape, score, search)
        if not req.rails and state.pod(f"h-{member}") is not None:
            state.release(f"h-{member}")  # the pod watch frees the node meanwhile
        return out

    state._answer = answer_then_release  # type: ignore[method-assign]
    state.filter(request, ["a", "b"])
    state._answer = asked  # type: ignore[method-assign]
    for node in ("a", "b"):
        exact = state.allocator.allocate(topologies[node], state.ledger(node), request)
        assert (node in state.filter(request, [node]).fits) == isinstance(exact, Allocation)
    # The freed node fits; the other still holds both VFs of rail 0 and refuses.
    assert len(state.filter(request, ["a", "b"]).fits) == 1
