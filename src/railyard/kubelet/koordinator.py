"""Koordinator's decision honoured on the node (decision 0095): a pod with no Railyard record
but a `scheduling.koordinator.sh/device-allocated` one gets, as its record, exactly the
devices Koordinator's scheduler chose, paired here (Koordinator records no pairing).

Opt-in (`koordinator.honourDeviceAllocated`) and only while the agent trusts every record:
the annotation carries no signature, so a node that checks signatures never believes it, and
the chart's admission policy is what keeps pod authors from writing it. Pure, no I/O.
"""

from __future__ import annotations

from dataclasses import replace

from railyard.allocation.names import KOORDINATOR_DEVICE_ALLOCATED
from railyard.allocation.types import Allocation
from railyard.kubelet.pairing import DeviceIndex, reconcile
from railyard.kubelet.pods import PodView
from railyard.kubelet.resolver import Kind, kind_of_nic
from railyard.records.allocation import RecordError
from railyard.records.koordinator import decode_device_allocated, devices_on
from railyard.topology.model import NodeTopology


def koordinator_allocation(text: str, topology: NodeTopology,
                           index: DeviceIndex | None = None) -> Allocation:
    """The Allocation of the record `text` on `topology`: its devices exactly, each GPU
    paired nearest-first (the distance class, then the NIC's load, then its address) with
    one NIC of its own while there are as many NICs as GPUs, shared otherwise — the pairing
    the node gives when kubelet departs from a record (`pairing.reconcile`). `decidedBy:
    node`: the pairing is this node's, and the write-back puts it on the pod as a Railyard
    record once admitted, where the extender's ledger sees it. RecordError naming the field
    when the record is malformed or names a device this node does not have."""
    where = KOORDINATOR_DEVICE_ALLOCATED
    found = devices_on(decode_device_allocated(text, where), topology, where)
    actual: dict[Kind, list[str]] = {"gpu": [g.device_id for g in found.gpus]}
    for nic in (*found.vfs, *found.pfs):
        actual.setdefault(kind_of_nic(nic), []).append(nic.pci_address)
    return reconcile(topology, None, actual, decided_at=None, index=index)


class KoordinatorRecords:
    """The adopter `ApiPods` applies to each pod view once the node is discovered."""

    def __init__(self, topology: NodeTopology) -> None:
        self.topology = topology
        self.index = DeviceIndex(topology)

    def __call__(self, view: PodView) -> PodView:
        """`view` with Koordinator's record as its allocation when it has none of Railyard's
        (a Railyard record, even one refused, always wins); a Koordinator record that cannot
        be used is the view's allocation error, so admission says why it planned alone."""
        if view.allocation is not None or view.allocation_error is not None:
            return view
        annotations = view.raw.get("metadata", {}).get("annotations") or {}
        text = annotations.get(KOORDINATOR_DEVICE_ALLOCATED)
        if text is None:
            return view
        if not isinstance(text, str):
            return replace(view, allocation_error=f"{KOORDINATOR_DEVICE_ALLOCATED}: expected "
                                                  "a JSON string")
        try:
            alloc = koordinator_allocation(text, self.topology, self.index)
        except RecordError as e:
            return replace(view, allocation_error=str(e))
        return replace(view, allocation=alloc, from_koordinator=True)
