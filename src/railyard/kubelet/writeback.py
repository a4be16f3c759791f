"""The node's truth written back to its pod. Where the node decided (`decidedBy: node`,
decision 0033: kubelet gave other devices than the record named, or the pod came without a
usable record), the node's record replaces the pod's `railyard.dev/allocation` annotation,
so the extender's ledger, rebuilt from the pods' annotations, holds what the pod really has.

One merge PATCH per pod, carrying the pod's uid as a precondition (a pod re-created under the
same name is not written); the annotation stays the one record (docs/allocation.md).
"""

from __future__ import annotations

import logging

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.allocation.types import Allocation
from railyard.kube.client import ApiError, ApiUnavailable, Client
from railyard.kube.objects import Object
from railyard.kubelet.pods import PodSource, PodView
from railyard.node.state import StateStore
from railyard.records.allocation import encode_allocation
from railyard.records.signature import sign_record

log = logging.getLogger(__name__)


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


class AllocationWriteBack:
    """Writes each node-decided record that its pod's annotation does not match yet."""

    def __init__(self, client: Client, store: StateStore, pods: PodSource,
                 signing_key: Ed25519PrivateKey | None = None) -> None:
        self.client, self.store, self.pods = client, store, pods
        self.signing_key = signing_key  # the node's own key: signs its truth (decision 0087)
        self._written: dict[str, str] = {}  # uid → the annotation last written
        self.writes = 0

    def due(self) -> list[tuple[PodView, Allocation]]:
        """Pods whose node record was decided by the node and differs from their annotation."""
        live = {p.uid: p for p in self.pods.pods()}
        out = []
        for rec in self.store.all():
            pod = live.get(rec.uid)
            if pod is None or pod.deleting or rec.allocation.decided_by != "node":
                continue
            if pod.allocation == rec.allocation and not pod.from_koordinator:
                self._written.pop(rec.uid, None)
                continue
            if self._written.get(rec.uid) == self._text(rec.uid, rec.allocation):
                continue  # written; the watch has not brought the pod back yet
            out.append((pod, rec.allocation))
        for uid in self._written.keys() - live.keys():
            del self._written[uid]
        return out

    def _text(self, uid: str, allocation: Allocation) -> str:
        text = encode_allocation(allocation)
        return text if self.signing_key is None else sign_record(text, uid, self.signing_key)

    async def write(self) -> int:
        """PATCH every pod that is due; how many were written. Failures are logged and
        tried again on the next call."""
        done = 0
        for pod, allocation in self.due():
            text = self._text(pod.uid, allocation)
            body = {"metadata": {"uid": pod.uid, "annotations": {ALLOCATION_ANNOTATION: text}}}
            try:
                await self.client.patch(pod_path(pod.namespace, pod.name), body, Object)
            except (ApiError, ApiUnavailable) as e:
                log.warning("%s: writing the node's allocation back failed: %s", pod, e)
                continue
            self._written[pod.uid] = text
            self.writes += 1
            done += 1
            log.info("%s: the node's allocation written back to the pod (decidedBy: node)", pod)
        return done
