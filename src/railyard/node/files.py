"""Writes that a crash cannot tear: write a temp file beside the target, then rename it over.

One home for the node side's write-temp-then-rename (pod records, CNI attachment records, Multus
device-info files, the CNI shim install). A rename within one folder is atomic, so a reader
sees the old file or the new one, never half of either; `fsync=True` also makes the new
contents survive a power loss before the rename is done (the folder still needs `fsync_dir`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

_seq = 0
_seq_lock = threading.Lock()


def _temp_name(path: Path) -> Path:
    """A temp name unique to this process and call, hidden, in the target's own folder."""
    global _seq
    with _seq_lock:
        _seq += 1
        n = _seq
    return path.with_name(f".{path.name}.{os.getpid()}.{n}.tmp")


def write_atomic(path: str | os.PathLike[str], body: bytes, *, mode: int = 0o600,
                 fsync: bool = False) -> None:
    """Replace `path` with `body` in one rename; OSError on failure, leaving no temp file.

    `mode` is exact (not filtered by the umask) so a file's readers do not depend on the
    process that happened to write it.
    """
    path = Path(path)
    tmp = _temp_name(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a crashed process that had our pid
    try:
        # O_EXCL: never write through something planted under the temp name.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make the folder's entries (renames, unlinks) durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
