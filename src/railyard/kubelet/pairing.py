"""Pairing what kubelet really gave: rebuild an Allocation around the actual device IDs.

When kubelet hands a pod other devices than recorded (it may: the preferred allocation is
advisory), the node records what really happened. `reconcile` keeps every recorded pair whose
GPU and NIC were both given, and pairs the rest nearest-first. `choose_local` is the node's
best local choice of N devices of one kind when the record cannot be honoured. Pure, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.kubelet.resolver import Kind, ids_of, kind_of_nic
from railyard.topology.model import Distance, Gpu, NodeTopology


class DeviceIndex:
    """Device plugin IDs to topology objects, for one node."""

    def __init__(self, topology: NodeTopology) -> None:
        self.topology = topology
        self.gpus: dict[str, Gpu] = {}
        for g in topology.gpus:
            self.gpus[g.device_id] = g
            self.gpus.setdefault(g.pci_address, g)
        self.nics: dict[str, NicRef] = {}
        self.uverbs: dict[str, str | None] = {}  # PCI address -> "uverbsN"
        for n in topology.nics:
            self.nics[n.pci_address] = NicRef.of_pf(n)
            self.uverbs[n.pci_address] = n.uverbs
            for v in n.vfs:
                self.nics[v.pci_address] = NicRef.of_vf(n, v)
                self.uverbs[v.pci_address] = v.uverbs
        self.numa = {n.pci_address: n.numa_node for n in topology.nics}
        self.rail = {n.pci_address: n.rail for n in topology.nics}  # docs/rails.md

    def gpu_ref(self, device_id: str) -> GpuRef:
        return GpuRef.of(self.gpus[device_id])

    def nic_ref(self, device_id: str, kind: Kind) -> NicRef:
        ref = self.nics[device_id]
        if kind_of_nic(ref) != kind:
            raise KeyError(device_id)
        return ref

    def is_kind(self, device_id: str, kind: Kind) -> bool:
        """Whether `device_id` is a device of this node served by `kind`'s plugin."""
        if kind == "gpu":
            return device_id in self.gpus
        ref = self.nics.get(device_id)
        return ref is not None and kind_of_nic(ref) == kind

    def distance(self, gpu: GpuRef, nic: NicRef) -> Distance:
        return self.topology.distance[gpu.pci_address][nic.pf_pci_address]


def _ordered(ids: Iterable[str], preferred: tuple[str, ...]) -> list[str]:
    """`ids` in the order of `preferred`, the others after it in their own order."""
    pos = {x: i for i, x in enumerate(preferred)}
    ids = list(dict.fromkeys(ids))
    return sorted(ids, key=lambda x: (pos.get(x, len(pos)), ids.index(x)))


def reconcile(topology: NodeTopology, base: Allocation | None,
              actual: Mapping[Kind, Iterable[str]], *, decided_at: str | None,
              index: DeviceIndex | None = None) -> Allocation:
    """An Allocation holding exactly the `actual` IDs (per kind), pairs kept where possible.

    Kinds absent from `actual` keep the base's IDs. The result is `decidedBy: node`.
    `index` saves rebuilding the ID index of a big node on every call.
    """
    idx = index or DeviceIndex(topology)
    # GPUs, every VF pool (the default first) the record or kubelet names, then PFs.
    pools = sorted({kind_of_nic(n) for n in (base.all_nics if base else ())}
                   | {k for k in actual if k not in ("gpu", "vf", "pf")})
    kinds = ("gpu", "vf", *(k for k in pools if k not in ("vf", "pf")), "pf")
    base_ids = {k: ids_of(base, k) if base else () for k in kinds}
    ids = {k: _ordered(actual[k], base_ids[k]) if k in actual else list(base_ids[k])
           for k in kinds}
    gpus = [idx.gpu_ref(i) for i in ids["gpu"]]
    nics = [idx.nic_ref(i, k) for k in kinds[1:] for i in ids[k]]
    if base is not None:  # base order: paired NICs first, in pair order
        order = [n.pci_address for n in base.all_nics]
        nics.sort(key=lambda n: order.index(n.pci_address) if n.pci_address in order
                  else len(order))
    # Only the paired pool's VFs (and PFs) pair; other pools' VFs stay unpaired NICs.
    paired_kind = _paired_kind(base, nics)
    lone_nics = [n for n in nics if n.kind == "vf" and kind_of_nic(n) != paired_kind]
    nics_all, nics = nics, [n for n in nics if n not in lone_nics]
    if base is not None and base.pairs:
        shared = len({p.nic.pci_address for p in base.pairs}) < len(base.pairs)
        pairing = "shared" if shared else "one-to-one"
    elif base is not None and base.all_gpus and base.all_nics:
        pairing = "none"
    elif gpus and nics:
        pairing = "one-to-one" if len(nics) >= len(gpus) else "shared"
    else:
        pairing = "none"
    pairs: list[Pair] = []
    unpaired_gpus: list[GpuRef] = []
    if pairing != "none":
        was = {p.gpu.pci_address: p.nic.pci_address for p in (base.pairs if base else ())}
        load: Counter[str] = Counter()
        by_addr = {n.pci_address: n for n in nics}
        chosen: dict[str, NicRef] = {}
        for g in gpus:  # keep recorded pairs whose both sides were given
            n = by_addr.get(was.get(g.pci_address, ""))
            if n is not None and (pairing == "shared" or not load[n.pci_address]):
                chosen[g.pci_address] = n
                load[n.pci_address] += 1
        for g in gpus:
            if g.pci_address in chosen:
                continue
            free = [n for n in nics if pairing == "shared" or not load[n.pci_address]]
            if not free:
                continue
            n = min(free, key=lambda n: (idx.distance(g, n), load[n.pci_address],
                                         n.pci_address))
            chosen[g.pci_address] = n
            load[n.pci_address] += 1
        for g in gpus:
            n = chosen.get(g.pci_address)
            if n is None:
                unpaired_gpus.append(g)
            else:
                pairs.append(Pair(g, n, idx.distance(g, n), idx.rail.get(n.pf_pci_address)))
        paired = {p.nic.pci_address for p in pairs}
        rest_nics = [n for n in nics if n.pci_address not in paired]
    else:
        unpaired_gpus, rest_nics = gpus, nics
    rest_nics += lone_nics
    nics = nics_all
    found = [*(topology.gpu(g.pci_address).numa_node for g in gpus),
             *(idx.numa[n.pf_pci_address] for n in nics)]
    numa = set(base.numa_nodes if base else ()) | {x for x in found if x is not None}
    out = Allocation(
        node=topology.node,
        numa_nodes=tuple(sorted(numa)),
        cpus=base.cpus if base else None,
        memory_bytes=base.memory_bytes if base else (),
        pairs=tuple(pairs),
        nics=tuple(rest_nics),
        gpus=tuple(unpaired_gpus),
    )
    return replace(out, decided_by="node", decided_at=decided_at)


def _paired_kind(base: Allocation | None, nics: Iterable[NicRef]) -> Kind:
    """The VF kind that pairs with GPUs: the record's paired VFs' pool, else the default
    pool when given, else the one pool given (docs/decisions/0085)."""
    for p in base.pairs if base else ():
        if p.nic.kind == "vf":
            return kind_of_nic(p.nic)
    kinds = {kind_of_nic(n) for n in nics if n.kind == "vf"}
    if "vf" in kinds or len(kinds) != 1:
        return "vf"
    return kinds.pop()


def pair_container(topology: NodeTopology, alloc: Allocation, gpus: Iterable[str],
                   nics: Iterable[str], *, decided_at: str | None,
                   index: DeviceIndex | None = None) -> Allocation | None:
    """`alloc` re-paired so that one container's GPUs (`gpus`) and NICs (`nics`) pair only
    with each other; None when no recorded pair crosses the container's boundary.

    Kubelet hands each container its own devices, so a recorded pair with one end in this
    container and the other in another can be honoured by neither. Pairs wholly inside or
    wholly outside the container are kept; the loose ends are paired nearest-first on their
    own side (one-to-one, or shared as the record shares NICs), and what finds no partner
    stays unpaired. The result is `decidedBy: node`.
    """
    idx = index or DeviceIndex(topology)
    g_in, n_in = set(gpus), set(nics)
    crossing = [p for p in alloc.pairs
                if (p.gpu.device_id in g_in) != (p.nic.pci_address in n_in)]
    if not crossing:
        return None
    shared = len({p.nic.pci_address for p in alloc.pairs}) < len(alloc.pairs)
    pairs = [p for p in alloc.pairs if p not in crossing]
    load: Counter[str] = Counter(p.nic.pci_address for p in pairs)
    loose_gpus = [*(p.gpu for p in crossing), *alloc.gpus]
    paired_kind = _paired_kind(alloc, alloc.all_nics)
    pairable = [n for n in alloc.all_nics if n.kind == "pf" or kind_of_nic(n) == paired_kind]
    for inside in (True, False):
        side = [n for n in pairable if (n.pci_address in n_in) == inside]
        for g in (g for g in loose_gpus if (g.device_id in g_in) == inside):
            free = [n for n in side if shared or not load[n.pci_address]]
            if not free:
                continue
            n = min(free, key=lambda n: (idx.distance(g, n), load[n.pci_address],
                                         n.pci_address))
            pairs.append(Pair(g, n, idx.distance(g, n), idx.rail.get(n.pf_pci_address)))
            load[n.pci_address] += 1
    order = [g.device_id for g in alloc.all_gpus]
    pairs.sort(key=lambda p: order.index(p.gpu.device_id))
    paired_gpus = {p.gpu.device_id for p in pairs}
    return replace(alloc, pairs=tuple(pairs),
                   nics=tuple(n for n in alloc.all_nics if n.pci_address not in load),
                   gpus=tuple(g for g in alloc.all_gpus if g.device_id not in paired_gpus),
                   decided_by="node", decided_at=decided_at)


def choose_local(topology: NodeTopology, kind: Kind, available: Iterable[str],
                 must_include: Iterable[str], size: int, *, keep: Iterable[str] = (),
                 partners: Iterable[str] = (), index: DeviceIndex | None = None) -> list[str]:
    """Pick `size` of `available`: kubelet's must-includes, then `keep` (recorded IDs still
    offered), then nearest to the pod's unmatched `partners` (GPU IDs when choosing NICs, NIC
    IDs when choosing GPUs), spreading NICs over PFs; PCI address breaks ties."""
    idx = index or DeviceIndex(topology)
    avail = [a for a in dict.fromkeys(available) if idx.is_kind(a, kind)]
    chosen: list[str] = []
    for x in (*must_include, *keep):
        if x in avail and x not in chosen and len(chosen) < size:
            chosen.append(x)
    todo = list(dict.fromkeys(partners))

    def dist(device: str, partner: str) -> int:
        """Distance class between a candidate and a partner of the other kind."""
        gpu, nic = (device, partner) if kind == "gpu" else (partner, device)
        if gpu not in idx.gpus or nic not in idx.nics:
            return int(Distance.SYS)
        return int(idx.distance(idx.gpu_ref(gpu), idx.nics[nic]))

    # A partner already matched by a kept device is not waiting for another one.
    for c in chosen:
        if todo:
            todo.remove(min(todo, key=lambda p: (dist(c, p), p)))
    per_pf: Counter[str] = Counter(idx.nics[c].pf_pci_address for c in chosen
                                   if c in idx.nics)
    taken = set(chosen)
    while len(chosen) < size:
        # VFs of one PF are interchangeable here: weigh only the lowest free one of each PF.
        rest: dict[str, str] = {}
        for a in avail:
            if a not in taken:
                group = idx.nics[a].pf_pci_address if kind not in ("gpu", "pf") else a
                if group not in rest or a < rest[group]:
                    rest[group] = a
        if not rest:
            break
        partner = todo[0] if todo else None

        def cost(a: str, partner: str | None = partner) -> tuple:
            crowd = per_pf[idx.nics[a].pf_pci_address] if kind != "gpu" else 0
            return (dist(a, partner) if partner else 0, crowd, a)

        best = min(rest.values(), key=cost)
        chosen.append(best)
        taken.add(best)
        if todo:
            todo.pop(0)
        if kind != "gpu":
            per_pf[idx.nics[best].pf_pci_address] += 1
    return chosen
