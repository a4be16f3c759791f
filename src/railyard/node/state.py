"""The node-local state store: pod → Allocation as kubelet really gave it, kept in `--state-dir`.

The agent writes it when kubelet admits a pod; the CNI service reads it to learn which NICs a
pod may receive. It survives agent restarts and is safe for two processes (the agent and a
CNI service, or two agents during an upgrade) through one lock file.

Layout: `<state_dir>/pods/<uid>.json`, one JSON document per pod, written temp + fsync +
rename (+ fsync of the folder; `railyard.node.files`), so a crash leaves either the old or the
new file, never half of one. `<state_dir>/.lock` is taken with `flock` around every
read-modify-write (`railyard.node.locks`).

API (all methods are synchronous and fast; call them from asyncio code directly):

- `StateStore(state_dir, node=None, durability="fsync")` — creates the folders; with `node`,
  `put` refuses an Allocation for another node. `durability="deferred"` (the agent's choice
  on kubelet's admission path) renames synchronously and fsyncs from a background thread
  within ~20 ms; `.flush()` forces it, `.close()` stops the thread.
- `.put(pod: PodKey, allocation, consumed=None)` — record (or replace) the pod's Allocation;
  what was already consumed is kept when the UID is the same;
  `consumed=Consumed(container, resource, ids)` notes a consumption in the same write.
- `.get(uid) -> PodRecord | None`, `.find(namespace, name) -> PodRecord | None`, `.all()`.
- `.mark_consumed(uid, container, resource, device_ids)` — kubelet allocated these IDs of
  `resource` to `container`; `PodRecord.consumed_ids(resource)` answers what is consumed;
  `.clear_consumed(uid, container, resource)` forgets a note made for the wrong pod.
- `.remove(uid) -> bool`.
- `.granted_nics(uid) -> tuple[NicRef, ...]` — the pod's NICs in pair order (paired NICs
  first, then unpaired): exactly what the CNI may move into the pod; empty for an unknown pod.

What the CNI moved is not kept here but in its attachment records (`railyard.node.attachments`);
a `sections` object that older versions wrote into a record is read past and not written back
(docs/decisions/0061).

Errors: `StateError(path, reason)` for an unreadable or malformed record or a bad argument;
`get` raises it, `all` skips such files and logs a warning (one bad file hides no other pod).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from railyard.allocation.types import Allocation, NicRef
from railyard.node.errors import StateError
from railyard.node.files import fsync_dir, write_atomic
from railyard.node.locks import FileLocks
from railyard.records.allocation import RecordError, allocation_from_json, allocation_to_json
from railyard.records.fields import Fields

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# Kubernetes UIDs are UUIDs; allow any name that is a safe single path component.
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")  # fullmatch: `$` passes a final "\n"


def is_pod_uid(uid: object) -> bool:
    """A UID usable as a record's file name (Kubernetes UIDs are UUIDs; tests use others)."""
    return isinstance(uid, str) and _UID.fullmatch(uid) is not None


__all__ = ["Consumed", "PodKey", "PodRecord", "StateError", "StateStore", "is_pod_uid"]


@dataclass(frozen=True, slots=True)
class PodKey:
    uid: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True, slots=True)
class Consumed:
    """Device IDs kubelet allocated for one (container, resource) of the pod."""

    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PodRecord:
    pod: PodKey
    allocation: Allocation
    consumed: tuple[Consumed, ...] = ()

    @property
    def uid(self) -> str:
        return self.pod.uid

    def consumed_ids(self, resource: str) -> tuple[str, ...]:
        """Every ID of `resource` kubelet allocated to any container of the pod, in call order."""
        return tuple(i for c in self.consumed if c.resource == resource for i in c.device_ids)

    def is_consumed(self, container: str, resource: str) -> bool:
        return any(c.container == container and c.resource == resource for c in self.consumed)

    @property
    def granted_nics(self) -> tuple[NicRef, ...]:
        return self.allocation.all_nics


# ----------------------------------------------------------------------- codec


def record_to_json(r: PodRecord) -> dict[str, Any]:
    return {
        "version": FORMAT_VERSION,
        "pod": {"uid": r.pod.uid, "namespace": r.pod.namespace, "name": r.pod.name},
        "allocation": allocation_to_json(r.allocation),
        "consumed": [
            {"container": c.container, "resource": c.resource, "deviceIds": list(c.device_ids)}
            for c in r.consumed
        ],
    }


def record_from_json(v: Any) -> PodRecord:
    """Decode one state file's document; RecordError names the bad field."""
    f = Fields(v, "record", RecordError)
    if f.get("version") != FORMAT_VERSION:
        f.fail("version", f"unsupported {f.get('version')!r}")
    pod = f.object("pod")
    key = PodKey(pod.string("uid"), pod.string("namespace"), pod.string("name"))
    alloc = allocation_from_json(f.get("allocation"), "record.allocation")
    consumed = tuple(Consumed(c.string("container"), c.string("resource"),
                              tuple(c.strings("deviceIds")))
                     for c in f.objects("consumed", optional=True))
    # "sections" (written by older versions, never used) is read past: decision 0061.
    return PodRecord(key, alloc, consumed)


# ----------------------------------------------------------------------- the store

Durability = Literal["fsync", "deferred"]
FLUSH_DELAY_S = 0.02
RETRY_MIN_S = 0.1  # after a failed fsync, the first pause; doubled up to RETRY_MAX_S
RETRY_MAX_S = 5.0


class _Flusher:
    """Deferred durability: fsync renamed files and their folder from a background thread.

    A write is visible to every process as soon as it is renamed into place and survives a
    crash of the writer; only a power loss within ~FLUSH_DELAY_S can lose it, after which the
    agent rebuilds records from PodResources at start (docs/decisions/0032).

    An fsync that fails (EIO, ENOSPC on a thin pool, ...) is logged with its path and the
    paths stay pending: the thread lives on and tries again after a pause that doubles up to
    RETRY_MAX_S, so one transient error never leaves every later write unsynced.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._pending: set[Path] = set()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="railyard-state-flush",
                                        daemon=True)
        self._thread.start()

    def later(self, path: Path) -> None:
        with self._cond:
            self._pending.add(path)
            self._cond.notify()

    def _run(self) -> None:
        pause = 0.0  # after a failed pass: how long to wait before the next one
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if pause and not self._stopped:
                    self._cond.wait(pause)  # stop() wakes it
                if self._stopped:
                    return  # stop() makes the last pass itself
            time.sleep(FLUSH_DELAY_S)  # gather the writes of one admission into one pass
            try:
                ok = self.flush()
            except Exception:  # never let the thread die: the next pass tries again
                log.exception("state store: flushing %s", self.folder)
                ok = False
            pause = 0.0 if ok else min(max(pause * 2, RETRY_MIN_S), RETRY_MAX_S)

    def flush(self) -> bool:
        """fsync every pending file and the folder; False (paths kept pending) on an error."""
        with self._cond:
            paths, self._pending = self._pending, set()
        if not paths:
            return True
        failed: set[Path] = set()
        for p in paths:
            try:
                fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # replaced or removed since: its successor is pending or gone
            except OSError as e:
                log.warning("state store: open %s to fsync: %s", p, e.strerror or e)
                failed.add(p)
                continue
            try:
                os.fsync(fd)
            except OSError as e:
                log.warning("state store: fsync %s: %s (will retry)", p, e.strerror or e)
                failed.add(p)
            finally:
                os.close(fd)
        try:
            fsync_dir(self.folder)
        except OSError as e:
            # The renames of every file of this pass are not known durable: retry them all.
            log.warning("state store: fsync of folder %s: %s (will retry)", self.folder,
                        e.strerror or e)
            failed = paths
        if failed:
            with self._cond:
                self._pending |= failed
            return False
        return True

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()
        if not self.flush():
            with self._cond:
                left = len(self._pending)
            log.error("state store: %d record(s) in %s not known durable at stop", left,
                      self.folder)


class StateStore:
    """One folder of pod records; every change is atomic and serialised by a file lock."""

    def __init__(self, state_dir: str | os.PathLike[str], node: str | None = None, *,
                 durability: Durability = "fsync") -> None:
        self.root = Path(state_dir)
        self.node = node
        self.durability = durability
        self.pods_dir = self.root / "pods"
        try:
            self.pods_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StateError(self.pods_dir, e.strerror or str(e)) from None
        self._lock_path = self.root / ".lock"
        # flock is per open file description: two threads of this process would not exclude
        # each other through it alone, so a thread lock sits in front.
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._held: FileLocks | None = None
        # Decoded records by file, valid while the file's (mtime, size, inode) stays: every
        # write renames a new inode into place, so another process's write is always seen.
        self._cache: dict[str, tuple[tuple[int, int, int], PodRecord]] = {}
        self._flusher: _Flusher | None = _Flusher(self.pods_dir) \
            if durability == "deferred" else None

    # ------------------------------------------------------------------ locking

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's lock (re-entrant in this process) across several operations."""
        with self._thread_lock:
            if self._depth == 0:
                self._held = FileLocks((self._lock_path,))
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._held is not None:
                    self._held.release()
                    self._held = None

    # ------------------------------------------------------------------ files

    def _path(self, uid: str) -> Path:
        if not is_pod_uid(uid):
            raise StateError("uid", f"not a usable pod UID: {uid!r}")
        return self.pods_dir / f"{uid}.json"

    def _read(self, path: Path) -> PodRecord | None:
        key = str(path)
        try:
            st = os.stat(key)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            hit = self._cache.get(key)
            if hit is not None and hit[0] == stamp:
                return hit[1]
            data = path.read_bytes()
        except FileNotFoundError:
            self._cache.pop(key, None)
            return None
        except OSError as e:
            raise StateError(path, e.strerror or str(e)) from None
        try:
            rec = record_from_json(json.loads(data))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StateError(path, f"not valid JSON: {e}") from None
        except RecordError as e:
            raise StateError(path, str(e)) from None
        self._cache[key] = (stamp, rec)
        return rec

    def _write(self, r: PodRecord) -> None:
        path = self._path(r.uid)
        body = json.dumps(record_to_json(r), indent=1, sort_keys=True).encode()
        try:
            write_atomic(path, body, fsync=self._flusher is None)
            st = os.stat(path)
            self._cache[str(path)] = ((st.st_mtime_ns, st.st_size, st.st_ino), r)
            if self._flusher is None:
                fsync_dir(self.pods_dir)
            else:
                self._flusher.later(path)
        except OSError as e:
            raise StateError(path, e.strerror or str(e)) from None

    # ------------------------------------------------------------------ API

    def put(self, pod: PodKey, allocation: Allocation, *,
            consumed: Consumed | None = None) -> PodRecord:
        """Record the pod's Allocation, keeping what was consumed.

        `consumed` also notes one (container, resource) consumption in the same write, which
        is what `Allocate` needs: one fsync'd write on kubelet's admission path, not two.
        """
        if self.node is not None and allocation.node != self.node:
            raise StateError(self._path(pod.uid),
                             f"allocation is for node {allocation.node!r}, this is {self.node!r}")
        with self.locked():
            old = self._read_quiet(pod.uid)
            if old is not None:
                rec = replace(old, pod=pod, allocation=allocation)
            else:
                rec = PodRecord(pod, allocation)
            if consumed is not None:
                kept = tuple(c for c in rec.consumed if (c.container, c.resource)
                             != (consumed.container, consumed.resource))
                rec = replace(rec, consumed=(*kept, consumed))
            self._write(rec)
            return rec

    def get(self, uid: str) -> PodRecord | None:
        return self._read(self._path(uid))

    def find(self, namespace: str, name: str) -> PodRecord | None:
        """The record of the pod with this namespace and name (the newest, should two exist)."""
        found = [r for r in self.all() if r.pod.namespace == namespace and r.pod.name == name]
        if not found:
            return None
        return max(found, key=lambda r: r.allocation.decided_at or "")

    def all(self) -> list[PodRecord]:
        """Every readable record, by UID; malformed files are logged and skipped."""
        out = []
        for path in sorted(self.pods_dir.glob("*.json")):
            try:
                r = self._read(path)
            except StateError as e:
                log.warning("state store: skipping %s", e)
                continue
            if r is not None:
                out.append(r)
        return out

    def mark_consumed(self, uid: str, container: str, resource: str,
                      device_ids: tuple[str, ...] | list[str]) -> PodRecord:
        """Note that kubelet gave `container` these IDs of `resource` (replaces a prior note)."""
        with self.locked():
            r = self._read(self._path(uid))
            if r is None:
                raise StateError(self._path(uid), "no record for this pod")
            kept = tuple(c for c in r.consumed
                         if not (c.container == container and c.resource == resource))
            r = replace(r, consumed=(*kept, Consumed(container, resource, tuple(device_ids))))
            self._write(r)
            return r

    def clear_consumed(self, uid: str, container: str, resource: str) -> PodRecord | None:
        """Forget a consumption note (it was attributed to the wrong pod); None: no record."""
        with self.locked():
            r = self._read(self._path(uid))
            if r is None:
                return None
            kept = tuple(c for c in r.consumed
                         if not (c.container == container and c.resource == resource))
            if kept != r.consumed:
                r = replace(r, consumed=kept)
                self._write(r)
            return r

    def remove(self, uid: str) -> bool:
        with self.locked():
            path = self._path(uid)
            self._cache.pop(str(path), None)
            try:
                path.unlink()
            except FileNotFoundError:
                return False
            if self._flusher is None:
                fsync_dir(self.pods_dir)
            else:
                self._flusher.later(path)  # gone: only the folder is synced
            return True

    def flush(self) -> bool:
        """Make every write so far durable now (deferred mode; a no-op otherwise).

        False when an fsync failed (logged; the background thread retries those writes)."""
        return self._flusher.flush() if self._flusher is not None else True

    def close(self) -> None:
        if self._flusher is not None:
            self._flusher.stop()
            self._flusher = None

    def granted_nics(self, uid: str) -> tuple[NicRef, ...]:
        """The pod's NICs in pair order; () for a pod this node holds no record of."""
        r = self.get(uid)
        if r is None:
            return ()
        if self.node is not None and r.allocation.node != self.node:
            return ()
        return r.granted_nics

    def _read_quiet(self, uid: str) -> PodRecord | None:
        """Read for overwrite: a malformed old file is replaced, not fatal."""
        try:
            return self._read(self._path(uid))
        except StateError as e:
            log.warning("state store: replacing unreadable %s", e)
            return None
