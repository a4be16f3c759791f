"""Which NICs a pod may receive: the node state store's word, confirmed by kubelet when possible.

The only source of devices is what the device plugin recorded when kubelet gave the pod its
devices (`railyard.node.state.StateStore`). Nothing in the network config or CNI_ARGS names a
device; CNI_ARGS only says which pod is asking. Where kubelet's PodResources API answers, every
granted NIC must also appear among the pod's device IDs there (VFs and PFs are advertised by PCI
address), so a stale or forged store entry moves nothing. The pod kubelet is asked about is the
one the record names, so a call naming the pod only by UID is confirmed like any other.

A record is trusted only for the node this lookup serves: a state folder copied from another
node names that node in every allocation and grants nothing here.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from railyard.allocation.types import NicRef
from railyard.cni.spec import CniError, Code, PodArgs
from railyard.node.ifnames import nic_pair_indexes
from railyard.node.paths import POD_RESOURCES_SOCKET
from railyard.node.state import PodRecord, StateError, StateStore, is_pod_uid
from railyard.records.dra_names import DRIVER, device_name

NODE_NAME_ENV = "RAILYARD_CNI_NODE_NAME"


def default_node_name() -> str:
    """The node a lookup serves when nobody said: the hostname (kubelet's default node name)."""
    return socket.gethostname()


@dataclass(frozen=True, slots=True)
class Grant:
    """A pod's NICs on this node in pair order, and the pod as the node's record names it.

    `pair_indexes`: for each NIC, the index of the first pair holding it (None: paired with no
    GPU), which the `gpu-index` interface names follow; None: every NIC is its own pair's."""

    pod: PodArgs
    nics: tuple[NicRef, ...]
    pair_indexes: tuple[int | None, ...] | None = None


class Grants(Protocol):
    def grant(self, pod: PodArgs) -> Grant | None:
        """What this node granted the asking pod; None when it holds nothing for it."""
        ...


class PodDevices(Protocol):
    def device_ids(self, namespace: str, name: str) -> frozenset[str] | None:
        """Every device ID kubelet assigned to the pod's containers; None when unreachable."""
        ...


class LivePods(Protocol):
    """The agent's view of the node's pods (`railyard.kubelet.pods.PodSource` fits)."""

    def pods(self) -> Sequence[object]:
        """The pods known now; each has a `.uid`."""
        ...

    @property
    def loaded(self) -> bool:
        """True once a list was read; until then absence of a pod means nothing."""
        ...


class StoreGrants:
    """Grants read from the agent's node state store, for one node.

    A call naming the pod by UID gets that UID's record; namespace/name given as well must
    match it. A call naming it only by namespace/name gets the one record of this node with
    that name whose pod is not known to be gone (`pods`, when the agent's pod list is at
    hand); several such records (a deleted pod's not yet forgotten) are refused with code 11
    rather than guessed between — pass K8S_POD_UID, or retry once the agent forgot the old one.
    """

    def __init__(self, store: StateStore, node: str | None = None, *,
                 pods: LivePods | None = None) -> None:
        self.store = store
        node = node or store.node
        if not node:
            raise ValueError("StoreGrants needs the node name its records must carry")
        self.node = node
        self.pods = pods

    def grant(self, pod: PodArgs) -> Grant | None:
        if pod.uid and not is_pod_uid(pod.uid):  # the runtime's argument, not our state
            raise CniError(Code.INVALID_ENV, f"CNI_ARGS: K8S_POD_UID {pod.uid[:80]!r} is not a "
                                             "pod UID")
        try:
            if pod.uid:
                rec = self.store.get(pod.uid)
            elif pod.namespace and pod.name:
                rec = self._by_name(pod.namespace, pod.name)
            else:
                raise CniError(Code.INVALID_ENV,
                               "CNI_ARGS: K8S_POD_UID, or K8S_POD_NAMESPACE and K8S_POD_NAME, "
                               "are needed to find the pod's devices")
        except StateError as e:
            raise CniError(Code.IO, f"node state store: {e}") from None
        if rec is None:
            return None
        self._for_this_node(rec)
        # A UID that names another pod than the one asking is refused, not trusted.
        if (pod.namespace and pod.namespace != rec.pod.namespace) or (
                pod.name and pod.name != rec.pod.name):
            raise CniError(Code.INVALID_ENV,
                           f"CNI_ARGS: pod {pod.namespace}/{pod.name} does not match the node's "
                           f"record for UID {rec.pod.uid} ({rec.pod.namespace}/{rec.pod.name})")
        return Grant(PodArgs(uid=rec.pod.uid, namespace=rec.pod.namespace, name=rec.pod.name,
                             infra_container_id=pod.infra_container_id), rec.granted_nics,
                     nic_pair_indexes(rec.allocation))

    def granted_nics(self, pod: PodArgs) -> tuple[NicRef, ...]:
        g = self.grant(pod)
        return g.nics if g is not None else ()

    def _for_this_node(self, rec: PodRecord) -> None:
        if rec.allocation.node != self.node:
            raise CniError(Code.NOT_CONFIRMED,
                           f"the node state store's record for pod {rec.pod} is for node "
                           f"{rec.allocation.node!r}, this is {self.node!r}; a state folder "
                           "from another node grants nothing here", "nothing was moved")

    def _by_name(self, namespace: str, name: str) -> PodRecord | None:
        found = [r for r in self.store.all()
                 if r.pod.namespace == namespace and r.pod.name == name]
        for r in found:
            self._for_this_node(r)
        if found and self.pods is not None and self.pods.loaded:
            live = {getattr(p, "uid", None) for p in self.pods.pods()}
            found = [r for r in found if r.uid in live]  # a gone pod's record is never ours
        if len(found) > 1:
            raise CniError(Code.TRY_AGAIN,
                           f"CNI_ARGS: {len(found)} records on this node name pod "
                           f"{namespace}/{name} (UIDs {', '.join(r.uid for r in found)}); pass "
                           "K8S_POD_UID to say which, or retry once the agent has forgotten the "
                           "deleted pod's", "nothing was moved")
        return found[0] if found else None


class KubeletPodResources:
    """PodResources v1 `List` on kubelet's socket; None when kubelet cannot be asked."""

    def __init__(self, socket_path: str = POD_RESOURCES_SOCKET,
                 timeout_s: float = 1.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    def device_ids(self, namespace: str, name: str) -> frozenset[str] | None:
        if not os.path.exists(self.socket_path):
            return None
        import grpc  # only when a kubelet is there to ask

        from railyard.kubelet.api import podresources_pb2, podresources_pb2_grpc
        from railyard.kubelet.podresources import unix_target

        try:
            with grpc.insecure_channel(unix_target(self.socket_path)) as channel:
                stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
                resp = stub.List(podresources_pb2.ListPodResourcesRequest(),
                                 timeout=self.timeout_s)
        except grpc.RpcError:
            return None
        ids: set[str] = set()
        for pod in resp.pod_resources:
            if pod.namespace == namespace and pod.name == name:
                for c in pod.containers:
                    for d in c.devices:
                        ids.update(d.device_ids)
                    # A DRA pod's: the devices of Railyard's driver in its prepared claims,
                    # by their slice names (decision 0109).
                    for claim in c.dynamic_resources:
                        ids.update(r.device_name for r in claim.claim_resources
                                   if r.driver_name == DRIVER)
        return frozenset(ids)


def confirm(nics: tuple[NicRef, ...], pod: PodArgs, source: PodDevices | None) -> None:
    """Refuse when kubelet answers and does not list every granted NIC for this pod.

    `pod` is the pod as the node's record names it (`Grant.pod`), so a call that gave only
    K8S_POD_UID is confirmed exactly like one that gave namespace and name.
    """
    if source is None or not (pod.namespace and pod.name):
        return
    ids = source.device_ids(pod.namespace, pod.name)
    if ids is None:
        return
    missing = [n.pci_address for n in nics
               if n.pci_address not in ids and device_name(n.pci_address) not in ids]
    if missing:
        raise CniError(Code.NOT_CONFIRMED,
                       f"kubelet's PodResources does not list {', '.join(missing)} for pod "
                       f"{pod.namespace}/{pod.name}; the node state store and kubelet disagree",
                       "nothing was moved")
