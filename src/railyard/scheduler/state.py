"""The cluster as the scheduler sees it: node topologies, one Ledger per node, bound pods.

The extender and the simulator share it. Questions about many nodes (filter, scores) are
answered per *group* of nodes with the same hardware shape and the same free state, so the
cost of a filter over 5,000 names is a few dictionary lookups per name plus one allocator
call per distinct group. Changes (bind, release) take the node's lock.

Searches run outside every lock, on a copy of the node's ledger: the extender asks from a
worker thread while its event loop releases and restores pods, and a search may take its
whole budget (docs/decisions/0077). A bind holds the devices only if the node did not change
while it searched; otherwise it searches again.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import operator
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, cast

from railyard.allocation.allocator import Allocator
from railyard.allocation.jobs import job_rails
from railyard.allocation.ledger import Ledger, LedgerConflict
from railyard.allocation.request import Request
from railyard.allocation.search import SEARCH_BUDGET
from railyard.allocation.types import Allocation, GpuRef, Infeasible, NicRef, Refusal
from railyard.records.allocation import format_decided_at
from railyard.scheduler.cluster_file import BoundPod, ClusterFileError, load_cluster
from railyard.topology.model import NodeTopology

log = logging.getLogger("railyard.scheduler")

# Answers kept per group; a group sees few request shapes, so this is rarely reached.
_ANSWERS_PER_GROUP = 256
# Searches one bind makes when the node keeps changing under it (pods released by the
# event loop meanwhile); then kube-scheduler hears an error and retries the pod.
_BIND_TRIES = 3
# What one question about many nodes (filter, scores, a preemption's victims) may explore in
# all, over the groups it decides: two decisions' budgets. Each group has its own decision,
# so without it a pod whose shape spends the budget would cost that once per group, in one
# call. Groups left once it is spent are answered "not decided" (never kept); the next call
# goes on from what the memo holds by then.
CALL_BUDGET = 2 * SEARCH_BUDGET


class NodeAllocator(Protocol):
    """The joint allocator as the cluster state uses it (`railyard.allocation.allocator`)."""

    def allocate(self, topology: NodeTopology, ledger: Ledger,
                 request: Request) -> Allocation | Infeasible: ...

    def node_score(self, topology: NodeTopology, ledger: Ledger, request: Request) -> int: ...

    def group_key(self, topology: NodeTopology, ledger: Ledger | None) -> Hashable:
        """Equal keys ⇒ equal answers (the empty ledger: None); element 0 names the shape."""
        ...

    # Optional: `explored`, the states searched so far (Allocator has it); an allocator
    # without it is never held to `ClusterState.call_budget`.


@dataclass(slots=True)
class FilterOutcome:
    """Which names fit; the others with the reason, split as kube-scheduler wants them."""

    fits: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # blocked by other pods
    unresolvable: dict[str, str] = field(default_factory=dict)  # preemption cannot help


class _Group:
    """Identity of the allocator's `group_key` (shape, free state). Nodes hold a reference,
    so grouping a name costs a hash of this object, not of the nested signature tuple.

    `answers` is the extender's memo: the allocator's answer for this group by request
    shape. The allocator memoises by the same key, but reaching its memo costs a signature
    computation per call; reaching this one costs a dict lookup, once per group per call
    (docs/decisions/0028).
    """

    __slots__ = ("__weakref__", "answers", "key", "outlook")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.answers: dict[tuple, _Answer] = {}
        self.outlook: object | None = None  # the allocator's rail outlook, once asked


@dataclass(frozen=True, slots=True)
class _Answer:
    """What the allocator said about a group for one request shape. Filter asks whether the
    pod fits, prioritize its score; each part is filled when first asked (None until then).
    Names no node: `refusal.text(name)` writes each member's own reason."""

    fits: bool | None = None
    refusal: Refusal | None = None  # why not, when `fits` is False
    score: int | None = None  # 0–10


# The answer "fits, score not asked yet" (frozen: one object serves every group).
_FITS = _Answer(fits=True)


class NeedsSearch(Exception):
    """A question asked with `search=False` needs the allocator: ask again where searching is
    allowed (the extender's worker thread)."""


# Stands for the refusal of names without a topology (`unknown_node_reason`).
_UNKNOWN = Refusal("unknown node", unresolvable=True)
_UNRESOLVABLE = operator.attrgetter("unresolvable")
_REASON = operator.attrgetter("reason")


class _Node:
    __slots__ = ("empty", "ledger", "lock", "name", "topology")

    def __init__(self, topology: NodeTopology, empty: _Group) -> None:
        self.topology = topology
        self.name = topology.node
        self.empty = empty  # the group of this node with nothing held
        self.ledger: _TrackedLedger | None = None  # created on first use: most start empty
        self.lock = threading.Lock()  # guards this node's ledger


class _TrackedLedger(Ledger):
    """A Ledger that tells the cluster state when it changes, however it is changed (the
    state's own bind/release, or a caller holding `ClusterState.ledger(name)`), so each
    node's group is always current and grouping a name is one dict lookup."""

    def __init__(self, topology: NodeTopology, holders: Iterable[tuple[str, Allocation]] = (),
                 on_change: Callable[[], None] | None = None) -> None:
        self._on_change: Callable[[], None] | None = None
        # Changes so far: a bind that searched on a copy holds its devices only when this
        # is still what it was when the copy was taken.
        self.changes = 0
        super().__init__(topology, holders)
        self._on_change = on_change

    def add(self, holder: str, alloc: Allocation) -> None:
        super().add(holder, alloc)
        self.changes += 1
        if self._on_change is not None:
            self._on_change()

    def remove(self, holder: str) -> Allocation | None:
        alloc = super().remove(holder)
        if alloc is not None:
            self.changes += 1
            if self._on_change is not None:
                self._on_change()
        return alloc


# The ledger holder of the devices a node reports unhealthy (not a pod UID: those are UUIDs).
# A whole node, as the admission reserve counts them: as many GPUs as the largest pods ask.
RESERVE_GPUS = 8
UNHEALTHY_HOLDER = "railyard.dev/unhealthy"
# Devices a rewritten record let go of while other records are still to be rewritten: kubelet
# may have given them to one of those pods (hold_records). No pod; held until all settle.
REWRITING_HOLDER = "railyard.dev/rewriting"
_NOT_PODS = (UNHEALTHY_HOLDER, REWRITING_HOLDER)


def unhealthy_hold(topology: NodeTopology, ledger: Ledger,
                   unhealthy: frozenset[str]) -> Allocation | None:
    """What to keep from new pods because the node reports it unhealthy (PCI addresses):
    each such device no pod holds. A VF of an unhealthy PF is unhealthy too. An unhealthy PF
    none of whose VFs a pod holds is held whole, which keeps its VFs with it; one with VFs in
    use gives up its other VFs one by one. `ledger` holds the pods only; None: nothing."""
    gpus = tuple(GpuRef.of(g) for g in topology.gpus
                 if g.pci_address in unhealthy and g.pci_address not in ledger.used_gpus)
    nics: list[NicRef] = []
    for nic in topology.nics:
        pf_down = nic.pci_address in unhealthy
        if nic.pci_address in ledger.used_pfs:
            continue  # a pod has it whole, VFs and all
        if pf_down and not ledger.vfs_used_on(nic.pci_address):
            nics.append(NicRef.of_pf(nic))
            continue
        nics += [NicRef.of_vf(nic, vf) for vf in nic.vfs
                 if (pf_down or vf.pci_address in unhealthy)
                 and vf.pci_address not in ledger.used_vfs]
    if not gpus and not nics:
        return None
    return Allocation(node=topology.node, numa_nodes=(), cpus=None, memory_bytes=(),
                      nics=tuple(nics), gpus=gpus)


def _free_part(ledger: Ledger, *allocations: Allocation | None) -> Allocation | None:
    """The devices of these allocations that `ledger` does not hold and its node has, as one
    device-only Allocation (CPUs and memory stay with the records); None when there are
    none. A device the node lacks (a bad record, or one from before its NodeTopology was
    republished smaller) is nobody's to hold."""
    topology = ledger.topology
    known_gpus = {g.pci_address for g in topology.gpus}
    known_pfs = {n.pci_address for n in topology.nics}
    known_vfs = {(v.pci_address, n.pci_address) for n in topology.nics for v in n.vfs}
    gpus: dict[str, GpuRef] = {}
    nics: dict[str, NicRef] = {}
    for alloc in allocations:
        if alloc is None:
            continue
        for g in alloc.all_gpus:
            if g.pci_address not in ledger.used_gpus and g.pci_address in known_gpus:
                gpus.setdefault(g.pci_address, g)
        for nic in alloc.all_nics:
            if nic.kind == "vf":
                free = ((nic.pci_address, nic.pf_pci_address) in known_vfs
                        and nic.pci_address not in ledger.used_vfs
                        and nic.pf_pci_address not in ledger.used_pfs)
            else:
                free = (nic.pci_address in known_pfs
                        and nic.pci_address not in ledger.used_pfs
                        and not ledger.vfs_used_on(nic.pci_address))
            if free:
                nics.setdefault(nic.pci_address, nic)
    whole = {pci for pci, nic in nics.items() if nic.kind == "pf"}
    nics = {pci: nic for pci, nic in nics.items()
            if nic.kind == "pf" or nic.pf_pci_address not in whole}  # the PF holds its VFs
    if not gpus and not nics:
        return None
    return Allocation(node=ledger.topology.node, numa_nodes=(), cpus=None, memory_bytes=(),
                      nics=tuple(nics.values()), gpus=tuple(gpus.values()))


def _hold_part(ledger: Ledger, holder: str, part: Allocation) -> bool:
    """Hold `part` (from `_free_part`) for `holder`; False when even that cannot be held.
    Its devices exist and are free, so only VF bandwidth shares past what a PF has left can
    refuse it: the VFs are then held without their shares (every device it may be using
    stays held; the PF's share count is already past what it has)."""
    try:
        ledger.add(holder, part)
        return True
    except LedgerConflict:
        pass
    bare = replace(part, nics=tuple(replace(n, bandwidth=None) for n in part.nics))
    try:
        ledger.add(holder, bare)
        return True
    except LedgerConflict:
        return False


def record_fault(topology: NodeTopology, alloc: Allocation) -> str | None:
    """Why `alloc` could not be held on this node even with nothing else held there (a device
    the node lacks, a PF held whole with one of its VFs, VF shares past 100 %, more memory
    than a NUMA node has); None when it could."""
    try:
        Ledger(topology).add("record", alloc)
    except LedgerConflict as e:
        return str(e)
    return None


class _PodTable(dict[str, BoundPod]):
    """The pods bound, by UID, and the UIDs of each job's pods (docs/rails.md): a job's rail
    sequence is read from its pods' records on every filter, so it must not cost a scan."""

    def __init__(self) -> None:
        super().__init__()
        self.by_job: dict[str, set[str]] = {}

    def __setitem__(self, uid: str, pod: BoundPod) -> None:
        old = self.get(uid)
        if old is not None:
            self._forget(old)
        super().__setitem__(uid, pod)
        if pod.job is not None:
            self.by_job.setdefault(pod.job, set()).add(uid)

    def __delitem__(self, uid: str) -> None:
        pod = self[uid]
        super().__delitem__(uid)
        self._forget(pod)

    def _forget(self, pod: BoundPod) -> None:
        if pod.job is not None and (uids := self.by_job.get(pod.job)) is not None:
            uids.discard(pod.uid)
            if not uids:
                del self.by_job[pod.job]


def now_rfc3339() -> str:
    return format_decided_at(datetime.now(UTC))


def unknown_node_reason(name: str) -> str:
    return f"node {name!r} is not known to Railyard (no topology for it)"


class ClusterState:
    """Node topologies + one Ledger per node + the pods bound so far."""

    def __init__(self, topologies: Iterable[NodeTopology],
                 allocator: NodeAllocator | None = None, *,
                 call_budget: int | None = CALL_BUDGET, idle_reserve: int = 0) -> None:
        self.allocator = allocator if allocator is not None else Allocator()
        self.call_budget = call_budget  # None: a call decides every group it names
        if idle_reserve < 0:
            raise ValueError(f"an idle-node reserve is a count of nodes ≥ 0, got {idle_reserve}")
        # The admission reserve (docs/scheduler.md): while at most this many whole nodes
        # (RESERVE_GPUS GPUs or more) are idle, a pod that would not fill one may not open one.
        self.idle_reserve = idle_reserve
        self._nodes: dict[str, _Node] = {}
        self._groups: weakref.WeakValueDictionary[Hashable, _Group] = (
            weakref.WeakValueDictionary())
        # Nodes regroup under their own locks, from the worker and the event loop alike:
        # two of them must not each make a group of one key.
        self._groups_lock = threading.Lock()
        # The empty node of each shape answers for every idle node of that shape; its
        # ledger is never changed. By empty group.
        self._blank: dict[_Group, Ledger] = {}
        # Every node's current group, by name: filter maps names through this in C.
        self._group_of_name: dict[str, _Group] = {}
        for t in topologies:
            self.add_node(t)
        self._pods = _PodTable()
        self._pods_lock = threading.Lock()  # taken inside a node lock, never around one
        # PCI addresses each node reports unhealthy; held under UNHEALTHY_HOLDER where free.
        self._unhealthy: dict[str, frozenset[str]] = {}
        # Per node, what REWRITING_HOLDER keeps (hold_records), by PCI address.
        self._rewriting: dict[str, Allocation] = {}
        # Records hold_records refused: ones no node state could hold (`record_fault`).
        self.refused_records = 0

    @classmethod
    def from_cluster_file(cls, path: str | Path,
                          allocator: NodeAllocator | None = None) -> ClusterState:
        cluster = load_cluster(path)
        state = cls(cluster.topologies, allocator)
        state.restore(cluster.pods)
        return state

    # ------------------------------------------------------------------ nodes

    def add_node(self, topology: NodeTopology) -> None:
        """A node appeared (its NodeTopology was created): empty, in its shape's empty group.
        Pods it already holds come back through `restore`."""
        if topology.node in self._nodes:
            raise ValueError(f"duplicate node {topology.node!r}")
        empty = self._intern(self.allocator.group_key(topology, None))
        if empty not in self._blank:
            self._blank[empty] = Ledger(topology)
        self._nodes[topology.node] = _Node(topology, empty)
        self._group_of_name[topology.node] = empty

    def remove_node(self, name: str) -> list[BoundPod]:
        """A node left (or its topology is about to be replaced): forget it and the pods it
        held here, which are returned. Filter then answers for it as for any unknown node."""
        n = self._nodes.get(name)
        if n is None:
            return []
        with n.lock, self._pods_lock:
            gone = [p for p in self._pods.values() if p.node == name]
            for p in gone:
                del self._pods[p.uid]
            del self._nodes[name]
            del self._group_of_name[name]
            self._unhealthy.pop(name, None)
            self._rewriting.pop(name, None)
        return gone

    def set_unhealthy(self, name: str, pci_addresses: Iterable[str]) -> bool:
        """The node reports these devices unhealthy (and every other one healthy): new pods
        get none of them; pods holding one keep it. False when the node is unknown."""
        n = self._nodes.get(name)
        if n is None:
            return False
        with n.lock:
            self._unhealthy[name] = frozenset(pci_addresses)
            self._hold_unhealthy(n)
        return True

    def unhealthy(self, name: str) -> frozenset[str]:
        return self._unhealthy.get(name, frozenset())

    def _hold_unhealthy(self, n: _Node) -> None:
        """Hold what `unhealthy_hold` says, again: after a health change or a pod's change
        on the node. Runs under the node's lock."""
        bad = self._unhealthy.get(n.name, frozenset())
        if n.ledger is None and not bad:
            return
        ledger = self._ledger(n)
        ledger.remove(UNHEALTHY_HOLDER)
        hold = unhealthy_hold(n.topology, ledger, bad)
        if hold is not None:
            ledger.add(UNHEALTHY_HOLDER, hold)

    # ------------------------------------------------------------------ lookups

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def node_names(self) -> list[str]:
        return list(self._nodes)

    def topology(self, name: str) -> NodeTopology:
        return self._nodes[name].topology

    def ledger(self, name: str) -> Ledger:
        return self._ledger(self._nodes[name])

    def pod_count(self) -> int:
        return len(self._pods)

    def pods(self) -> list[BoundPod]:
        with self._pods_lock:
            return list(self._pods.values())

    def pod(self, uid: str) -> BoundPod | None:
        return self._pods.get(uid)

    def _ledger(self, node: _Node) -> _TrackedLedger:
        if node.ledger is None:
            node.ledger = self._new_ledger(node)
        return node.ledger

    def _new_ledger(self, node: _Node,
                    holders: Iterable[tuple[str, Allocation]] = ()) -> _TrackedLedger:
        return _TrackedLedger(node.topology, holders, lambda: self._regroup(node))

    def _intern(self, key: Hashable) -> _Group:
        with self._groups_lock:
            g = self._groups.get(key)
            if g is None:
                g = self._groups[key] = _Group(key)
            return g

    def _regroup(self, node: _Node) -> None:
        """The node's ledger changed: move it to the group of its new free state. Runs
        inside the change, so under whatever lock the changer holds."""
        led = node.ledger
        if led is None:
            return
        self._group_of_name[node.name] = self._intern(
            self.allocator.group_key(node.topology, led))

    def _grouped(self, names: list[str]) -> tuple[list[_Group | None], dict[_Group, str]]:
        """Each name's group (None: unknown node), and one member name per group."""
        of_name = list(map(self._group_of_name.get, names))
        some_member: dict[_Group | None, str] = dict(zip(of_name, names, strict=True))
        some_member.pop(None, None)  # no None key is left: the cast says so
        return of_name, cast(dict[_Group, str], some_member)

    def _answer(self, g: _Group, member: str, request: Request, shape: tuple,
                score: bool, search: bool = True) -> _Answer:
        """The allocator's answer for a group with the part asked for filled in: the score
        (`score`), else whether the pod fits. `member` is a node of the group; `shape` is
        `request.shape` (built once per call, not once per group). Without `search`, an
        answer neither the group nor the allocator's memo holds raises NeedsSearch."""
        known = g.answers.get(shape)
        if known is not None and (known.score if score else known.fits) is not None:
            return known
        node = self._nodes[member]
        topology, empty = node.topology, node.empty
        if g is empty:
            return self._ask(g, self._blank[empty], topology, request, shape, score, search)
        free_gpus = 0  # set below whenever the node has not moved, the only case that reads it
        view: Ledger | None = None
        with node.lock:
            ledger = node.ledger
            moved = ledger is None or self._group_of_name.get(member) is not g
            if ledger is not None and not moved:
                free_gpus = len(topology.gpus) - len(ledger.used_gpus)
                if request.gpus <= free_gpus:
                    view = ledger.copy()  # the node as it is in `g`, searched outside the lock
        if view is not None:
            return self._ask(g, view, topology, request, shape, score, search)
        if moved:  # another thread changed the node meanwhile: answer, keep nothing here
            return self._answer(self._group_of_name[member], member, request, shape, score,
                                search)
        # Too few GPUs left, whatever the topology: no search needed. Whether the node could
        # ever host the pod is the empty node's answer (asked once per shape).
        never = self._answer(empty, member, request, shape, False, search).refusal
        if never is not None and never.search_budget_spent:
            never = None  # not known for the empty node; what is known here is the count
        if score:
            return self._keep(g, shape, score=0)
        return self._keep(g, shape, fits=False, refusal=never or Refusal(
            f"{request.gpus} GPUs requested but only {free_gpus} of {len(topology.gpus)} free"))

    def _ask(self, g: _Group, ledger: Ledger, topology: NodeTopology, request: Request,
             shape: tuple, score: bool, search: bool = True) -> _Answer:
        if score:
            if search:
                raw = self.allocator.node_score(topology, ledger, request)
            else:
                known = getattr(self.allocator, "node_score_known", None)
                found = known(topology, ledger, request) if known is not None else None
                if found is None:
                    raise NeedsSearch
                raw = int(found)
            value = max(0, min(10, int(raw)))
            if value == 0:
                # 0 is also what a search that spent its budget scores, which is not the
                # group's answer: ask the allocator again (its own memo answers at once).
                return _Answer(score=0)
            return self._keep(g, shape, score=value)
        result = self._fits(topology, ledger, request, search)
        if result is True:
            return self._keep(g, shape, fits=True)
        assert isinstance(result, Infeasible)
        # The allocator's own refusal names no node. An Infeasible without one (another
        # allocator) is kept as it was said about `topology`'s node.
        refusal = result.refusal or Refusal(result.reason, result.unresolvable)
        if refusal.search_budget_spent:
            return _Answer(fits=False, refusal=refusal)  # not the group's answer: not kept
        return self._keep(g, shape, fits=False, refusal=refusal)

    def _fits(self, topology: NodeTopology, ledger: Ledger, request: Request,
              search: bool) -> Infeasible | bool:
        """True when the pod fits, else why not: the allocator's `fits` where it has one
        (for a required rail sequence it spares the best choice), else its decision."""
        fits = getattr(self.allocator, "fits", None)
        if fits is None:
            result = self._allocate(topology, ledger, request, search)
            return result if isinstance(result, Infeasible) else True
        answer = fits(topology, ledger, request, search)
        if answer is None:
            raise NeedsSearch
        return cast(Infeasible | bool, answer)

    def _allocate(self, topology: NodeTopology, ledger: Ledger, request: Request,
                  search: bool) -> Allocation | Infeasible:
        """The allocator's answer; without `search`, only one its memo holds (NeedsSearch
        otherwise: an allocator without `allocate_known` always searches)."""
        if search:
            return self.allocator.allocate(topology, ledger, request)
        known = getattr(self.allocator, "allocate_known", None)
        result = known(topology, ledger, request) if known is not None else None
        if result is None:
            raise NeedsSearch
        return cast(Allocation | Infeasible, result)

    @staticmethod
    def _keep(g: _Group, shape: tuple, *, fits: bool | None = None,
              refusal: Refusal | None = None, score: int | None = None) -> _Answer:
        """Keep the part of a group's answer just learned beside the part already known."""
        known = g.answers.get(shape)
        if known is None:
            answer = (_FITS if fits is True and refusal is None and score is None
                      else _Answer(fits, refusal, score))
        elif score is None:
            answer = replace(known, fits=fits, refusal=refusal)
        else:
            answer = replace(known, score=score)
        if len(g.answers) >= _ANSWERS_PER_GROUP:
            g.answers.clear()
        g.answers[shape] = answer
        return answer

    # ------------------------------------------------------------------ questions

    def search_mark(self) -> int:
        """The states the allocator has explored so far: a call's start, for `over_budget`."""
        return int(getattr(self.allocator, "explored", 0))

    def over_budget(self, mark: int) -> bool:
        """Whether the call that started at `mark` has explored its `call_budget`."""
        return self.call_budget is not None and self.search_mark() - mark >= self.call_budget

    def _deferred(self) -> Refusal:
        return Refusal(
            f"not decided: this call's search budget ({self.call_budget:,} states) went to "
            f"other nodes; kube-scheduler will ask again", unresolvable=True,
            search_budget_spent=True)

    def filter(self, request: Request, node_names: Iterable[str], *,
               uid: str | None = None, search: bool = True,
               ranked: bool = False) -> FilterOutcome:
        """Which nodes can host `request` now; one allocator call per group of nodes.

        A pod `uid` that already holds devices fits only the node it holds them on. Without
        `search`, only from the answers the groups hold (NeedsSearch otherwise). `ranked`
        keeps of the nodes that fit only those `scores` ranks best, ties all kept, in their
        order: where kube-scheduler binds when Railyard's ranking decides (decision 0104;
        the simulator models the same).
        """
        scored = request  # a preferred sequence does not change the fit, but the score
        if request.wanted_rails and request.rail_policy == "preferred":
            # A preferred sequence never changes whether a pod fits: the plain answers hold.
            request = replace(request, rails=())
        names = list(node_names)
        out = FilterOutcome()
        held = self._pods.get(uid) if uid is not None else None
        if held is not None:
            # kube-scheduler missed the bind's reply (timeout, dropped connection, restart)
            # and schedules the pod again: its own devices must not count against it, and
            # only a bind to the same node can succeed (docs/decisions/0027).
            reason = (f"pod {held.namespace}/{held.name} ({held.uid}) is already bound to "
                      f"{held.node!r}")
            out.fits = [name for name in names if name == held.node]
            out.unresolvable = {name: reason for name in names if name != held.node}
            return out
        if not request.wants_devices:
            out.fits = names  # none of our resources: not ours to judge
            return out
        of_name, some_member = self._grouped(names)
        # Per group, why the pod does not fit; None: it fits.
        shape = request.shape
        mark = self.search_mark()
        refusals: dict[_Group | None, Refusal | None] = {}
        # A required sequence is answered from each group's rail outlook where it can be
        # (`_required_by_outlooks`): a new sequence then costs no search per group.
        by_outlook = (request.wanted_rails and request.rail_policy == "required"
                      and hasattr(self.allocator, "rail_fits_known_many"))
        plain = replace(request, rails=()) if by_outlook else request
        plain_shape = plain.shape
        unknown: list[tuple[_Group, str]] = []
        for g, member in some_member.items():
            known = g.answers.get(shape)  # the common case, without a call
            if known is None or known.fits is None:
                unknown.append((g, member))
            else:
                refusals[g] = known.refusal
        if by_outlook and unknown:
            # All the groups whose answer without the sequence is known, in one call: what
            # a new sequence asks of most of them.
            answered, unknown = self._required_by_outlooks(
                unknown, request, shape, plain_shape,
                lambda: search and not self.over_budget(mark))
            for g, known in answered:
                refusals[g] = known.refusal
        for g, member in unknown:
            if self.over_budget(mark):
                refusals[g] = self._deferred()
                continue
            known = None
            if by_outlook:
                known = self._required_by_outlook(g, member, request, shape, plain,
                                                  plain_shape, search)
            if known is None or known.fits is None:
                known = self._answer(g, member, request, shape, score=False, search=search)
            refusals[g] = known.refusal
        if None in of_name:
            refusals[None] = _UNKNOWN
        # Answer in the caller's order (kube-scheduler does not care, people reading do),
        # with C-level maps: at 5,000 names a Python loop per name is most of the cost.
        of = list(map(refusals.__getitem__, of_name))
        good = list(map(operator.is_, of, itertools.repeat(None)))
        out.fits = list(itertools.compress(names, good))
        # The group of each node that fits, for `ranked` (None is never one: it refuses).
        fit_groups = cast(list[_Group], list(itertools.compress(of_name, good))) if ranked else []
        if self.idle_reserve and out.fits:
            kept = self._keep_reserve(request, out.fits, out.unresolvable)
            if ranked and len(kept) < len(out.fits):
                left = set(kept)
                fit_groups = [g for name, g in zip(out.fits, fit_groups, strict=True)
                              if name in left]
            out.fits = kept
        if ranked and len(out.fits) > 1:
            out.fits = self._best_of(scored, out.fits, fit_groups, search)
        if len(out.fits) == len(names):
            return out
        bad = list(map(operator.not_, good))
        if not any(r is _UNKNOWN or (r is not None and r.node_has is not None)
                   for r in refusals.values()):
            # Every reason is one string for all its nodes: no per-name work in Python.
            bad_of = list(itertools.compress(of, bad))
            bad_names = list(itertools.compress(names, bad))
            hard = list(map(_UNRESOLVABLE, bad_of))
            texts = list(map(_REASON, bad_of))
            out.unresolvable.update(itertools.compress(zip(bad_names, texts, strict=True), hard))
            out.failed.update(itertools.compress(zip(bad_names, texts, strict=True),
                                                 map(operator.not_, hard)))
            return out
        for name, refusal in itertools.compress(zip(names, of, strict=True), bad):
            assert refusal is not None
            if refusal is _UNKNOWN:
                out.unresolvable[name] = unknown_node_reason(name)
            elif refusal.unresolvable:
                out.unresolvable[name] = refusal.text(name)
            else:
                out.failed[name] = refusal.text(name)
        return out

    def _required_by_outlooks(self, groups: list[tuple[_Group, str]], request: Request,
                              shape: tuple, plain_shape: tuple, may_search: Callable[[], bool],
                              ) -> tuple[list[tuple[_Group, _Answer]], list[tuple[_Group, str]]]:
        """Whether a pod with a `rails: required` sequence fits each of `groups`, from its
        answer without the sequence and its rail outlook, all in one allocator call
        (`Allocator.rail_fits_known_many`, which searches only an empty node per shape, and
        only while `may_search()`): the groups answered, each with its answer (kept), and
        those it cannot say for (no answer without the sequence yet, a spent budget's, or
        the outlook cannot tell: the caller asks the allocator). `plain_shape` is the shape
        of `request` without the sequence (built once per call)."""
        left: list[tuple[_Group, str]] = []
        asks: list[tuple[NodeTopology, object, bool]] = []
        asked: list[tuple[_Group, str, _Answer]] = []
        for g, member in groups:
            without = g.answers.get(plain_shape)
            if without is None or without.fits is None or (
                    without.refusal is not None and without.refusal.search_budget_spent):
                left.append((g, member))
                continue
            outlook = self._outlook(g, member)
            if outlook is None:  # `member` left g meanwhile: its outlook is not g's state
                left.append((g, member))
                continue
            asks.append((self._nodes[member].topology, outlook, without.fits))
            asked.append((g, member, without))
        said_all = self.allocator.rail_fits_known_many(  # type: ignore[attr-defined]
            request, asks, may_search) if asks else []
        answered: list[tuple[_Group, _Answer]] = []
        for (g, member, without), said in zip(asked, said_all, strict=True):
            if said is None:
                left.append((g, member))
            elif said is True:
                answered.append((g, self._keep(g, shape, fits=True)))
            else:
                answered.append((g, self._keep(
                    g, shape, fits=False, refusal=without.refusal if said is False else said)))
        return answered, left

    def _required_by_outlook(self, g: _Group, member: str, request: Request, shape: tuple,
                             plain: Request, plain_shape: tuple,
                             search: bool) -> _Answer | None:
        """`_required_by_outlooks` for one group, first asking (searching where it must) for
        its answer without the sequence; None where that cannot say. `plain` is `request`
        without the sequence."""
        without = g.answers.get(plain_shape)
        if without is None or without.fits is None:
            # Kept on g only if it is still g's: `_answer` answers for the group `member`
            # is in now, and a spent budget is not kept at all.
            self._answer(g, member, plain, plain_shape, score=False, search=search)
        answered, _ = self._required_by_outlooks([(g, member)], request, shape, plain_shape,
                                                 lambda: search)
        return answered[0][1] if answered else None

    def idle_whole_nodes(self) -> int:
        """Nodes of RESERVE_GPUS GPUs or more with nothing held: what the reserve keeps."""
        group_of = self._group_of_name
        return sum(1 for n in list(self._nodes.values())
                   if len(n.topology.gpus) >= RESERVE_GPUS and group_of.get(n.name) is n.empty)

    def _keep_reserve(self, request: Request, fits: list[str],
                      refused: dict[str, str]) -> list[str]:
        """`fits` without the idle whole nodes a pod that would not fill one may not open
        while the reserve is down to its last `idle_reserve` (each added to `refused`). Read
        without the node locks: a bind racing this filter may open one more (a bind does not
        check the reserve), which the next filter counts."""
        idle = self.idle_whole_nodes()
        if idle > self.idle_reserve:
            return fits
        kept = []
        for name in fits:
            n = self._nodes[name]
            gpus = len(n.topology.gpus)
            if (gpus >= RESERVE_GPUS and request.gpus < gpus
                    and self._group_of_name.get(name) is n.empty):
                refused[name] = (
                    f"node {name!r} is one of the last {idle} idle nodes of "
                    f"{RESERVE_GPUS}+ GPUs, kept for pods that fill one (admission reserve "
                    f"{self.idle_reserve}; the pod asks {request.gpus} of its {gpus} GPUs)")
            else:
                kept.append(name)
        return kept

    def scores(self, request: Request, node_names: Iterable[str], *,
               uid: str | None = None, search: bool = True) -> dict[str, int]:
        """The allocator's 0–10 score per node (0 for unknown nodes and device-less pods);
        a pod `uid` that already holds devices scores 10 on its node, 0 elsewhere. Without
        `search`, only from the answers the groups hold (NeedsSearch otherwise)."""
        names = list(node_names)
        held = self._pods.get(uid) if uid is not None else None
        if held is not None:
            return {name: 10 if name == held.node else 0 for name in names}
        if not request.wants_devices:
            return dict.fromkeys(names, 0)
        of_name, some_member = self._grouped(names)
        score = self._scores_of(request, some_member, search)
        score[None] = 0
        return dict(zip(names, map(score.__getitem__, of_name), strict=True))

    def _best_of(self, request: Request, fits: list[str], groups: list[_Group],
                 search: bool) -> list[str]:
        """The best-scored of `fits` for a device pod not held yet, from the group of each
        (looked up once, by filter): one score per group, then C-level maps per name."""
        score = self._scores_of(request, dict(zip(groups, fits, strict=True)), search)
        best = max(score.values())
        return list(itertools.compress(fits, map(best.__eq__, map(score.__getitem__, groups))))

    def _scores_of(self, request: Request, some_member: dict[_Group, str],
                   search: bool) -> dict[_Group | None, int]:
        """The score of each group (`some_member`: one node of each), with the pod's rail
        sequence where it has one."""
        if request.wanted_rails and request.rail_policy in ("preferred", "required"):
            return self._rail_scores(request, some_member, search)
        return self._group_scores(request, some_member, search)

    def _group_scores(self, request: Request, some_member: dict[_Group, str],
                      search: bool) -> dict[_Group | None, int]:
        """The score of each group (`some_member`: one node of each)."""
        shape = request.shape
        score: dict[_Group | None, int] = {}
        mark = self.search_mark()
        for g, member in some_member.items():
            known = g.answers.get(shape)  # the common case, without a call
            if known is None or known.score is None:
                if self.over_budget(mark):
                    score[g] = 0  # not decided in this call
                    continue
                known = self._answer(g, member, request, shape, score=True, search=search)
            assert known.score is not None
            score[g] = known.score
        return score

    def _rail_scores(self, request: Request, some_member: dict[_Group, str],
                     search: bool) -> dict[_Group | None, int]:
        """Scores for a pod with a rail sequence (docs/rails.md), bounded: each new
        sequence may cost a search per group, so the exact score with the sequence is asked
        only of the groups that might win. A group's score without the sequence bounds the
        one with it (`allocator.rail_score_bound`, tightened per group from its rail outlook
        when that is needed); groups are scored exactly best bound first, until no group
        left could beat the best exact score. Every other node keeps its plain score,
        capped one below that best (it is not known to keep the rails, so it never outranks
        a node that is) — under `required` only where the pod fits with its sequence
        (filter's answer), 0 elsewhere. So the best-scored nodes score what the exact
        question would give them, and no node would score higher with it."""
        plain = self._group_scores(replace(request, rails=()), some_member, search)
        required = request.rail_policy == "required"
        shape = request.shape
        coarse = getattr(type(self.allocator), "coarse_rail_bound", None)
        fine = getattr(self.allocator, "rail_score_bound", None)
        exact: dict[_Group | None, int] = {}
        # (−bound, order, refined, group, member): a heap, best bound first.
        pending: list[tuple[int, int, bool, _Group, str]] = []
        bound_of: dict[int, int] = {}  # the coarse bound by plain score: 11 values at most
        for k, (g, member) in enumerate(some_member.items()):
            p = plain[g]
            if p == 0:  # does not fit: a sequence cannot change that
                exact[g] = 0
                continue
            known = g.answers.get(shape)
            if known is not None and known.score is not None:
                exact[g] = known.score
            else:
                bound = bound_of.get(p)
                if bound is None:
                    bound = bound_of[p] = 10 if coarse is None else coarse(p, request)
                pending.append((-bound, k, fine is None, g, member))
        best = max(exact.values(), default=0)
        heapq.heapify(pending)
        while pending and -pending[0][0] > best:
            neg, k, refined, g, member = heapq.heappop(pending)
            if not refined:
                assert fine is not None
                outlook = self._outlook(g, member)
                # Without g's outlook (`member` left g meanwhile) the coarse bound stands.
                tight = -neg if outlook is None else fine(self.topology(member), outlook,
                                                          request, plain[g], search)
                if tight is None:
                    raise NeedsSearch
                if tight < -neg:
                    heapq.heappush(pending, (-tight, k, True, g, member))
                    continue
            known = self._answer(g, member, request, shape, score=True, search=search)
            assert known.score is not None
            exact[g] = known.score
            best = max(best, known.score)
        if required:
            for _, _, _, g, member in pending:
                if g in exact:
                    continue
                known = g.answers.get(shape)  # filter's answer, as a rule
                if known is None or known.fits is None:
                    known = self._answer(g, member, request, shape, score=False, search=search)
                if not known.fits:
                    exact[g] = 0
        cap = max(best - 1, 1)
        return {g: exact[g] if g in exact else min(plain[g], cap) for g in some_member}

    def _outlook(self, g: _Group, member: str) -> object | None:
        """The allocator's rail outlook of group `g` (`member` is one of its nodes): kept on
        the group, so it is worked out once per free state. None when `member` has left `g`
        meanwhile (a bind or a release on it): another group's outlook must never be mixed
        with g's answers, which are kept on g."""
        if g.outlook is not None:
            return g.outlook
        node = self._nodes[member]
        if g is node.empty:
            outlook = self.allocator.rail_outlook(node.topology, None)  # type: ignore[attr-defined]
        else:
            with node.lock:
                if self._group_of_name.get(member) is not g or node.ledger is None:
                    return None  # moved meanwhile: g's free state is not its own now
                outlook = self.allocator.rail_outlook(  # type: ignore[attr-defined]
                    node.topology, node.ledger)
        g.outlook = outlook
        return outlook

    # ------------------------------------------------------------------ changes

    def job_rails(self, job: str | None) -> tuple[int | None, ...]:
        """The rail sequence of `job` from the records of its pods bound so far (`jobs.
        job_rails`); () for no job, or a job none of whose pods holds a pair yet."""
        if job is None:
            return ()
        with self._pods_lock:
            uids = self._pods.by_job.get(job)
            if not uids:
                return ()
            held = [p.allocation.rails for u in uids
                    if (p := self._pods[u]).allocation is not None]
        return job_rails(held)

    def job_request(self, request: Request, job: str | None) -> Request:
        """`request` with its job's rail sequence (docs/rails.md): what filter, prioritize and
        bind weigh for a pod of a job; the first pod of a job, like a pod of none, has none
        and picks freely."""
        if job is None or not request.takes_job_rails:
            return request
        rails = self.job_rails(job)
        return replace(request, rails=rails) if rails != request.rails else request

    def bind(self, uid: str, namespace: str, name: str, node: str, request: Request, *,
             decided_at: str | None = None, search: bool = True,
             job: str | None = None) -> Allocation | Infeasible:
        """Allocate on `node` against its latest ledger and hold the devices for `uid`.
        `job`: the pod's job, recorded with it (its rails then steer the job's next pods).

        Idempotent: binding a UID again to the node it holds returns its Allocation. Without
        `search`, only from the allocator's memo: NeedsSearch (nothing held) otherwise.
        """
        who = f"pod {namespace}/{name} ({uid})"
        for _ in range(_BIND_TRIES):
            # Looked up on each try: the node may have been replaced (a new NodeTopology
            # shape) or removed while the last try searched.
            n = self._nodes.get(node)
            if n is None:
                return Infeasible(unknown_node_reason(node), unresolvable=True)
            with n.lock:
                held = self._pods.get(uid)
                if held is not None:
                    if held.node == node and held.allocation is not None:
                        return held.allocation
                    return Infeasible(f"{who} is already bound to {held.node!r}",
                                      unresolvable=True)
                ledger = self._ledger(n)
                changes = ledger.changes
                view = ledger.copy()
            # Outside the lock: the event loop takes it to release pods, and must not wait
            # for a search.
            result = self._allocate(n.topology, view, request, search)
            if isinstance(result, Infeasible):
                return result
            with n.lock:
                if (self._nodes.get(node) is not n or n.ledger is not ledger
                        or ledger.changes != changes):
                    # The node changed while we searched, or was replaced or removed (its
                    # old ledger is no one's now): decide on what it is now.
                    continue
                alloc = result.stamped("scheduler", decided_at or now_rfc3339())
                with self._pods_lock:
                    if uid in self._pods:  # the same UID raced onto another node
                        return Infeasible(f"{who} is already bound to "
                                          f"{self._pods[uid].node!r}", unresolvable=True)
                    try:
                        ledger.add(uid, alloc)
                    except LedgerConflict as e:  # an allocator bug; never a double allocation
                        return Infeasible(f"allocation conflicts with the ledger: {e}")
                    self._pods[uid] = BoundPod(namespace, name, uid, node, alloc, job)
                return alloc
        return Infeasible(f"node {node!r} changed during each of {_BIND_TRIES} searches for "
                          f"{who}; kube-scheduler will retry")

    def bind_without_devices(self, uid: str, namespace: str, name: str,
                             node: str) -> Infeasible | None:
        """Record that `uid`, a pod asking for no Railyard devices, is bound to `node`;
        None when done (or it already was, to the same node).

        It holds nothing, but a pod is bound once: without the record, a second bind of the
        same UID to another node would be taken too (issue 19).
        """
        if node not in self._nodes:
            return Infeasible(unknown_node_reason(node), unresolvable=True)
        with self._pods_lock:
            held = self._pods.get(uid)
            if held is None:
                self._pods[uid] = BoundPod(namespace, name, uid, node, None)
                return None
        if held.node == node and held.allocation is None:
            return None
        return Infeasible(f"pod {namespace}/{name} ({uid}) is already bound to {held.node!r}",
                          unresolvable=True)

    def release(self, uid: str) -> BoundPod | None:
        """Free what `uid` holds; None when it holds nothing (release is idempotent)."""
        pod = self._pods.get(uid)
        if pod is None:
            return None
        n = self._nodes.get(pod.node)
        if n is None:  # its node left meanwhile: nothing held, only the record to forget
            with self._pods_lock:
                if self._pods.get(uid) is not pod:
                    return None
                del self._pods[uid]
            return pod
        with n.lock, self._pods_lock:
            if self._pods.get(uid) is not pod:
                return None  # released (or rebound) meanwhile
            del self._pods[uid]
            if n.ledger is not None:
                n.ledger.remove(uid)
                if n.name in self._unhealthy:
                    self._hold_unhealthy(n)  # what the pod held may be unhealthy
        return pod

    def restore(self, pods: Iterable[BoundPod]) -> None:
        """Rebuild ledgers from recorded pods: all of them or, on any conflict, none.

        Raises ClusterFileError naming the pod.
        """
        pods = list(pods)
        for p in pods:
            if p.node not in self._nodes:
                raise ClusterFileError(f"pod {p.namespace}/{p.name} ({p.uid})",
                                       f"unknown node {p.node!r}")
        # The nodes' locks, in name order (nobody else takes two), for the whole rebuild: a
        # bind committing from the worker thread meanwhile must not be lost by the swap.
        with ExitStack() as locked:
            for name in sorted({p.node for p in pods if p.allocation is not None}):
                locked.enter_context(self._nodes[name].lock)
            fresh: dict[str, _TrackedLedger] = {}
            seen: set[str] = set()
            for p in pods:
                where = f"pod {p.namespace}/{p.name} ({p.uid})"
                n = self._nodes[p.node]
                if p.uid in seen or p.uid in self._pods:
                    raise ClusterFileError(where, "uid recorded twice")
                seen.add(p.uid)
                if p.allocation is None:
                    continue
                ledger = fresh.get(p.node)
                if ledger is None:
                    current = [(h, a) for h, a in
                               (n.ledger.holders() if n.ledger is not None else ())
                               if h != UNHEALTHY_HOLDER]  # held again below, around the pods
                    ledger = fresh[p.node] = self._new_ledger(n, current)
                try:
                    ledger.add(p.uid, p.allocation)
                except LedgerConflict as e:
                    raise ClusterFileError(where, str(e)) from None
            for name, ledger in fresh.items():
                n = self._nodes[name]
                n.ledger = ledger
                self._hold_unhealthy(n)
                self._regroup(n)
            with self._pods_lock:
                for p in pods:  # a pod bound without devices holds nothing but its node
                    self._pods[p.uid] = p

    def hold_records(self, pods: Iterable[BoundPod]) -> list[BoundPod]:
        """Hold what these pods' records say now, in one change; the pods not settled yet.

        The agent rewrites a record to what kubelet really gave the pod, one pod at a time,
        so two pods kubelet swapped name each other's devices until both are rewritten. Taken
        together they fit; one whose record still clashes with a pod outside `pods` holds,
        for now, every device of its old holding and its new record that nobody else holds —
        no device it may be using looks free — and is returned, to be offered again with the
        next change. A new record no device of which is free (one copied from another pod)
        holds nothing, and the pod is not bound here.
        """
        pods = list(pods)
        uids = {p.uid for p in pods}
        bound_on = {bp.node for u in uids if (bp := self._pods.get(u)) is not None}
        names = sorted({p.node for p in pods} | bound_on | set(self._rewriting))
        names = [name for name in names if name in self._nodes]
        with ExitStack() as locked:
            for name in names:
                locked.enter_context(self._nodes[name].lock)
            fresh: dict[str, _TrackedLedger] = {}
            held: dict[str, Allocation] = {}  # what each of the pods holds now, by uid
            for name in names:
                n = self._nodes[name]
                current = list(n.ledger.holders()) if n.ledger is not None else []
                held.update((h, a) for h, a in current if h in uids)
                fresh[name] = self._new_ledger(
                    n, [(h, a) for h, a in current if h not in uids and h not in _NOT_PODS])
            waiting = [p for p in pods if p.node in fresh and p.allocation is not None]
            placed = True
            while waiting and placed:  # a record may fit only once another has moved
                placed = False
                for p in list(waiting):
                    try:
                        fresh[p.node].add(p.uid, p.allocation)  # type: ignore[arg-type]
                    except LedgerConflict:
                        continue
                    waiting.remove(p)
                    placed = True
            unbound = set()
            for p in list(waiting):
                fault = record_fault(fresh[p.node].topology, p.allocation)  # type: ignore[arg-type]
                if fault is not None:
                    # No other record's move will ever make it fit: refused, not waiting.
                    # What of it exists and is free is held all the same (the pod may be
                    # using it); the rest is nobody's.
                    waiting.remove(p)
                    self.refused_records += 1
                    log.warning("pod %s/%s (%s): its record cannot be held on %s (%s); "
                                "holding only the devices it names that the node has free",
                                p.namespace, p.name, p.uid, p.node, fault)
                before = held.get(p.uid)
                hold = _free_part(fresh[p.node], p.allocation,
                                  before if before is not None and before.node == p.node
                                  else None)
                if hold is not None and not _hold_part(fresh[p.node], p.uid, hold):
                    hold = None
                if hold is None and p.uid not in self._pods:
                    unbound.add(p.uid)  # new, and may take nothing: not bound here
            let_go = {name: [a for a in (self._rewriting.get(name),) if a is not None]
                      for name in fresh}
            for before in held.values():
                let_go[before.node].append(before)
            self._rewriting.clear()
            for name, ledger in fresh.items():
                n = self._nodes[name]
                if (waiting and (hold := _free_part(ledger, *let_go[name])) is not None
                        and _hold_part(ledger, REWRITING_HOLDER, hold)):
                    self._rewriting[name] = hold
                n.ledger = ledger
                self._hold_unhealthy(n)
                self._regroup(n)
            with self._pods_lock:
                for p in pods:
                    if p.uid in unbound or p.node not in self._nodes:
                        if p.uid in self._pods:
                            del self._pods[p.uid]
                    else:
                        self._pods[p.uid] = p
        return [p for p in waiting if p.uid not in unbound]

    # ------------------------------------------------------------------ preemption

    def victims(self, request: Request, node: str, candidates: list[str]) -> list[str] | None:
        """kube-scheduler's proposed victims on `node` (pod UIDs), when evicting all of them
        lets `request` fit; None when it does not, or when nothing is proposed.

        The list is answered whole, never shortened: kube-scheduler built it by removing
        every lower-priority pod and reprieving each one its own filters (CPU, memory, GPU
        count...) can spare, so every pod left in it is needed by those filters, whatever
        devices it holds here. Nor is it lengthened: which other pods may go is a priority
        question only kube-scheduler can answer (docs/decisions/0026).
        """
        n = self._nodes.get(node)
        if n is None or not candidates:
            return None
        gone = set(candidates)
        with n.lock:
            left = [(h, a) for h, a in self._ledger(n).holders()
                    if h not in gone and h != UNHEALTHY_HOLDER]
        ledger = Ledger(n.topology, left)
        hold = unhealthy_hold(n.topology, ledger, self.unhealthy(node))
        if hold is not None:  # what the victims free may be unhealthy
            ledger.add(UNHEALTHY_HOLDER, hold)
        if isinstance(self.allocator.allocate(n.topology, ledger, request), Infeasible):
            return None
        return list(candidates)
