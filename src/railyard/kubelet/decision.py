"""What one `Allocate` call decides about a pod's record, as a pure function.

Given the pod, its recorded Allocation and consumption notes, the IDs kubelet passed, and the
node's devices as values, `decide_allocate` says what the record holds afterwards and what the
container holds once kubelet is done with it (decisions 0033, 0034). `Admission` gathers the
inputs, writes the record and builds the grant (env, devices, mounts) from the answer; nothing
here reads a clock, the store or the pod list, or logs: the caller logs `warnings`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from railyard.allocation.names import ResourceNames
from railyard.allocation.types import Allocation
from railyard.kubelet.pairing import DeviceIndex, pair_container, reconcile
from railyard.kubelet.pods import PodView
from railyard.kubelet.resolver import Kind, ids_of, kind_of, kinds_of
from railyard.node.state import Consumed
from railyard.topology.model import NodeTopology

KINDS: tuple[Kind, ...] = ("gpu", "vf", "pf")  # without VF pools; `NodeDevices.kinds` has all


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """The node's devices as the decision needs them: topology, its ID index, the resource
    names, and the kinds whose plugin is this agent's."""

    topology: NodeTopology
    index: DeviceIndex
    names: ResourceNames
    served: frozenset[Kind]

    @property
    def kinds(self) -> tuple[Kind, ...]:
        return kinds_of(self.names)

    @property
    def nic_kinds(self) -> tuple[Kind, ...]:
        return tuple(k for k in self.kinds if k != "gpu")

    def resource_of(self, kind: Kind) -> str:
        if kind in ("gpu", "vf", "pf"):
            return {"gpu": self.names.gpu, "vf": self.names.vf, "pf": self.names.pf}[kind]
        return kind  # another VF pool: its kind is its resource name


@dataclass(frozen=True, slots=True)
class AllocateDecision:
    """The pod's record after one Allocate call, and what the container's grant must say."""

    allocation: Allocation  # the record to store (`decidedBy: node` where it departs from base)
    consumed: Consumed  # this call's note: the container, the resource, kubelet's IDs
    # The container's IDs per kind once this call is noted; complete only when `last`.
    container_ids: Mapping[Kind, tuple[str, ...]]
    last: bool  # kubelet is done with the container: every resource of ours is allocated
    # The container holds NICs of several of this agent's plugins (VFs and PFs, or VFs of
    # two pools): a variable they would each set comes from the last one only.
    spans_nic_kinds: bool
    warnings: tuple[str, ...] = ()  # where the node departed from the record, for the log


def partners(alloc: Allocation, kind: Kind, mine: Iterable[str]) -> list[str]:
    """The other side of the pairs holding `mine`: GPU IDs for NICs, NIC PCIs for GPUs."""
    held = set(mine)
    if kind == "gpu":
        return [p.nic.pci_address for p in alloc.pairs if p.gpu.device_id in held]
    return [p.gpu.device_id for p in alloc.pairs if p.nic.pci_address in held]


def decide_allocate(pod: PodView, container: str, expected: Sequence[str],
                    notes: Sequence[Consumed], base: Allocation, kind: Kind, ids: Sequence[str],
                    node: NodeDevices, decided_at: str) -> AllocateDecision:
    """The record once kubelet gives `ids` (of `kind`) to `pod`'s `container`.

    `base` is the pod's recorded Allocation (or the node's plan for it), `notes` what kubelet
    gave its containers so far, `expected` what this container was steered to. Where kubelet's
    IDs differ from the record, the record is rebuilt around them; when kubelet is done with
    the container, pairs crossing its boundary are re-paired within it. Both stamp `decided_at`.
    """
    resource = node.resource_of(kind)
    warnings: list[str] = []
    actual = {k: pod_ids(pod, notes, container, expected, k, base,
                         ids if k == kind else (), node)
              for k in node.kinds}
    alloc = base
    if not all(set(ids_of(base, k)) == set(v) for k, v in actual.items()):
        alloc = reconcile(node.topology, base, actual, decided_at=decided_at, index=node.index)
        warnings.append(f"{pod}: kubelet gave {resource} {list(ids)} to {container}, not the "
                        f"recorded {list(expected)}; recording what kubelet gave "
                        "(decidedBy: node)")
    view = pod.container(container)
    assert view is not None  # candidates() took it from this pod
    # The container's IDs per kind once this call is noted: kubelet is done with it when
    # every resource it asks for has been allocated.
    mine = {k: [i for cn in notes if cn.container == container
                and cn.resource == node.resource_of(k) for i in cn.device_ids]
            for k in node.kinds}
    mine[kind] = list(ids)  # replaces an earlier note of this resource, as the store does
    noted = {cn.resource for cn in notes if cn.container == container} | {resource}
    ours = [r for r, _ in view.devices if kind_of(node.names, r) in node.served]
    last = all(r in noted for r in ours)
    if last:
        # Devices of a kind another plugin serves are never seen here: the record's
        # partners of this container's devices stand for them.
        all_nics = [i for k in node.nic_kinds for i in mine[k]]
        if "gpu" not in node.served:
            mine["gpu"] = partners(alloc, "vf", all_nics)
        for k in node.nic_kinds:
            if k not in node.served and view.count(node.resource_of(k)):
                mine[k] = [p.nic.pci_address for p in alloc.pairs
                           if p.gpu.device_id in mine["gpu"]
                           and p.nic.pci_address in ids_of(alloc, k)]
        all_nics = [i for k in node.nic_kinds for i in mine[k]]
        repaired = pair_container(node.topology, alloc, mine["gpu"], all_nics,
                                  decided_at=decided_at, index=node.index)
        if repaired is not None:
            warnings.append(f"{pod}: {container} was given devices the record pairs with "
                            "another container's; pairing them within the container "
                            "(decidedBy: node)")
            alloc = repaired
    spans = sum(1 for k in node.nic_kinds
                if k in node.served and view.count(node.resource_of(k))) > 1
    return AllocateDecision(
        allocation=alloc, consumed=Consumed(container, resource, tuple(ids)),
        container_ids={k: tuple(v) for k, v in mine.items()}, last=last,
        spans_nic_kinds=spans, warnings=tuple(warnings))


def pod_ids(pod: PodView, notes: Sequence[Consumed], container: str, expected: Sequence[str],
            k: Kind, base: Allocation, passed: Sequence[str], node: NodeDevices) -> list[str]:
    """The pod's IDs of kind `k` once kubelet gives `passed` to `container`.

    What kubelet gave so far is fact; the rest of the pod's share is still the record's,
    so a later container keeps its recorded devices when an earlier one got others.
    The IDs this container was steered to but did not get go last: they were its own,
    not a later container's.
    """
    r = node.resource_of(k)
    given = list(dict.fromkeys([
        *(i for cn in notes if cn.resource == r and cn.container != container
          for i in cn.device_ids), *passed]))
    passed_over = [i for i in expected if i not in given] if passed else []
    rest = [i for i in ids_of(base, k) if i not in given and i not in passed_over]
    rest += passed_over
    return given + rest[:max(0, pod.total(r) - len(given))]
