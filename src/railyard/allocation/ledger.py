"""What is in use on one node, and by whom; double allocation is an error, not an overwrite.

A Ledger is mutable (its owner, the cluster state or the agent, guards it with a per-node
lock) but does no I/O. It is rebuilt from recorded Allocations, so it never needs saving.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from railyard.allocation.types import Allocation
from railyard.topology.cpus import parse_cpulist
from railyard.topology.model import NodeTopology


class LedgerConflict(ValueError):
    """An allocation overlaps what another holder already has (or is not on this node)."""


@dataclass(frozen=True, slots=True)
class Holding:
    """What one holder (a pod UID) has, flattened for fast set operations."""

    gpus: frozenset[str]
    vfs: frozenset[str]
    pfs: frozenset[str]
    cpus: frozenset[int]
    memory_bytes: tuple[tuple[int, int], ...]
    bandwidth: tuple[tuple[str, int], ...] = ()  # (PF, its VFs' shares summed), sorted

    @classmethod
    def of(cls, alloc: Allocation) -> Holding:
        vfs = [n.pci_address for n in alloc.vfs]
        pfs = [n.pci_address for n in alloc.pfs]
        gpus = [g.pci_address for g in alloc.all_gpus]
        for what, items in (("GPU", gpus), ("VF", vfs), ("PF", pfs)):
            dup = [a for a, c in Counter(items).items() if c > 1]
            if dup:
                raise LedgerConflict(f"allocation names {what} {dup[0]} twice")
        shares: Counter[str] = Counter()
        for n in alloc.vfs:
            if n.bandwidth:
                shares[n.pf_pci_address] += n.bandwidth
        return cls(
            frozenset(gpus), frozenset(vfs), frozenset(pfs),
            frozenset(parse_cpulist(alloc.cpus or "")), alloc.memory_bytes,
            tuple(sorted(shares.items())),
        )


class Ledger:
    """Used GPUs, VFs, whole PFs, exclusive CPUs and memory per NUMA node on one node."""

    def __init__(self, topology: NodeTopology,
                 holders: Iterable[tuple[str, Allocation]] = ()) -> None:
        self.topology = topology
        self._allocations: dict[str, Allocation] = {}
        self._holdings: dict[str, Holding] = {}
        self.used_gpus: set[str] = set()
        self.used_vfs: set[str] = set()
        self.used_pfs: set[str] = set()
        self.used_cpus: set[int] = set()
        self.used_memory: Counter[int] = Counter()
        self._vfs_used_per_pf: Counter[str] = Counter()
        # VF bandwidth shares held per PF, percent (docs/decisions/0093): never past 100.
        self._bandwidth_per_pf: Counter[str] = Counter()
        # VFs of pools other than the default, per (PF, pool): what the signature tells apart.
        self._vfs_used_per_pool: Counter[tuple[str, str]] = Counter()
        self._pf_of_vf = {v.pci_address: n.pci_address for n in topology.nics for v in n.vfs}
        self._pool_of_vf = {v.pci_address: v.pool for n in topology.nics for v in n.vfs
                            if v.pool is not None}
        self._gpus = {g.pci_address for g in topology.gpus}
        self._pfs = {n.pci_address for n in topology.nics}
        self._numa_of_cpu = {c: n.id for n in topology.numa_nodes for c in n.cpu_ids}
        self._cpus = frozenset(self._numa_of_cpu)
        self._memory = {n.id: n.memory_bytes for n in topology.numa_nodes}
        # `signature()` until the next change: every memoised allocate asks for it, and
        # rebuilding it costs several µs. Only add/remove change what it reads.
        self._signature: tuple | None = None
        for holder, alloc in holders:
            self.add(holder, alloc)

    # ------------------------------------------------------------------ changes

    def add(self, holder: str, alloc: Allocation) -> None:
        """Record `alloc` for `holder`; raise LedgerConflict and change nothing on overlap."""
        if holder in self._holdings:
            raise LedgerConflict(f"{holder} already holds an allocation on {self.topology.node}")
        if alloc.node != self.topology.node:
            raise LedgerConflict(
                f"allocation is for node {alloc.node!r}, ledger is {self.topology.node!r}")
        h = Holding.of(alloc)
        self._check(h)
        self._signature = None
        self._allocations[holder] = alloc
        self._holdings[holder] = h
        self.used_gpus |= h.gpus
        self.used_vfs |= h.vfs
        self.used_pfs |= h.pfs
        self.used_cpus |= h.cpus
        for numa, b in h.memory_bytes:
            self.used_memory[numa] += b
        for pf, share in h.bandwidth:
            self._bandwidth_per_pf[pf] += share
        for vf in h.vfs:
            self._vfs_used_per_pf[self._pf_of_vf[vf]] += 1
            pool = self._pool_of_vf.get(vf)
            if pool is not None:
                self._vfs_used_per_pool[(self._pf_of_vf[vf], pool)] += 1

    def remove(self, holder: str) -> Allocation | None:
        """Free what `holder` had; None when it had nothing (removal is idempotent)."""
        alloc = self._allocations.pop(holder, None)
        if alloc is None:
            return None
        h = self._holdings.pop(holder)
        self._signature = None
        self.used_gpus -= h.gpus
        self.used_vfs -= h.vfs
        self.used_pfs -= h.pfs
        self.used_cpus -= h.cpus
        for numa, b in h.memory_bytes:
            self.used_memory[numa] -= b
            if self.used_memory[numa] <= 0:
                del self.used_memory[numa]
        for pf, share in h.bandwidth:
            self._bandwidth_per_pf[pf] -= share
            if self._bandwidth_per_pf[pf] <= 0:
                del self._bandwidth_per_pf[pf]
        for vf in h.vfs:
            pf = self._pf_of_vf[vf]
            self._vfs_used_per_pf[pf] -= 1
            if self._vfs_used_per_pf[pf] <= 0:
                del self._vfs_used_per_pf[pf]
            pool = self._pool_of_vf.get(vf)
            if pool is not None:
                self._vfs_used_per_pool[(pf, pool)] -= 1
                if self._vfs_used_per_pool[(pf, pool)] <= 0:
                    del self._vfs_used_per_pool[(pf, pool)]
        return alloc

    def _check(self, h: Holding) -> None:
        node = self.topology.node
        for what, mine, known, used in (
            ("GPU", h.gpus, self._gpus, self.used_gpus),
            ("VF", h.vfs, self._pf_of_vf.keys(), self.used_vfs),
            ("PF", h.pfs, self._pfs, self.used_pfs),
        ):
            unknown = mine - known
            if unknown:
                raise LedgerConflict(f"{what} {min(unknown)} does not exist on {node}")
            taken = mine & used
            if taken:
                a = min(taken)
                raise LedgerConflict(f"{what} {a} on {node} is already held by {self.holder_of(a)}")
        for vf in sorted(h.vfs):  # within one allocation too: a record granting both is wrong
            if self._pf_of_vf[vf] in h.pfs:
                raise LedgerConflict(
                    f"allocation holds PF {self._pf_of_vf[vf]} on {node} whole and its VF {vf}")
        for pf in h.pfs:  # a whole PF excludes its VFs, and the other way round
            if self._vfs_used_per_pf.get(pf):
                raise LedgerConflict(f"PF {pf} on {node} has VFs in use; cannot take it whole")
        for vf in h.vfs:
            if self._pf_of_vf[vf] in self.used_pfs:
                raise LedgerConflict(f"VF {vf} on {node} belongs to a PF held whole")
        for pf, share in h.bandwidth:
            if pf not in self._pfs:
                raise LedgerConflict(f"PF {pf} does not exist on {node}")
            held = self._bandwidth_per_pf.get(pf, 0)
            if held + share > 100:
                raise LedgerConflict(
                    f"PF {pf} on {node} has {100 - held}% of its bandwidth left; the "
                    f"allocation's VFs there ask {share}%")
        if h.cpus - self._cpus:
            raise LedgerConflict(f"CPU {min(h.cpus - self._cpus)} does not exist on {node}")
        if h.cpus & self.used_cpus:
            raise LedgerConflict(f"CPU {min(h.cpus & self.used_cpus)} on {node} is already pinned")
        for numa, b in h.memory_bytes:
            if numa not in self._memory:
                raise LedgerConflict(f"NUMA node {numa} does not exist on {node}")
            if self.used_memory[numa] + b > self._memory[numa]:
                raise LedgerConflict(f"NUMA node {numa} on {node} lacks {b} bytes of memory")

    def copy(self) -> Ledger:
        """An independent plain Ledger holding the same: what a search reads while this one
        may change (the extender searches in a worker thread; docs/decisions/0077). Shares
        the topology's tables, which never change; copies only what is held."""
        new = Ledger.__new__(Ledger)
        new.topology = self.topology
        new._allocations = dict(self._allocations)
        new._holdings = dict(self._holdings)
        new.used_gpus = set(self.used_gpus)
        new.used_vfs = set(self.used_vfs)
        new.used_pfs = set(self.used_pfs)
        new.used_cpus = set(self.used_cpus)
        new.used_memory = Counter(self.used_memory)
        new._vfs_used_per_pf = Counter(self._vfs_used_per_pf)
        new._vfs_used_per_pool = Counter(self._vfs_used_per_pool)
        new._bandwidth_per_pf = Counter(self._bandwidth_per_pf)
        new._pf_of_vf = self._pf_of_vf
        new._pool_of_vf = self._pool_of_vf
        new._gpus = self._gpus
        new._pfs = self._pfs
        new._numa_of_cpu = self._numa_of_cpu
        new._cpus = self._cpus
        new._memory = self._memory
        new._signature = self._signature
        return new

    # ------------------------------------------------------------------ queries

    def holder_of(self, pci_address: str) -> str | None:
        for holder, h in self._holdings.items():
            if pci_address in h.gpus or pci_address in h.vfs or pci_address in h.pfs:
                return holder
        return None

    def allocation(self, holder: str) -> Allocation | None:
        return self._allocations.get(holder)

    def holders(self) -> Iterator[tuple[str, Allocation]]:
        return iter(list(self._allocations.items()))

    def __len__(self) -> int:
        return len(self._allocations)

    def vfs_used_on(self, pf_pci_address: str) -> int:
        return self._vfs_used_per_pf.get(pf_pci_address, 0)

    def vfs_used_in_pool(self, pf_pci_address: str, pool: str) -> int:
        """VFs of one pool other than the default in use on a PF."""
        return self._vfs_used_per_pool.get((pf_pci_address, pool), 0)

    def bandwidth_used_on(self, pf_pci_address: str) -> int:
        """The bandwidth shares its VFs hold on a PF, percent."""
        return self._bandwidth_per_pf.get(pf_pci_address, 0)

    def signature(self) -> tuple:
        """The free state as a hashable value: equal on two nodes of one shape ⇒ same answers.

        VFs enter only as counts per PF (the allocator treats VFs of a PF as interchangeable
        and picks concrete ones afterwards), so nodes that differ only in *which* VFs are
        used still share a signature; pinned CPUs likewise enter as counts per NUMA node.
        Memory enters per NUMA node in bytes. VFs of pools other than the default enter
        again per (PF, pool), so nodes that differ in which pool's VFs are used differ; the
        item is empty on a node without pools. VF bandwidth shares enter summed per PF
        (empty when none is held). Cached until the next add/remove.
        """
        if self._signature is not None:
            return self._signature
        self._signature = (
            tuple(sorted(self.used_gpus)),
            tuple(sorted(self._vfs_used_per_pf.items())),
            tuple(sorted(self.used_pfs)),
            tuple(sorted(Counter(self._numa_of_cpu[c] for c in self.used_cpus).items())),
            tuple(sorted(self.used_memory.items())),
            tuple(sorted(self._vfs_used_per_pool.items())),
            tuple(sorted(self._bandwidth_per_pf.items())),
        )
        return self._signature
