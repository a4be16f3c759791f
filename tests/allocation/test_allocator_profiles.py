"""The allocator on real server shapes: the issue's "done when" cases and every Allocation form."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest

from railyard.allocation.allocator import Allocator, allocate
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request, parse_request_spec
from railyard.allocation.types import Allocation, GpuRef, Infeasible, NicRef
from railyard.discovery.profiles import build_topology, profile
from railyard.records.allocation import allocation_from_json, allocation_to_json
from railyard.topology.cpus import parse_cpulist
from railyard.topology.model import Distance, NodeTopology

GiB = 1 << 30


def topo(name: str, vfs_per_pf: int = 8, node: str | None = None) -> NodeTopology:
    return build_topology(profile(name), vfs_per_pf=vfs_per_pf, node=node or name)


def alloc_ok(t: NodeTopology, ledger: Ledger, spec: str, hints: str | None = None,
             allocator: Allocator | None = None) -> Allocation:
    result = (allocator or Allocator()).allocate(t, ledger, parse_request_spec(spec, hints))
    assert isinstance(result, Allocation), result
    ledger.add(f"pod-{len(ledger)}", result)  # every answer must be holdable
    return result


def holder(t: NodeTopology, *, gpus=(), vfs=(), pfs=()) -> Allocation:
    """An allocation holding the given devices (by PCI address), pairs omitted."""
    nics = []
    for a in vfs:
        pf, vf = t.vf(a)
        nics.append(NicRef.of_vf(pf, vf))
    nics += [NicRef.of_pf(t.nic(a)) for a in pfs]
    return Allocation(t.node, (), None, (), nics=tuple(nics),
                      gpus=tuple(GpuRef.of(t.gpu(a)) for a in gpus))


# ----------------------------------------------------------------------- done-when cases


def test_hgx_4nic_two_gpus_two_vfs_get_pix_nics_on_distinct_pfs():
    t = topo("hgx-h100-4nic")
    a = alloc_ok(t, Ledger(t), "gpus=2,vfs=2")
    assert [p.distance for p in a.pairs] == [Distance.PIX, Distance.PIX]
    assert len({p.nic.pf_pci_address for p in a.pairs}) == 2
    assert a.numa_nodes == (0,)


def test_dgx_a100_two_plus_two_takes_one_switch_group_on_one_numa_node():
    t = topo("dgx-a100")
    a = alloc_ok(t, Ledger(t), "gpus=2,vfs=2")
    gpus = [t.gpu(p.gpu.pci_address) for p in a.pairs]
    assert gpus[0].pcie_root == gpus[1].pcie_root  # one two-level switch group
    assert [p.distance for p in a.pairs] == [Distance.PXB, Distance.PXB]
    assert len({p.nic.pf_pci_address for p in a.pairs}) == 2
    assert len(a.numa_nodes) == 1


def test_dgx_h100_eight_plus_eight_is_eight_pix_pairs_on_eight_pfs():
    t = topo("dgx-h100")
    a = alloc_ok(t, Ledger(t), "gpus=8,vfs=8")
    assert len(a.pairs) == 8
    assert all(p.distance == Distance.PIX for p in a.pairs)
    assert len({p.nic.pf_pci_address for p in a.pairs}) == 8
    # GPU i is paired with the NIC under its own switch, whatever the RDMA numbering.
    assert all(t.gpu(p.gpu.pci_address).switch == t.nic(p.nic.pf_pci_address).switch
               for p in a.pairs)


def test_max_distance_the_hardware_cannot_meet_is_unresolvable_with_a_reason():
    t = topo("hgx-h100-4nic")
    r = parse_request_spec("gpus=8,vfs=8", '{"maxDistance": "PXB"}')
    result = Allocator().allocate(t, Ledger(t), r)
    assert isinstance(result, Infeasible)
    assert result.unresolvable
    assert "PXB" in result.reason


def test_max_distance_blocked_by_exhausted_pfs_names_numa_node_and_pfs():
    t = topo("dgx-h100", vfs_per_pf=1)
    ledger = Ledger(t, [
        ("numa0", holder(t, gpus=[g.pci_address for g in t.gpus if g.numa_node == 0])),
        ("vf-only", holder(t, vfs=[t.nic("0000:9a:00.0").vfs[0].pci_address,
                                   t.nic("0000:c0:00.0").vfs[0].pci_address])),
    ])
    r = parse_request_spec("gpus=4,vfs=4", '{"maxDistance": "PXB"}')
    result = Allocator().allocate(t, ledger, r)
    assert isinstance(result, Infeasible)
    assert not result.unresolvable  # freeing the VFs would help
    assert "4 GPUs free on NUMA 1 but only 2 free VFs within PXB of them" in result.reason
    assert "PF 0000:9a:00.0 exhausted" in result.reason
    assert "PF 0000:c0:00.0 exhausted" in result.reason



def test_max_distance_blocked_by_one_gpus_own_pf_names_that_gpu():
    """Two free GPUs on a DGX H100 (4 VFs per PF), the first one's PIX PF exhausted: the
    other PF has 4 free VFs, more than the 2 asked for, so "only 4 free VFs within PIX"
    explained nothing. The reason names the GPU that has no free NIC near it, and why."""
    t = topo("dgx-h100", vfs_per_pf=4)
    g0 = t.gpus[0]
    own = t.nic("0000:18:00.0")
    assert t.distance[g0.pci_address][own.pci_address] == Distance.PIX
    ledger = Ledger(t, [("x", holder(t, gpus=[g.pci_address for g in t.gpus[2:]],
                                      vfs=[v.pci_address for v in own.vfs]))])
    result = Allocator().allocate(t, ledger, Request(gpus=2, vfs=2, max_distance=Distance.PIX))
    assert isinstance(result, Infeasible) and not result.unresolvable
    assert result.reason == (
        "maxDistance PIX: 2 GPUs need a free NIC within PIX but only 1 of the 2 free GPUs "
        f"have one: GPU {g0.pci_address} (PF 0000:18:00.0 exhausted)")


# ----------------------------------------------------------------------- each Allocation form


def test_shared_pairing_spreads_gpus_evenly_over_nearest_nics():
    t = topo("hgx-h100-4nic")
    a = alloc_ok(t, Ledger(t), "gpus=8,vfs=4")
    per_nic: dict[str, list[str]] = {}
    for p in a.pairs:
        per_nic.setdefault(p.nic.pci_address, []).append(p.gpu.pci_address)
    assert sorted(len(v) for v in per_nic.values()) == [2, 2, 2, 2]
    # Each NIC serves the GPU under its switch (PIX) and a neighbour on its NUMA node.
    assert sorted(p.distance.name for p in a.pairs) == ["NODE"] * 4 + ["PIX"] * 4
    assert not a.nics and not a.gpus


def test_extra_vfs_are_unpaired_and_stay_near():
    t = topo("dgx-h100")
    a = alloc_ok(t, Ledger(t), "gpus=2,vfs=4")
    assert len(a.pairs) == 2 and len(a.nics) == 2
    assert all(n.kind == "vf" for n in a.nics)
    assert a.numa_nodes == (0,)


def test_vf_only_pod_takes_vfs_without_pairs_and_lowest_vf_indices():
    t = topo("dgx-h100")
    a = alloc_ok(t, Ledger(t), "vfs=2")
    assert not a.pairs and not a.gpus
    assert [n.vf_index for n in a.nics] == [0, 1]
    assert len(a.numa_nodes) == 1


def test_whole_pf_is_a_nic_of_kind_pf_paired_like_a_vf():
    t = topo("dgx-h100")
    a = alloc_ok(t, Ledger(t), "gpus=1,pfs=1")
    (pair,) = a.pairs
    assert pair.nic.kind == "pf" and pair.nic.vf_index is None
    assert pair.nic.pf_pci_address == pair.nic.pci_address
    assert pair.distance == Distance.PIX


def test_gpu_only_pod_on_hgx_keeps_pix_nics_for_later_pods():
    t = topo("hgx-h100-4nic")
    ledger = Ledger(t)
    first = alloc_ok(t, ledger, "gpus=1")
    (gpu,) = first.gpus
    assert not first.pairs
    assert all(t.distance[gpu.pci_address][n.pci_address] != Distance.PIX for n in t.nics)
    alloc_ok(t, ledger, "gpus=2")
    after = alloc_ok(t, ledger, "gpus=4,vfs=4")
    assert all(p.distance == Distance.PIX for p in after.pairs)


def test_pairing_none_gives_gpus_and_nics_without_pairs():
    t = topo("dgx-h100")
    a = alloc_ok(t, Ledger(t), "gpus=2,vfs=2", '{"pairing": "none"}')
    assert not a.pairs and len(a.gpus) == 2 and len(a.nics) == 2


def test_one_to_one_with_fewer_nics_leaves_the_rest_of_the_gpus_unpaired():
    t = topo("dgx-h100")
    a = alloc_ok(t, Ledger(t), "gpus=4,vfs=2", '{"pairing": "one-to-one"}')
    assert len(a.pairs) == 2 and len(a.gpus) == 2
    assert len({p.nic.pci_address for p in a.pairs}) == 2


def test_every_form_round_trips_through_the_records_codec():
    t = topo("dgx-h100")
    for spec in ("gpus=2,vfs=2", "gpus=4,vfs=2", "vfs=3", "gpus=1,pfs=1", "gpus=2",
                 "gpus=1,vfs=3,cpus=4,memory=8Gi"):
        a = alloc_ok(t, Ledger(t), spec)
        assert allocation_from_json(allocation_to_json(a)) == a


# ----------------------------------------------------------------------- allocatable devices


def test_vfio_and_in_pod_vfs_are_never_offered():
    t = topo("dgx-h100", vfs_per_pf=2)
    pf = t.nic("0000:18:00.0")  # GPU 0's NIC
    vfio = replace(pf.vfs[0], driver="vfio-pci")
    gone = replace(pf.vfs[1], netdev=None, rdma_device=None)
    t = replace(t, nics=tuple(replace(n, vfs=(vfio, gone)) if n is pf else n for n in t.nics))
    a = alloc_ok(t, Ledger(t), "gpus=1,vfs=1")
    assert a.pairs[0].nic.pf_pci_address != pf.pci_address
    # Taking the PF whole is refused too: a VF of it is inside some pod.
    b = alloc_ok(t, Ledger(t), "pfs=1", '{"numa": "none"}')
    assert b.nics[0].pci_address != pf.pci_address


def test_default_route_pf_is_never_taken_whole_and_down_ports_offer_nothing():
    t = topo("generic")
    nic0, nic1 = t.nics
    t = replace(t, nics=(replace(nic0, default_route=True), replace(nic1, port_state="1: DOWN")))
    result = Allocator().allocate(t, Ledger(t), Request(pfs=1))
    assert isinstance(result, Infeasible) and result.unresolvable
    assert "default route" in result.reason
    vfs = Allocator().allocate(t, Ledger(t), Request(vfs=2))
    assert isinstance(vfs, Allocation)  # the default-route PF still gives VFs
    assert {n.pf_pci_address for n in vfs.nics} == {nic0.pci_address}


def test_pf_with_vfs_in_use_cannot_be_taken_whole_and_vice_versa():
    t = topo("generic", vfs_per_pf=1)
    nic0, nic1 = t.nics
    ledger = Ledger(t, [("a", holder(t, vfs=[nic0.vfs[0].pci_address])),
                        ("b", holder(t, pfs=[nic1.pci_address]))])
    result = Allocator().allocate(t, ledger, Request(pfs=1))
    assert isinstance(result, Infeasible) and not result.unresolvable
    assert "VFs in use" in result.reason
    vfs = Allocator().allocate(t, ledger, Request(vfs=1))
    assert isinstance(vfs, Infeasible)


# ----------------------------------------------------------------------- NUMA, CPUs, memory


def test_cpus_and_memory_go_to_the_devices_numa_node_lowest_free_first():
    t = topo("dgx-h100")
    ledger = Ledger(t)
    first = alloc_ok(t, ledger, "gpus=1,vfs=1,cpus=4,memory=16Gi")
    assert first.numa_nodes == (0,)
    assert first.cpus == "0-3"
    assert first.memory_bytes == ((0, 16 * GiB),)
    second = alloc_ok(t, ledger, "gpus=1,vfs=1,cpus=2")
    assert second.cpus == "4-5"


def test_pod_spanning_two_numa_nodes_splits_cpus_and_memory_over_them():
    t = topo("dgx-h100")
    a = alloc_ok(t, Ledger(t), "gpus=8,vfs=8,cpus=8,memory=64Gi")
    assert a.numa_nodes == (0, 1)
    numa_of = {c: n.id for n in t.numa_nodes for c in n.cpu_ids}
    cpus = parse_cpulist(a.cpus or "")
    assert sorted(numa_of[c] for c in cpus) == [0] * 4 + [1] * 4
    assert a.memory_bytes == ((0, 32 * GiB), (1, 32 * GiB))


def test_numa_single_is_hard_and_preferred_is_not():
    t = topo("dgx-h100")
    single = parse_request_spec("gpus=5,vfs=5", '{"numa": "single"}')
    result = Allocator().allocate(t, Ledger(t), single)
    assert isinstance(result, Infeasible) and result.unresolvable
    assert "single" in result.reason
    assert isinstance(Allocator().allocate(t, Ledger(t), parse_request_spec("gpus=5,vfs=5")),
                      Allocation)


def test_cpus_spill_to_another_numa_node_only_when_the_device_node_is_full():
    t = topo("generic")  # one NUMA node, 16 CPUs
    assert isinstance(Allocator().allocate(t, Ledger(t), Request(gpus=1, exclusive_cpus=17)),
                      Infeasible)
    a = alloc_ok(t, Ledger(t), "gpus=1,cpus=16")
    assert a.cpus == "0-15"


# ----------------------------------------------------------------------- reasons, scores, memo


def test_more_gpus_than_the_node_has_is_unresolvable():
    t = topo("generic")
    result = allocate(t, Ledger(t), Request(gpus=3))
    assert isinstance(result, Infeasible) and result.unresolvable
    assert "3 GPUs" in result.reason


def test_full_node_is_infeasible_but_resolvable():
    t = topo("dgx-h100")
    ledger = Ledger(t)
    allocator = Allocator()
    for _ in range(8):
        a = alloc_ok(t, ledger, "gpus=1,vfs=1", allocator=allocator)
        assert a.pairs[0].distance == Distance.PIX
    result = allocator.allocate(t, ledger, Request(gpus=1, vfs=1))
    assert isinstance(result, Infeasible) and not result.unresolvable
    assert "only 0 of 8 free" in result.reason



@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Abort the block after `seconds`, so a slow search fails fast instead of hanging."""
    def expire(*_: object) -> None:
        raise TimeoutError(f"allocator took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(("name", "vfs_per_pf", "request_"), [
    # 8 PFs with one VF each: 8 VFs need all 8 PFs, so none is left to take whole.
    ("mi300x", 1, Request(gpus=4, vfs=8, pfs=1)),
    ("mi300x", 1, Request(gpus=4, vfs=8, pfs=3)),
    # 12 PFs, 8 of them with one VF: 8 VFs + 5 whole PFs need 13.
    ("dgx-h100", 1, Request(gpus=8, vfs=8, pfs=5)),
    # 8 PFs with 4 VFs: 3 taken whole leave 20 VFs, not 28.
    ("mi300x", 4, Request(gpus=4, vfs=28, pfs=3)),
])
def test_vfs_and_whole_pfs_competing_for_the_same_pfs_answer_quickly(name, vfs_per_pf,
                                                                      request_):
    """Enough free VFs and enough whole-able PFs in total, but a PF held whole gives no VFs,
    so nothing fits. The search had no incumbent to prune with and walked every GPU set and
    pairing, twice (then again for `unresolvable`): seconds to minutes per node group,
    inside kube-scheduler's sequential cycle. A count check now says no at once."""
    t = build_topology(profile(name), vfs_per_pf=vfs_per_pf, node=name)
    start = time.perf_counter()
    with deadline(3.0):
        result = Allocator().allocate(t, Ledger(t), request_)
    elapsed = time.perf_counter() - start
    assert isinstance(result, Infeasible) and result.unresolvable
    assert "a PF held whole gives no VFs" in result.reason
    assert elapsed < 1.0, f"{elapsed:.2f} s for {request_}"



def test_numa_single_with_no_numa_node_holding_the_devices_answers_quickly():
    """`numa: single` wants every device on one NUMA node. 2 GPUs + 8 VFs + 4 whole PFs fit a
    DGX H100 (2 VFs per PF) but no one NUMA node of it: the search walked every GPU set and
    pairing to find that out (1.2 s); counts per NUMA node now say no at once."""
    t = topo("dgx-h100", vfs_per_pf=2)
    request_ = Request(gpus=2, vfs=8, pfs=4, numa="single")
    start = time.perf_counter()
    with deadline(3.0):
        result = Allocator().allocate(t, Ledger(t), request_)
    elapsed = time.perf_counter() - start
    assert isinstance(result, Infeasible) and result.unresolvable
    assert result.reason.startswith("numa: single: no single NUMA node holds"), result.reason
    assert elapsed < 0.3, f"{elapsed:.2f} s for {request_}"


def test_node_score_is_zero_when_infeasible_and_ranks_pix_above_pxb():
    alloc = Allocator()
    h100, a100 = topo("dgx-h100"), topo("dgx-a100")
    r = Request(gpus=2, vfs=2)
    assert alloc.node_score(h100, Ledger(h100), r) > alloc.node_score(a100, Ledger(a100), r) > 0
    assert alloc.node_score(h100, Ledger(h100), Request(gpus=9)) == 0


def test_binpack_prefers_a_used_node_and_spread_an_idle_one():
    t = topo("dgx-h100")
    used = Ledger(t, [("a", holder(t, gpus=["0000:df:00.0"]))])
    r = Request(gpus=1, vfs=1)
    binpack, spread = Allocator("binpack"), Allocator("spread")
    assert binpack.node_score(t, used, r) > binpack.node_score(t, Ledger(t), r)
    assert spread.node_score(t, used, r) < spread.node_score(t, Ledger(t), r)
    for s in (binpack, spread):
        assert all(1 <= s.node_score(t, ledger, r) <= 10 for ledger in (used, Ledger(t)))


def test_node_score_drops_when_the_node_cannot_place_the_pod_as_well_as_when_empty():
    t = topo("dgx-h100", vfs_per_pf=1)
    numa0 = [g.pci_address for g in t.gpus if g.numa_node == 0]
    ledger = Ledger(t, [("a", holder(t, gpus=[*numa0[:2], "0000:9d:00.0", "0000:c3:00.0"]))])
    r = Request(gpus=4, vfs=4)
    alloc = Allocator()
    assert alloc.node_score(t, ledger, r) < alloc.node_score(t, Ledger(t), r)


def test_memo_answers_nodes_of_one_shape_with_their_own_names():
    alloc = Allocator()
    r = Request(gpus=2, vfs=2)
    a = alloc.allocate(topo("dgx-h100", node="n1"), Ledger(topo("dgx-h100", node="n1")), r)
    t2 = topo("dgx-h100", node="n2")
    b = alloc.allocate(t2, Ledger(t2), r)
    assert isinstance(a, Allocation) and isinstance(b, Allocation)
    assert (a.node, b.node) == ("n1", "n2")
    assert a.pairs == b.pairs


def test_unknown_packing_is_refused():
    with pytest.raises(ValueError, match="packing"):
        Allocator("random")  # type: ignore[arg-type]


def test_memoised_reason_names_each_node_itself():
    alloc = Allocator()
    for name in ("gpu-a", "gpu-b"):
        t = topo("dgx-h100", node=name)
        result = alloc.allocate(t, Ledger(t), Request(gpus=9))
        assert isinstance(result, Infeasible)
        assert result.reason == f"9 GPUs requested but {name} has 8"


def test_a_reason_naming_the_node_carries_a_refusal_for_other_nodes_of_its_group():
    """The extender answers a whole group from one member's reason. Putting another name in
    by rewriting the asked node's name as a word also rewrote other words equal to it (node
    "9": "9 GPUs requested but 9 has 8"); the refusal it came from names no node."""
    t = topo("dgx-h100", node="9")
    result = Allocator().allocate(t, Ledger(t), Request(gpus=9))
    assert isinstance(result, Infeasible)
    assert result.reason == "9 GPUs requested but 9 has 8"
    assert result.refusal is not None
    assert result.refusal.at("n2").reason == "9 GPUs requested but n2 has 8"


def test_memo_names_each_nodes_own_devices_for_a_shared_shape():
    """Two nodes of one shape with their own GPU UUIDs: the memoised answer (and its cached
    pairs) must name the second node's devices, not the first's."""
    alloc = Allocator()
    r = Request(gpus=8, vfs=8)
    t1 = topo("dgx-h100", node="n1")
    t2 = replace(
        topo("dgx-h100", node="n2"),
        gpus=tuple(replace(g, uuid=f"GPU-n2-{g.index}") for g in t1.gpus))
    assert t1.shape_key == t2.shape_key
    a = alloc.allocate(t1, Ledger(t1), r)
    b = alloc.allocate(t2, Ledger(t2), r)
    assert isinstance(a, Allocation) and isinstance(b, Allocation)
    assert [p.gpu.uuid for p in b.pairs] == [f"GPU-n2-{p.gpu.index}" for p in a.pairs]
    assert [p.nic for p in a.pairs] == [p.nic for p in b.pairs]
    assert alloc.allocate(t1, Ledger(t1), r) == a  # the first node's pairs are its own still
