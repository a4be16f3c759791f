"""A node's hardware as the allocator searches it: indices, bit masks and integer distances.

Built once per shape (equal `shape_key`) and shared by every node of that shape; only the
parts naming devices are per node (`same_shape`). `FreeState` is the ledger's free state in
the same terms. Pure: no I/O; the caches here belong to the `Allocator` that built them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import TypedDict

from railyard.allocation.ledger import Ledger
from railyard.allocation.types import GpuRef, NicRef, Pair
from railyard.topology.model import GDR_LIMIT, Distance, Gpu, Nic, NodeTopology, Vf


class PfMode(IntEnum):
    """How a PF serves a pod: not (yet) at all, with some of its VFs, or itself whole.

    The values order the key's address tie-break: at one PF, a VF target sorts before the
    whole PF.
    """

    UNUSED = 0
    VF = 1
    WHOLE = 2


def vf_allocatable(vf: Vf) -> bool:
    """An RDMA VF the host can hand out: an RDMA VF (`Vf.is_rdma`) still in the host view.

    An RDMA VF with neither a netdev nor an RDMA device has moved into some pod's namespace;
    it is held, whether or not the ledger knows by whom (docs/allocation.md, "What
    is offered"), until discovery sees it back on the host.
    """
    return vf.is_rdma and (vf.netdev is not None or vf.rdma_device is not None)


def vf_held_in_pod(vf: Vf) -> bool:
    """An RDMA VF out of the host view: its PF cannot be taken whole."""
    return vf.is_rdma and vf.netdev is None and vf.rdma_device is None


def port_usable(nic: Nic) -> bool:
    """A PF whose port state is known and not ACTIVE offers nothing (no VFs, not itself)."""
    return nic.port_state is None or nic.port_state.upper().endswith("ACTIVE")


@dataclass(slots=True)
class ShapeCaches:
    """Memo tables shared by every topology object of one shape (owned by the Allocator)."""

    aligned: dict[tuple[int, int], int] = field(default_factory=dict)
    empty: FreeState | None = None  # `empty_state`, built on first use


@dataclass(frozen=True, slots=True, eq=False)
class NodeShape:
    """One topology in search terms. GPUs and PFs are indexed in PCI address order, so
    comparing index tuples compares addresses (the key's last item)."""

    topology: NodeTopology
    key: tuple  # equal for nodes the allocator cannot tell apart
    id: int  # a small stand-in for `key` in memo keys (hashing `key` costs microseconds)
    gpus: tuple[Gpu, ...]
    pfs: tuple[Nic, ...]
    dist: tuple[tuple[int, ...], ...]  # [gpu][pf] distance class as an int (PIX = 0)
    numa_ids: tuple[int, ...]  # real NUMA node ids, ascending; bit b ↔ numa_ids[b]
    gpu_numa: tuple[int, ...]  # bit index per GPU (len(numa_ids) means "unknown")
    pf_numa: tuple[int, ...]
    pf_rail: tuple[int, ...]  # per PF: its fabric rail, −1 when not known (docs/rails.md)
    vfs: tuple[tuple[Vf, ...], ...]  # allocatable VFs per PF, lowest vf index first
    # VF pools (docs/decisions/0085): their names (None, the default pool, first), and per
    # PF the pool index of each VF of `vfs`, and how many of them each pool has.
    pool_names: tuple[str | None, ...]
    vf_pool: tuple[tuple[int, ...], ...]
    pool_sizes: tuple[tuple[int, ...], ...]  # [pool][PF]: allocatable VFs
    has_held_vfs: tuple[bool, ...]  # per PF: some VF is out of the host view
    port_ok: tuple[bool, ...]
    whole_static: tuple[bool, ...]  # may be taken whole when nothing of it is in use
    aligned_adj: tuple[int, ...]  # per GPU: mask of PFs within GDR_LIMIT
    cpus: tuple[tuple[int, ...], ...]  # per NUMA bit: CPU ids, ascending
    memory: tuple[int, ...]  # per NUMA bit: bytes
    nonallocatable_vfs: dict[str, int]  # VF address never offered (vfio, held) -> PF index
    pool_of_vf: dict[str, int]  # every VF's address -> its pool index (used VFs' pools)
    caches: ShapeCaches
    # Ready-made record parts (immutable), so turning a choice into an Allocation is cheap.
    gpu_refs: tuple[GpuRef, ...]
    vf_refs: tuple[tuple[tuple[str, NicRef], ...], ...]  # per PF, like `vfs`
    pf_refs: tuple[NicRef, ...]
    distances: tuple[tuple[Distance, ...], ...]  # `dist` as Distance members
    # (GPU, PF, position in `vf_refs[PF]` or −1 for the whole PF) -> its Pair, filled by the
    # allocator: Pairs are immutable, so allocations of this node's devices share them.
    pair_cache: dict[tuple[int, int, int], Pair]


def build_shape(topology: NodeTopology, caches_by_key: dict[tuple, ShapeCaches],
                ids_by_key: dict[tuple, int], key: tuple | None = None) -> NodeShape:
    """The search view of `topology` from scratch (about a millisecond on a DGX).

    `shape_key` holds everything that decides what is offered (port state, default route,
    VF driver and host visibility), so it alone identifies the shape.
    """
    if key is None:
        key = topology.shape_key
    shape_id = ids_by_key.setdefault(key, len(ids_by_key))
    caches = caches_by_key.setdefault(key, ShapeCaches())
    gpus = tuple(sorted(topology.gpus, key=lambda g: g.pci_address))
    pfs = tuple(sorted(topology.nics, key=lambda n: n.pci_address))
    numa_ids = tuple(sorted(n.id for n in topology.numa_nodes))
    bit_of = {nid: b for b, nid in enumerate(numa_ids)}
    unknown = len(numa_ids)

    def numa_bit(numa: int | None) -> int:
        if numa is None or numa < 0:
            # A single-NUMA machine that does not report it (common in VMs) is that node.
            return 0 if len(numa_ids) == 1 else unknown
        return bit_of.get(numa, unknown)

    dist = tuple(
        tuple(int(topology.distance[g.pci_address][n.pci_address]) for n in pfs) for g in gpus
    )
    port_ok = tuple(port_usable(n) for n in pfs)
    vfs = _offered_vfs(pfs, port_ok)
    held = tuple(any(vf_held_in_pod(v) for v in n.vfs) for n in pfs)
    nonalloc = {
        v.pci_address: j for j, (n, ok) in enumerate(zip(pfs, port_ok, strict=True))
        for v in n.vfs if not ok or not vf_allocatable(v)
    }
    numa_by_id = {n.id: n for n in topology.numa_nodes}
    pool_names = _pool_names(pfs)
    return NodeShape(
        topology=topology,
        key=key,
        id=shape_id,
        gpus=gpus,
        pfs=pfs,
        dist=dist,
        numa_ids=numa_ids,
        gpu_numa=tuple(numa_bit(g.numa_node) for g in gpus),
        pf_numa=tuple(numa_bit(n.numa_node) for n in pfs),
        pf_rail=tuple(-1 if n.rail is None else n.rail for n in pfs),
        vfs=vfs,
        **_pools(pfs, vfs, pool_names),
        has_held_vfs=held,
        port_ok=port_ok,
        whole_static=tuple(ok and not n.default_route for n, ok in zip(pfs, port_ok,
                                                                        strict=True)),
        aligned_adj=tuple(
            sum(1 << j for j, d in enumerate(row) if d <= GDR_LIMIT) for row in dist
        ),
        cpus=tuple(tuple(sorted(numa_by_id[i].cpu_ids)) for i in numa_ids),
        memory=tuple(numa_by_id[i].memory_bytes for i in numa_ids),
        nonallocatable_vfs=nonalloc,
        caches=caches,
        **_refs(gpus, pfs, vfs),
        distances=tuple(tuple(Distance(d) for d in row) for row in dist),
    )


def _pool_names(pfs: Sequence[Nic]) -> tuple[str | None, ...]:
    named = {v.pool for n in pfs for v in n.vfs if v.pool is not None}
    return (None, *sorted(named))


class _Pools(TypedDict):
    pool_names: tuple[str | None, ...]
    vf_pool: tuple[tuple[int, ...], ...]
    pool_sizes: tuple[tuple[int, ...], ...]
    pool_of_vf: dict[str, int]


def _pools(pfs: Sequence[Nic], vfs: Sequence[Sequence[Vf]],
           names: tuple[str | None, ...]) -> _Pools:
    index = {p: i for i, p in enumerate(names)}
    vf_pool = tuple(tuple(index[v.pool] for v in vs) for vs in vfs)
    return {
        "pool_names": names,
        "vf_pool": vf_pool,
        "pool_sizes": tuple(tuple(ps.count(q) for ps in vf_pool) for q in range(len(names))),
        "pool_of_vf": {v.pci_address: index[v.pool] for n in pfs for v in n.vfs},
    }


def _offered_vfs(pfs: Sequence[Nic], port_ok: Sequence[bool]) -> tuple[tuple[Vf, ...], ...]:
    return tuple(
        tuple(sorted((v for v in n.vfs if vf_allocatable(v)), key=lambda v: v.vf_index))
        if ok else ()
        for n, ok in zip(pfs, port_ok, strict=True)
    )


class _Refs(TypedDict):
    """`NodeShape`'s per-node fields: what names this node's own devices."""

    gpu_refs: tuple[GpuRef, ...]
    vf_refs: tuple[tuple[tuple[str, NicRef], ...], ...]
    pf_refs: tuple[NicRef, ...]
    pair_cache: dict[tuple[int, int, int], Pair]


def _refs(gpus: Sequence[Gpu], pfs: Sequence[Nic], vfs: Sequence[Sequence[Vf]]) -> _Refs:
    """The record parts naming one node's own devices (UUIDs, netdevs, RDMA names)."""
    return {
        "gpu_refs": tuple(GpuRef.of(g) for g in gpus),
        "vf_refs": tuple(tuple((v.pci_address, NicRef.of_vf(n, v)) for v in vs)
                         for n, vs in zip(pfs, vfs, strict=True)),
        "pf_refs": tuple(NicRef.of_pf(n) for n in pfs),
        "pair_cache": {},  # new refs, new Pairs
    }


def same_shape(known: NodeShape, topology: NodeTopology) -> NodeShape:
    """`known`'s search view for another node of the same shape (equal `shape_key`).

    Everything the search reads is shared; only what names devices is this node's own
    (UUIDs, netdev and RDMA names are not in `shape_key`): tens of µs instead of a full
    build, and nothing at all when the nodes share their device tuples (built from one
    profile).
    """
    if topology.gpus is known.topology.gpus and topology.nics is known.topology.nics:
        return replace(known, topology=topology)
    gpus = tuple(sorted(topology.gpus, key=lambda g: g.pci_address))
    pfs = tuple(sorted(topology.nics, key=lambda n: n.pci_address))
    vfs = _offered_vfs(pfs, known.port_ok)
    return replace(known, topology=topology, gpus=gpus, pfs=pfs, vfs=vfs,
                   **_refs(gpus, pfs, vfs), **_pools(pfs, vfs, known.pool_names))


@dataclass(frozen=True, slots=True)
class FreeState:
    """What is free on the node, in the shape's indices."""

    gpus: int  # mask of free GPUs
    vfs: tuple[int, ...]  # free allocatable VFs per PF (0 when the PF is held whole)
    whole_ok: tuple[bool, ...]  # per PF: may be taken whole now
    cpus: tuple[int, ...]  # free CPUs per NUMA bit
    memory: tuple[int, ...]  # free bytes per NUMA bit
    in_use: bool  # anything at all held on the node (for packing)
    # [pool][PF]: free VFs of each pool (`shape.pool_names`); `vfs` is their sum, except in
    # `for_pool`'s view, where it is one pool's and `any_vfs` keeps the sum.
    pools: tuple[tuple[int, ...], ...] = ()
    any_vfs: tuple[int, ...] = ()
    # Per PF: the bandwidth its VFs' shares leave, percent (docs/decisions/0093); empty: 100
    # on every PF (nothing held asks a share).
    bandwidth: tuple[int, ...] = ()

    def capped(self, share: int) -> FreeState:
        """The free state as a request whose VFs each ask `share` percent sees it: a PF
        gives at most as many VFs as its bandwidth left holds shares (`vfs` only: such a
        request asks the VFs of one pool, already selected by `for_pool`)."""
        if not share:
            return self
        left = self.bandwidth or (100,) * len(self.vfs)
        return replace(self, vfs=tuple(min(v, b // share)
                                       for v, b in zip(self.vfs, left, strict=True)))

    def for_pool(self, pool: int | None) -> FreeState:
        """The free state as one pool's request sees it: `vfs` counts that pool's VFs only
        (none when the node has no such pool)."""
        if pool is None:
            return replace(self, vfs=(0,) * len(self.vfs))
        if len(self.pools) == 1:
            return self
        return replace(self, vfs=self.pools[pool])


def free_rails(shape: NodeShape, free: FreeState) -> tuple[int, ...]:
    """The known rails of the PFs with a free VF or free whole, ascending: what a refusal of
    a required rail sequence names (docs/rails.md)."""
    whole_ok, pf_rail = free.whole_ok, shape.pf_rail
    return tuple(sorted({pf_rail[j] for j, n in enumerate(free.vfs)
                         if (n or whole_ok[j]) and pf_rail[j] >= 0}))


def empty_state(shape: NodeShape) -> FreeState:
    """Everything free: a function of the shape key alone (the counts, not the devices), so
    built once and shared by every node of the shape (the free state is immutable)."""
    known = shape.caches.empty
    if known is None:
        known = shape.caches.empty = _empty_state(shape)
    return known


def _empty_state(shape: NodeShape) -> FreeState:
    vfs = tuple(len(v) for v in shape.vfs)
    return FreeState(
        gpus=(1 << len(shape.gpus)) - 1,
        vfs=vfs,
        whole_ok=tuple(w and not h for w, h in zip(shape.whole_static, shape.has_held_vfs,
                                                  strict=True)),
        cpus=tuple(len(c) for c in shape.cpus),
        memory=shape.memory,
        in_use=False,
        pools=shape.pool_sizes,
        any_vfs=vfs,
    )


def free_state(shape: NodeShape, ledger: Ledger, signature: Sequence) -> FreeState:
    """The free state from a ledger and its `signature()` (already computed by the caller).

    Everything read here is a function of (shape, signature, used non-allocatable VFs), which
    is what the allocator's memo key holds.
    """
    used_gpus = ledger.used_gpus
    used_pfs = ledger.used_pfs
    gpus = 0
    for i, g in enumerate(shape.gpus):
        if g.pci_address not in used_gpus:
            gpus |= 1 << i
    vfs: list[int] = []
    whole: list[bool] = []
    npools = len(shape.pool_names)
    # Used VFs that were never offered (vfio, held) do not reduce the offered count.
    odd = [0] * len(shape.pfs)
    odd_pool = [[0] * len(shape.pfs) for _ in range(npools)] if npools > 1 else [odd]
    if shape.nonallocatable_vfs:
        for v in ledger.used_vfs:
            j = shape.nonallocatable_vfs.get(v)
            if j is not None:
                odd[j] += 1
                if npools > 1:
                    odd_pool[shape.pool_of_vf[v]][j] += 1
    pools = [[0] * len(shape.pfs) for _ in range(npools)] if npools > 1 else []
    for j, n in enumerate(shape.pfs):
        a = n.pci_address
        used = ledger.vfs_used_on(a)
        if a in used_pfs:
            vfs.append(0)
            whole.append(False)
            continue
        vfs.append(len(shape.vfs[j]) - (used - odd[j]))
        whole.append(shape.whole_static[j] and used == 0 and not shape.has_held_vfs[j])
        if npools == 1:
            continue
        rest = vfs[-1]
        for q in range(1, npools):
            name = shape.pool_names[q]
            assert name is not None  # only the default pool, index 0, is unnamed
            used_q = ledger.vfs_used_in_pool(a, name)
            pools[q][j] = shape.pool_sizes[q][j] - (used_q - odd_pool[q][j])
            rest -= pools[q][j]
        pools[0][j] = rest
    cpu_used = dict(signature[3])
    mem_used = dict(signature[4])
    cpus = tuple(len(c) - cpu_used.get(nid, 0) for nid, c in zip(shape.numa_ids, shape.cpus,
                                                                 strict=True))
    memory = tuple(m - mem_used.get(nid, 0) for nid, m in zip(shape.numa_ids, shape.memory,
                                                             strict=True))
    in_use = any(signature)
    free_vfs = tuple(vfs)
    bandwidth = tuple(100 - ledger.bandwidth_used_on(n.pci_address) for n in shape.pfs) \
        if signature[6] else ()
    return FreeState(gpus, free_vfs, tuple(whole), cpus, memory, in_use,
                     pools=(free_vfs,) if npools == 1 else tuple(map(tuple, pools)),
                     any_vfs=free_vfs, bandwidth=bandwidth)
