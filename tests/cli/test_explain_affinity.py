"""`railyard explain` shows a pod's preferred and achieved affinity (decision 0091): from the
record, as `render` (a pure function of what was fetched) writes it."""

from __future__ import annotations

from dataclasses import replace

import msgspec

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Affinity, Allocation
from railyard.cli.explain import Facts, PodStatus, render
from railyard.discovery.profiles import DGX_H100, HGX_H100_4NIC, ProfileSpec, build_topology
from railyard.kube.objects import Pod
from railyard.topology.model import Distance
from support.pods import pod


def _facts(alloc: Allocation) -> Facts:
    p = pod("uid-1", {"main": {"nvidia.com/gpu": len(alloc.pairs),
                               "railyard.dev/vf": len(alloc.pairs)}},
            name="trainer", namespace="ml", node=alloc.node, phase="Running", alloc=alloc)
    return Facts(msgspec.convert(p, Pod), PodStatus(phase="Running"))


def _placed(profile: ProfileSpec, gpus: int, prefer: Distance | None) -> Allocation:
    t = build_topology(profile, 8)
    a = Allocator().allocate(t, Ledger(t), Request(gpus=gpus, vfs=gpus, prefer_distance=prefer))
    assert isinstance(a, Allocation)
    return a.stamped("scheduler", "2026-12-03T18:00:00Z")


def test_a_pod_that_fell_back_is_told_so_with_both_levels():
    lines = render(_facts(_placed(HGX_H100_4NIC, 8, Distance.PIX)))
    [line] = [x for x in lines if "affinity:" in x]
    assert line == ("  affinity: preferred PIX, achieved NODE: fell back (the node had no "
                    "placement within PIX free)")
    assert lines.index(line) == 1 + next(i for i, x in enumerate(lines)
                                         if x.startswith("  worst pair distance NODE"))


def test_a_met_preference_says_met_and_a_pod_without_one_shows_no_line():
    [line] = [x for x in render(_facts(_placed(DGX_H100, 2, Distance.PXB))) if "affinity" in x]
    assert line == "  affinity: preferred PXB, achieved PIX: met"
    assert not [x for x in render(_facts(_placed(DGX_H100, 2, None))) if "affinity" in x]


def test_a_record_the_node_re_paired_since_shows_the_pairs_worst_beside_the_recorded_one():
    a = _placed(DGX_H100, 2, Distance.PIX)
    stale = replace(a, affinity=Affinity(Distance.PIX, Distance.NODE))
    [line] = [x for x in render(_facts(stale)) if "affinity" in x]
    assert line.endswith("; the pairs recorded now have worst PIX")
