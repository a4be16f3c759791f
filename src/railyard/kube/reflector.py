"""One reflector for every watched kind (pods, NodeTopology CRs, leases): a store of the
objects keyed by `namespace/name`, kept current by list → watch, as client-go's reflector.

- List in pages (a consistent read), then watch from the list's resourceVersion with
  `allowWatchBookmarks`; a bookmark moves the resourceVersion on without an object.
- The server ending a watch (its `timeoutSeconds`, jittered like client-go's 5–10 min) is
  normal: watch again from the last resourceVersion. So is a watch that cannot connect at
  all (nothing was lost): retry it, with backoff, from the same resourceVersion.
- 410 Gone (on the watch request, or as an ERROR event in the stream) means the server no
  longer has that history: list again. A dropped or silent connection also lists again
  (after a backoff), since events may have been missed in between.
- A re-list is applied as a diff against the store: the callback sees the ADDED, MODIFIED
  and DELETED changes that happened while the watch was away, never a replaced store.
- Failures back off exponentially with jitter up to a cap; a watch that delivers resets it.

Changes go to one synchronous callback, in the order the server sent them; the callback runs
on the reflector's task, so a slow consumer slows the stream instead of growing a queue.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import msgspec

from railyard.kube.client import (
    MAX_LINE_BYTES,
    PAGE_SIZE,
    WATCH_READ_TIMEOUT_S,
    ApiError,
    ApiUnavailable,
    ApiUnreachable,
    Client,
)
from railyard.kube.objects import HasMeta, ObjectList, ObjectMeta, Status, WatchEvent

log = logging.getLogger(__name__)

T = TypeVar("T", bound=HasMeta)
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]
WATCH_TIMEOUT_S = 300  # the server ends each watch after 300..600 s


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """One change to the store: the object as it is now (as it was last, for DELETED) and,
    for MODIFIED and DELETED, what the store held before."""

    type: ChangeType
    key: str
    object: T
    old: T | None = None


def key_of(meta: ObjectMeta) -> str:
    """client-go's MetaNamespaceKeyFunc: `namespace/name`, or `name` when cluster-scoped."""
    return f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name


class Backoff:
    """Exponential backoff with jitter and a cap: attempt n waits a uniform draw from
    [d/2, d], d = min(cap, initial · factor^n) — so restarted replicas do not re-list in step."""

    def __init__(self, initial_s: float = 0.5, cap_s: float = 30.0, factor: float = 2.0,
                 rng: random.Random | None = None) -> None:
        self.initial_s, self.cap_s, self.factor = initial_s, cap_s, factor
        self.attempts = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        d = min(self.cap_s, self.initial_s * self.factor ** self.attempts)
        self.attempts += 1
        return self._rng.uniform(d / 2, d)

    def reset(self) -> None:
        self.attempts = 0


class _Meta(msgspec.Struct):
    metadata: ObjectMeta


class _Relist(Exception):
    """The watch cannot go on from the resourceVersion it has: list again."""


class Reflector(Generic[T]):
    """List → watch one collection (`path`, e.g. `/api/v1/pods`, with `params` such as a
    `fieldSelector`) into `store`, calling `on_change` for each change. `run()` runs until
    cancelled; `synced` is set once the first list is in the store."""

    def __init__(self, client: Client, path: str, type_: type[T], *,
                 on_change: Callable[[Change[T]], None] | None = None,
                 params: Mapping[str, str] | None = None,
                 watch_timeout_s: int = WATCH_TIMEOUT_S,
                 read_timeout_s: float = WATCH_READ_TIMEOUT_S,
                 max_line_bytes: int = MAX_LINE_BYTES,
                 page_size: int = PAGE_SIZE,
                 backoff: Backoff | None = None,
                 rng: random.Random | None = None) -> None:
        self.client, self.path, self.type = client, path, type_
        self.on_change = on_change
        self.params = dict(params or {})
        self.watch_timeout_s, self.read_timeout_s = watch_timeout_s, read_timeout_s
        self.max_line_bytes, self.page_size = max_line_bytes, page_size
        self.backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self.store: dict[str, T] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.lists = 0  # how many times it has listed (the first, and each re-list)
        self.relists: Counter[str] = Counter()  # why it listed again: gone, unavailable, error
        self.handler_errors = 0  # changes `on_change` raised on (logged; the watch goes on)
        self._events = msgspec.json.Decoder(WatchEvent)
        self._object = msgspec.json.Decoder(type_)
        self._page: msgspec.json.Decoder[ObjectList[T]] = msgspec.json.Decoder(
            ObjectList[type_])  # type: ignore[valid-type]
        self._meta = msgspec.json.Decoder(_Meta)
        self._status = msgspec.json.Decoder(Status)

    async def run(self) -> None:
        """List and watch until cancelled. Run again after a cancel, it resumes watching from
        where it was and lists only if the server no longer has that history."""
        resume = self.synced.is_set() and bool(self.resource_version)
        while True:
            try:
                if not resume:
                    await self._list()
                resume = False
                while True:  # a watch the server ended on time: go on from where it was
                    await self._watch()
            except _Relist as why:
                self.relists["gone"] += 1
                log.info("%s: list again: %s", self.path, why)
                if self.backoff.attempts:  # the last relist also ended so: do not spin
                    await asyncio.sleep(self.backoff.next())
                else:
                    self.backoff.attempts = 1
            except (ApiUnavailable, ApiError, msgspec.DecodeError) as e:
                self.relists["unavailable" if isinstance(e, ApiUnavailable) else "error"] += 1
                delay = self.backoff.next()
                log.warning("%s: %s; list again in %.1f s", self.path, e, delay)
                await asyncio.sleep(delay)

    # ------------------------------------------------------------------ list

    async def _list(self) -> None:
        query = dict(self.params)
        query["limit"] = str(self.page_size)
        fresh: dict[str, T] = {}
        while True:
            try:
                page = await self.client.list_page(self.path, self.type, query, self._page)
            except ApiError as e:
                if e.gone and "continue" in query:  # the continue token expired: start over
                    query.pop("continue")
                    fresh.clear()
                    continue
                raise
            for item in page.items:
                fresh[key_of(item.metadata)] = item
            if not page.metadata.continue_:
                break
            query["continue"] = page.metadata.continue_
        self.lists += 1
        self._replace(fresh)
        self.resource_version = page.metadata.resource_version
        self.synced.set()

    def _replace(self, fresh: dict[str, T]) -> None:
        """Apply a list as the changes it makes to the store."""
        old = self.store
        self.store = {}
        for key, obj in fresh.items():
            before = old.pop(key, None)
            self.store[key] = obj
            if before is None:
                self._emit(Change("ADDED", key, obj))
            elif before.metadata.resource_version != obj.metadata.resource_version:
                self._emit(Change("MODIFIED", key, obj, before))
        for key, gone in old.items():
            self._emit(Change("DELETED", key, gone, gone))

    # ------------------------------------------------------------------ watch

    async def _watch(self) -> None:
        while True:
            try:
                return await self._watch_once()
            except ApiUnreachable as e:
                delay = self.backoff.next()
                log.warning("%s: %s; watch again in %.1f s", self.path, e, delay)
                await asyncio.sleep(delay)

    async def _watch_once(self) -> None:
        params = dict(self.params)
        params.update(resourceVersion=self.resource_version, allowWatchBookmarks="true",
                      timeoutSeconds=str(int(self.watch_timeout_s * (1 + self._rng.random()))))
        try:
            async for line in self.client.watch_lines(
                    self.path, params, read_timeout_s=self.read_timeout_s,
                    max_line_bytes=self.max_line_bytes):
                self._apply(self._events.decode(line))
                self.backoff.reset()
        except ApiError as e:
            if e.gone:
                raise _Relist(str(e)) from None
            raise

    def _apply(self, event: WatchEvent) -> None:
        kind = event.type
        if kind == "BOOKMARK":
            self.resource_version = self._meta.decode(event.object).metadata.resource_version
            return
        if kind == "ERROR":
            status = self._status.decode(event.object)
            if status.code == 410:
                raise _Relist(f"410 {status.reason}: {status.message}")
            raise ApiError(status.code, status.reason, status.message, f"WATCH {self.path}")
        obj = self._object.decode(event.object)
        key = key_of(obj.metadata)
        self.resource_version = obj.metadata.resource_version
        before = self.store.get(key)
        if kind == "DELETED":
            if before is not None:
                del self.store[key]
            self._emit(Change("DELETED", key, obj, before))
        elif kind in ("ADDED", "MODIFIED"):
            self.store[key] = obj
            self._emit(Change("ADDED" if before is None else "MODIFIED", key, obj, before))

    def _emit(self, change: Change[T]) -> None:
        """Hand one change to `on_change`. A handler that raises is a bug in it (or a record
        it did not expect), not a reason to stop watching: it is logged with the change's
        key and counted in `handler_errors`, and the next changes still come."""
        if self.on_change is None:
            return
        try:
            self.on_change(change)
        except Exception:
            self.handler_errors += 1
            log.exception("%s: handling %s %s failed; watching on", self.path, change.type,
                          change.key)
