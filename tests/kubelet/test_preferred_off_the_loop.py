"""GetPreferredAllocation never blocks the agent's event loop (docs/decisions/0077): planning a
pod without a record searches in a worker thread, within the allocator's budget, and a
hostile request shape gets the greedy node plan instead of a long search."""

from __future__ import annotations

import asyncio
import threading
import time

from railyard.allocation.names import DEFAULT_RESOURCES as NAMES
from railyard.allocation.search import SEARCH_BUDGET
from railyard.kubelet.admission import Admission
from railyard.kubelet.api import deviceplugin_pb2 as pb
from railyard.kubelet.plugin import DeviceList, DevicePluginServicer
from railyard.kubelet.pods import PodView, pod_view
from railyard.node.state import StateStore
from support.agent import NODE, topology
from support.pods import pod

TOPO = topology("dgx-h100", vfs_per_pf=8)
VFS = [v.pci_address for n in TOPO.nics for v in n.vfs]


class Pods:
    """A pods source holding the given pods."""

    def __init__(self, *pods: dict) -> None:
        self._pods = [pod_view(p) for p in pods]
        self.loaded = True

    def pods(self) -> list[PodView]:
        return self._pods

    async def look_up(self) -> bool:
        return False


class BlockingHandler:
    """An admission whose preference waits until released (at most 3 s)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = threading.Event()

    def preferred(self, resource, available, must_include, size):
        self.started.set()
        self.go.wait(3.0)
        return list(available)[:size]

    def allocate(self, resource, device_ids):
        raise AssertionError("not called")

    async def catch_up(self, resource, size):
        return None


def request(available: list[str], size: int) -> pb.PreferredAllocationRequest:
    return pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available,
                                               allocation_size=size)])


async def loop_ticks_while(task: asyncio.Future, every_s: float = 0.02) -> float:
    """The longest gap between ticks of the loop while `task` runs."""
    worst = 0.0
    while not task.done():
        t = time.monotonic()
        await asyncio.sleep(every_s)
        worst = max(worst, time.monotonic() - t - every_s)
    return worst


def test_a_slow_preference_leaves_the_loop_free():
    handler = BlockingHandler()
    servicer = DevicePluginServicer(NAMES.vf, DeviceList(), handler)

    async def scenario():
        call = asyncio.ensure_future(servicer.GetPreferredAllocation(request(VFS, 2), None))
        t0 = time.monotonic()
        while not handler.started.is_set():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the loop runs while the preference waits
        ticked = time.monotonic() - t0
        assert not call.done()
        handler.go.set()
        answer = await call
        return ticked, list(answer.container_responses[0].deviceIDs)

    ticked, ids = asyncio.run(scenario())
    assert ticked < 1.0
    assert ids == VFS[:2]


def test_a_hostile_pod_without_a_record_gets_a_node_plan_within_the_budget(tmp_path):
    hostile = pod("evil", {"main": {NAMES.gpu: 2, NAMES.vf: 32, NAMES.pf: 1}}, node=NODE,
                  phase="Pending", created="2026-01-01T00:00:00Z",
                  hints={"maxDistance": "PIX", "pairing": "one-to-one"})
    admission = Admission(TOPO, StateStore(tmp_path, NODE), Pods(hostile), NAMES)
    servicer = DevicePluginServicer(NAMES.vf, DeviceList(), admission)

    async def scenario():
        t0 = time.monotonic()
        call = asyncio.ensure_future(servicer.GetPreferredAllocation(request(VFS, 32), None))
        gap = await loop_ticks_while(call)
        answer = await call
        return gap, time.monotonic() - t0, list(answer.container_responses[0].deviceIDs)

    gap, took, ids = asyncio.run(scenario())
    assert gap < 0.25  # the search ran beside the loop
    assert len(ids) == 32 and set(ids) <= set(VFS)
    assert admission.allocator.explored > SEARCH_BUDGET  # it searched, and spent the budget:
    record = admission.store.get("evil")
    assert record is not None and record.allocation.decided_by == "node"  # the greedy plan
    assert took < 30  # the budget bounds it (unbounded, this shape searched for seconds)
