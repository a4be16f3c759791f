"""Koordinator's device-allocated honoured on the node (kubelet.koordinator, decision 0095):
a pod with no Railyard record but a Koordinator one gets exactly those devices, paired here
nearest-first; Railyard's record always wins; a bad Koordinator record is an error the
admission reports, never a grant; and once admitted it is written back as a Railyard record.
The agent's switch: tests/agent/test_koordinator_honour_switch.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from railyard.allocation.names import (
    ALLOCATION_ANNOTATION,
    DEFAULT_RESOURCES,
    KOORDINATOR_DEVICE_ALLOCATED,
)
from railyard.kubelet.admission import Admission
from railyard.kubelet.apipods import ApiPods
from railyard.kubelet.koordinator import KoordinatorRecords, koordinator_allocation
from railyard.kubelet.pods import pod_view
from railyard.kubelet.writeback import AllocationWriteBack
from railyard.node.state import StateStore
from railyard.records.allocation import RecordError
from railyard.topology.model import Distance
from support.agent import GPU, NODE, VF, allocation, pod, topology

TOPO = topology()  # generic: GPU 0 PIX to PF 0000:13:00.0, GPU 1 PHB to 0000:42:00.0
NEAR0, NEAR1 = TOPO.nics[0], TOPO.nics[1]


def koord_text(vfs: list[str], gpus: tuple[int, ...] = (0, 1)) -> str:
    """Koordinator's record: GPUs by UUID, one VF per RDMA entry, as its scheduler writes."""
    pf_of = {v.pci_address: n.pci_address for n in TOPO.nics for v in n.vfs}
    return json.dumps({
        "gpu": [{"minor": i, "id": TOPO.gpus[i].uuid} for i in gpus],
        "rdma": [{"minor": -1, "id": pf_of[v], "resources": {"koordinator.sh/rdma": "1"},
                  "extension": {"vfs": [{"minor": -1, "busID": v}]}} for v in vfs]})


def koord_pod(uid: str, text: str, **kw: Any) -> dict[str, Any]:
    p = pod(uid, {"main": {GPU: 2, VF: 2}}, **kw)
    p["metadata"]["annotations"][KOORDINATOR_DEVICE_ALLOCATED] = text
    return p


# Listed far VF first: Koordinator's two lists say nothing of which goes with which.
CROSSED = [NEAR1.vfs[2].pci_address, NEAR0.vfs[3].pci_address]


def test_exactly_koordinators_devices_are_the_record_each_gpu_paired_with_its_nearest_vf():
    alloc = koordinator_allocation(koord_text(CROSSED), TOPO)
    assert alloc.node == NODE and alloc.decided_by == "node"
    assert [(p.gpu.index, p.nic.pci_address, p.distance) for p in alloc.pairs] == [
        (0, NEAR0.vfs[3].pci_address, Distance.PIX),
        (1, NEAR1.vfs[2].pci_address, Distance.PHB)]  # NODE to the other: the nearer won
    assert alloc.gpus == () and alloc.nics == ()


def test_more_gpus_than_nics_share_the_nic_and_a_whole_pf_pairs_too():
    text = json.dumps({"gpu": [{"minor": 0}, {"minor": 1}],
                       "rdma": [{"id": NEAR1.pci_address,
                                 "resources": {"koordinator.sh/rdma": "100"}}]})
    alloc = koordinator_allocation(text, TOPO)
    assert [(p.gpu.index, p.nic.pci_address, p.nic.kind) for p in alloc.pairs] == [
        (0, NEAR1.pci_address, "pf"), (1, NEAR1.pci_address, "pf")]


def test_a_pod_with_only_koordinators_record_gets_it_and_kubelet_is_steered_to_it(tmp_path):
    view = KoordinatorRecords(TOPO)(pod_view(koord_pod("k1", koord_text(CROSSED))))
    assert view.allocation is not None and view.allocation_error is None

    class Source:
        loaded = True

        def pods(self):
            return [view]

        async def look_up(self) -> bool:
            return False

    adm = Admission(TOPO, StateStore(tmp_path, TOPO.node), Source(), DEFAULT_RESOURCES)
    every_vf = [v.pci_address for n in TOPO.nics for v in n.vfs]
    # Kubelet offers every VF; the plugin steers it to Koordinator's two, in pair order.
    assert adm.preferred(VF, every_vf, [], 2) == [NEAR0.vfs[3].pci_address,
                                                   NEAR1.vfs[2].pci_address]
    adm.allocate(GPU, [g.device_id for g in TOPO.gpus])
    grant = adm.allocate(VF, CROSSED)
    # The pair map of the node's pairing: GPU 0 with its PIX VF, GPU 1 with the other.
    assert grant.envs["VLLM_GPU_NIC_PCIE_MAPPING"] == (
        f"{TOPO.gpus[0].pci_address}={NEAR0.vfs[3].pci_address},"
        f"{TOPO.gpus[1].pci_address}={NEAR1.vfs[2].pci_address}")
    [record] = adm.store.all()
    assert record.uid == "k1" and record.allocation == view.allocation
    # Admitted: the node's pairing is due on the pod as a Railyard record (decidedBy: node),
    # where the extender's ledger sees it; once there, nothing more is due.
    back = AllocationWriteBack(None, adm.store, Source())  # type: ignore[arg-type]
    assert [(p.uid, a) for p, a in back.due()] == [("k1", view.allocation)]
    assert view.allocation is not None
    written = koord_pod("k1", koord_text(CROSSED), alloc=view.allocation)
    view = KoordinatorRecords(TOPO)(pod_view(written))
    assert not view.from_koordinator and back.due() == []


def test_railyards_record_wins_over_koordinators():
    ours = allocation(TOPO, [(0, NEAR0.vfs[0].pci_address), (1, NEAR1.vfs[0].pci_address)])
    view = KoordinatorRecords(TOPO)(pod_view(koord_pod("k2", koord_text(CROSSED),
                                                      alloc=ours)))
    assert view.allocation == ours


def test_a_refused_railyard_record_is_not_replaced_by_koordinators():
    raw = koord_pod("k3", koord_text(CROSSED))
    raw["metadata"]["annotations"][ALLOCATION_ANNOTATION] = "{broken"
    view = KoordinatorRecords(TOPO)(pod_view(raw))
    assert view.allocation is None
    assert view.allocation_error is not None and ALLOCATION_ANNOTATION in view.allocation_error


@pytest.mark.parametrize(("text", "says"), [
    ("{", "not valid JSON"),
    (json.dumps({"gpu": [{"minor": 0, "id": "GPU-of-another-node"}]}), "is not on node-a"),
    (json.dumps({"rdma": [{"id": "0000:99:00.0"}]}), "PF 0000:99:00.0 is not on node-a"),
])
def test_a_bad_koordinator_record_is_no_record_and_says_why(text, says):
    view = KoordinatorRecords(TOPO)(pod_view(koord_pod("k4", text)))
    assert view.allocation is None
    assert view.allocation_error is not None
    assert view.allocation_error.startswith(KOORDINATOR_DEVICE_ALLOCATED)
    assert says in view.allocation_error
    with pytest.raises(RecordError):
        koordinator_allocation(text, TOPO)


def test_a_pod_without_either_record_is_left_as_it_is():
    plain = pod_view(pod("k5", {"main": {GPU: 1}}))
    assert KoordinatorRecords(TOPO)(plain) is plain


def test_the_api_source_adopts_the_pods_it_listed_before_discovery_and_those_after():
    pods = ApiPods(None, NODE)  # type: ignore[arg-type]  # no request is made here
    import msgspec

    from railyard.kubelet.apipods import NodePod

    def node_pod(uid: str) -> NodePod:
        return msgspec.convert(koord_pod(uid, koord_text(CROSSED)), NodePod)

    pods._set("team/k6", node_pod("k6"))
    pods._publish()
    assert [p.allocation for p in pods.pods()] == [None]  # not honoured before adoption
    pods.adopt_records(KoordinatorRecords(TOPO))
    pods._set("team/k7", node_pod("k7"))
    pods._publish()
    assert [p.uid for p in pods.pods() if p.allocation is not None] == ["k6", "k7"]
