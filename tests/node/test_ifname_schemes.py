"""The one rule for pod interface names (railyard.node.ifnames): today's `sequential` names
and the opt-in `gpu-index` names, `rdma<i>` for pair i and `rdmau<j>` for unpaired NICs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.node.ifnames import (
    GPU_INDEX,
    SEQUENTIAL,
    allocation_ifnames,
    ifname_problem,
    nic_pair_indexes,
    pod_ifnames,
)
from railyard.topology.model import Distance

TOPO = build_topology(DGX_H100, 2)
PFS = [n for n in TOPO.nics if n.vfs]


def vf(i: int) -> NicRef:
    return NicRef.of_vf(PFS[i % len(PFS)], PFS[i % len(PFS)].vfs[i // len(PFS)])


def alloc(pair_nics: list[int], unpaired: list[int] = ()) -> Allocation:  # type: ignore[assignment]
    pairs = tuple(Pair(GpuRef.of(TOPO.gpus[g]), vf(n), Distance.PIX)
                  for g, n in enumerate(pair_nics))
    return Allocation(TOPO.node, (0,), None, (), pairs=pairs,
                      nics=tuple(vf(n) for n in unpaired))


def test_sequential_is_todays_naming_whatever_the_pairs() -> None:
    a = alloc([0, 1, 1, 2], [3])
    assert pod_ifnames(nic_pair_indexes(a)) == ("net1", "net1-1", "net1-2", "net1-3")
    assert pod_ifnames(nic_pair_indexes(a), SEQUENTIAL, "eth9") == (
        "eth9", "eth9-1", "eth9-2", "eth9-3")


def test_gpu_index_names_each_nic_after_its_pair_and_unpaired_nics_apart() -> None:
    assert pod_ifnames(nic_pair_indexes(alloc([0, 1, 2, 3])), GPU_INDEX) == (
        "rdma0", "rdma1", "rdma2", "rdma3")
    # A NIC two pairs share takes its first pair's name; the second pair's name is nobody's.
    shared = alloc([0, 1, 1, 2], [3, 4])
    assert nic_pair_indexes(shared) == (0, 1, 3, None, None)
    assert pod_ifnames(nic_pair_indexes(shared), GPU_INDEX) == (
        "rdma0", "rdma1", "rdma3", "rdmau0", "rdmau1")
    assert pod_ifnames(nic_pair_indexes(alloc([], [5, 6])), GPU_INDEX) == ("rdmau0", "rdmau1")


def test_gpu_index_names_are_the_same_on_any_node_for_the_same_pod_shape() -> None:
    # Different VFs, PFs and GPUs: the pod's pair order alone decides the names.
    a, b = alloc([0, 1], [2]), alloc([5, 3], [7])
    assert list(allocation_ifnames(a, GPU_INDEX).values()) == \
        list(allocation_ifnames(b, GPU_INDEX).values()) == ["rdma0", "rdma1", "rdmau0"]


def test_the_base_name_plays_no_part_under_gpu_index() -> None:
    assert pod_ifnames((0, 1), GPU_INDEX, "eth9") == ("rdma0", "rdma1")


def test_an_unknown_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="gpu-index"):
        pod_ifnames((0,), "by-rail")


@given(st.lists(st.one_of(st.none(), st.integers(0, 127)), max_size=140, unique_by=lambda x:
                x if x is not None else object()))
def test_gpu_index_names_are_valid_and_distinct(indexes: list[int | None]) -> None:
    names = pod_ifnames(indexes, GPU_INDEX)
    assert len(set(names)) == len(names)
    assert all(ifname_problem(n) is None for n in names)
