"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it
(docs/decisions/0074): one holder at a time, taken over only after the holder has not
renewed for the lease's duration, every write guarded by the Lease's resourceVersion.

`Elector` is the state machine, over a `LeaseStore` and a clock it is given (tests drive it
with a fake one); `ApiLeases` is the store on the API server. A follower judges expiry by its
own clock from when it last saw the record change (client-go's observedTime), so the
holders' clocks need not agree; the leader calls itself leader only while its last renewal is
younger than the renew deadline, which is shorter than the lease, so it stops before anyone
else can start (`is_leader()` is the fence each write checks).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec

from railyard.kube.client import ApiError, ApiUnavailable, Client
from railyard.kube.objects import ObjectMeta

log = logging.getLogger("railyard.kube.lease")

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A Lease's spec, and the resourceVersion it was read at ("" for one not yet created)."""

    holder: str = ""
    lease_duration_s: int = 0
    acquire_time: str = ""
    renew_time: str = ""
    transitions: int = 0
    resource_version: str = ""

    def same_as(self, other: LeaseRecord | None) -> bool:
        return other is not None and replace(self, resource_version="") == replace(
            other, resource_version="")


class LeaseConflict(Exception):
    """Someone wrote the Lease since it was read (409), or created it first."""


class LeaseStore(Protocol):
    """Where the Lease lives. `get` returns None when there is none; `create` and `update`
    return the record as written (with its new resourceVersion) or raise LeaseConflict."""

    async def get(self) -> LeaseRecord | None: ...

    async def create(self, record: LeaseRecord) -> LeaseRecord: ...

    async def update(self, record: LeaseRecord) -> LeaseRecord: ...


def micro_time(at: datetime) -> str:
    """Kubernetes' MicroTime: RFC 3339 with microseconds, in UTC."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    """POD_NAME in a pod (a restarted container keeps its lease), else hostname_pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


class Elector:
    """Campaign for, hold and give back one Lease. `step()` is one round; `run()` loops it
    every `retry_period_s`. Times from `clock` (seconds, monotonic) and `wall` (for the
    Lease's timestamps)."""

    def __init__(self, store: LeaseStore, identity: str, *, lease_duration_s: float = 15.0,
                 renew_deadline_s: float = 10.0, retry_period_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        if not 0 < retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("leader election needs 0 < retry period < renew deadline < "
                             f"lease duration (got {retry_period_s:g}, {renew_deadline_s:g}, "
                             f"{lease_duration_s:g} s)")
        self.store, self.identity = store, identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.clock, self.wall = clock, wall
        self.holder = ""  # who holds it, as last seen
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # our last successful write as holder
        self._leading = False  # as last told to on_change
        self.on_change: Callable[[bool], None] | None = None

    def is_leader(self) -> bool:
        """Held, and renewed within the renew deadline: safe to write as the leader."""
        return (self._renewed_at is not None
                and self.clock() - self._renewed_at < self.renew_deadline_s)

    def time_left(self) -> float:
        """Seconds before the renew deadline (as `is_leader` counts it); 0 when not leader:
        how long a write started now may still wait for its answer as the leader's."""
        if self._renewed_at is None:
            return 0.0
        return max(0.0, self.renew_deadline_s - (self.clock() - self._renewed_at))

    async def step(self) -> bool:
        """One try to acquire or renew; whether we lead afterwards."""
        try:
            won = await self._try()
        except (ApiError, ApiUnavailable) as e:
            log.warning("lease %s: %s", self.identity, e)
            won = False
        if not won and self._renewed_at is not None and not self.is_leader():
            log.warning("%s: could not renew the lease within %g s: no longer the leader",
                        self.identity, self.renew_deadline_s)
            self._renewed_at = None
        leads = self.is_leader()
        if leads != self._leading:
            self._leading = leads
            if self.on_change is not None:
                self.on_change(leads)
        return leads

    async def _try(self) -> bool:
        now, stamp = self.clock(), micro_time(self.wall())
        current = await self.store.get()
        duration = max(1, round(self.lease_duration_s))
        if current is None:
            mine = LeaseRecord(self.identity, duration, stamp, stamp, 0)
            return await self._write(self.store.create, mine, now)
        if not current.same_as(self._observed):
            self._observed, self._observed_at = current, now
        self.holder = current.holder
        ours = current.holder == self.identity
        if (current.holder and not ours
                and now < self._observed_at + current.lease_duration_s):
            return False  # someone else's, and not expired by our clock
        if ours:
            mine = replace(current, lease_duration_s=duration, renew_time=stamp)
        else:
            mine = replace(current, holder=self.identity, lease_duration_s=duration,
                           acquire_time=stamp, renew_time=stamp,
                           transitions=current.transitions + 1)
            log.info("%s: taking over the lease from %r", self.identity, current.holder)
        return await self._write(self.store.update, mine, now)

    async def _write(self, write: Callable[[LeaseRecord], Awaitable[LeaseRecord]],
                     mine: LeaseRecord, now: float) -> bool:
        try:
            written = await write(mine)
        except LeaseConflict:
            return False  # another replica wrote first: read again next round
        self._observed, self._observed_at = written, now
        self._renewed_at = now
        self.holder = self.identity
        return True

    async def run(self) -> None:
        """Campaign and renew until cancelled."""
        while True:
            await self.step()
            await asyncio.sleep(self.retry_period_s)

    async def release(self) -> None:
        """Give the lease back (on a clean stop), so another replica need not wait it out."""
        if self._renewed_at is None:
            return
        self._renewed_at = None
        if self._leading:
            self._leading = False
            if self.on_change is not None:
                self.on_change(False)
        try:
            current = await self.store.get()
            if current is not None and current.holder == self.identity:
                await self.store.update(replace(current, holder="", lease_duration_s=1,
                                                renew_time=micro_time(self.wall())))
        except (ApiError, ApiUnavailable, LeaseConflict) as e:
            log.warning("releasing the lease: %s", e)


class LeaseSpec(msgspec.Struct, rename="camel", omit_defaults=True):
    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None
    renew_time: str | None = None
    lease_transitions: int | None = None


class LeaseObject(msgspec.Struct, omit_defaults=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: LeaseSpec = msgspec.field(default_factory=LeaseSpec)


class ApiLeases:
    """The Lease `namespace/name` on the API server."""

    def __init__(self, client: Client, namespace: str, name: str) -> None:
        self.client, self.namespace, self.name = client, namespace, name
        self.collection = LEASES.format(namespace=namespace)
        self.path = f"{self.collection}/{name}"

    async def get(self) -> LeaseRecord | None:
        try:
            return _record(await self.client.get(self.path, LeaseObject))
        except ApiError as e:
            if e.not_found:
                return None
            raise

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        return await self._send(self.client.create, self.collection, record)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        return await self._send(self.client.put, self.path, record)

    async def _send(self, verb: Callable[[str, Any, type[LeaseObject]], Awaitable[LeaseObject]],
                    path: str,
                    record: LeaseRecord) -> LeaseRecord:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": record.resource_version or None},
                "spec": {"holderIdentity": record.holder or None,
                         "leaseDurationSeconds": record.lease_duration_s,
                         "acquireTime": record.acquire_time or None,
                         "renewTime": record.renew_time or None,
                         "leaseTransitions": record.transitions}}
        try:
            return _record(await verb(path, body, LeaseObject))
        except ApiError as e:
            if e.conflict:  # 409: a newer resourceVersion, or created by someone else
                raise LeaseConflict(str(e)) from e
            raise


def _record(obj: LeaseObject) -> LeaseRecord:
    s = obj.spec
    return LeaseRecord(s.holder_identity or "", s.lease_duration_seconds or 0,
                       s.acquire_time or "", s.renew_time or "", s.lease_transitions or 0,
                       obj.metadata.resource_version)
