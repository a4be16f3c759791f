"""The node state's one error shape: the file (or argument) it concerns, and why."""

from __future__ import annotations

import os


class StateError(Exception):
    """A state file or argument that cannot be used; names the file (or argument) and why."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


class LockBusy(StateError):
    """A lock another holder kept for longer than the caller would wait."""
