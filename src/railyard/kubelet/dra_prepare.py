"""Prepare and unprepare of our claims on the node: the claim becomes the pod's one record.

`ClaimPreparer.prepare` reads the claim from the API server (kubelet passes only its name),
turns its allocation into the pod's Allocation record in the node store (the record the CNI
and the pair map read), writes the pair file and the claim's CDI spec, and answers the CDI IDs.
`unprepare` removes exactly what the prepared-claim document says prepare made (without it,
what the claim's pair file leads to). Both redo or undo from what is on disk, so a retry, an
agent restart or a lost memory ends right (decision 0109); `restore` prepares again what
kubelet holds prepared when the node lost it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import msgspec

from railyard.allocation.names import DEFAULT_RESOURCES, ResourceNames
from railyard.allocation.types import Allocation, GpuRef
from railyard.kube.client import Client
from railyard.kubelet.admission import utc_now
from railyard.kubelet.dra_cdi import CDI_DIR, CdiSpecs, ClaimDevice, cdi_id, claim_envs, claim_spec
from railyard.kubelet.dra_claim import (
    ClaimAllocation,
    ClaimError,
    ClaimRef,
    DeviceNames,
    OtherGpu,
    ResultDevice,
    claim_to_allocation,
    device_conflicts,
    read_claim,
)
from railyard.kubelet.dra_prepared import PreparedClaim, PreparedClaims, PreparedDevice
from railyard.kubelet.pairing import DeviceIndex
from railyard.kubelet.pairmap import (
    DEFAULT_PAIR_MAP,
    PairMapOptions,
    container_pairs,
    pair_file_json,
)
from railyard.kubelet.podresources import AssignedPod
from railyard.node.attachments import attached_pods
from railyard.node.errors import StateError
from railyard.node.pairfiles import PairFiles
from railyard.node.state import PodKey, StateStore, is_pod_uid
from railyard.records.dra_names import DRIVER, PCI_BUS_ID
from railyard.topology.model import NodeTopology

log = logging.getLogger(__name__)

API = "/apis/resource.k8s.io/v1"


class ClaimSource(Protocol):
    """Where claims are read: the API server, with the node's own credentials."""

    async def claim(self, namespace: str, name: str) -> Any:
        """The ResourceClaim as JSON; raises on an error (the message reaches kubelet)."""
        ...


@dataclass(frozen=True, slots=True)
class ApiClaims:
    client: Client

    async def claim(self, namespace: str, name: str) -> Any:
        body = await self.client.request(
            "GET", f"{API}/namespaces/{namespace}/resourceclaims/{name}")
        return msgspec.json.decode(body)


def pair_file_name(claim_uid: str) -> str:
    """The pair file's name in the pod's pair folder: one per claim (a claim serves one pod,
    and every container of the pod given one of its devices mounts the same file)."""
    return f"claim-{claim_uid}"


class ClaimPreparer:
    def __init__(self, topology: NodeTopology, store: StateStore, claims: ClaimSource, *,
                 state_dir: str, cdi: CdiSpecs, clock: Callable[[], str],
                 names: ResourceNames = DEFAULT_RESOURCES,
                 pair_map: PairMapOptions = DEFAULT_PAIR_MAP, driver: str = DRIVER,
                 other_gpus: Callable[[], Awaitable[OtherGpu | None]] | None = None) -> None:
        self.topology = topology
        self.index = DeviceIndex(topology)
        self.devices = DeviceNames(self.index)
        self.store = store
        self.claims = claims
        self.state_dir = state_dir
        self.prepared = PreparedClaims(state_dir)
        self.pair_files = PairFiles(state_dir)
        self.cdi = cdi
        self.clock = clock
        self.names = names
        self.pair_map = pair_map
        self.driver = driver
        self.other_gpus = other_gpus  # GPUs of another driver in our claims (NVIDIA's)
        # One claim at a time: each reads every pod's record to refuse overlaps, then writes.
        self._deciding = asyncio.Lock()

    # ------------------------------------------------------------------ prepare

    async def prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        """The claim's devices with their CDI IDs; ClaimError (or another error, whose
        message kubelet shows) when it cannot be prepared, with nothing of it left."""
        doc = await self.claims.claim(ref.namespace, ref.name)
        claim = read_claim(doc, ref, self.topology.node, self.driver)
        if not claim.ours:  # nothing of ours in it: nothing to record, nothing to undo
            return ()
        other = None
        if claim.others and self.other_gpus is not None:
            other = await self.other_gpus()
        async with self._deciding:
            # In a worker thread: a few fsyncs, which the agent's loop (the device plugins,
            # the CNI service) should not wait on.
            return await asyncio.to_thread(self._prepare, claim, other)

    async def restore(self, assigned: Callable[[], Awaitable[Sequence[AssignedPod]]]
                      ) -> list[ClaimRef]:
        """Prepare again the claims of ours kubelet holds prepared (PodResources, `assigned`)
        for pods the node has no record of: a state folder lost, or a new agent beside
        running pods. Kubelet never asks again (its checkpoint says prepared), and without
        the record a sandbox made again would get no VFs from the CNI. The claims restored;
        one that cannot be read or prepared is logged and left."""
        found: list[ClaimRef] = []
        for pod in await assigned():
            if self.store.find(pod.namespace, pod.name) is not None:
                continue
            for c in pod.claims:
                if self.driver not in c.drivers:
                    continue
                try:
                    doc = await self.claims.claim(c.namespace, c.name)
                except Exception as e:
                    log.warning("claim %s/%s of pod %s/%s, prepared by kubelet, not read: %s",
                                c.namespace, c.name, pod.namespace, pod.name, e)
                    continue
                meta = doc.get("metadata") if isinstance(doc, dict) else None
                uid = meta.get("uid") if isinstance(meta, dict) else None
                if isinstance(uid, str) and is_pod_uid(uid):
                    found.append(ClaimRef(c.namespace, uid, c.name))
        if not found:
            return []
        # Only what kubelet still holds: a pod deleted meanwhile had its claims unprepared.
        still = {(c.namespace, c.name) for p in await assigned() for c in p.claims}
        restored = []
        for ref in found:
            if (ref.namespace, ref.name) not in still:
                continue
            try:
                await self.prepare(ref)
            except Exception as e:
                log.warning("claim %s, prepared by kubelet, not prepared again: %s", ref, e)
                continue
            log.warning("claim %s: kubelet holds it prepared and the node had no record of "
                        "its pod; prepared again from the claim", ref)
            restored.append(ref)
        return restored

    def _prepare(self, claim: ClaimAllocation, other: OtherGpu | None
                 ) -> tuple[PreparedDevice, ...]:
        ref, pod = claim.claim, claim.pod
        alloc = claim_to_allocation(claim, self.devices, decided_at=self.clock(),
                                    other_gpu=other)
        with self.store.locked():
            before = self.prepared.get(ref.uid)
            if before is not None and before.pod.uid != pod.uid:
                log.warning("claim %s: prepared before for pod %s, now for %s; undoing the "
                            "old preparation", ref, before.pod, pod)
                self._undo(before)
            self._refuse_overlaps(claim, alloc)
            devices = tuple(PreparedDevice(r.base_request, r.pool, r.device,
                                           (cdi_id(ref.uid, r.device),)) for r in claim.ours)
            # First the document (what to undo), then what it names: a crash in between
            # leaves what unprepare, or the next prepare, finds and ends.
            self.prepared.put(PreparedClaim(ref, pod, devices))
            old = self.store.get(pod.uid)
            if old is None or replace(old.allocation, decided_at=None) != \
                    replace(alloc, decided_at=None):
                self.store.put(pod, alloc)
            else:
                alloc = old.allocation  # the same decision: keep its first stamp
        pair_file = self._write_pair_file(pod, ref, alloc)
        named = [ClaimDevice(r.device, d) for r in claim.ours
                 if (d := self.devices.device(r.device)) is not None]
        envs = claim_envs(alloc, self.index, self.names, self.pair_map,
                          [d.device for d in named if isinstance(d.device, GpuRef)])
        self.cdi.write(ref.uid, claim_spec(ref.uid, named, envs, self.index, self.names,
                                           pair_file))
        log.info("claim %s prepared for pod %s: %d pairs, %d NICs, %d GPUs", ref, pod,
                 len(alloc.pairs), len(alloc.all_nics), len(alloc.all_gpus))
        return devices

    def _refuse_overlaps(self, claim: ClaimAllocation, alloc: Allocation) -> None:
        ref, pod = claim.claim, claim.pod
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        mine = {p.pod.uid: p for p in self.prepared.all()}
        held = self.store.get(pod.uid)
        if held is not None:
            by = mine.get(pod.uid)
            if by is None or by.claim.uid != ref.uid:
                raise ClaimError(where, f"pod {pod} already holds "
                                        + (f"claim {by.claim}'s devices" if by else
                                           "devices given outside DRA")
                                        + f"; {self.driver} serves one claim per pod")
        others = [(r.pod, r.allocation) for r in self.store.all() if r.uid != pod.uid]
        why = device_conflicts(alloc, others)
        if why is not None:
            raise ClaimError(where, why)

    def _write_pair_file(self, pod: PodKey, ref: ClaimRef, alloc: Allocation) -> str:
        gpus = [g.device_id for g in alloc.all_gpus]
        nics = [n.pci_address for n in alloc.all_nics]
        name = pair_file_name(ref.uid)
        body = pair_file_json(container_pairs(alloc, gpus, nics), namespace=pod.namespace,
                              pod=pod.name, uid=pod.uid, container=name,
                              options=self.pair_map)
        return str(self.pair_files.write(pod.uid, name, body).resolve())

    # ------------------------------------------------------------------ unprepare

    async def unprepare(self, ref: ClaimRef) -> None:
        """Remove what prepare made for the claim; without its document (lost, or
        unreadable), what the node still has of it: see `_undo_unrecorded`."""
        async with self._deciding:
            await asyncio.to_thread(self._unprepare, ref)

    def _unprepare(self, ref: ClaimRef) -> None:
        self.prepared.path(ref.uid)  # a UID that is not one path component: refused here
        with self.store.locked():
            try:
                before = self.prepared.get(ref.uid)
            except StateError as e:  # kubelet would retry a failure forever: undo all else
                log.warning("claim %s: its prepared-claim document is unreadable (%s); "
                            "unpreparing from what else the node keeps", ref, e)
                before = None
            if before is None:
                self._undo_unrecorded(ref)
                return
            self._undo(before)

    def _undo(self, p: PreparedClaim) -> None:
        """Everything the document names gone, the document last (under the store lock)."""
        self.cdi.remove(p.claim.uid)
        self._free_pod(p.claim, p.pod.uid, str(p.pod))
        self.prepared.remove(p.claim.uid)
        log.info("claim %s unprepared (pod %s)", p.claim, p.pod)

    def _undo_unrecorded(self, ref: ClaimRef) -> None:
        """No document: the pod is found by the claim's pair file, whose name says the claim
        (`<state_dir>/pairs/<pod uid>/claim-<claim uid>.json`, written only by prepare), and
        its record and pair files go as the document's would; the CDI spec by the claim's
        name. A state folder lost whole leaves only the CDI spec (the record went with it);
        a record without a pair file is the agent's clean-up's, once the pod is gone."""
        name = pair_file_name(ref.uid)
        for uid in self.pair_files.pods():
            if is_pod_uid(uid) and self.pair_files.path(uid, name).exists():
                self._free_pod(ref, uid, uid)
                log.info("claim %s: no preparation recorded; unprepared from its pair file "
                         "(pod %s)", ref, uid)
        if self.cdi.remove(ref.uid):
            log.info("claim %s: no preparation recorded; its CDI spec removed", ref)
        self.prepared.remove(ref.uid)  # an unreadable one

    def _free_pod(self, claim: ClaimRef, uid: str, pod: str) -> None:
        """The pod's record and pair files gone, the record kept while the CNI holds the
        pod's devices (under the store lock)."""
        if uid in attached_pods(self.state_dir):
            # The CNI still has the pod's VFs in its namespace: the record stays until its
            # DEL, and the agent's clean-up forgets it then, as for any pod (docs/agent.md).
            log.warning("claim %s unprepared while the CNI still holds pod %s's devices; "
                        "its record stays until the CNI's DEL", claim, pod)
        else:
            self.store.remove(uid)
        self.pair_files.remove(uid)  # last: the link `_undo_unrecorded` finds the pod by


# ----------------------------------------------------------------------- other drivers' GPUs

# NVIDIA's driver before it wrote the standard attribute gave the address in its own domain
# (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/deviceinfo.go, `pcieBusID`).
VENDOR_PCI_BUS_ID = "pcieBusID"


def _pci_address(driver: str, attrs: dict[str, Any]) -> str | None:
    for key in (PCI_BUS_ID, VENDOR_PCI_BUS_ID, f"{driver}/{VENDOR_PCI_BUS_ID}"):
        value = attrs.get(key)
        pci = value.get("string") if isinstance(value, dict) else None
        if isinstance(pci, str):
            return pci.lower()
    return None


def slice_gpus(slices: list[Any], topology: NodeTopology) -> OtherGpu:
    """Another driver's GPU devices, by (driver, pool, device), as this node's topology
    knows them: by the PCI address their ResourceSlices give them (the standard `pciBusID`,
    else the driver's own `pcieBusID`). The PCI address, not the UUID: discovery knows it
    for every GPU (a UUID only where the driver or NVML tells it), and it names a device
    everywhere else in Railyard."""
    gpus = {g.pci_address: GpuRef.of(g) for g in topology.gpus}
    found: dict[tuple[str, str, str], GpuRef] = {}
    for s in slices:
        spec = s.get("spec") if isinstance(s, dict) else None
        if not isinstance(spec, dict):
            continue
        pool = spec.get("pool")
        pool = pool if isinstance(pool, dict) else {}
        driver = str(spec.get("driver"))
        for d in spec.get("devices") or ():
            attrs = d.get("attributes") if isinstance(d, dict) else None
            pci = _pci_address(driver, attrs) if isinstance(attrs, dict) else None
            if pci is not None and pci in gpus:
                found[(driver, str(pool.get("name")), str(d.get("name")))] = gpus[pci]

    def lookup(r: ResultDevice) -> GpuRef | None:
        return found.get((r.driver, r.pool, r.device))

    return lookup


def api_preparer(topology: NodeTopology, store: StateStore, client: Client, *, state_dir: str,
                 cdi_dir: str = CDI_DIR, names: ResourceNames = DEFAULT_RESOURCES,
                 pair_map: PairMapOptions = DEFAULT_PAIR_MAP,
                 slices: Callable[[], Awaitable[list[Any] | None]] | None = None
                 ) -> ClaimPreparer:
    """The agent's preparer: claims read with its client; `slices` reads the node's
    ResourceSlices (the agent's `kube.resourceslices.node_slices`), for other drivers' GPUs
    in our claims (NVIDIA's, paired by their `pciBusID`)."""

    async def other_gpus() -> OtherGpu | None:
        found = None if slices is None else await slices()
        return None if found is None else slice_gpus(found, topology)

    return ClaimPreparer(topology, store, ApiClaims(client), state_dir=state_dir,
                         cdi=CdiSpecs(cdi_dir), clock=utc_now, names=names, pair_map=pair_map,
                         other_gpus=other_gpus)
