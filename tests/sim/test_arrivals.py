"""Arrivals: the FGD drawing method and the RDMA demand rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.sim.arrivals import DemandRule, draw_arrivals
from railyard.sim.sharing import gpu_milli_of
from railyard.sim.trace import Trace, TracePod, load_trace, parse_trace
from railyard.topology.model import Distance

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"


def small_trace() -> Trace:
    rows = ["a,1,1,1,1000", "b,1,1,1,300", "c,1,1,2,1000", "d,1,1,8,1000", "e,1,1,0,0"]
    return parse_trace(HEADER + "\n" + "\n".join(rows) + "\n", "small")


def test_drawing_stops_once_requested_gpus_reach_130_percent():
    # Counted in milli-GPUs: the 300-milli share counts 0.3 of a GPU (decision 0094).
    arrivals = draw_arrivals(small_trace(), 100, seed=1)
    requested = sum(gpu_milli_of(a.pod) for a in arrivals)
    assert any(a.pod.gpu_milli == 300 for a in arrivals)
    assert requested >= 130_000
    assert requested - gpu_milli_of(arrivals[-1].pod) < 130_000  # the last pod crossed it


def test_cpu_only_pods_never_arrive():
    arrivals = draw_arrivals(small_trace(), 200, seed=2)
    assert all(a.request.gpus > 0 for a in arrivals)


def test_same_seed_same_sequence_and_another_seed_differs():
    a = draw_arrivals(small_trace(), 64, seed=7)
    b = draw_arrivals(small_trace(), 64, seed=7)
    c = draw_arrivals(small_trace(), 64, seed=8)
    assert [(x.uid, x.request) for x in a] == [(x.uid, x.request) for x in b]
    assert [x.uid for x in a] != [x.uid for x in c]


def test_training_pods_want_one_vf_per_gpu_and_strict_adds_pxb():
    rule = DemandRule()
    pod = TracePod("t", 1, 1, 4, 1000)
    assert rule.request(pod, 0.9)[1].vfs == 4
    assert rule.request(pod, 0.9)[1].max_distance is None
    kind, req = DemandRule(strict=True).request(pod, 0.9)
    assert kind == "training" and req.max_distance is Distance.PXB


def test_one_gpu_pods_want_a_vf_by_the_draw_and_fractions_get_a_whole_gpu():
    rule = DemandRule(vf_share=0.25)
    frac = TracePod("f", 1, 1, 1, 300)
    assert rule.request(frac, 0.1) == ("rdma", rule.request(frac, 0.1)[1])
    assert rule.request(frac, 0.1)[1].gpus == 1 and rule.request(frac, 0.1)[1].vfs == 1
    assert rule.request(frac, 0.5)[0] == "plain"
    assert rule.request(frac, 0.5)[1].vfs == 0
    assert DemandRule(strict=True).request(frac, 0.1)[1].max_distance is None


def test_vf_share_changes_demand_but_not_which_pods_arrive():
    trace = load_trace("openb-multigpu20")
    none = draw_arrivals(trace, 400, 3, DemandRule(vf_share=0.0))
    every = draw_arrivals(trace, 400, 3, DemandRule(vf_share=1.0))
    assert [a.uid for a in none] == [a.uid for a in every]
    assert all(a.request.vfs == 0 for a in none if a.request.gpus == 1)
    assert all(a.request.vfs == 1 for a in every if a.request.gpus == 1)


def test_default_share_of_one_gpu_pods_wanting_a_vf_is_near_a_quarter():
    arrivals = draw_arrivals(load_trace("openb-default"), 4000, 0)
    singles = [a for a in arrivals if a.request.gpus == 1]
    share = sum(a.request.vfs == 1 for a in singles) / len(singles)
    assert 0.22 < share < 0.28


def test_trace_with_times_arrives_in_trace_order():
    text = HEADER + ",creation_time\n" + "".join(f"p{i},1,1,1,1000,{100 - i}\n"
                                                   for i in range(20))
    arrivals = draw_arrivals(parse_trace(text, "t"), 30, 0)
    times = [a.pod.creation_time for a in arrivals]
    assert times == sorted(times)


def test_bad_rule_and_cluster_are_rejected():
    with pytest.raises(ValueError, match="vf share"):
        DemandRule(vf_share=1.5)
    with pytest.raises(ValueError, match="no GPUs"):
        draw_arrivals(small_trace(), 0, 0)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 300), st.integers(0, 2**32), st.floats(0.1, 2.0))
def test_drawn_gpus_reach_the_target_and_uids_are_unique(gpus, seed, load):
    arrivals = draw_arrivals(small_trace(), gpus, seed, load=load)
    assert sum(a.request.gpus for a in arrivals) >= load * gpus
    assert len({a.uid for a in arrivals}) == len(arrivals)
    assert [a.seq for a in arrivals] == list(range(len(arrivals)))
