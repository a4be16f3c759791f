"""The NodeTopology custom resource (`railyard.dev/v1alpha1`, cluster-scoped, named after
its node): its spec is the discovery document (`records.topology`, docs/topology.md), its
status a small value — device counts, the devices that are not healthy, and conditions.

Pure: the caller gives the Node's uid (for the owner reference) and the conditions' times.
The CRD itself is deploy/crds/nodetopologies.railyard.dev.yaml; the printer columns read
`status.summary` (free/total as text, since a column shows one JSONPath) and
`status.health`, which the encoder derives from the counts, so they never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from railyard.records.fields import FieldError, Fields
from railyard.records.topology import TopologyFormatError, topology_from_json, topology_to_json
from railyard.topology.model import NodeTopology

GROUP = "railyard.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "NodeTopology"
PLURAL = "nodetopologies"
HEALTHY, DEGRADED = "Healthy", "Degraded"
CONDITION_STATUSES = ("True", "False", "Unknown")


class NodeTopologyResourceError(FieldError):
    """A NodeTopology object without the documented shape; `path` names the field
    (`spec.nics[0].pciAddress`, `status.gpus.free`)."""


@dataclass(frozen=True, slots=True)
class DeviceCounts:
    """Of one kind of device: how many the node has, how many pods hold, and how many are
    free (healthy and not held). total - free - held are unhealthy and not held."""

    total: int
    free: int
    held: int

    def __post_init__(self) -> None:
        if min(self.total, self.free, self.held) < 0 or self.free + self.held > self.total:
            raise ValueError(f"counts do not add up: {self.free} free + {self.held} held "
                             f"> {self.total} total")

    @property
    def summary(self) -> str:
        return f"{self.free}/{self.total}"


@dataclass(frozen=True, slots=True)
class UnhealthyDevice:
    pci_address: str
    reason: str  # "link down", "port state DOWN", "GPU lost", …


@dataclass(frozen=True, slots=True)
class Condition:
    """A metav1.Condition, less observedGeneration (the status carries its own)."""

    type: str
    status: str  # True, False or Unknown
    reason: str  # CamelCase, as the API asks
    message: str
    last_transition_time: str  # RFC 3339, from the caller's clock


@dataclass(frozen=True, slots=True)
class NodeTopologyStatus:
    """What the agent reports about its node beyond the hardware: counts, the devices that
    are not healthy (every other device is healthy: the list stays short and so does the
    status the extender re-reads on every change), and conditions."""

    gpus: DeviceCounts
    nics: DeviceCounts  # physical functions
    vfs: DeviceCounts
    unhealthy: tuple[UnhealthyDevice, ...] = ()
    conditions: tuple[Condition, ...] = ()
    observed_generation: int = 0

    @property
    def health(self) -> str:
        return DEGRADED if self.unhealthy else HEALTHY


# ---------------------------------------------------------------------------- encode


def resource_name(node: str) -> str:
    """A NodeTopology is named after its node."""
    return node


def node_topology_resource(topology: NodeTopology, node_uid: str | None) -> dict[str, Any]:
    """The object to create: metadata (name; owner: the Node, so the garbage collector
    removes it with the node) and spec. The status is written through its subresource."""
    metadata: dict[str, Any] = {"name": resource_name(topology.node)}
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node",
                                        "name": topology.node, "uid": node_uid}]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata,
            "spec": topology_to_json(topology)}


def status_to_json(status: NodeTopologyStatus) -> dict[str, Any]:
    def counts(c: DeviceCounts) -> dict[str, int]:
        return {"total": c.total, "free": c.free, "held": c.held}

    return {
        "health": status.health,
        "summary": {"gpus": status.gpus.summary, "nics": status.nics.summary,
                    "vfs": status.vfs.summary},
        "gpus": counts(status.gpus),
        "nics": counts(status.nics),
        "vfs": counts(status.vfs),
        "unhealthyDevices": [{"pciAddress": d.pci_address, "reason": d.reason}
                             for d in status.unhealthy],
        "conditions": [{"type": c.type, "status": c.status, "reason": c.reason,
                        "message": c.message, "lastTransitionTime": c.last_transition_time,
                        "observedGeneration": status.observed_generation}
                       for c in status.conditions],
        "observedGeneration": status.observed_generation,
    }


# ---------------------------------------------------------------------------- decode


def spec_from_resource(obj: Any) -> NodeTopology:
    """The topology in a NodeTopology object; its spec must name the object's node."""
    top = Fields(obj, "", NodeTopologyResourceError)
    name = top.object("metadata").string("name", nonempty=True)
    try:
        topology = topology_from_json(top.object("spec").d)
    except TopologyFormatError as e:
        raise NodeTopologyResourceError(f"spec.{e.path}" if e.path else "spec",
                                        e.reason) from None
    if topology.node != name:
        top.fail("spec.node", f"expected the object's name {name!r}, got {topology.node!r}")
    return topology


def status_from_resource(obj: Any) -> NodeTopologyStatus | None:
    """The status of a NodeTopology object; None when it has none yet."""
    top = Fields(obj, "", NodeTopologyResourceError)
    if top.get("status") is None:
        return None
    return status_from_json(top.d["status"], "status")


def status_from_json(document: Any, path: str = "") -> NodeTopologyStatus:
    s = Fields(document, path, NodeTopologyResourceError)
    generation = s.integer("observedGeneration", default=0)
    return NodeTopologyStatus(
        gpus=_counts(s, "gpus"),
        nics=_counts(s, "nics"),
        vfs=_counts(s, "vfs"),
        unhealthy=tuple(UnhealthyDevice(pci_address=d.pci_address("pciAddress"),
                                        reason=d.string("reason"))
                        for d in s.objects("unhealthyDevices", optional=True)),
        conditions=tuple(Condition(type=c.string("type", nonempty=True),
                                   status=c.one_of("status", CONDITION_STATUSES),
                                   reason=c.string("reason"),
                                   message=c.string("message", default=""),
                                   last_transition_time=c.string("lastTransitionTime"))
                         for c in s.objects("conditions", optional=True)),
        observed_generation=generation,
    )


def _counts(s: Fields, key: str) -> DeviceCounts:
    c = s.object(key)
    total, free, held = c.integer("total"), c.integer("free"), c.integer("held")
    if free + held > total:
        c.fail("", f"free {free} + held {held} exceed total {total}")
    return DeviceCounts(total=total, free=free, held=held)
