"""FGD (Weng et al., ATC '23): the fragmentation measure against its definition, written out
plainly, and the decisions it leads to."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.allocation.request import Request
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.sim.fgd import FgdPolicy, Workload, expected_fragmentation


def by_definition(free_cpu: int, free: list[int], shapes: dict[tuple[int, int, int], int]
                  ) -> float:
    """The paper's F_n(M), one task shape at a time, GPU by GPU."""
    total = sum(shapes.values())
    out = 0.0
    for (cpu, gpus, milli), count in shapes.items():
        if milli < 1000:  # a share of one GPU: a GPU with at least `milli` free
            runs = cpu <= free_cpu and any(f >= milli for f in free)
            frag = sum(f for f in free if f < milli) if runs else sum(free)
        else:  # whole GPUs: that many entirely free GPUs
            runs = cpu <= free_cpu and sum(1 for f in free if f == 1000) >= gpus
            frag = sum(f for f in free if f < 1000) if runs else sum(free)
        out += count / total * frag
    return out


def test_fragments_are_the_gpus_too_small_for_the_shape_or_all_when_it_cannot_run():
    free = [1000, 1000, 300]
    assert expected_fragmentation(8000, free, Workload([(1000, 1, 500)])) == 300
    assert expected_fragmentation(8000, free, Workload([(1000, 1, 200)])) == 0
    assert expected_fragmentation(8000, free, Workload([(1000, 1, 1000)])) == 300
    assert expected_fragmentation(8000, free, Workload([(1000, 4, 1000)])) == 2300
    assert expected_fragmentation(500, free, Workload([(1000, 1, 200)])) == 2300  # no CPUs
    # Weighed by popularity: half the tasks see 300, half 2,300.
    mixed = Workload([(1000, 1, 500), (1000, 4, 1000)])
    assert expected_fragmentation(8000, free, mixed) == pytest.approx(1300)


@settings(max_examples=200, deadline=None)
@given(free_cpu=st.integers(0, 16_000),
       free=st.lists(st.sampled_from([0, 1000, 1000]) | st.integers(0, 1000), max_size=8),
       shapes=st.dictionaries(
           st.tuples(st.integers(0, 16_000), st.integers(1, 8), st.just(1000))
           | st.tuples(st.integers(0, 16_000), st.just(1), st.integers(1, 999)),
           st.integers(1, 50), min_size=1, max_size=12))
def test_expected_fragmentation_is_the_definition(free_cpu, free, shapes):
    workload = Workload([s for s, k in shapes.items() for _ in range(k)])
    assert expected_fragmentation(free_cpu, free, workload) == pytest.approx(
        by_definition(free_cpu, free, shapes))


def test_fgd_fills_the_gpu_whose_remainder_no_task_could_use():
    """One GPU has 300 free; the workload asks 500-milli shares and whole GPUs. A 300-milli
    pod there removes a 300-milli fragment; on a fresh GPU it would leave 700 (a 500 fits,
    still no fragment) and keep the 300 one: FGD takes the first."""
    topologies = list(cluster_from_spec("dgx-h100:1"))
    policy = FgdPolicy(topologies, 0, [(1000, 1, 500), (1000, 1, 1000)])
    first = policy.place("a", Request(gpus=1), gpu_milli=700, cpu_milli=1000)
    second = policy.place("b", Request(gpus=1), gpu_milli=300, cpu_milli=1000)
    assert second.all_gpus == first.all_gpus
    node = topologies[0].node
    assert policy.shares.used(node, first.all_gpus[0].pci_address) == 1000


def test_fgd_prefers_the_node_where_a_whole_gpu_pod_leaves_no_stranded_share():
    """Two nodes: one with a single free GPU next to shared ones, one empty. An 8-GPU shape
    dominates the workload, so the one-GPU pod goes where no 8-GPU task could run anyway."""
    topologies = list(cluster_from_spec("dgx-h100:2"))
    a, _ = (t.node for t in topologies)
    policy = FgdPolicy(topologies, 0, [(1000, 8, 1000)] * 9 + [(1000, 1, 1000)])
    policy.place("half", Request(gpus=1), [a], gpu_milli=500, cpu_milli=1000)
    placed = policy.place("one", Request(gpus=1), gpu_milli=1000, cpu_milli=1000)
    assert placed.node == a  # b stays whole for the 8-GPU tasks


def test_fgd_releases_the_cpus_and_milli_it_held():
    topologies = list(cluster_from_spec("dgx-h100:1"))
    policy = FgdPolicy(topologies, 0)
    node = topologies[0].node
    free_before = policy._free(node)
    policy.place("a", Request(gpus=1), gpu_milli=250, cpu_milli=4000)
    policy.place("b", Request(gpus=2), cpu_milli=2000)
    assert policy._free(node) != free_before
    policy.release("a")
    policy.release("b")
    assert policy._free(node) == free_before
