"""What one Allocate decides about a pod's record, as a pure function (decisions 0033, 0034)."""

from __future__ import annotations

from railyard.allocation.names import DEFAULT_RESOURCES as NAMES
from railyard.kubelet.decision import NodeDevices, decide_allocate
from railyard.kubelet.pairing import DeviceIndex
from railyard.kubelet.pods import pod_view
from railyard.node.state import Consumed
from support.agent import GPU, VF, allocation, pod, topology
from support.allocations import nearest_vf

TOPO = topology("dgx-h100", vfs_per_pf=2)
DEVICES = NodeDevices(TOPO, DeviceIndex(TOPO), NAMES, frozenset({"gpu", "vf", "pf"}))
NOW = "2026-03-01T00:00:00Z"


def test_kubelet_giving_the_recorded_ids_keeps_the_record_and_warns_of_nothing():
    a = allocation(TOPO, [(0, nearest_vf(TOPO, 0))])
    p = pod_view(pod("u", {"main": {GPU: 1, VF: 1}}, alloc=a))
    d = decide_allocate(p, "main", (nearest_vf(TOPO, 0),), (), a, "vf",
                        [nearest_vf(TOPO, 0)], DEVICES, NOW)
    assert d.allocation == a and d.warnings == ()
    assert d.consumed == Consumed("main", VF, (nearest_vf(TOPO, 0),))
    assert not d.last  # the GPU plugin has not been called for this container yet


def test_other_ids_rebuild_the_record_around_them_as_the_nodes_decision():
    a = allocation(TOPO, [(0, nearest_vf(TOPO, 0))])
    other = nearest_vf(TOPO, 0, 1)
    p = pod_view(pod("u", {"main": {GPU: 1, VF: 1}}, alloc=a))
    d = decide_allocate(p, "main", (nearest_vf(TOPO, 0),), (), a, "vf", [other], DEVICES, NOW)
    assert d.allocation.decided_by == "node" and d.allocation.decided_at == NOW
    assert [x.nic.pci_address for x in d.allocation.pairs] == [other]
    assert len(d.warnings) == 1 and other in d.warnings[0]


def test_the_last_plugin_of_a_container_gets_the_whole_containers_ids():
    a = allocation(TOPO, [(0, nearest_vf(TOPO, 0))])
    gpu = TOPO.gpus[0].device_id
    p = pod_view(pod("u", {"main": {GPU: 1, VF: 1}}, alloc=a))
    notes = (Consumed("main", GPU, (gpu,)),)
    d = decide_allocate(p, "main", (nearest_vf(TOPO, 0),), notes, a, "vf",
                        [nearest_vf(TOPO, 0)], DEVICES, NOW)
    assert d.last and not d.spans_nic_kinds
    assert d.container_ids == {"gpu": (gpu,), "vf": (nearest_vf(TOPO, 0),), "pf": ()}
    assert d.allocation == a
