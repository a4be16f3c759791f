"""Which NICs a pod may receive: the node state store's word, confirmed by kubelet when possible.

The only source of devices is what the device plugin recorded when kubelet gave the pod its
devices (`railyard.agent.state.StateStore`). Nothing in the network config or CNI_ARGS names a
device; CNI_ARGS only says which pod is asking. Where kubelet's PodResources API answers, every
granted NIC must also appear among the pod's device IDs there (VFs and PFs are advertised by PCI
address), so a stale or forged store entry moves nothing.
"""

from __future__ import annotations

import os
from typing import Protocol

from railyard.agent.state import StateError, StateStore
from railyard.allocation.types import NicRef
from railyard.cni.spec import CniError, Code, PodArgs

DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


class Grants(Protocol):
    def granted_nics(self, pod: PodArgs) -> tuple[NicRef, ...]:
        """The pod's NICs on this node in pair order; () when this node holds none for it."""
        ...


class PodDevices(Protocol):
    def device_ids(self, namespace: str, name: str) -> frozenset[str] | None:
        """Every device ID kubelet assigned to the pod's containers; None when unreachable."""
        ...


class StoreGrants:
    """Grants read from the agent's node state store."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def granted_nics(self, pod: PodArgs) -> tuple[NicRef, ...]:
        try:
            if pod.uid:
                rec = self.store.get(pod.uid)
            elif pod.namespace and pod.name:
                rec = self.store.find(pod.namespace, pod.name)
            else:
                raise CniError(Code.INVALID_ENV,
                               "CNI_ARGS: K8S_POD_UID, or K8S_POD_NAMESPACE and K8S_POD_NAME, "
                               "are needed to find the pod's devices")
        except StateError as e:
            raise CniError(Code.IO, f"node state store: {e}") from None
        if rec is None:
            return ()
        # A UID that names another pod than the one asking is refused, not trusted.
        if (pod.namespace and pod.namespace != rec.pod.namespace) or (
                pod.name and pod.name != rec.pod.name):
            raise CniError(Code.INVALID_ENV,
                           f"CNI_ARGS: pod {pod.namespace}/{pod.name} does not match the node's "
                           f"record for UID {rec.pod.uid} ({rec.pod.namespace}/{rec.pod.name})")
        return rec.granted_nics


class KubeletPodResources:
    """PodResources v1 `List` on kubelet's socket; None when kubelet cannot be asked."""

    def __init__(self, socket_path: str = DEFAULT_POD_RESOURCES_SOCKET,
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
        return frozenset(ids)


def confirm(nics: tuple[NicRef, ...], pod: PodArgs, source: PodDevices | None) -> None:
    """Refuse when kubelet answers and does not list every granted NIC for this pod."""
    if source is None or not (pod.namespace and pod.name):
        return
    ids = source.device_ids(pod.namespace, pod.name)
    if ids is None:
        return
    missing = [n.pci_address for n in nics if n.pci_address not in ids]
    if missing:
        raise CniError(Code.NOT_CONFIRMED,
                       f"kubelet's PodResources does not list {', '.join(missing)} for pod "
                       f"{pod.namespace}/{pod.name}; the node state store and kubelet disagree",
                       "nothing was moved")
