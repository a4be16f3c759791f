"""Departures: pods replayed on the trace's clock leave and free exactly what they held."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import (
    Arrival,
    draw_arrivals,
    live_peak,
    timeline,
    trace_arrivals,
)
from railyard.sim.run import DEFAULT_POLICIES, make_policy, simulate
from railyard.sim.sharing import gpu_milli_of
from railyard.sim.trace import Trace, TraceError, TracePod, load_trace, parse_trace

CLUSTER = "dgx-h100:1,hgx-h100-4nic:1"


@st.composite
def timed_arrivals(draw: st.DrawFn) -> list[Arrival]:
    """Pods of 1–8 GPUs, with or without VFs, arriving and leaving at random times."""
    n = draw(st.integers(1, 40))
    out = []
    for seq in range(n):
        gpus = draw(st.sampled_from([1, 1, 1, 2, 4, 8]))
        vfs = draw(st.sampled_from([0, 1, gpus]))
        arrive = float(draw(st.integers(0, 50)))
        life = float(draw(st.integers(0, 30)))
        pod = TracePod(f"p{seq}", 1000, 1024, gpus, 1000, int(arrive), int(arrive + life))
        out.append(Arrival(seq, f"u{seq}", pod, "training" if gpus > 1 else "rdma",
                           Request(gpus=gpus, vfs=vfs), arrive, arrive + life))
    return sorted(out, key=lambda a: a.seq)


def held(ledgers: dict[str, Ledger]) -> tuple[set[str], set[str], set[str]]:
    gpus: set[str] = set()
    vfs: set[str] = set()
    holders: set[str] = set()
    for led in ledgers.values():
        gpus |= led.used_gpus
        vfs |= led.used_vfs
        holders |= {h for h, _ in led.holders()}
    return gpus, vfs, holders


@pytest.mark.parametrize("name", DEFAULT_POLICIES)
@settings(max_examples=25, deadline=None)
@given(arrivals=timed_arrivals(), seed=st.integers(0, 3))
def test_departures_free_exactly_what_each_pod_held_and_leave_empty_ledgers(
        name: str, arrivals: list[Arrival], seed: int) -> None:
    topologies = list(cluster_from_spec(CLUSTER))
    policy = make_policy(name, topologies, seed)
    live: dict[str, object] = {}
    for departs, a in timeline(arrivals):
        if departs:
            policy.release(a.uid)
            live.pop(a.uid, None)
        else:
            result = policy.place(a.uid, a.request)
            if hasattr(result, "node"):
                live[a.uid] = result
        ledgers = dict(policy.ledgers())
        gpus, vfs, holders = held(ledgers)
        # At every step, what is held is the sum of what the live placed pods hold.
        assert holders == set(live)
        assert gpus == {g.pci_address for al in live.values() for g in al.all_gpus}
        assert vfs == {v.pci_address for al in live.values() for v in al.vfs}
    for t in topologies:
        led = policy.ledgers()[t.node]
        assert len(led) == 0
        assert led.signature() == Ledger(t).signature()  # the empty ledger


def test_timeline_frees_before_it_takes_at_one_moment_and_never_leaves_before_arriving():
    pod = TracePod("p", 1, 1, 1, 1000)
    a = Arrival(0, "a", pod, "plain", Request(gpus=1), 0.0, 5.0)
    b = Arrival(1, "b", pod, "plain", Request(gpus=1), 5.0, 5.0)  # no lifetime
    c = Arrival(2, "c", pod, "plain", Request(gpus=1), 5.0, None)
    order = [(d, x.uid) for d, x in timeline([a, b, c])]
    assert order == [(False, "a"), (True, "a"), (False, "b"), (False, "c"), (True, "b")]


def test_a_cluster_with_every_pod_gone_has_nothing_allocated_and_ratio_taken_at_full_demand():
    topologies = list(cluster_from_spec("dgx-h100:1"))
    pod = TracePod("p", 1, 1, 4, 1000)
    arrivals = [Arrival(i, f"u{i}", pod, "training", Request(gpus=4, vfs=4), float(i),
                        float(i) + 1.5) for i in range(4)]
    result = simulate(topologies, arrivals, ["best-fit", "railyard"], seed=0)
    for r in result.results.values():
        m = r.metrics.as_json()
        assert m["podsPlaced"] == 4 and m["gpusAllocated"] == 0
        assert m["gpuAllocationRatioAtEnd"] == 0.0
        # Two pods of 4 live at once fill the 8 GPUs: the moment demand reaches 100%.
        assert m["gpuAllocationRatio"] == m["atFullLoad"]["gpuAllocationRatio"] == 1.0


def test_trace_arrivals_compress_creation_times_until_live_demand_reaches_the_cluster():
    trace = load_trace("openb-default")
    drawn = draw_arrivals(trace, 64, seed=3)
    replay, factor = trace_arrivals(trace, 64, seed=3)
    assert [a.uid for a in replay] == [a.uid for a in drawn]  # the same pods, same order
    assert factor > 1  # openb's pods are short-lived: as they are, the cluster stays empty
    milli = [gpu_milli_of(a.pod) for a in replay]  # shares count their milli (0094)
    peak = live_peak([a.arrive_s for a in replay], [a.depart_s for a in replay], milli)
    assert peak >= 64_000
    # The least such factor (within the search's precision): a little less falls short.
    slower = [a.arrive_s / 0.98 for a in replay]  # creation times divided by 0.98 × factor
    departs = [None if a.depart_s is None else s + (a.depart_s - a.arrive_s)
               for s, a in zip(slower, replay, strict=True)]
    assert live_peak(slower, departs, milli) < 64_000
    for a in replay:
        assert a.depart_s is not None and a.depart_s >= a.arrive_s
        assert a.depart_s - a.arrive_s == pytest.approx(a.pod.deletion_time - a.pod.creation_time)


def test_trace_arrivals_come_all_at_once_when_even_that_cannot_fill_the_cluster():
    replay, factor = trace_arrivals(load_trace("openb-default"), 64, seed=0, load=0.5)
    assert math.isinf(factor)
    assert {a.arrive_s for a in replay} == {0.0}


def test_a_trace_without_deletion_times_cannot_be_replayed():
    trace = Trace("t", (TracePod("p", 1, 1, 1, 1000, 0),), has_times=True)
    with pytest.raises(ValueError, match="no creation and deletion times"):
        trace_arrivals(trace, 8, seed=0)


def test_deletion_times_are_read_and_an_empty_one_means_the_pod_stays():
    text = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
            "a,1000,1024,1,1000,5,9\nb,1000,1024,2,1000,6,\n")
    trace = parse_trace(text, "t")
    assert trace.has_lifetimes
    assert [(p.creation_time, p.deletion_time) for p in trace.pods] == [(5, 9), (6, None)]


def test_a_deletion_before_the_creation_is_an_error_naming_line_and_column():
    text = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
            "a,1000,1024,1,1000,5,4\n")
    with pytest.raises(TraceError, match=r"line 2, column deletion_time: 4 is before"):
        parse_trace(text, "t")


def test_cli_replays_trace_times_by_default_and_refuses_them_for_a_trace_without():
    from typer.testing import CliRunner

    from railyard.cli.main import app

    small = ["simulate", "--cluster", "dgx-h100:1", "--no-progress", "--policies", "best-fit"]
    bad = CliRunner().invoke(app, [*small, "--trace", "openb-multigpu20", "--arrivals", "trace"])
    assert bad.exit_code == 2 and "has no creation_time and deletion_time" in bad.output
    wrong = CliRunner().invoke(app, [*small, "--arrivals", "later"])
    assert wrong.exit_code == 2 and "--arrivals must be one of trace, draw" in wrong.output
