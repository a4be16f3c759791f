"""What the node reports in its NodeTopology's status: devices free and held by the node's
records, the devices that are not healthy, and one condition — a pure function of the agent's
state, so a status that did not change compares equal and is not written again.

Held is what the node's records name (pods kubelet admitted, and pending node plans); a
device both held and unhealthy counts as held. A PF is held only when a pod has it whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from railyard.kubelet.resolver import Kind, ids_of
from railyard.node.state import PodRecord
from railyard.records.nodetopology_cr import (
    Condition,
    DeviceCounts,
    NodeTopologyStatus,
    UnhealthyDevice,
)
from railyard.topology.model import NodeTopology

DEVICES_HEALTHY = "DevicesHealthy"


def _counts(ids: set[str], held: set[str], unhealthy: Mapping[str, str]) -> DeviceCounts:
    held &= ids
    busy = held | (ids & unhealthy.keys())
    return DeviceCounts(total=len(ids), free=len(ids) - len(busy), held=len(held))


def node_status(topology: NodeTopology, records: Iterable[PodRecord],
                unhealthy: Mapping[str, str], now: str,
                previous: NodeTopologyStatus | None = None) -> NodeTopologyStatus:
    """`unhealthy`: device plugin ID → why (the agent's health scan); `now` stamps a
    condition whose status changed (one that did not keep its time from `previous`)."""
    kinds: tuple[Kind, ...] = ("gpu", "pf")
    held: dict[Kind, set[str]] = {kind: set() for kind in (*kinds, "vf")}
    for r in records:
        for kind in kinds:
            held[kind].update(ids_of(r.allocation, kind))
        held["vf"].update(n.pci_address for n in r.allocation.vfs)  # every pool's
    gpu_pci = {g.device_id: g.pci_address for g in topology.gpus}
    gpus = _counts(set(gpu_pci), held["gpu"], unhealthy)
    nics = _counts({n.pci_address for n in topology.nics}, held["pf"], unhealthy)
    vfs = _counts({v.pci_address for n in topology.nics for v in n.vfs}, held["vf"], unhealthy)
    bad = tuple(sorted((UnhealthyDevice(gpu_pci.get(i, i), why) for i, why in unhealthy.items()),
                       key=lambda d: d.pci_address))
    status, reason = ("False", "DevicesUnhealthy") if bad else ("True", "AllHealthy")
    message = f"{len(bad)} device(s) not healthy" if bad else "every device is healthy"
    since = now
    for c in previous.conditions if previous is not None else ():
        if c.type == DEVICES_HEALTHY and c.status == status:
            since = c.last_transition_time
    return NodeTopologyStatus(gpus=gpus, nics=nics, vfs=vfs, unhealthy=bad, conditions=(
        Condition(DEVICES_HEALTHY, status, reason, message, since),))
