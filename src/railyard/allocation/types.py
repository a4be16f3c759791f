"""What the allocator decides: an Allocation (GPU↔NIC pairs, CPUs, memory) or why not.

The Allocation is the one record every component honours; its JSON form lives in
`railyard.records.allocation` and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from railyard.topology.model import Distance, Gpu, Nic, Vf

NicKind = Literal["vf", "pf"]
DecidedBy = Literal["scheduler", "node"]


@dataclass(frozen=True, slots=True)
class GpuRef:
    index: int
    pci_address: str
    uuid: str | None

    @classmethod
    def of(cls, gpu: Gpu) -> GpuRef:
        return cls(gpu.index, gpu.pci_address, gpu.uuid)

    @property
    def device_id(self) -> str:
        """The device plugin's ID for this GPU: its UUID, else its PCI address."""
        return self.uuid or self.pci_address


@dataclass(frozen=True, slots=True)
class NicRef:
    """A VF, or a whole PF (`kind="pf"`, `pf_pci_address == pci_address`, no VF index)."""

    kind: NicKind
    pci_address: str
    pf_pci_address: str
    vf_index: int | None
    rdma_device: str | None
    netdev: str | None
    pool: str | None = None  # a VF's pool (its resource name); None: the default pool
    # A VF's share of its PF's line rate, percent (docs/decisions/0093); None: none asked.
    bandwidth: int | None = None

    @classmethod
    def of_vf(cls, pf: Nic, vf: Vf) -> NicRef:
        return cls("vf", vf.pci_address, pf.pci_address, vf.vf_index, vf.rdma_device,
                   vf.netdev, vf.pool)

    @classmethod
    def of_pf(cls, pf: Nic) -> NicRef:
        return cls("pf", pf.pci_address, pf.pci_address, None, pf.rdma_device, pf.netdev)


@dataclass(frozen=True, slots=True)
class Pair:
    gpu: GpuRef
    nic: NicRef
    distance: Distance
    # The fabric rail of the NIC's port (docs/rails.md); None: the node does not know it.
    rail: int | None = None


@dataclass(frozen=True, slots=True)
class Affinity:
    """The pod's `preferDistance` and the worst pair it got (docs/decisions/0091)."""

    preferred: Distance
    achieved: Distance

    @property
    def fell_back(self) -> bool:
        """Whether the pod got a worse worst pair than it preferred."""
        return self.achieved > self.preferred


@dataclass(frozen=True, slots=True)
class Allocation:
    """One pod's devices on one node, in pair order.

    `pairs` has one entry per paired GPU (with shared pairing several name the same NIC);
    `nics` are NICs paired with no GPU; `gpus` are GPUs without a NIC.
    """

    node: str
    numa_nodes: tuple[int, ...]
    cpus: str | None  # exclusive CPUs as a kernel cpulist; None when the pod shares the pool
    memory_bytes: tuple[tuple[int, int], ...]  # (NUMA node, bytes), sorted by node
    pairs: tuple[Pair, ...] = ()
    nics: tuple[NicRef, ...] = ()
    gpus: tuple[GpuRef, ...] = ()
    decided_by: DecidedBy = "scheduler"
    decided_at: str | None = None  # RFC 3339, stamped by the adapter that records it
    version: int = 1
    # Set when the pod asked `preferDistance` and got pairs: what it preferred and achieved.
    affinity: Affinity | None = None

    def stamped(self, decided_by: DecidedBy, decided_at: str) -> Allocation:
        return replace(self, decided_by=decided_by, decided_at=decided_at)

    @property
    def all_gpus(self) -> tuple[GpuRef, ...]:
        """Every GPU of the pod, paired ones first, in pair order."""
        return tuple(p.gpu for p in self.pairs) + self.gpus

    @property
    def all_nics(self) -> tuple[NicRef, ...]:
        """Every distinct NIC of the pod, paired ones first in pair order, then unpaired."""
        seen: dict[str, NicRef] = {}
        for nic in (*(p.nic for p in self.pairs), *self.nics):
            seen.setdefault(nic.pci_address, nic)
        return tuple(seen.values())

    @property
    def vfs(self) -> tuple[NicRef, ...]:
        return tuple(n for n in self.all_nics if n.kind == "vf")

    @property
    def pfs(self) -> tuple[NicRef, ...]:
        return tuple(n for n in self.all_nics if n.kind == "pf")

    @property
    def rails(self) -> tuple[int | None, ...]:
        """The rail of each pair, in pair order: the pod's rail sequence."""
        return tuple(p.rail for p in self.pairs)

    @property
    def worst_distance(self) -> Distance | None:
        return max((p.distance for p in self.pairs), default=None)


@dataclass(frozen=True, slots=True)
class Infeasible:
    """No allocation on this node, and why, in words a user can act on.

    `unresolvable` is True when no preemption could help (the node is too small for the
    request even when empty), which the extender reports as FailedAndUnresolvableNodes.
    """

    reason: str
    unresolvable: bool = False
    # The memoised refusal this answer was written from, when it came from one: the same
    # for every node of the group (shape, free state), so whoever answers for other nodes
    # of the group writes each one's own answer with `refusal.at(node)`.
    refusal: Refusal | None = field(default=None, compare=False, repr=False)

    def __bool__(self) -> bool:  # an Infeasible is never a success
        return False


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request does not fit any node of one shape and free state: what memos keep.

    It names no node, so one refusal serves a whole group; `at(node)` is one node's
    `Infeasible`. A reason about the node's own size (`node_has`) gets the node's name
    there and then, as a separate field, never by rewriting a memoised text.
    """

    reason: str
    unresolvable: bool = False
    node_has: str | None = None  # set: the sentence goes on "but <node> has <node_has>"
    # The search ran out of its budget before it could say: not a fact about the node, so
    # no memo keeps it as the answer for the shape (docs/decisions/0077).
    search_budget_spent: bool = False
    # The answer when it is the same for every node (no `node_has`), made once: a memoised
    # `allocate` that says no costs ~1 µs, and building a frozen dataclass costs as much.
    _anywhere: Infeasible | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.node_has is None:
            object.__setattr__(self, "_anywhere",
                               Infeasible(self.reason, self.unresolvable, refusal=self))

    def text(self, node: str) -> str:
        """The reason as said about `node`."""
        if self.node_has is None:
            return self.reason
        return f"{self.reason} but {node} has {self.node_has}"

    def at(self, node: str) -> Infeasible:
        if self._anywhere is not None:
            return self._anywhere
        return Infeasible(self.text(node), self.unresolvable, refusal=self)
