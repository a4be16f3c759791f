"""An independent, exhaustive reference for the allocator's key (docs/allocation.md, items 1–8).

Slow on purpose: it enumerates every GPU set, every GPU→PF pairing and every way to take
VFs and whole PFs, with no bounds and no ordering tricks, and computes the key of each
candidate from scratch. `key_of` computes the same key from a concrete Allocation, so the
allocator's answer is judged by what it returns, not by its internals.

VF pools (docs/decisions/0085): a VF is taken from its own pool only; the paired pool's VFs
pair, the other pools' are unpaired NICs; a PF is open (aligned capacity) while it has a free
VF of any pool; the address tie-break lists the paired pool's PFs, then each other pool's.

Bandwidth (docs/decisions/0093): the VFs a candidate takes on a PF, each asking
`r.vf_bandwidth` percent, and the shares the ledger's records hold there sum to at most 100.

Rails (docs/rails.md): pair p (the p-th paired GPU in address order) wants the rail
`r.wanted_rails[p]` (None: any); a pair whose NIC's PF is on another rail, or on none, is a
mismatch: infeasible under `rails: required`, else counted right after the worst distance.
"""

from __future__ import annotations

from collections import Counter
from itertools import combinations, product

from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation
from railyard.topology.model import GDR_LIMIT, NodeTopology

UNPAIRED = ("zzzz", 0)  # sorts after every PCI address
VF, WHOLE = 0, 1


def pairing_bounds(r: Request) -> tuple[int, int, int]:
    """(lo, hi, pairs): GPUs each NIC serves, and how many GPUs get a NIC."""
    k, n = r.gpus, r.nics
    if r.pairing == "none" or k == 0 or n == 0:
        return 0, 0, 0
    if n >= k:
        return 0, 1, k
    if r.pairing == "shared":
        return k // n, -(-k // n), k
    return 1, 1, n


class Node:
    """Free state of a node, read straight from the topology and the ledger."""

    def __init__(self, t: NodeTopology, ledger: Ledger | None) -> None:
        self.t = t
        used_vfs = ledger.used_vfs if ledger else set()
        used_pfs = ledger.used_pfs if ledger else set()
        used_gpus = ledger.used_gpus if ledger else set()
        used_cpus = ledger.used_cpus if ledger else set()
        self.free_gpus = sorted(g.pci_address for g in t.gpus if g.pci_address not in used_gpus)
        self.gpu_numa = {g.pci_address: self.numa(g.numa_node) for g in t.gpus}
        self.pf_numa = {n.pci_address: self.numa(n.numa_node) for n in t.nics}
        self.free_vfs: dict[str, int] = {}
        self.free_pool: dict[tuple[str, str | None], int] = {}  # (PF, pool) -> free VFs
        self.whole_ok: dict[str, bool] = {}
        for n in t.nics:
            port = n.port_state is None or n.port_state.upper().endswith("ACTIVE")
            # docs/allocation.md, "What is offered": an RDMA VF (not vfio-pci, bound or with an
            # RDMA device) is offered while in the host view; one that left it is held by a pod.
            in_view = [v for v in n.vfs if v.netdev is not None or v.rdma_device is not None]
            offered = [v for v in in_view if v.is_rdma]
            held = any(v.is_rdma and v not in in_view for v in n.vfs)
            in_use = any(v.pci_address in used_vfs for v in n.vfs)
            whole_held = n.pci_address in used_pfs
            self.free_vfs[n.pci_address] = 0 if (not port or whole_held) else sum(
                1 for v in offered if v.pci_address not in used_vfs)
            for v in offered:
                key = (n.pci_address, v.pool)
                self.free_pool.setdefault(key, 0)
                if port and not whole_held and v.pci_address not in used_vfs:
                    self.free_pool[key] += 1
            self.whole_ok[n.pci_address] = (port and not n.default_route and not whole_held
                                            and not in_use and not held)
        # VF bandwidth shares held per PF (docs/decisions/0093), from the records themselves.
        self.bandwidth_used: Counter[str] = Counter()
        for _, held in (ledger.holders() if ledger else ()):
            for n in held.vfs:
                self.bandwidth_used[n.pf_pci_address] += n.bandwidth or 0
        self.free_cpus = {m.id: len(m.cpu_ids - used_cpus) for m in t.numa_nodes}
        self.free_mem = {m.id: m.memory_bytes - (ledger.used_memory[m.id] if ledger else 0)
                         for m in t.numa_nodes}

    def numa(self, n: int | None) -> object:
        if n is None:
            return self.t.numa_nodes[0].id if len(self.t.numa_nodes) == 1 else "unknown"
        return n

    def span(self, r: Request, devices: set) -> int | None:
        real = {d for d in devices if d != "unknown"}
        unknown = int("unknown" in devices)
        ids = sorted(self.free_cpus)
        best = None
        if r.exclusive_cpus or r.memory_bytes:
            for size in range(len(ids) + 1):
                for extra in combinations([i for i in ids if i not in real], size):
                    t = real | set(extra)
                    if (sum(self.free_cpus[i] for i in t) >= r.exclusive_cpus
                            and sum(self.free_mem[i] for i in t) >= r.memory_bytes):
                        best = len(t)
                        break
                if best is not None:
                    break
            if best is None:
                return None
        else:
            best = len(real)
        if r.numa == "single" and best + unknown > 1:
            return None
        return 0 if r.numa == "none" else best + unknown

    def aligned(self, gpus_after: list[str], open_pfs: list[str]) -> int:
        """Maximum matching by trying every assignment (tiny graphs only)."""
        edges = {g: [p for p in open_pfs if self.t.distance[g][p] <= GDR_LIMIT]
                 for g in gpus_after}
        best = 0

        def go(idx: int, used: frozenset, size: int) -> None:
            nonlocal best
            best = max(best, size)
            if idx == len(gpus_after) or size + len(gpus_after) - idx <= best:
                return
            for p in edges[gpus_after[idx]]:
                if p not in used:
                    go(idx + 1, used | {p}, size + 1)
            go(idx + 1, used, size)

        go(0, frozenset(), 0)
        return best


def key_parts(node: Node, r: Request, gset: tuple[str, ...],
              targets: tuple[tuple[str, int], ...], vf_counts: dict[str, int],
              whole: set[str], others: tuple[dict[str, int], ...] = ()) -> tuple | None:
    """The key of one abstract candidate, or None if it breaks a rule or a hard limit.
    `vf_counts`: the paired pool's VFs per PF; `others`: each other pool's, in
    `other_pools(r)` order."""
    t = node.t
    lo, hi, pairs = pairing_bounds(r)
    loads: Counter[str] = Counter()
    dists = []
    wanted = r.wanted_rails
    rail_of = {n.pci_address: n.rail for n in t.nics}
    mism = 0
    for g, (pf, kind) in zip(gset, targets, strict=True):
        if (pf, kind) == UNPAIRED:
            continue
        if (kind == WHOLE) != (pf in whole) or (kind == VF and vf_counts.get(pf, 0) == 0):
            return None
        d = int(t.distance[g][pf])
        if r.max_distance is not None and d > r.max_distance:
            return None
        p = len(dists)
        if p < len(wanted) and wanted[p] is not None and rail_of[pf] != wanted[p]:
            if r.rail_policy == "required":
                return None
            mism += 1
        loads[pf] += 1
        dists.append(d)
    if len(dists) != pairs:
        return None
    for pf in t.nics:
        a = pf.pci_address
        n_inst = 1 if a in whole else vf_counts.get(a, 0)
        if not n_inst * lo <= loads[a] <= n_inst * hi:
            return None
    devices = {node.gpu_numa[g] for g in gset}
    devices |= {node.pf_numa[a] for a, c in vf_counts.items() if c}
    devices |= {node.pf_numa[a] for a in whole}
    devices |= {node.pf_numa[a] for o in others for a, c in o.items() if c}
    span = node.span(r, devices)
    if span is None:
        return None
    gpus_after = [g for g in node.free_gpus if g not in gset]
    open_pfs = [a for a, f in node.free_vfs.items()
                if f - vf_counts.get(a, 0) - sum(o.get(a, 0) for o in others) > 0
                and a not in whole]
    aligned = node.aligned(gpus_after, open_pfs)
    worst = max(dists, default=0)
    crowd = (max(loads.values(), default=0), sum(c * c for c in loads.values()))
    paired_whole = {pf for pf, kind in targets if kind == WHOLE and pf != UNPAIRED[0]}
    vfms: tuple[str, ...] = ()
    for counts in (vf_counts, *others):
        vfms += tuple(sorted(a for a, c in counts.items() for _ in range(c)))
    tie = (tuple(gset), tuple(targets), tuple(sorted(whole - paired_whole)), vfms)
    return (worst, mism, sum(dists), span, *crowd, -aligned, tie)


def other_pools(r: Request) -> list[tuple[str | None, int]]:
    """The pools asked besides the paired one, (pool, count), in the search's order."""
    return [(p, c) for p, c in r.vf_counts if p != r.pair_pool]


def brute_force(t: NodeTopology, ledger: Ledger | None, r: Request) -> tuple | None:
    """The minimum key over every candidate; None when nothing is feasible."""
    node = Node(t, ledger)
    if len(node.free_gpus) < r.gpus:
        return None
    pfs = [n.pci_address for n in t.nics]
    asked = [(r.pair_pool, r.paired_vfs), *other_pools(r)]
    per_pf = []
    for a in pfs:
        ranges = [range(node.free_pool.get((a, p), 0) + 1) if c else range(1)
                  for p, c in asked]
        options: list[tuple[str, tuple[int, ...]]] = [("vf", cs) for cs in product(*ranges)]
        if node.whole_ok[a]:
            options.append(("whole", ()))
        per_pf.append(options)
    configs = []
    for combo in product(*per_pf):
        counts = [{a: cs[q] for a, (kind, cs) in zip(pfs, combo, strict=True)
                   if kind == "vf" and cs[q]} for q in range(len(asked))]
        whole = {a for a, (kind, _) in zip(pfs, combo, strict=True) if kind == "whole"}
        if (all(sum(c.values()) == n for c, (_, n) in zip(counts, asked, strict=True))
                and len(whole) == r.pfs
                and all(node.bandwidth_used[a] + r.vf_bandwidth * sum(c.get(a, 0) for c in counts)
                        <= 100 for a in pfs)):
            configs.append((counts, whole))
    best = None
    for gset in combinations(node.free_gpus, r.gpus):
        for counts, whole in configs:
            options = [UNPAIRED, *((a, VF) for a in counts[0]), *((a, WHOLE) for a in whole)]
            for targets in product(options, repeat=r.gpus):
                key = key_parts(node, r, gset, targets, counts[0], whole, tuple(counts[1:]))
                if key is not None and (best is None or key < best):
                    best = key
    return best


def key_of(t: NodeTopology, ledger: Ledger, r: Request, a: Allocation) -> tuple | None:
    """The key of a concrete Allocation, computed as the brute force computes it."""
    node = Node(t, ledger)
    by_gpu = {p.gpu.pci_address: p.nic for p in a.pairs}
    gset = tuple(sorted(g.pci_address for g in a.all_gpus))
    targets = tuple(
        (by_gpu[g].pf_pci_address, WHOLE if by_gpu[g].kind == "pf" else VF)
        if g in by_gpu else UNPAIRED
        for g in gset
    )
    counts = Counter(n.pf_pci_address for n in a.vfs if n.pool == r.pair_pool)
    others = tuple(dict(Counter(n.pf_pci_address for n in a.vfs if n.pool == p))
                   for p, _ in other_pools(r))
    whole = {n.pci_address for n in a.pfs}
    return key_parts(node, r, gset, targets, dict(counts), whole, others)
