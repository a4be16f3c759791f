"""What one admission did, as a value: its one log line and the agent's metrics read it.

`Admission` makes an `Admitted` per `Allocate` (which pod it served, the devices, whether the
record was followed or the node decided, and why) and a `Corrected` when the PodResources
check rewrites a record; it logs each as one logfmt line (docs/observability.md) and hands it
to its `AdmissionObserver` (the agent's metrics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from railyard.allocation.types import Allocation
from railyard.records.logline import decision_line

# Outcomes of one Allocate, the `outcome` label of railyard_agent_admissions_total.
RECORD = "record"  # kubelet's IDs are the record's: the scheduler's (or an earlier) decision
NODE = "node"  # the node decided: no usable record, or kubelet gave other devices
UNMATCHED = "unmatched"  # no pending pod matches: answered for the devices alone
REFUSED = "refused"  # the call failed (device IDs this plugin never offered, an error)
OUTCOMES = (RECORD, NODE, UNMATCHED, REFUSED)


@dataclass(frozen=True, slots=True)
class Admitted:
    node: str
    resource: str
    device_ids: tuple[str, ...]
    outcome: str
    pod: str | None = None  # namespace/name
    uid: str | None = None
    container: str | None = None
    allocation: Allocation | None = None  # the pod's record after the call
    why: str | None = None

    def line(self) -> str:
        return decision_line("admit", outcome=self.outcome, pod=self.pod, uid=self.uid,
                             node=self.node, container=self.container,
                             resource=self.resource, devices=",".join(self.device_ids),
                             allocation=self.allocation, why=self.why)


@dataclass(frozen=True, slots=True)
class Corrected:
    """The PodResources check rewrote a pod's record to what kubelet assigned."""

    node: str
    pod: str
    uid: str
    allocation: Allocation
    why: str

    def line(self) -> str:
        return decision_line("correct", pod=self.pod, uid=self.uid, node=self.node,
                             allocation=self.allocation, why=self.why)


class AdmissionObserver(Protocol):
    """Who counts admissions (`railyard.kubelet.metrics.AgentMetrics`)."""

    def admitted(self, a: Admitted) -> None: ...

    def corrected(self, c: Corrected) -> None: ...
