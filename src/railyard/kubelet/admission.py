"""Admission on the node: steer kubelet to the recorded devices, then remember what it gave.

Every plugin (GPU, VF, PF) calls into one `Admission`, which is how the GPU and the VF plugin
reach the same pod and the same record whatever order kubelet calls them in: the record lives
in the state store, and consumption is noted per (pod, container, resource) as it happens.

- `preferred`: the recorded IDs when kubelet offers them all, else the best local choice.
  A pod without a record (it bypassed the scheduler) gets a node-made plan, recorded first.
- `allocate`: only the IDs kubelet passed; where they differ from the record, the record is
  rebuilt around them (`decidedBy: node`) and a warning is logged.
- `check`: PodResources' account of what kubelet really assigned is the final word.

What an `Allocate` decides about the record is `decision.decide_allocate`, a pure function;
here are the inputs it needs (the pod, its record, a plan for a pod without one), the store
write, and the grant built from its answer.

Planning a pod without a record runs the allocator's search (up to its budget, about half a
second; docs/decisions/0077), so `preferred` is called from a worker thread; `preferred`,
`allocate` and `check` take one lock, so they still decide one at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger, LedgerConflict
from railyard.allocation.names import ResourceNames
from railyard.allocation.request import Request, RequestError, pair_pool_of
from railyard.allocation.types import Allocation, GpuRef, NicRef
from railyard.kubelet.decision import (
    AllocateDecision,
    NodeDevices,
    decide_allocate,
    partners,
)
from railyard.kubelet.othergpus import GPU_NAMING_ENVS, PAIRS_FILE_ENV, Correction
from railyard.kubelet.outcome import (
    NODE,
    RECORD,
    UNMATCHED,
    AdmissionObserver,
    Admitted,
    Corrected,
)
from railyard.kubelet.pairing import DeviceIndex, choose_local, pair_container, reconcile
from railyard.kubelet.pairmap import (
    DEFAULT_PAIR_MAP,
    PAIRS_FILE,
    PairMapOptions,
    container_pairs,
    hcas,
    nccl_ib_hca,
    pair_file_json,
    pair_map_envs,
)
from railyard.kubelet.podresources import AssignedPod
from railyard.kubelet.pods import PodSource, PodView
from railyard.kubelet.resolver import (
    Candidate,
    Kind,
    candidates,
    expected_ids,
    ids_of,
    kind_of,
    kind_of_nic,
    kinds_of,
    match_allocate,
)
from railyard.kubelet.response import (
    PAIRS_ENV,
    ContainerGrant,
    PairFile,
    gpu_grant,
    in_pair_order,
    nic_grant,
    pairs_json,
)
from railyard.node.state import PodKey, PodRecord, StateStore
from railyard.records.allocation import format_decided_at
from railyard.topology.model import NodeTopology

log = logging.getLogger(__name__)

# Called after every Allocate with the resolved pod (None when none matched) and the grant.
AfterAllocate = Callable[[PodView | None, ContainerGrant], None]


def utc_now() -> str:
    return format_decided_at(datetime.now(UTC))


class Admission:
    def __init__(self, topology: NodeTopology, store: StateStore, pods: PodSource,
                 names: ResourceNames, *,
                 offered: Callable[[Kind], frozenset[str]] | None = None,
                 allocator: Allocator | None = None,
                 clock: Callable[[], str] = utc_now,
                 on_allocated: AfterAllocate | None = None,
                 served: Iterable[Kind] | None = None,
                 pair_map: PairMapOptions = DEFAULT_PAIR_MAP,
                 observer: AdmissionObserver | None = None,
                 on_corrected: Callable[[Correction], None] | None = None) -> None:
        self.topology = topology
        self.node = topology.node
        self.store = store
        self.pods = pods
        self.names = names
        self.index = DeviceIndex(topology)
        self._offered = offered
        self.allocator = allocator if allocator is not None else Allocator()
        self.clock = clock
        self.on_allocated = on_allocated
        self.pair_map = pair_map
        self.observer = observer  # counts what `_said` logs (the agent's metrics)
        # Told of each record the PodResources check corrects, with the pair files made
        # again (decision 0090): the agent writes them and raises the Event. Called under
        # the decision lock, in the check's thread, before the corrected record is written.
        self.on_corrected = on_corrected
        # The kinds whose plugin is ours: another plugin (NVIDIA's, with gpuPlugin: false)
        # never calls in, so a container is done when our resources are allocated.
        self.kinds = kinds_of(names)  # GPUs, every VF pool, PFs
        self.served = frozenset(served if served is not None else self.kinds)
        self.devices = NodeDevices(topology, self.index, names, self.served)
        # What GetPreferredAllocation just answered, per resource: (uid, container, IDs).
        self._hint: dict[str, tuple[str, str, frozenset[str]]] = {}
        # One decision at a time: `preferred` runs in a worker thread, `allocate` and `check`
        # wherever they are called; all three read and write the records and `_hint`.
        self._deciding = threading.Lock()

    # ------------------------------------------------------------------ helpers

    def _said(self, what: Admitted | Corrected) -> None:
        """A decision's one log line (docs/observability.md), and its count."""
        log.info("%s", what.line())
        if self.observer is not None:
            if isinstance(what, Admitted):
                self.observer.admitted(what)
            else:
                self.observer.corrected(what)

    def resource_of(self, kind: Kind) -> str:
        return self.devices.resource_of(kind)

    def offered(self, kind: Kind) -> frozenset[str]:
        if self._offered is not None:
            return self._offered(kind)
        if kind == "gpu":
            return frozenset(g.device_id for g in self.topology.gpus)
        return frozenset(i for i, n in self.index.nics.items() if kind_of_nic(n) == kind)

    def _records(self) -> dict[str, PodRecord]:
        return {r.uid: r for r in self.store.all()}

    @staticmethod
    def _key(pod: PodView) -> PodKey:
        return PodKey(pod.uid, pod.namespace, pod.name)

    async def catch_up(self, resource: str, size: int) -> None:
        """Before answering kubelet: when no pending pod of this node asks for `size` of
        `resource`, the pod kubelet is admitting may not have reached the pod source yet
        (a watch a moment behind); ask the source to look once, within its bound."""
        if candidates(self.pods.pods(), self._records(), self.node, self.names, resource,
                      size, unusable=self.unusable):
            return
        await self.pods.look_up()

    # ------------------------------------------------------------------ preferred

    def preferred(self, resource: str, available: Sequence[str], must_include: Sequence[str],
                  size: int) -> list[str]:
        with self._deciding:
            return self._preferred(resource, available, must_include, size)

    def _preferred(self, resource: str, available: Sequence[str], must_include: Sequence[str],
                   size: int) -> list[str]:
        kind = kind_of(self.names, resource)
        records = self._records()
        cands = candidates(self.pods.pods(), records, self.node, self.names, resource, size,
                           unusable=self.unusable)
        if not cands:
            log.info("%s: no pending pod on %s asks for %d; best local choice", resource,
                     self.node, size)
            return choose_local(self.topology, kind, available, must_include, size,
                                index=self.index)
        c = cands[0]
        alloc, expected = c.allocation, c.expected
        if alloc is None:
            alloc = self._plan(c, records, kind, available)
            container = c.pod.container(c.container)
            assert container is not None  # candidates() took it from this pod
            expected = expected_ids(c.pod, records.get(c.pod.uid), container, alloc, resource,
                                    kind)
        if (len(expected) == size and set(expected) <= set(available)
                and set(must_include) <= set(expected)):
            answer = list(expected)
        else:
            answer = choose_local(self.topology, kind, available, must_include, size,
                                  keep=expected, partners=partners(alloc, kind, expected),
                                  index=self.index)
            log.warning("%s: %s recorded %s for %s but kubelet offers %d of them; "
                        "preferring %s", c.pod, resource, list(expected), c.container,
                        len(set(expected) & set(available)), answer)
        self._hint[resource] = (c.pod.uid, c.container, frozenset(answer))
        return answer

    # ------------------------------------------------------------------ the node's plan

    def _ledger(self, records: Mapping[str, PodRecord], exclude: str) -> Ledger:
        """Everything held on this node: admitted pods (store) and pending decisions."""
        ledger = Ledger(self.topology)
        live = {p.uid: p for p in self.pods.pods()}
        holders: list[tuple[str, Allocation]] = []
        for uid, r in records.items():
            p = live.get(uid)
            if uid != exclude and (p is None or not p.terminated):
                holders.append((uid, r.allocation))
        for p in live.values():
            if (p.uid != exclude and p.uid not in records and p.allocation is not None
                    and p.node_name == self.node and p.pending
                    and p.allocation.node == self.node):
                holders.append((p.uid, p.allocation))
        for uid, a in holders:
            try:
                ledger.add(uid, a)
            except LedgerConflict as e:
                log.warning("ledger on %s: ignoring %s's record: %s", self.node, uid, e)
        return ledger

    def _request(self, pod: PodView) -> Request:
        """What the node plans for: as many devices as kubelet will hand the pod, with the
        pod's own hints, CPUs and memory when its request parses."""
        gpus, vfs = pod.total(self.names.gpu), pod.total(self.names.vf)
        pfs = pod.total(self.names.pf)
        pool_vfs = tuple((p, n) for p in sorted(self.names.vf_pools) if (n := pod.total(p)))
        hint = pod.request.pair_pool if pod.request is not None else None
        if hint is not None and hint not in dict(pool_vfs):
            hint = None
        try:
            pair_pool = pair_pool_of(vfs, pool_vfs, hint, self.names)
        except RequestError:  # several other pools and no hint: the first pairs
            pair_pool = pool_vfs[0][0]
        if pod.request is not None:
            return replace(pod.request, gpus=gpus, vfs=vfs, pfs=pfs, pool_vfs=pool_vfs,
                           pair_pool=pair_pool)
        return Request(gpus=gpus, vfs=vfs, pfs=pfs, pool_vfs=pool_vfs, pair_pool=pair_pool)

    def _plan(self, c: Candidate, records: Mapping[str, PodRecord], kind: Kind,
              available: Sequence[str]) -> Allocation:
        """The best local pairing for a pod with no usable record; stored as `decidedBy:
        node`."""
        pod = c.pod
        request = self._request(pod)
        ledger = self._ledger(records, exclude=pod.uid)
        free = {k: self.offered(k) - self._used(ledger, k) for k in self.kinds}
        free[kind] &= frozenset(available)
        alloc = self._allocator_plan(ledger, request, free)
        if alloc is None:
            alloc = self._greedy_plan(request, free)
        alloc = alloc.stamped("node", self.clock())
        self.store.put(self._key(pod), alloc)
        why = c.record_error or pod.allocation_error
        log.warning("%s %s; the node decided %s", pod,
                    f"has a recorded allocation it cannot use: {why}" if why else
                    "has no recorded allocation (it bypassed the scheduler)",
                    [(p.gpu.device_id, p.nic.pci_address) for p in alloc.pairs] or
                    [*ids_of(alloc, "gpu"), *(n.pci_address for n in alloc.all_nics)])
        return alloc

    def unusable(self, alloc: Allocation) -> str | None:
        """The first device of a record that this node does not have as recorded, named by
        its field; None when every device is here. Such a record is the scheduler's view of
        another node state (a GPU fell off the bus, a hand-edited annotation): the node
        decides instead of failing kubelet's call on it."""
        idx = self.index
        fields = [*((f"pairs[{i}].gpu", p.gpu) for i, p in enumerate(alloc.pairs)),
                  *((f"gpus[{i}]", g) for i, g in enumerate(alloc.gpus))]
        for where, g in fields:
            have = idx.gpus.get(g.device_id)
            if have is None or have.pci_address != g.pci_address:
                return f"{where}: GPU {g.device_id} ({g.pci_address}) is not on {self.node}"
        nics = [*((f"pairs[{i}].nic", p.nic) for i, p in enumerate(alloc.pairs)),
                *((f"nics[{i}]", n) for i, n in enumerate(alloc.nics))]
        for where, n in nics:
            have_nic = idx.nics.get(n.pci_address)
            if have_nic is None:
                return f"{where}: {n.kind.upper()} {n.pci_address} is not on {self.node}"
            if (have_nic.kind, have_nic.pf_pci_address) != (n.kind, n.pf_pci_address):
                return (f"{where}: {n.pci_address} is a {have_nic.kind.upper()} of PF "
                        f"{have_nic.pf_pci_address} on {self.node}, not a {n.kind.upper()} "
                        f"of {n.pf_pci_address}")
            if have_nic.pool != n.pool:  # its pool's plugin hands it out, no other
                return (f"{where}: VF {n.pci_address} is in pool "
                        f"{self.names.resource_of_pool(have_nic.pool)} on {self.node}, not "
                        f"{self.names.resource_of_pool(n.pool)}")
        return None

    def _used(self, ledger: Ledger, kind: Kind) -> frozenset[str]:
        if kind == "gpu":
            return frozenset(self.topology.gpu(a).device_id for a in ledger.used_gpus)
        if kind == "pf":
            return frozenset(ledger.used_pfs)
        return frozenset(v for v in ledger.used_vfs
                         if v in self.index.nics and kind_of_nic(self.index.nics[v]) == kind)

    def _allocator_plan(self, ledger: Ledger, request: Request,
                        free: Mapping[Kind, frozenset[str]]) -> Allocation | None:
        # Hold what this plugin may not hand out (unoffered, or not offered by kubelet now) so
        # the allocator cannot pick it. Whole PFs are held only when the pod wants no VFs:
        # a held PF would also hold its VFs. Those VFs are then not held again: the ledger
        # refuses one holding that names a PF whole and a VF of it.
        gpus = [GpuRef.of(g) for g in self.topology.gpus
                if g.device_id not in free["gpu"] and g.pci_address not in ledger.used_gpus]
        held_pfs = {i for i, n in self.index.nics.items()
                    if n.kind == "pf" and request.all_vfs == 0 and i not in free["pf"]
                    and i not in ledger.used_pfs and not ledger.vfs_used_on(i)}

        def held(i: str, n: NicRef) -> bool:
            if n.kind == "vf":
                return (i not in free.get(kind_of_nic(n), ()) and i not in ledger.used_vfs
                        and n.pf_pci_address not in ledger.used_pfs
                        and n.pf_pci_address not in held_pfs)
            return i in held_pfs

        nics = [n for i, n in self.index.nics.items() if held(i, n)]
        if gpus or nics:
            try:
                ledger.add("railyard/unavailable", Allocation(
                    node=self.node, numa_nodes=(), cpus=None, memory_bytes=(),
                    nics=tuple(nics), gpus=tuple(gpus)))
            except LedgerConflict as e:
                log.warning("cannot hold unavailable devices for planning: %s", e)
        try:
            result = self.allocator.allocate(self.topology, ledger, request)
        except Exception:
            log.exception("allocator failed; using the greedy node plan")
            return None
        if not isinstance(result, Allocation):
            log.info("allocator: %s; using the greedy node plan", getattr(result, "reason", ""))
            return None
        if any(not set(ids_of(result, k)) <= free[k] for k in self.kinds):
            return None  # it chose something kubelet will not give: do not steer there
        return result

    def _greedy_plan(self, request: Request, free: Mapping[Kind, frozenset[str]]) -> Allocation:
        topo = self.topology
        idx = self.index
        gpus = choose_local(topo, "gpu", sorted(free["gpu"]), (), request.gpus, index=idx)
        chosen: dict[Kind, list[str]] = {"gpu": gpus}
        paired = "vf" if request.pair_pool is None else request.pair_pool
        vfs = choose_local(topo, paired, sorted(free.get(paired, ())), (), request.paired_vfs,
                           partners=gpus, index=idx)
        chosen[paired] = vfs
        for pool, n in request.vf_counts:  # the other pools' VFs pair with nothing
            kind = "vf" if pool is None else pool
            if kind != paired:
                chosen[kind] = choose_local(topo, kind, sorted(free.get(kind, ())), (), n,
                                            index=idx)
        chosen["pf"] = choose_local(topo, "pf", sorted(free["pf"]), (), request.pfs,
                                    partners=gpus[len(vfs):], index=idx)
        return reconcile(topo, None, chosen, decided_at=self.clock(), index=idx)

    # ------------------------------------------------------------------ allocate

    def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerGrant:
        with self._deciding:
            return self._allocate(resource, device_ids)

    def _allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerGrant:
        kind = kind_of(self.names, resource)
        ids = list(dict.fromkeys(device_ids))
        records = self._records()
        cands = candidates(self.pods.pods(), records, self.node, self.names, resource, len(ids),
                           unusable=self.unusable)
        hint = self._hint.pop(resource, None)
        c = match_allocate(cands, ids, hint[:2] if hint and hint[2] == set(ids) else None)
        if c is None:
            log.warning("%s: Allocate of %s matches no pending pod on %s; answering for the "
                        "devices alone", resource, ids, self.node)
            grant = self._grant(kind, resource, ids, None)
            self._said(Admitted(self.node, resource, tuple(ids), UNMATCHED,
                                why="no pending pod of this node matches"))
            if self.on_allocated is not None:
                self.on_allocated(None, grant)
            return grant
        return self._allocate_for(c, kind, resource, ids, records)

    def _allocate_for(self, c: Candidate, kind: Kind, resource: str, ids: list[str],
                      records: dict[str, PodRecord]) -> ContainerGrant:
        pod = c.pod
        rec = records.get(pod.uid)
        base = c.allocation
        planned = base is None
        if base is None:
            base = self._plan(c, records, kind, ids)
            rec = self.store.get(pod.uid)
        decision = decide_allocate(pod, c.container, c.expected, rec.consumed if rec else (),
                                   base, kind, ids, self.devices, decided_at=self.clock())
        for warning in decision.warnings:
            log.warning("%s", warning)
        self.store.put(self._key(pod), decision.allocation, consumed=decision.consumed)
        grant = self._grant_for(decision, kind, resource, ids, pod, c.container)
        # The node decided: now (no usable record, kubelet gave other devices) or in an
        # earlier call (GetPreferredAllocation's plan, another container's Allocate).
        by_node = planned or bool(decision.warnings) or base.decided_by == "node"
        why = ("; ".join(decision.warnings) if decision.warnings else
               c.record_error or pod.allocation_error or (
                   "no recorded allocation (it bypassed the scheduler)"
                   if pod.allocation is None else "the node's record from an earlier call")
               if by_node else None)
        self._said(Admitted(self.node, resource, tuple(ids), NODE if by_node else RECORD,
                            f"{pod.namespace}/{pod.name}", pod.uid, c.container,
                            decision.allocation, why))
        if self.on_allocated is not None:
            self.on_allocated(pod, grant)
        return grant

    def _grant_for(self, d: AllocateDecision, kind: Kind, resource: str, ids: list[str],
                   pod: PodView, container: str) -> ContainerGrant:
        """The container's answer for this call: its devices, mounts and variables."""
        alloc = d.allocation
        grant = self._grant(kind, resource, ids, alloc)
        if d.spans_nic_kinds:
            # Kubelet keeps the first plugin's value of a variable two plugins set, so a
            # variable that spans resources comes from the container's last plugin only.
            grant.envs.pop("NCCL_IB_HCA", None)
        if d.last:
            # The pair map in every form, once kubelet has given the container everything.
            nics = [i for k in self.devices.nic_kinds for i in d.container_ids[k]]
            grant.envs[PAIRS_ENV] = pairs_json(alloc, gpus=d.container_ids["gpu"], nics=nics)
            recorded = {n.pci_address: n for n in alloc.all_nics}
            held = container_pairs(alloc, d.container_ids["gpu"], nics,
                                   named={i: self._nic_ref(i, recorded) for i in nics
                                          if i in self.index.nics})
            if d.spans_nic_kinds and (devices := hcas(held.nics)):
                grant.envs["NCCL_IB_HCA"] = nccl_ib_hca(devices)
            grant.envs.update(pair_map_envs(held, self.pair_map))
            grant.pair_file = PairFile(pod.uid, container, pair_file_json(
                held, namespace=pod.namespace, pod=pod.name, uid=pod.uid, container=container,
                options=self.pair_map))
            if "gpu" not in self.served:
                # Another plugin's GPUs: kubelet may not have allocated them yet, and this
                # answer's variables are final. Those naming GPUs are left out, not guessed;
                # the pair file is made right before the container starts (decision 0090).
                for name in GPU_NAMING_ENVS:
                    grant.envs.pop(name, None)
                grant.envs[PAIRS_FILE_ENV] = PAIRS_FILE
        return grant

    def _nic_ref(self, pci: str, recorded: Mapping[str, NicRef]) -> NicRef:
        """A NIC as this node's discovery names it; the record only fills a gap."""
        ref, rec = self.index.nics[pci], recorded.get(pci)
        return rec if rec is not None and ref.rdma_device is None else ref

    def _grant(self, kind: Kind, resource: str, given: list[str],
               alloc: Allocation | None) -> ContainerGrant:
        ordered = in_pair_order(given, alloc, kind)
        if kind == "gpu":
            return gpu_grant([self.index.gpu_ref(i) for i in ordered])
        recorded = {n.pci_address: n for n in alloc.all_nics} if alloc else {}
        nics = [self._nic_ref(i, recorded) for i in ordered]
        return nic_grant(resource, nics, {i: self.index.uverbs.get(i) for i in ordered})

    # ------------------------------------------------------------------ check

    def check(self, assigned: Iterable[AssignedPod]) -> list[str]:
        """Make the store agree with PodResources; returns the warnings it logged."""
        with self._deciding:
            return self._check(assigned)

    def _check(self, assigned: Iterable[AssignedPod]) -> list[str]:
        warnings: list[str] = []
        by_name = {(p.namespace, p.name): p for p in self.pods.pods()}
        records = self._records()
        managed = self.names.managed
        owner: dict[tuple[str, str], str] = {}  # (resource, device ID) -> uid per kubelet
        known: list[tuple[AssignedPod, PodView]] = []
        for a in assigned:
            if not any(a.has(r) for r in managed):
                continue
            pod = by_name.get((a.namespace, a.name))
            if pod is None:
                continue  # a pod we do not know yet: nothing to map its UID from
            for r in managed:
                for i in a.ids(r):
                    owner[(r, i)] = pod.uid
            known.append((a, pod))
        for a, pod in known:
            try:
                warnings += self._check_pod(a, pod, records.get(pod.uid), owner)
            except Exception as e:  # one pod's odd data must not stop the others' repair
                msg = f"{pod}: PodResources check failed: {e!r}; record left as it was"
                log.exception("%s", msg)
                warnings.append(msg)
        # Consumption we noted for a pod that kubelet says belongs to another: forget it.
        for held in self.store.all():
            for cn in held.consumed:
                wrong = [i for i in cn.device_ids
                         if owner.get((cn.resource, i), held.uid) != held.uid]
                if wrong:
                    msg = (f"{held.pod}: {cn.resource} {wrong} were noted for {cn.container} "
                           f"but kubelet gave them to another pod; note removed")
                    log.warning("%s", msg)
                    warnings.append(msg)
                    self.store.clear_consumed(held.uid, cn.container, cn.resource)
        return warnings

    def _check_pod(self, a: AssignedPod, pod: PodView, rec: PodRecord | None,
                   owner: Mapping[tuple[str, str], str]) -> list[str]:
        """Make one pod's record agree with what kubelet assigned it; the warnings."""
        warnings: list[str] = []

        def warn(msg: str) -> None:
            log.warning("%s", msg)
            warnings.append(msg)

        base = rec.allocation if rec else (
            pod.allocation if pod.allocation and pod.allocation.node == self.node else None)
        if base is not None and (why := self.unusable(base)):
            warn(f"{pod}: the record is not usable on {self.node} ({why}); rebuilding it "
                 f"from what kubelet assigned")
            base = None
        actual: dict[Kind, list[str]] = {}
        unknown: set[str] = set()  # resources whose IDs this node cannot interpret
        for k in self.kinds:
            r = self.resource_of(k)
            if not a.has(r):
                continue
            ids = list(dict.fromkeys(a.ids(r)))
            strange = [i for i in ids if not self._known(k, i)]
            if strange:
                # Another plugin's naming (NVIDIA's time-slicing replicas 'GPU-…::0', MIG
                # devices) when ours is off: no fact about this node's devices to record.
                warn(f"{pod}: kubelet assigned {r} {strange}, which are not device IDs of "
                     f"{self.node}; the record keeps its own {r}")
                unknown.add(r)
                continue
            if base is not None and len(ids) < pod.total(r):
                # Not reported yet (a container kubelet has still to admit) or not at all
                # (PodResources leaves out init containers): the record's share stands,
                # unless kubelet gave it to another pod.
                ids += [i for i in ids_of(base, k) if i not in ids
                        and owner.get((r, i), pod.uid) == pod.uid][:pod.total(r) - len(ids)]
            actual[k] = ids
        if base is None and not actual:
            return warnings
        notes = [(cname, r, ids) for cname, per in a.containers.items()
                 for r, ids in per.items() if r in self.names.managed and r not in unknown]
        alloc_ok = base is not None and all(
            set(ids_of(base, k)) == set(v) for k, v in actual.items())
        if alloc_ok and base is not None and "gpu" not in self.served:
            # The pod's GPUs are the record's, but another plugin may have swapped them
            # between containers: a pair must not cross a container's boundary.
            alloc_ok = self._paired_per_container(base, a, pod, unknown) is base
        consumed_ok = rec is not None and all(
            any(cn.container == cname and cn.resource == r and set(cn.device_ids) == set(ids)
                for cn in rec.consumed) for cname, r, ids in notes)
        if alloc_ok and consumed_ok:
            return warnings
        if not alloc_ok:
            new = reconcile(self.topology, base, actual, decided_at=self.clock(),
                            index=self.index)
            new = self._paired_per_container(new, a, pod, unknown)
            warn(f"{pod}: kubelet assigned {dict(actual)}, which differs from the record; "
                 f"the node's record now holds what kubelet assigned (decidedBy: node)")
            # What derives from the record (the pair files) first, the record last: a crash
            # between the two leaves the record uncorrected, so the next check makes both
            # again; the other order would leave a record that agrees with kubelet beside a
            # pair file naming the old pairs, never rewritten (docs/reliability.md).
            if self.on_corrected is not None:
                self.on_corrected(Correction(
                    pod.namespace, pod.name, pod.uid, base, new,
                    {c: self._container_ids(a, c, "gpu", unknown) for c in a.containers},
                    self._pair_files(pod, new, a, unknown), self.names.gpu))
            self.store.put(self._key(pod), new)
            self._said(Corrected(self.node, f"{pod.namespace}/{pod.name}", pod.uid, new,
                                 f"kubelet assigned {dict(actual)}"))
        elif rec is None:
            self.store.put(self._key(pod), base)  # type: ignore[arg-type]
        for cname, r, noted in notes:
            self.store.mark_consumed(pod.uid, cname, r, list(noted))
        return warnings

    def _container_ids(self, a: AssignedPod, container: str, kind: Kind,
                       unknown: set[str]) -> tuple[str, ...]:
        r = self.resource_of(kind)
        if r in unknown:
            return ()
        return tuple(dict.fromkeys(a.containers.get(container, {}).get(r, ())))

    def _complete(self, a: AssignedPod, pod: PodView, container: str) -> bool:
        """Whether PodResources lists every device the container asks for (kubelet is
        done admitting it)."""
        view = pod.container(container)
        per = a.containers.get(container, {})
        return view is not None and all(
            len(set(per.get(r, ()))) >= n for r, n in view.devices if r in self.names.managed)

    def _paired_per_container(self, alloc: Allocation, a: AssignedPod, pod: PodView,
                              unknown: set[str]) -> Allocation:
        """`alloc` with no pair crossing a container's boundary, by what kubelet assigned
        each container (a GPU of one container cannot talk over another's NIC)."""
        if self.names.gpu in unknown:  # GPU IDs this node cannot name: nothing to pair by
            return alloc
        for cname in a.containers:
            if not self._complete(a, pod, cname):
                continue
            gpus = self._container_ids(a, cname, "gpu", unknown)
            nics = [i for k in self.devices.nic_kinds
                    for i in self._container_ids(a, cname, k, unknown)]
            repaired = pair_container(self.topology, alloc, gpus, nics,
                                      decided_at=alloc.decided_at, index=self.index)
            alloc = repaired if repaired is not None else alloc
        return alloc

    def _pair_files(self, pod: PodView, alloc: Allocation, a: AssignedPod,
                    unknown: set[str]) -> tuple[PairFile, ...]:
        """The pair file of each container holding NICs of ours, from `alloc` and the
        devices kubelet really gave it; only containers kubelet is done with."""
        files: list[PairFile] = []
        if self.names.gpu in unknown:  # GPU IDs this node cannot name: the file stands
            return ()
        recorded = {n.pci_address: n for n in alloc.all_nics}
        for cname in a.containers:
            nics = [i for k in self.devices.nic_kinds if k in self.served
                    for i in self._container_ids(a, cname, k, unknown)]
            if not nics or not self._complete(a, pod, cname):
                continue
            held = container_pairs(alloc, self._container_ids(a, cname, "gpu", unknown), nics,
                                   named={i: self._nic_ref(i, recorded) for i in nics
                                          if i in self.index.nics})
            files.append(PairFile(pod.uid, cname, pair_file_json(
                held, namespace=pod.namespace, pod=pod.name, uid=pod.uid, container=cname,
                options=self.pair_map)))
        return tuple(files)

    def _known(self, kind: Kind, device_id: str) -> bool:
        """Whether `device_id` names a device of this node of this kind."""
        return self.index.is_kind(device_id, kind)
