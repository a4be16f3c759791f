"""The cluster mode's parts that need no API server: what the node reports in its
NodeTopology's status, and when admission asks its pod source to look again."""

from __future__ import annotations

import asyncio

from railyard.allocation.names import DEFAULT_RESOURCES
from railyard.kubelet.admission import Admission
from railyard.kubelet.pods import pod_view
from railyard.kubelet.report import DEVICES_HEALTHY, node_status
from railyard.node.state import PodKey, PodRecord, StateStore
from support.agent import GPU, VF, allocation, pod, topology
from support.allocations import nearest_vf

TOPO = topology()
VFS = sum(len(n.vfs) for n in TOPO.nics)


def _record(uid: str, pairs) -> PodRecord:
    return PodRecord(PodKey(uid, "team", uid), allocation(TOPO, pairs))


def test_status_counts_held_devices_and_keeps_unhealthy_held_ones_held():
    vf0, vf1 = nearest_vf(TOPO, 0), nearest_vf(TOPO, 1, 1)
    gpu1 = TOPO.gpus[1]
    records = [_record("a", [(0, vf0)]), _record("b", [(1, vf1)])]
    status = node_status(TOPO, records, {gpu1.device_id: "GPU gone", "0000:ff:00.0": "x"},
                         "2026-01-01T00:00:00Z")
    assert (status.gpus.total, status.gpus.held, status.gpus.free) == (len(TOPO.gpus), 2,
                                                                       len(TOPO.gpus) - 2)
    assert (status.vfs.total, status.vfs.held, status.vfs.free) == (VFS, 2, VFS - 2)
    assert status.nics.held == 0 and status.nics.free == len(TOPO.nics)
    # The GPU is reported by its PCI address; an unknown ID stays as it is.
    assert [d.pci_address for d in status.unhealthy] == sorted([gpu1.pci_address,
                                                                "0000:ff:00.0"])
    assert status.health == "Degraded"
    (cond,) = status.conditions
    assert (cond.type, cond.status, cond.reason) == (DEVICES_HEALTHY, "False", "DevicesUnhealthy")


def test_status_keeps_a_condition_time_until_the_condition_changes():
    first = node_status(TOPO, [], {}, "2026-01-01T00:00:00Z")
    again = node_status(TOPO, [], {}, "2026-01-02T00:00:00Z", previous=first)
    assert again == first  # an unchanged node writes nothing
    worse = node_status(TOPO, [], {TOPO.gpus[0].device_id: "gone"}, "2026-01-03T00:00:00Z",
                        previous=again)
    assert worse.conditions[0].last_transition_time == "2026-01-03T00:00:00Z"


class _LateSource:
    """A pod source whose watch is behind: the pod appears only when looked up."""

    def __init__(self, late: dict) -> None:
        self.late = late
        self.known: list = []
        self.look_ups = 0
        self.loaded = True

    def pods(self):
        return self.known

    async def look_up(self) -> bool:
        self.look_ups += 1
        self.known = [pod_view(self.late)]
        return True


def test_admission_looks_up_only_when_no_pod_asks_for_the_devices(tmp_path):
    vf = nearest_vf(TOPO, 0)
    source = _LateSource(pod("u1", {"main": {GPU: 1, VF: 1}}, alloc=allocation(TOPO, [(0, vf)])))
    adm = Admission(TOPO, StateStore(tmp_path, TOPO.node), source, DEFAULT_RESOURCES)

    async def go() -> None:
        await adm.catch_up(VF, 1)
        assert source.look_ups == 1
        assert [p.uid for p in source.pods()] == ["u1"]
        await adm.catch_up(VF, 1)  # the pod is known now: no second read
        assert source.look_ups == 1

    asyncio.run(go())
    grant = adm.allocate(VF, [vf])
    assert adm.store.get("u1") is not None and grant.envs
