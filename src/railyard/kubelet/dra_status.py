"""After railyard-cni's ADD of a DRA pod, its claim's `status.devices` names each of our NICs'
interface in the pod, MAC and addresses (KEP-4817's network data; `records.dra_status`,
decision 0113).

The CNI service tells `ClaimStatusWriter.interfaces_added` on the ADD's thread; the write runs
on the agent's loop, off the ADD's path, so the pod's sandbox never waits on the API server and
never fails for it: a write that fails (after a few tries where trying again can help) is
logged, counted and told (the agent makes it a Warning Event on the pod). It writes only the
claims this node prepared for that pod (their prepared-claim documents,
`kubelet.dra_prepared`), only our driver's devices of them, by server-side apply as
`railyard-agent`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from railyard.kube.client import ApiError, ApiUnavailable, Client
from railyard.kubelet.dra_prepared import PreparedClaim, PreparedClaims
from railyard.node.state import PodKey
from railyard.records.dra_names import DRIVER, device_name
from railyard.records.dra_status import (
    FIELD_MANAGER,
    DeviceStatusError,
    NicNetwork,
    network_status,
    status_apply,
)

log = logging.getLogger(__name__)

API = "/apis/resource.k8s.io/v1"
ATTEMPTS = 4  # tries of one write where trying again can help, RETRY_S apart, doubling
RETRY_S = 0.5
RETRIED = frozenset({429, 500, 502, 503, 504})  # busy or failing: the same body may pass

# Outcomes of one claim's write (the metric's label).
WRITTEN, FAILED, GONE = "written", "failed", "gone"


class PodInterface(Protocol):
    """An interface railyard-cni's ADD gave the pod (`railyard.cni.context.PodInterface`)."""

    @property
    def pci(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def mac(self) -> str: ...
    @property
    def ips(self) -> tuple[str, ...]: ...


# Told when a claim's status was not written: the pod, and why (the agent makes it an Event).
NotWritten = Callable[[PodKey, str], None]


class ClaimStatusWriter:
    """Writes our entries of the claims of a pod whose interfaces railyard-cni just added."""

    def __init__(self, client: Client, state_dir: str, loop: asyncio.AbstractEventLoop, *,
                 node: str, registry: CollectorRegistry | None = None,
                 not_written: NotWritten | None = None, driver: str = DRIVER,
                 attempts: int = ATTEMPTS, retry_s: float = RETRY_S) -> None:
        self.client = client
        self.prepared = PreparedClaims(state_dir)
        self.loop = loop
        self.node = node
        self.not_written = not_written
        self.driver = driver
        self.attempts = attempts
        self.retry_s = retry_s
        # Writes handed over and not yet ended (a test or the agent's stop may wait on them).
        self.pending: set[concurrent.futures.Future[list[str]]] = set()
        self._writes = Counter(
            "railyard_agent_dra_claim_status_writes",
            "Writes of a DRA claim's status.devices network data after a CNI ADD, by outcome: "
            "written, failed (logged and told as a pod Event), gone (the claim was deleted).",
            ["node", "outcome"], registry=registry if registry is not None
            else CollectorRegistry())

    # ------------------------------------------------------------------ the CNI's hook

    def interfaces_added(self, pod_uid: str | None, interfaces: Sequence[PodInterface]
                         ) -> concurrent.futures.Future[list[str]] | None:
        """From the CNI service's `on_added` (any thread): the write handed to the agent's
        loop, the ADD not kept waiting; its future, None when there is nothing to write."""
        if not pod_uid or not interfaces or self.loop.is_closed():
            return None
        future = asyncio.run_coroutine_threadsafe(self.write(pod_uid, interfaces), self.loop)
        self.pending.add(future)
        future.add_done_callback(self.pending.discard)
        return future

    # ------------------------------------------------------------------ the write

    async def write(self, pod_uid: str, interfaces: Sequence[PodInterface]) -> list[str]:
        """Each claim prepared here for the pod written; the outcomes, claim by claim (none:
        the pod has no claim of ours, e.g. one given devices by the device plugins)."""
        claims = [p for p in await asyncio.to_thread(self.prepared.all) if p.pod.uid == pod_uid]
        return [await self._write_claim(p, interfaces) for p in claims]

    def entries(self, p: PreparedClaim, interfaces: Sequence[PodInterface]) -> list[dict]:
        """Our entries for the claim: the interfaces whose device is one of the claim's that
        prepare took (the node's record of the allocation), in the ADD's order."""
        devices = {d.device: d for d in p.devices}
        nics = [NicNetwork(name, devices[name].pool, i.name, i.mac or None, i.ips)
                for i in interfaces if (name := device_name(i.pci)) in devices]
        allocated = frozenset((self.driver, d.pool, d.device) for d in p.devices)
        return network_status(nics, allocated, driver=self.driver)

    async def _write_claim(self, p: PreparedClaim, interfaces: Sequence[PodInterface]) -> str:
        c = p.claim
        try:
            entries = self.entries(p, interfaces)
        except DeviceStatusError as e:
            return self._failed(p, str(e))
        if not entries:
            return WRITTEN  # none of its devices moved: nothing of ours to say
        path = f"{API}/namespaces/{c.namespace}/resourceclaims/{c.name}/status"
        body = status_apply(c.namespace, c.name, c.uid, entries)
        for attempt in range(self.attempts):
            last = attempt == self.attempts - 1
            try:
                await self.client.apply(path, body, dict[str, Any], field_manager=FIELD_MANAGER)
            except ApiError as e:
                if e.not_found:  # deleted with its pod meanwhile: nothing left to say it on
                    self._writes.labels(self.node, GONE).inc()
                    log.info("claim %s is gone; its network data not written", c)
                    return GONE
                if e.status not in RETRIED or last:
                    return self._failed(p, str(e))
            except ApiUnavailable as e:
                if last:
                    return self._failed(p, str(e))
            else:
                self._writes.labels(self.node, WRITTEN).inc()
                log.info("claim %s: network data of %d NICs written (%s)", c, len(entries),
                         ", ".join(f"{e['device']}>{e.get('networkData', {}).get('interfaceName')}"
                                   for e in entries))
                return WRITTEN
            await asyncio.sleep(self.retry_s * 2 ** attempt)
        raise AssertionError("unreachable: the last attempt returns")

    def _failed(self, p: PreparedClaim, why: str) -> str:
        self._writes.labels(self.node, FAILED).inc()
        message = (f"the network data of ResourceClaim {p.claim.namespace}/{p.claim.name} "
                   f"(status.devices) was not written: {why}; the pod keeps its NICs")
        log.warning("pod %s: %s", p.pod, message)
        if self.not_written is not None:
            self.not_written(p.pod, message)
        return FAILED
