"""Which pod is kubelet admitting? `Allocate` carries no pod identity, so we infer it.

The pod being admitted is pending on this node, and its next container in kubelet's order
(init containers first) asks for exactly as many devices as kubelet does. A pod kubelet has
started admitting comes first (it admits one pod at a time), then pods by creation time, the
order kubelet admits a batch in (`HandlePodAdditions` sorts by `creationTimestamp`). Nothing a
pod writes itself orders them: not its record's `decidedAt`, nor whether it has a record at
all (issue 19, class 5: a pod stamping itself an early `decidedAt` was served another pod's
Allocate). The record is the node's state store first, else the scheduler's annotation.
Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from railyard.allocation.names import ResourceNames
from railyard.allocation.types import Allocation, NicRef
from railyard.kubelet.pods import ContainerView, PodView
from railyard.node.state import PodRecord

# What one device plugin serves: "gpu", "vf" (the default VF pool), "pf", or another VF
# pool, named by its resource name (which always holds a '/', so never one of the three).
Kind = str
BASE_KINDS: tuple[Literal["gpu", "vf", "pf"], ...] = ("gpu", "vf", "pf")


def kinds_of(names: ResourceNames) -> tuple[Kind, ...]:
    """Every kind of this node's resources: GPUs, each VF pool (the default first), PFs."""
    return ("gpu", "vf", *names.vf_pools, "pf")


def kind_of(names: ResourceNames, resource: str) -> Kind:
    if resource == names.gpu:
        return "gpu"
    if resource == names.vf:
        return "vf"
    if resource == names.pf:
        return "pf"
    if resource in names.vf_pools:
        return resource
    raise KeyError(resource)


def is_vf_kind(kind: Kind) -> bool:
    return kind not in ("gpu", "pf")


def pool_of(kind: Kind) -> str | None:
    """A VF kind's pool as records name it (None: the default pool)."""
    return None if kind == "vf" else kind


def kind_of_nic(nic: NicRef) -> Kind:
    """The kind whose plugin hands out this NIC: its pool's for a VF."""
    if nic.kind == "pf":
        return "pf"
    return "vf" if nic.pool is None else nic.pool


def ids_of(alloc: Allocation, kind: Kind) -> tuple[str, ...]:
    """The device plugin IDs of one kind in an Allocation, in pair order."""
    if kind == "gpu":
        return tuple(g.device_id for g in alloc.all_gpus)
    if kind == "pf":
        return tuple(n.pci_address for n in alloc.pfs)
    pool = pool_of(kind)
    return tuple(n.pci_address for n in alloc.vfs if n.pool == pool)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pod and the container kubelet is most likely allocating for."""

    pod: PodView
    container: str
    allocation: Allocation | None  # None: no record (the pod bypassed the scheduler)
    expected: tuple[str, ...]  # the recorded IDs for this container, in pair order
    from_store: bool  # the record is the node's (state store), not the annotation
    admitting: bool = False  # kubelet already allocated some of this pod's devices
    held: frozenset[str] = frozenset()  # IDs of this resource kubelet gave the pod so far
    record_error: str | None = None  # why the pod's record was not usable (allocation None)


def recorded(pod: PodView, records: Mapping[str, PodRecord]) -> tuple[Allocation | None, bool]:
    """The pod's decision: the node's state store wins over the scheduler's annotation."""
    r = records.get(pod.uid)
    if r is not None:
        return r.allocation, True
    return pod.allocation, False


def _order(c: Candidate) -> tuple:
    # Kubelet admits one pod at a time, calling every plugin for each of its containers
    # before it starts the next pod: a pod with some devices allocated and some not is the
    # one being admitted. Then the API server's creation time, a fact the pod author cannot
    # choose (the store's `consumed` is the node's own). It is to the second: pods created
    # together tie, and keep the order the pods source delivered them in (the sort is
    # stable) — from the API, the order they were bound to this node, which is the order
    # kubelet's own watch receives them in and so admits them within one creation second.
    return (not c.admitting, c.pod.created or "~")


def reusable(pod: PodView, rec: PodRecord | None, resource: str,
             container: str) -> tuple[str, ...]:
    """The IDs kubelet will hand `container` first: what the pod's finished init containers
    hold and no sidecar or app container took since (devicemanager's `devicesToReuse`)."""
    free: list[str] = []
    for c in pod.admission_order:
        if c.name == container:
            break
        if rec is None or not c.count(resource):
            continue
        ids = [i for cn in rec.consumed if cn.container == c.name and cn.resource == resource
               for i in cn.device_ids]
        if c.passes_on:
            free += [i for i in ids if i not in free]
        else:
            free = [i for i in free if i not in ids]
    return tuple(free)


def expected_ids(pod: PodView, rec: PodRecord | None, container: ContainerView,
                 alloc: Allocation, resource: str, kind: Kind) -> tuple[str, ...]:
    """The IDs `container` should get: those it reuses, then recorded ones nobody got yet."""
    size = container.count(resource)
    reused = reusable(pod, rec, resource, container.name)[:size]
    taken = set(rec.consumed_ids(resource)) if rec else set()
    fresh = tuple(i for i in ids_of(alloc, kind) if i not in taken)
    return reused + fresh[:size - len(reused)]


def misfit(pod: PodView, alloc: Allocation, resource: str, kind: Kind) -> str | None:
    """Why a record cannot steer `resource` for the pod: it holds another count than kubelet
    will allocate (a record decided for another request); None when it fits."""
    n = len(ids_of(alloc, kind))
    if n != pod.total(resource):
        return f"it holds {n} {resource}, kubelet gives the pod {pod.total(resource)}"
    return None


def candidates(pods: Iterable[PodView], records: Mapping[str, PodRecord], node: str,
               names: ResourceNames, resource: str, size: int, *,
               unusable: Callable[[Allocation], str | None] | None = None) -> list[Candidate]:
    """Every pod that could be the one kubelet is admitting, most likely first.

    A pod whose record cannot be followed (`misfit`, or `unusable` naming a device this node
    lacks) stays a candidate without a record, with the reason: the node decides for it,
    rather than its calls going to some other pod.
    """
    kind = kind_of(names, resource)
    out = []
    for pod in pods:
        if pod.node_name != node or not pod.pending:
            continue
        rec = records.get(pod.uid)
        container = next(
            (c for c in pod.admission_order
             if c.count(resource) and not (rec and rec.is_consumed(c.name, resource))),
            None,
        )
        if container is None or container.count(resource) != size:
            continue
        alloc, from_store = recorded(pod, records)
        error = None
        if alloc is not None:
            if alloc.node != node:
                error = f"it was decided for node {alloc.node}"
            else:
                error = (misfit(pod, alloc, resource, kind)
                         or (unusable(alloc) if unusable else None))
            if error is not None:
                alloc = None
        expected: tuple[str, ...] = ()
        if alloc is not None:
            expected = expected_ids(pod, rec, container, alloc, resource, kind)
        out.append(Candidate(pod, container.name, alloc, expected, from_store,
                             admitting=bool(rec and rec.consumed),
                             held=frozenset(rec.consumed_ids(resource)) if rec else frozenset(),
                             record_error=error))
    out.sort(key=_order)
    return out


def match_allocate(cands: list[Candidate], ids: Iterable[str],
                   hint: tuple[str, str] | None = None) -> Candidate | None:
    """The candidate an `Allocate` of `ids` is for.

    IDs the pod already holds identify it for certain: kubelet passes them again only to
    let a later container of the same pod reuse what its init containers had, and then
    without asking `GetPreferredAllocation` first. Exact recorded IDs are next; then what
    `GetPreferredAllocation` just answered (`hint` = (uid, container)); then the most likely
    candidate.
    """
    want = set(ids)
    for c in cands:
        if c.held & want:
            return c
    exact = [c for c in cands if c.expected and set(c.expected) == want]
    if len(exact) == 1:
        return exact[0]
    # Two records naming the same devices: one of them was not the scheduler's. Which pod
    # GetPreferredAllocation planned for decides, else kubelet's order; never the records.
    if hint is not None:
        for c in cands:
            if (c.pod.uid, c.container) == hint:
                return c
    ordered = exact or cands
    return ordered[0] if ordered else None
