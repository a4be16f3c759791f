"""Folder events on the event loop: inotify, so a deleted plugin socket is seen in milliseconds.

Kubelet deletes every socket in `device-plugins/` when it starts (the reference's "a plugin
must notice"); polling every few seconds would leave kubelet without our devices for that
long. The watcher re-arms itself when the folder is deleted and made again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from inotify_simple import INotify
from inotify_simple import flags as F

log = logging.getLogger(__name__)

MASK = (F.CREATE | F.DELETE | F.MOVED_FROM | F.MOVED_TO | F.CLOSE_WRITE | F.DELETE_SELF
        | F.MOVE_SELF)
REARM_INTERVAL_S = 0.5


class FolderWatch:
    """Calls `on_change(names)` with the entry names that changed in one folder."""

    def __init__(self, folder: str, on_change: Callable[[set[str]], None]) -> None:
        self.folder = folder
        self.on_change = on_change
        self._inotify: INotify | None = None
        self._wd: int | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._inotify = INotify()
        self._loop.add_reader(self._inotify.fileno(), self._readable)
        self._arm()
        self._task = asyncio.create_task(self._rearm_loop())

    def _arm(self) -> bool:
        assert self._inotify is not None
        try:
            self._wd = self._inotify.add_watch(self.folder, MASK)
            return True
        except OSError:
            self._wd = None
            return False

    async def _rearm_loop(self) -> None:
        """While the folder does not exist, look for it twice a second."""
        while True:
            await asyncio.sleep(REARM_INTERVAL_S)
            if self._wd is None and self._arm():
                log.info("watching %s again", self.folder)
                self.on_change({""})  # the folder came (back): everything may have changed

    def _readable(self) -> None:
        assert self._inotify is not None
        names: set[str] = set()
        for ev in self._inotify.read(timeout=0):
            if ev.mask & (F.DELETE_SELF | F.MOVE_SELF | F.IGNORED):
                self._wd = None
                names.add("")
            elif ev.name:
                names.add(ev.name)
        if names:
            self.on_change(names)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._inotify is not None and self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None
