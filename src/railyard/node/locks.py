"""The node state's one locking discipline: an exclusive `flock` on a lock file per thing
protected (the pod-record store as a whole, or one device), held through an open file
description of its own.

flock belongs to the open file description, so two threads that each open the file exclude
each other exactly as two processes do; closing the descriptor releases the lock, so a crashed
holder never leaves one behind. Several locks are taken in the order given: callers sort them
(device locks by PCI address) so that two holders never wait on each other.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterable
from types import TracebackType

from railyard.node.errors import LockBusy

POLL_S = 0.005  # between tries while waiting with a time limit


class FileLocks:
    """Exclusive flocks on `paths`, taken at construction and held until `release()` (or the
    end of a `with` block). `timeout_s=None` waits as long as it takes; otherwise LockBusy
    names the first lock file still held by another after that long, and nothing stays held."""

    __slots__ = ("_fds",)

    def __init__(self, paths: Iterable[str | os.PathLike[str]],
                 timeout_s: float | None = None) -> None:
        self._fds: list[int] = []
        deadline = 0.0 if timeout_s is None else time.monotonic() + timeout_s
        try:
            for path in paths:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                self._fds.append(fd)
                if timeout_s is None:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                else:
                    _flock_until(fd, path, deadline, timeout_s)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # closing releases the flock

    def __enter__(self) -> FileLocks:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def lock_removable(path: str | os.PathLike[str], timeout_s: float) -> FileLocks:
    """An exclusive flock on a lock file that its holder may remove (while holding it).

    A waiter may have opened the file before the holder removed it: once its flock is taken it
    checks that `path` still names the file it locked, and locks the path again otherwise, so
    two callers never both hold "the" lock on two files of one name. LockBusy after
    `timeout_s` in all.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        locks = FileLocks((path,), max(0.0, deadline - time.monotonic()))
        held = os.fstat(locks._fds[0])
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return locks
        locks.release()  # removed (and maybe made again) by the holder before us: again


def _flock_until(fd: int, path: str | os.PathLike[str], deadline: float,
                 timeout_s: float) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if time.monotonic() >= deadline:
            raise LockBusy(path, f"held by another for more than {timeout_s:g} s")
        time.sleep(POLL_S)
