"""A ResourceClaim's allocation, read for this node, and turned into the node's one Allocation.

Pure: `read_claim` checks what kubelet's call cannot (the claim is the one named, allocated
for this node, reserved for exactly one pod, no admin access) and keeps our driver's devices
in result order; `claim_to_allocation` pairs them, the k-th GPU with the k-th NIC in request
order, into the same record the device plugins write (decision 0109). `nic_conflicts` is the
refusal DRA cannot make itself: a whole PF beside one of its VFs, in one claim or across pods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.kubelet.othergpus import is_gpu_driver
from railyard.kubelet.pairing import DeviceIndex
from railyard.node.state import PodKey, is_pod_uid
from railyard.records.dra_names import DRIVER, device_name
from railyard.records.fields import FieldError, Fields


class ClaimError(FieldError):
    """A claim this node cannot prepare; the message is what kubelet shows on the pod."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as kubelet names it in NodePrepareResources: all it passes."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True, slots=True)
class ResultDevice:
    """One entry of `status.allocation.devices.results`."""

    request: str  # as the result names it: `request` or `request/subrequest`
    driver: str
    pool: str
    device: str
    share_id: str | None = None

    @property
    def base_request(self) -> str:
        """The claim's request a `firstAvailable` subrequest belongs to (kubelet's rule)."""
        return self.request.partition("/")[0]


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    claim: ClaimRef
    pod: PodKey  # the one pod in `status.reservedFor`
    ours: tuple[ResultDevice, ...]  # our driver's devices, in result (request) order
    others: tuple[ResultDevice, ...]  # other drivers' (NVIDIA's GPUs), in result order


def read_claim(doc: object, ref: ClaimRef, node: str, driver: str = DRIVER) -> ClaimAllocation:
    """Check a ResourceClaim (JSON as the API server serves it) and keep what prepare needs.

    ClaimError names the field at fault: another claim under the name (UID differs), not
    allocated, allocated for another node, reserved for no pod or for several (the CNI moves
    our VFs into one pod's network namespace), admin access (it never grants exclusive use).
    """
    f = Fields(doc, f"ResourceClaim {ref.namespace}/{ref.name}", ClaimError)
    meta = f.object("metadata")
    if meta.get("uid") != ref.uid:
        meta.fail("uid", f"is {meta.get('uid')!r}, kubelet asked for {ref.uid!r} "
                         "(the claim was deleted and made again)")
    status = f.object("status", optional=True)
    if "allocation" not in status:
        status.fail("allocation", "missing: the claim is not allocated")
    allocation = status.object("allocation")
    _check_node(allocation, node)
    pods = [r for r in status.objects("reservedFor", optional=True)
            if r.get("resource") == "pods" and r.get("apiGroup", "") in ("", None)]
    if len(pods) != 1:
        status.fail("reservedFor", f"reserved for {len(pods)} pods; a claim of {driver} "
                                   "devices serves exactly one pod (its VFs move into that "
                                   "pod's network namespace)")
    pod_uid = pods[0].string("uid", nonempty=True)
    if not is_pod_uid(pod_uid):
        pods[0].fail("uid", "not a pod UID")
    pod = PodKey(pod_uid, ref.namespace, pods[0].string("name", nonempty=True))
    ours: list[ResultDevice] = []
    others: list[ResultDevice] = []
    for r in allocation.object("devices", optional=True).objects("results", optional=True):
        result = ResultDevice(r.string("request", nonempty=True), r.string("driver"),
                              r.string("pool"), r.string("device", nonempty=True),
                              r.string_or_null("shareID"))
        if result.driver != driver:
            others.append(result)
            continue
        if r.get("adminAccess") is True:
            r.fail("adminAccess", f"admin access to {result.device} is not served: "
                                  f"{driver} devices are given to one pod whole")
        ours.append(result)
    return ClaimAllocation(ref, pod, tuple(ours), tuple(others))


def _check_node(allocation: Fields, node: str) -> None:
    """A node-local allocation names its node in `nodeSelector` (matchFields metadata.name)."""
    names: set[str] = set()
    selector = allocation.object("nodeSelector", optional=True)
    for term in selector.objects("nodeSelectorTerms", optional=True):
        for m in term.objects("matchFields", optional=True):
            if m.get("key") == "metadata.name" and m.get("operator") == "In":
                names.update(m.strings("values", optional=True))
    if names and node not in names:
        allocation.fail("nodeSelector", f"allocated for node {sorted(names)[0]!r}, "
                                        f"this is {node!r}")


# ----------------------------------------------------------------------- device names


class DeviceNames:
    """This node's devices by slice device name: GPUs, whole PFs and VFs."""

    def __init__(self, index: DeviceIndex) -> None:
        self.index = index
        self.gpus: dict[str, GpuRef] = {device_name(g.pci_address): GpuRef.of(g)
                                        for g in index.topology.gpus}
        self.nics: dict[str, NicRef] = {device_name(pci): nic
                                        for pci, nic in index.nics.items()}

    def device(self, name: str) -> GpuRef | NicRef | None:
        return self.gpus.get(name) or self.nics.get(name)


# A device of another driver (NVIDIA's GPU) as the GPU of this node's topology it is, found
# by the PCI address its slice gives it; None: no GPU of this node.
OtherGpu = Callable[[ResultDevice], GpuRef | None]


def claim_to_allocation(claim: ClaimAllocation, names: DeviceNames, *, decided_at: str,
                        other_gpu: OtherGpu | None = None) -> Allocation:
    """The node's record of the claim: the k-th GPU paired with the k-th NIC, result order.

    Results come in the claim's request order, so a template's requests pair as written,
    pair by pair (`railyard dra claim-template` writes `nic-0, gpu-0, nic-1, gpu-1, …`;
    decision 0112). A device of ours this node does not have is refused
    (the slice it came from is stale, or of another node); NICs beyond the GPUs stay
    unpaired, as do GPUs beyond the NICs.

    Another driver's GPUs (NVIDIA's, `--gpus nvidia`) are this node's GPUs as `other_gpu`
    finds them by PCI address, in their result order after ours. A device of a GPU driver
    that it cannot find is refused, not skipped: pairs go by position, and one GPU left out
    would pair every later GPU with the NIC of the pair before (kubelet retries a refused
    prepare; a slice read that failed heals then). Other drivers' other devices are not ours
    to pair.
    """
    where = f"ResourceClaim {claim.claim.namespace}/{claim.claim.name}"
    node = names.index.topology.node
    gpus: list[GpuRef] = []
    nics: list[NicRef] = []
    for r in claim.ours:
        d = names.device(r.device)
        if d is None:
            raise ClaimError(where, f"device {r.device!r} of pool {r.pool!r} is not a device "
                                    f"of node {node!r}")
        if isinstance(d, GpuRef):
            gpus.append(d)
        else:
            nics.append(d)
    for r in claim.others:
        g = other_gpu(r) if other_gpu is not None else None
        if g is not None:
            gpus.append(g)
        elif is_gpu_driver(r.driver):
            why = ("the node's ResourceSlices could not be read" if other_gpu is None else
                   f"its ResourceSlice gives it no PCI address of a GPU of node {node!r}")
            raise ClaimError(where, f"GPU {r.device!r} of driver {r.driver!r} (request "
                                    f"{r.request!r}) cannot be paired: {why}")
    topo, index = names.index.topology, names.index
    pairs = tuple(Pair(g, n, index.distance(g, n), index.rail.get(n.pf_pci_address))
                  for g, n in zip(gpus, nics, strict=False))
    numa = {index.numa.get(n.pf_pci_address) for n in nics}
    numa |= {topo.gpu(g.pci_address).numa_node for g in gpus}
    return Allocation(
        node=topo.node,
        numa_nodes=tuple(sorted(n for n in numa if n is not None)),
        cpus=None,
        memory_bytes=(),
        pairs=pairs,
        nics=tuple(nics[len(pairs):]),
        gpus=tuple(gpus[len(pairs):]),
        decided_by="node",
        decided_at=decided_at,
    )


def device_conflicts(alloc: Allocation, held: Iterable[tuple[PodKey, Allocation]]
                     ) -> str | None:
    """Why `alloc`'s devices cannot be given, or None: a whole PF with one of its own VFs, or
    a device (a NIC, its PF, a VF of it, a GPU) that another pod's record holds.

    DRA's allocator sees a PF and its VFs as unrelated devices unless the slices say
    otherwise, so the node is where this is refused (issue 29).
    """
    mine = alloc.all_nics
    for pf in (n for n in mine if n.kind == "pf"):
        vfs = [n.pci_address for n in mine
               if n.kind == "vf" and n.pf_pci_address == pf.pci_address]
        if vfs:
            return (f"PF {pf.pci_address} is asked whole together with its own VF {vfs[0]}; "
                    "a PF given whole cannot also lend a VF")
    gpus = {g.pci_address for g in alloc.all_gpus}
    for pod, other in held:
        for n in mine:
            for o in other.all_nics:
                if _overlap(n, o):
                    return f"{_named(n)} overlaps {_named(o)}, held by pod {pod}"
        for g in other.all_gpus:
            if g.pci_address in gpus:
                return f"GPU {g.pci_address} is held by pod {pod}"
    return None


def _overlap(a: NicRef, b: NicRef) -> bool:
    if a.pci_address == b.pci_address:
        return True
    return (a.kind == "pf" and b.pf_pci_address == a.pci_address) or \
        (b.kind == "pf" and a.pf_pci_address == b.pci_address)


def _named(n: NicRef) -> str:
    return f"{'VF' if n.kind == 'vf' else 'PF'} {n.pci_address}"
