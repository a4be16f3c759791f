"""`ClusterState.filter(ranked=True)` (decision 0104) scores from the groups its own filter
looked up; it must answer exactly what filter followed by `scores` cut to the best would:
with and without a rail sequence, with the admission reserve taking nodes out first, with
unknown names in the call, and with the refusals untouched."""

from __future__ import annotations

import random

import pytest

from railyard.allocation.request import Request
from railyard.allocation.types import Allocation
from railyard.discovery.profiles import build_topology, profile
from railyard.scheduler.state import ClusterState

SHAPES = ("dgx-h100", "dgx-a100", "hgx-h100-4nic")


def _cluster(rng: random.Random, reserve: int) -> tuple[ClusterState, list[str]]:
    names = [f"n{i}" for i in range(12)]
    state = ClusterState([build_topology(profile(rng.choice(SHAPES)), 2, node=n)
                          for n in names], idle_reserve=reserve)
    for n in rng.sample(names, 8):  # some nodes partly held, some idle
        for k in range(rng.randint(1, 5)):
            got = state.bind(f"{n}-{k}", "default", f"{n}-{k}", n,
                             Request(gpus=rng.choice([1, 2]), vfs=1))
            assert isinstance(got, Allocation) or k > 0
    return state, names


def _unranked_then_scored(state: ClusterState, request: Request,
                          names: list[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    out = state.filter(request, names)
    if len(out.fits) < 2:
        return out.fits, out.failed, out.unresolvable
    scores = state.scores(request, out.fits)
    best = max(scores.values())
    return [n for n in out.fits if scores[n] == best], out.failed, out.unresolvable


@pytest.mark.parametrize("reserve", [0, 4])  # 4: the idle nodes left, so it refuses
@pytest.mark.parametrize("seed", range(8))
def test_the_ranked_filter_is_filter_then_the_best_scores(seed, reserve):
    rng = random.Random(seed)
    state, names = _cluster(rng, reserve)
    asked = [*names, "not-a-node"]
    rng.shuffle(asked)
    cut = reserved = 0
    for _ in range(12):
        gpus = rng.choice([0, 1, 2, 4, 8])
        policy = rng.choice(["", "preferred", "required"]) if gpus else ""
        rails = tuple(rng.sample(range(8), gpus)) if policy else ()
        request = Request(gpus=gpus, vfs=max(gpus, 1), rails=rails,
                          rail_policy=policy or "preferred")
        ranked = state.filter(request, asked, ranked=True)
        fits, failed, unresolvable = _unranked_then_scored(state, request, asked)
        assert ranked.fits == fits
        assert ranked.failed == failed and ranked.unresolvable == unresolvable
        cut += len(state.filter(request, asked).fits) > len(ranked.fits)
        reserved += any("admission reserve" in why for why in unresolvable.values())
    assert cut > 0  # some answers were cut short by their rank
    assert (reserved > 0) == (reserve > 0)  # and the reserve took nodes out first


def test_a_held_pod_is_answered_its_own_node_ranked_or_not():
    state = ClusterState([build_topology(profile("dgx-h100"), 2, node=f"n{i}")
                          for i in range(3)])
    request = Request(gpus=2, vfs=2)
    assert isinstance(state.bind("u1", "default", "p1", "n1", request), Allocation)
    ranked = state.filter(request, ["n0", "n1", "n2"], uid="u1", ranked=True)
    assert ranked.fits == ["n1"] and set(ranked.unresolvable) == {"n0", "n2"}
