"""Which pod is kubelet admitting? `Allocate` carries no pod identity, so we infer it.

The pod being admitted is pending on this node, has a recorded Allocation (the node's state
store first, else the scheduler's annotation) whose devices of this resource are not yet
consumed, and its next container asks for exactly as many devices as kubelet does. Oldest
`decidedAt` first (kubelet admits pods one at a time, in about that order); pods with no
record (they bypassed the scheduler) come after, oldest first. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from railyard.agent.state import PodRecord
from railyard.allocation.names import ResourceNames
from railyard.allocation.types import Allocation
from railyard.kubelet.pods import PodView

Kind = Literal["gpu", "vf", "pf"]


def kind_of(names: ResourceNames, resource: str) -> Kind:
    if resource == names.gpu:
        return "gpu"
    if resource == names.vf:
        return "vf"
    if resource == names.pf:
        return "pf"
    raise KeyError(resource)


def ids_of(alloc: Allocation, kind: Kind) -> tuple[str, ...]:
    """The device plugin IDs of one kind in an Allocation, in pair order."""
    if kind == "gpu":
        return tuple(g.device_id for g in alloc.all_gpus)
    if kind == "vf":
        return tuple(n.pci_address for n in alloc.vfs)
    return tuple(n.pci_address for n in alloc.pfs)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pod and the container kubelet is most likely allocating for."""

    pod: PodView
    container: str
    allocation: Allocation | None  # None: no record (the pod bypassed the scheduler)
    expected: tuple[str, ...]  # the recorded IDs for this container, in pair order
    from_store: bool  # the record is the node's (state store), not the annotation
    admitting: bool = False  # kubelet already allocated some of this pod's devices


def recorded(pod: PodView, records: Mapping[str, PodRecord]) -> tuple[Allocation | None, bool]:
    """The pod's decision: the node's state store wins over the scheduler's annotation."""
    r = records.get(pod.uid)
    if r is not None:
        return r.allocation, True
    return pod.allocation, False


def _order(c: Candidate) -> tuple:
    # Kubelet admits one pod at a time, calling every plugin for each of its containers
    # before it starts the next pod: a pod with some devices allocated and some not is the
    # one being admitted, whatever the ages of the others' decisions.
    a = c.allocation
    return (not c.admitting, a is None, (a.decided_at or "~") if a else "", c.pod.created,
            c.pod.namespace, c.pod.name)


def candidates(pods: Iterable[PodView], records: Mapping[str, PodRecord], node: str,
               names: ResourceNames, resource: str, size: int) -> list[Candidate]:
    """Every pod that could be the one kubelet is admitting, most likely first."""
    kind = kind_of(names, resource)
    out = []
    for pod in pods:
        if pod.node_name != node or not pod.pending:
            continue
        rec = records.get(pod.uid)
        container = next(
            (c for c in pod.containers
             if c.count(resource) and not (rec and rec.is_consumed(c.name, resource))),
            None,
        )
        if container is None or container.count(resource) != size:
            continue
        alloc, from_store = recorded(pod, records)
        if alloc is not None and alloc.node != node:
            alloc = None  # decided for another node: as good as no record here
        expected: tuple[str, ...] = ()
        if alloc is not None:
            ids = ids_of(alloc, kind)
            if len(ids) != pod.total(resource):
                continue  # the record does not fit the pod's request: not this pod's shape
            taken = set(rec.consumed_ids(resource)) if rec else set()
            expected = tuple(i for i in ids if i not in taken)[:size]
        out.append(Candidate(pod, container.name, alloc, expected, from_store,
                             admitting=bool(rec and rec.consumed)))
    out.sort(key=_order)
    return out


def match_allocate(cands: list[Candidate], ids: Iterable[str],
                   hint: tuple[str, str] | None = None) -> Candidate | None:
    """The candidate an `Allocate` of `ids` is for.

    Exact recorded IDs identify a pod for certain; then what `GetPreferredAllocation` just
    answered (`hint` = (uid, container)); then the most likely candidate.
    """
    want = set(ids)
    for c in cands:
        if c.expected and set(c.expected) == want:
            return c
    if hint is not None:
        for c in cands:
            if (c.pod.uid, c.container) == hint:
                return c
    return cands[0] if cands else None
