"""The extender's state file: what it bound, so a restart rebuilds exactly the same ledger.

A journal of JSON lines (a header, then `{"bind": pod}` and `{"release": uid}`), appended and
fsynced before a bind is acknowledged; concurrent binds share one fsync (group commit). At
start, and whenever the journal grows to several times the live pods, it is rewritten as a
snapshot through temp file + fsync + rename, so the file on disk is always either the old
complete version or the new one (docs/decisions/0021).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
from collections.abc import Iterable
from pathlib import Path

from railyard.scheduler.cluster_file import BoundPod, ClusterFileError, pod_from_json, pod_to_json

HEADER = {"railyardSchedulerState": 1}
# Compact once the journal holds this many more lines than there are live pods (and 4x them).
_SLACK_LINES = 1000


class StateFileError(Exception):
    """The state file cannot be read or written; the message says which and why."""


def _line(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` or raise OSError.

    write(2) on a regular file may take fewer bytes than asked without failing (the disk
    fills or the file-size limit is reached part-way); the rest is retried, which then fails
    with the reason. A write that takes nothing is a failure, never a loop.
    """
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, f"write took no bytes with {len(view)} left")
        view = view[n:]


def read_state(path: Path) -> list[BoundPod]:
    """Replay a state file into the pods it holds, in bind order.

    A final line without its newline is a write cut short by a crash: it was never
    acknowledged, so it is dropped. Anything else malformed is an error naming the line.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise StateFileError(f"{path}: cannot read: {e}") from None
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    if not lines:
        if torn:
            raise StateFileError(f"{path}:1: header cut short; not a Railyard state file")
        return []
    live: dict[str, BoundPod] = {}
    for i, raw in enumerate(lines, start=1):
        where = f"{path}:{i}"
        try:
            obj = json.loads(raw)
        except ValueError as e:  # also bad UTF-8 and integers past the 4,300-digit limit
            raise StateFileError(f"{where}: not valid JSON: {e}") from None
        except RecursionError:
            raise StateFileError(f"{where}: not valid JSON: nested too deeply") from None
        if i == 1:
            if obj != HEADER:
                raise StateFileError(f"{where}: expected the header {json.dumps(HEADER)}")
            continue
        if not isinstance(obj, dict) or len(obj) != 1:
            raise StateFileError(f"{where}: expected {{\"bind\": pod}} or {{\"release\": uid}}")
        if "bind" in obj:
            try:
                pod = pod_from_json(obj["bind"], "bind")
            except ClusterFileError as e:
                raise StateFileError(f"{where}: {e}") from None
            live.pop(pod.uid, None)
            live[pod.uid] = pod
        elif "release" in obj and isinstance(obj["release"], str):
            live.pop(obj["release"], None)
        else:
            raise StateFileError(f"{where}: expected {{\"bind\": pod}} or {{\"release\": uid}}")
    return list(live.values())


def _apply(live: dict[str, bytes], ops: list[tuple[str, str, bytes]]) -> None:
    for op, uid, line in ops:
        if op == "bind":
            live[uid] = line
        else:
            live.pop(uid, None)


class StateFile:
    """The journal, open for appending. Implements `ClusterWriter.bind` for the service."""

    def __init__(self, path: Path, pods: Iterable[BoundPod]) -> None:
        self.path = path
        self._live: dict[str, bytes] = {p.uid: _line({"bind": pod_to_json(p)}) for p in pods}
        self._fd: int | None = None
        self._lines = 0
        self._broken = False  # a failed write may have left a partial line: rewrite first
        self._pending: list[tuple[str, str, bytes, asyncio.Future[None]]] = []
        self._writing: set[str] = set()  # UIDs of the batch being written, not yet in _live
        self._flusher: asyncio.Task[None] | None = None
        self.compactions = 0

    @classmethod
    def open(cls, path: str | Path,
             seed: Iterable[BoundPod] = ()) -> tuple[StateFile, list[BoundPod]]:
        """Load `path`, or start from `seed` (a cluster file's pods) when it does not exist
        yet. Nothing is written until `compact()` or the first record, so the caller can
        validate the pods first."""
        p = Path(path)
        pods = read_state(p) if p.exists() else list(seed)
        return cls(p, pods), pods

    def compact(self) -> None:
        """Rewrite the file as a snapshot of the live pods and open it for appending."""
        self._compact()

    # ------------------------------------------------------------------ writing (sync)

    def _compact(self) -> None:
        """Write the live pods to a temp file, fsync, rename over the journal, fsync the dir."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        data = _line(HEADER) + b"".join(self._live.values())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, data)
                os.fsync(fd)
                # The rename destroys the journal: only a snapshot known whole may replace it.
                size = os.fstat(fd).st_size
                if size != len(data):
                    raise OSError(errno.EIO, f"snapshot holds {size} of {len(data)} bytes")
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # a partial snapshot only takes space (the disk may be full)
            raise StateFileError(f"{self.path}: cannot write a snapshot: {e}") from None
        # From here the file on disk is the snapshot; the old descriptor names a dead inode
        # (an error closing it changes nothing on disk, so it must not fail the batch).
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            self._broken = True
            raise StateFileError(f"{self.path}: cannot reopen after a snapshot: {e}") from None
        self._lines = len(self._live) + 1
        self._broken = False
        self.compactions += 1

    def _append(self, ops: list[tuple[str, str, bytes]]) -> None:
        """Apply a batch of (op, uid, line) durably, then to the in-memory mirror."""
        if self._broken or self._fd is None:
            live = dict(self._live)
            _apply(live, ops)
            old, self._live = self._live, live
            try:
                self._compact()
            except StateFileError:
                self._live = old
                raise
            return
        try:
            _write_all(self._fd, b"".join(line for _, _, line in ops))
            os.fsync(self._fd)
        except OSError as e:
            self._broken = True
            raise StateFileError(f"{self.path}: cannot append: {e}") from None
        _apply(self._live, ops)  # in place once durable: no copy of ~10,000 lines per bind
        self._lines += len(ops)
        if self._lines > max(_SLACK_LINES, 4 * len(self._live)):
            # The batch is durable already; a failed snapshot only means a longer journal
            # (or, past the rename, a rewrite on the next batch: `_broken`).
            with contextlib.suppress(StateFileError):
                self._compact()

    def bind_sync(self, pod: BoundPod) -> None:
        self._append([("bind", pod.uid, _line({"bind": pod_to_json(pod)}))])

    def release_sync(self, uid: str) -> None:
        if uid in self._live:
            self._append([("release", uid, _line({"release": uid}))])

    # ------------------------------------------------------------------ writing (async)

    async def bind(self, pod: BoundPod) -> None:
        """Record the bound pod durably (returns after fsync); StateFileError on failure.
        A pod without devices is recorded too: it is bound to its node all the same."""
        await self._submit("bind", pod.uid, _line({"bind": pod_to_json(pod)}))

    async def release(self, uid: str) -> None:
        """Record that `uid` holds nothing now, after any bind of it already submitted
        (waiting, or in the batch being written: the release then goes in the next one)."""
        if (uid in self._live or uid in self._writing
                or any(u == uid for _, u, _, _ in self._pending)):
            await self._submit("release", uid, _line({"release": uid}))

    async def _submit(self, op: str, uid: str, line: bytes) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((op, uid, line, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await fut

    async def _flush(self) -> None:
        # Everything submitted while one batch is being written goes into the next batch:
        # one fsync acknowledges all of it.
        while self._pending:
            batch, self._pending = self._pending, []
            self._writing = {u for _, u, _, _ in batch}
            try:
                await asyncio.to_thread(self._append, [(o, u, ln) for o, u, ln, _ in batch])
            except Exception as e:  # any error: the waiting binds must hear of it, not hang
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
            else:
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_result(None)
            finally:
                self._writing = set()  # written (now in _live) or failed (never held)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
