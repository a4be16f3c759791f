"""The offline bound with the GPUs as bins (decision 0099): a share sits on one GPU, so the
bound never lets shares of one pod straddle GPUs. Brute force on small instances: the bound
is never below the best packing, and with configurations equal to the best packing of the
group's pooled GPUs; the dual-feasible-function rows never cut off a packing."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import railyard.sim.bounds as bounds_module
from railyard.allocation.request import Request
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import Arrival
from railyard.sim.bounds import (
    MIP_REL_GAP,
    dff_rows,
    full_demand_moment,
    node_groups,
    offline_bounds,
    share_configurations,
)
from railyard.sim.run import DEFAULT_POLICIES, simulate
from railyard.sim.sharing import MILLI_PER_GPU, gpu_milli_of, shares_gpu
from railyard.sim.trace import TracePod


def arrival(seq: int, gpus: int = 1, milli: int = 1000, arrive: float = 0.0,
            depart: float | None = None) -> Arrival:
    """A pod of `gpus` whole GPUs, or (gpus 1, milli < 1000) a share of one."""
    kind = "training" if gpus > 1 else "plain"
    return Arrival(seq, f"u{seq}", TracePod(f"p{seq}", 100, 64, gpus, milli), kind,
                   Request(gpus=gpus, vfs=gpus if gpus > 1 else 0), arrive, depart)


def packs(shares: list[int], bins: int) -> bool:
    """Whether these shares fit `bins` GPUs of 1000 milli each (backtracking, largest first)."""
    if bins < 0:
        return False
    free = [MILLI_PER_GPU] * bins

    def place(i: int, order: list[int]) -> bool:
        if i == len(order):
            return True
        tried = set()
        for b, left in enumerate(free):
            if left >= order[i] and left not in tried:
                tried.add(left)
                free[b] -= order[i]
                if place(i + 1, order):
                    return True
                free[b] += order[i]
        return False

    return place(0, sorted(shares, reverse=True))


def best_pooled_packing(live: list[Arrival], gpus: int) -> int:
    """The most milli-GPUs of `live` that `gpus` pooled GPUs can hold: whole-GPU pods on
    whole GPUs, each share on one GPU (every subset tried)."""
    best = 0
    for r in range(len(live) + 1):
        for chosen in itertools.combinations(live, r):
            whole = sum(a.pod.num_gpu for a in chosen if not shares_gpu(a.pod))
            if packs([a.pod.gpu_milli for a in chosen if shares_gpu(a.pod)], gpus - whole):
                best = max(best, sum(gpu_milli_of(a.pod) for a in chosen))
    return best


def bound_milli(spec: str, arrivals: list[Arrival]) -> tuple[int, str]:
    gpu = offline_bounds(list(cluster_from_spec(spec)), arrivals).gpu_allocation_ratio
    assert gpu.count is not None
    methods = {g["method"] for g in gpu.details["gpuPacking"]}
    return round(gpu.count * MILLI_PER_GPU), "/".join(sorted(methods))


def test_configurations_are_the_maximal_ways_to_fill_one_gpu():
    assert sorted(map(sorted, map(dict.items, share_configurations([500, 300, 300])))) == [
        [(300, 1), (500, 1)], [(300, 3)], [(500, 2)]]
    assert share_configurations([]) == []
    assert share_configurations([100, 110, 120, 130], limit=3) is None


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(50, 999), min_size=1, max_size=5, unique=True))
def test_every_set_of_shares_on_one_gpu_is_part_of_a_configuration(sizes: list[int]) -> None:
    configs = share_configurations(sizes)
    assert configs is not None
    for c in configs:
        assert sum(s * k for s, k in c.items()) <= MILLI_PER_GPU
        assert MILLI_PER_GPU - sum(s * k for s, k in c.items()) < min(sizes)  # maximal
    for counts in itertools.product(*(range(MILLI_PER_GPU // s + 1) for s in sizes)):
        if sum(s * k for s, k in zip(sizes, counts, strict=True)) <= MILLI_PER_GPU:
            assert any(all(c.get(s, 0) >= k for s, k in zip(sizes, counts, strict=True))
                       for c in configs)


def test_shares_of_one_pod_no_longer_straddle_gpus():
    # Three 510-milli shares on 2 GPUs: pooled milli-GPUs took all three (1530 of 2000);
    # on GPUs only two fit, one per GPU.
    three = [arrival(i, milli=510) for i in range(3)]
    assert bound_milli("generic:1", three) == (1020, "configurations")
    # Five 350s on 2 GPUs: two per GPU.
    five = [arrival(i, milli=350) for i in range(5)]
    assert bound_milli("generic:1", five) == (1400, "configurations")


@pytest.mark.parametrize(("milli", "count", "expected"), [(510, 3, 1020), (350, 5, 1400),
                                                          (260, 9, 1560)])
def test_dff_rows_where_configurations_are_too_many_are_tight_here(monkeypatch, milli, count,
                                                                   expected):
    monkeypatch.setattr(bounds_module, "MAX_CONFIGURATIONS", 0)
    arrivals = [arrival(i, milli=milli) for i in range(count)]
    assert bound_milli("generic:1", arrivals) == (expected, "dff")
    # bounds.json says so, per group.
    out = offline_bounds(list(cluster_from_spec("generic:1")), arrivals).as_json()
    (packing,) = out["gpuAllocationRatio"]["gpuPacking"]
    assert packing["method"] == "dff" and "more than 0 configurations" in packing["note"]


def test_the_solver_prints_nothing(capfd):
    """HiGHS writes to the process's stdout unless told not to: the console report and
    anything piping `railyard simulate` must not see it."""
    arrivals = [arrival(i, milli=m) for i, m in enumerate([510, 350, 350, 260, 810, 160] * 3)]
    arrivals += [arrival(100 + i, gpus=g) for i, g in enumerate([1, 2, 4])]
    offline_bounds(list(cluster_from_spec("dgx-h100:1,generic:2")), arrivals)
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 999), min_size=1, max_size=12), bins=st.integers(1, 6),
       whole=st.integers(0, 3), seed=st.integers(0, 10**6))
def test_dff_rows_never_cut_off_a_packing(sizes: list[int], bins: int, whole: int,
                                          seed: int) -> None:
    # A packing: `whole` GPUs held whole, the shares first-fit in random order on the rest
    # (those that fit nowhere are left out).
    pick = random.Random(seed)
    order = sizes[:]
    pick.shuffle(order)
    free = [MILLI_PER_GPU] * bins
    placed = []
    for s in order:
        for b in range(whole, bins):
            if free[b] >= s:
                free[b] -= s
                placed.append(s)
                break
    for row in dff_rows(sizes):
        assert sum(row[s] for s in placed) + min(whole, bins) <= bins
        assert all(Fraction(0) <= v <= 1 for v in row.values())


@st.composite
def small_instance(draw: st.DrawFn) -> list[Arrival]:
    sizes = draw(st.lists(st.integers(100, 900), min_size=1, max_size=3))
    out = []
    for seq in range(draw(st.integers(1, 8))):
        if draw(st.integers(0, 2)):
            out.append(arrival(seq, milli=draw(st.sampled_from(sizes))))
        else:
            out.append(arrival(seq, gpus=draw(st.sampled_from([1, 1, 2, 4]))))
    return out


@settings(max_examples=30, deadline=None)
@given(arrivals=small_instance(), spec=st.sampled_from(["dgx-h100:1", "generic:1", "generic:2"]))
def test_the_bound_is_the_best_pooled_packing_with_configurations(arrivals: list[Arrival],
                                                                  spec: str) -> None:
    if spec.startswith("generic"):  # 2 GPUs per node: no pod of more than one
        arrivals = [a if a.pod.num_gpu == 1 else arrival(a.seq) for a in arrivals]
    topologies = list(cluster_from_spec(spec))
    (group,) = node_groups(topologies)
    gpus = group.count * group.gpus
    live, _ = full_demand_moment(arrivals, gpus)
    best = best_pooled_packing(live, gpus)
    got, method = bound_milli(spec, arrivals)
    assert method in ("configurations", "whole GPUs")
    assert best <= got <= best * (1 + MIP_REL_GAP) + 1e-6
    # The pooled packing is at least any real one: no policy beats the bound (raises if so).
    simulate(topologies, arrivals, list(DEFAULT_POLICIES), seed=0)


@st.composite
def share_churn(draw: st.DrawFn) -> list[Arrival]:
    out = []
    for seq in range(draw(st.integers(1, 30))):
        gpus = draw(st.sampled_from([1, 1, 1, 2, 4, 8]))
        milli = draw(st.sampled_from([1000, 150, 250, 330, 500, 600, 810])) if gpus == 1 else 1000
        arrive = float(draw(st.integers(0, 30)))
        life = draw(st.one_of(st.none(), st.integers(0, 20)))
        out.append(arrival(seq, gpus, milli, arrive, None if life is None else arrive + life))
    return out


@settings(max_examples=20, deadline=None)
@given(arrivals=share_churn(), seed=st.integers(0, 2), dff=st.booleans())
def test_no_policy_beats_the_bound_on_random_churn_with_shares(arrivals: list[Arrival],
                                                               seed: int, dff: bool) -> None:
    topologies = list(cluster_from_spec("dgx-h100:1,hgx-h100-4nic:1,generic:2"))
    with pytest.MonkeyPatch.context() as patch:
        if dff:  # the rows that stand in for too many configurations
            patch.setattr(bounds_module, "MAX_CONFIGURATIONS", 0)
        result = simulate(topologies, arrivals, list(DEFAULT_POLICIES), seed)  # raises if beaten
    assert result.bounds is not None and result.bounds.gpu_allocation_ratio.value is not None
