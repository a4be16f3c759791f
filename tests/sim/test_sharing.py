"""Shared GPUs in the simulator (decision 0094): the one account of milli-GPUs per GPU, every
policy's placement of shares, departures, and how GPU allocation counts shares."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.allocation.request import Request
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.arrivals import Arrival, timeline
from railyard.sim.policies import KoordinatorPolicy
from railyard.sim.run import DEFAULT_POLICIES, make_policy, simulate
from railyard.sim.sharing import MILLI_PER_GPU, GpuShares, ShareError, gpu_milli_of, share_of
from railyard.sim.trace import TracePod

CLUSTER = "dgx-h100:1,hgx-h100-4nic:1"


def arrival(seq: int, gpus: int, milli: int, vfs: int = 0, arrive: float = 0.0,
            life: float | None = None) -> Arrival:
    depart = None if life is None else arrive + life
    pod = TracePod(f"p{seq}", 1000, 1024, gpus, milli, int(arrive),
                   None if depart is None else int(depart))
    return Arrival(seq, f"u{seq}", pod, "training" if gpus > 1 else "rdma",
                   Request(gpus=gpus, vfs=vfs), arrive, depart)


def test_a_share_is_its_milli_and_whole_gpus_count_a_thousand_each():
    assert gpu_milli_of(TracePod("a", 1, 1, 1, 250)) == share_of(TracePod("a", 1, 1, 1, 250)) == 250
    assert gpu_milli_of(TracePod("b", 1, 1, 4, 1000)) == 4000
    assert share_of(TracePod("b", 1, 1, 4, 1000)) == MILLI_PER_GPU
    assert gpu_milli_of(TracePod("c", 1, 1, 1, 1000)) == 1000
    assert gpu_milli_of(TracePod("d", 1, 1, 0, 0)) == 0


def test_a_gpu_never_holds_more_than_1000_and_its_last_share_frees_it():
    shares = GpuShares()
    assert shares.hold("a", "n", "g", 600, "stand-in") is True  # opened
    assert shares.hold("b", "n", "g", 400, "ignored") is False
    with pytest.raises(ShareError):
        shares.hold("c", "n", "g", 1, "x")
    with pytest.raises(ShareError):
        shares.hold("a", "n", "h", 1, "x")  # one share per pod
    assert shares.used("n", "g") == 1000
    share, freed = shares.release("a") or (None, None)
    assert share is not None and share.milli == 600 and freed is None
    share, freed = shares.release("b") or (None, None)
    assert share is not None and share.milli == 400 and freed == "stand-in"
    assert shares.used_on("n") == {} and shares.holder("n", "g") is None
    assert shares.release("b") is None


@st.composite
def shared_arrivals(draw: st.DrawFn) -> list[Arrival]:
    """Mostly shares of one GPU (1–999 milli), some whole-GPU pods, with or without VFs,
    arriving and leaving at random times."""
    out = []
    for seq in range(draw(st.integers(1, 40))):
        gpus = draw(st.sampled_from([1, 1, 1, 1, 2, 8]))
        milli = draw(st.integers(1, 999)) if gpus == 1 and draw(st.booleans()) else 1000
        vfs = draw(st.sampled_from([0, 0, 1])) if gpus == 1 else gpus
        out.append(arrival(seq, gpus, milli, vfs, float(draw(st.integers(0, 40))),
                           float(draw(st.integers(0, 30)))))
    return out


@pytest.mark.parametrize("name", DEFAULT_POLICIES)
@settings(max_examples=20, deadline=None)
@given(arrivals=shared_arrivals(), seed=st.integers(0, 3))
def test_departures_free_exactly_the_milli_they_held_and_no_gpu_exceeds_1000(
        name: str, arrivals: list[Arrival], seed: int) -> None:
    topologies = list(cluster_from_spec(CLUSTER))
    policy = make_policy(name, topologies, seed, workload=arrivals)
    shares = policy.shares  # type: ignore[attr-defined]
    placed: dict[str, int] = {}  # live shares placed -> milli
    for departs, a in timeline(arrivals):
        before = shares.total_milli()
        if departs:
            policy.release(a.uid)
            assert before - shares.total_milli() == placed.pop(a.uid, 0)
        else:
            result = policy.place(a.uid, a.request, gpu_milli=share_of(a.pod),
                                  cpu_milli=a.pod.cpu_milli)
            took = shares.total_milli() - before
            if a.pod.gpu_milli < MILLI_PER_GPU and hasattr(result, "node"):
                assert took == a.pod.gpu_milli and len(result.all_gpus) == 1
                placed[a.uid] = took
                gpu = result.all_gpus[0].pci_address
                # The share's GPU is held whole by its stand-in, never by a whole-GPU pod.
                holder = policy.ledgers()[result.node].holder_of(gpu)
                assert holder == shares.holder(result.node, gpu) is not None
            else:
                assert took == 0
        for t in topologies:
            for used in shares.used_on(t.node).values():
                assert 0 < used <= MILLI_PER_GPU
        assert shares.total_milli() == sum(placed.values())
    assert shares.total_milli() == 0 and not placed
    for led in policy.ledgers().values():
        assert not led.used_gpus and not led.used_vfs and len(led) == 0


def test_gpu_allocation_counts_a_share_as_its_milli():
    """Four half-GPU pods and six one-GPU pods ask exactly the 8 GPUs of one node: best-fit
    puts the halves on 2 GPUs and fills the node (8.0 GPUs, 100%); every policy's count is
    half a GPU per share placed plus one per whole pod."""
    topologies = list(cluster_from_spec("dgx-h100:1"))
    arrivals = [arrival(i, 1, 500) for i in range(4)] + [arrival(4 + i, 1, 1000)
                                                         for i in range(6)]
    result = simulate(topologies, arrivals, list(DEFAULT_POLICIES), seed=0)
    for name, r in result.results.items():
        m = r.metrics.as_json()
        shares = sum(1 for a in arrivals[:4] if r.metrics.held_milli.get(a.uid))
        whole = m["podsPlaced"] - shares
        assert m["gpusAllocated"] == pytest.approx(0.5 * shares + whole), name
        assert m["gpuAllocationRatio"] == pytest.approx((0.5 * shares + whole) / 8), name
    for name in ("best-fit", "fgd", "railyard"):
        m = result.results[name].metrics.as_json()
        assert m["gpusAllocated"] == 8 and m["gpuAllocationRatio"] == 1.0, name


def test_best_fit_puts_a_share_where_the_least_is_left_and_koordinator_on_a_fresh_gpu():
    topologies = list(cluster_from_spec("dgx-h100:1"))
    node = topologies[0].node
    for name in ("best-fit", "koordinator", "fgd", "railyard"):
        policy = make_policy(name, topologies, 0)
        a = policy.place("a", Request(gpus=1), gpu_milli=700)  # one GPU has 300 left
        b = policy.place("b", Request(gpus=1), gpu_milli=100)  # another has 900 left
        if name == "koordinator":  # LeastAllocated on devices: the GPU with the most free
            assert a.all_gpus[0] != b.all_gpus[0]
            continue
        assert a.all_gpus[0] == b.all_gpus[0], name  # b on a's GPU: 200 left
        c = policy.place("c", Request(gpus=1), gpu_milli=300)  # no room on it: a fresh GPU
        assert c.all_gpus[0] != a.all_gpus[0], name
        d = policy.place("d", Request(gpus=1), gpu_milli=150)  # fits a's GPU (200 left)
        assert d.all_gpus[0] == a.all_gpus[0], name
        assert policy.shares.used(node, a.all_gpus[0].pci_address) == 950  # type: ignore
    assert isinstance(make_policy("koordinator", topologies, 0), KoordinatorPolicy)
