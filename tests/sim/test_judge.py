"""Judging placements: best matching (against brute force) and the bandwidth model."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.discovery.profiles import build_topology, profile
from railyard.sim.judge import (
    CLASS_FACTOR,
    JudgedPair,
    best_matching,
    collective_efficiency,
    gdr_capable,
)
from railyard.topology.model import Distance

H100 = build_topology(profile("dgx-h100"))
A100 = build_topology(profile("dgx-a100"))
HGX = build_topology(profile("hgx-h100-4nic"))


def compute_pfs(t):
    return [n.pci_address for n in t.nics if n.vfs]


def brute_force(t, gpus, pfs):
    """(bottleneck, sum) of the best assignment, by trying every one."""
    best = None
    k = min(len(gpus), len(pfs))
    for gsub in itertools.combinations(gpus, k):
        for perm in itertools.permutations(pfs, k):
            ds = [int(t.distance[g][p]) for g, p in zip(gsub, perm, strict=True)]
            key = (max(ds), sum(ds))
            best = key if best is None or key < best else best
    return best


def test_aligned_gpus_and_vfs_on_dgx_h100_match_pix():
    gpus = [g.pci_address for g in H100.gpus[:4]]
    nearest = [min(compute_pfs(H100), key=H100.distance[g].get) for g in gpus]
    pfs = list(reversed(nearest))  # handed out in another order than the GPUs
    pairs = best_matching(H100, gpus, pfs)
    assert [p.distance for p in pairs] == [Distance.PIX] * 4
    assert {p.gpu for p in pairs} == set(gpus)


def test_single_gpu_takes_its_nearest_vf():
    gpu = H100.gpus[0].pci_address
    pfs = compute_pfs(H100)
    pairs = best_matching(H100, [gpu], pfs)
    assert len(pairs) == 1 and pairs[0].distance is Distance.PIX


def test_more_gpus_than_vfs_leaves_gpus_unpaired():
    gpus = [g.pci_address for g in HGX.gpus]
    pairs = best_matching(HGX, gpus, compute_pfs(HGX)[:2])
    assert len(pairs) == 2
    assert not gdr_capable(pairs, 8)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([H100, A100, HGX]), st.data())
def test_best_matching_equals_brute_force(topology, data):
    all_gpus = [g.pci_address for g in topology.gpus]
    all_pfs = compute_pfs(topology)
    k = data.draw(st.integers(1, 4))
    gpus = data.draw(st.lists(st.sampled_from(all_gpus), min_size=k, max_size=k, unique=True))
    pfs = data.draw(st.lists(st.sampled_from(all_pfs), min_size=1, max_size=4))  # VFs may share
    pairs = best_matching(topology, gpus, pfs)
    got = (max(int(p.distance) for p in pairs), sum(int(p.distance) for p in pairs))
    assert got == brute_force(topology, gpus, pfs)
    assert len({p.gpu for p in pairs}) == len(pairs) == min(len(gpus), len(pfs))


def test_collective_runs_at_the_slowest_rank():
    pairs = [JudgedPair("g0", "p0", Distance.PIX), JudgedPair("g1", "p1", Distance.SYS)]
    assert collective_efficiency(pairs) == CLASS_FACTOR[Distance.SYS]


def test_ranks_sharing_a_pf_share_its_bandwidth():
    pairs = [JudgedPair("g0", "p0", Distance.PIX), JudgedPair("g1", "p0", Distance.PIX)]
    assert collective_efficiency(pairs) == 0.5
    assert gdr_capable(pairs, 2)


def test_model_orders_classes_and_gdr_stops_at_pxb():
    factors = [CLASS_FACTOR[d] for d in Distance]
    assert factors == sorted(factors, reverse=True)
    assert CLASS_FACTOR[Distance.PXB] == 1.0 and CLASS_FACTOR[Distance.PHB] < 1.0
    assert gdr_capable([JudgedPair("g", "p", Distance.PXB)], 1)
    assert not gdr_capable([JudgedPair("g", "p", Distance.PHB)], 1)
    assert collective_efficiency([]) == 0.0
