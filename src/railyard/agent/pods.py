"""Where the agent learns about pods: the `PodSource` seam and its pods-file implementation.

The pods file is a JSON list of v1 Pods, or a PodList, written by someone else (a test, a
sidecar that mirrors the API server); it is input only. It is re-read whenever it changed
(an mtime/size check on every lookup, so a pod written just before kubelet asks is seen),
and a file that does not parse keeps the last good list and logs why. The Kubernetes API
source comes later behind the same Protocol.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Protocol

from railyard.allocation.names import DEFAULT_RESOURCES, ResourceNames
from railyard.kubelet.pods import PodError, PodView, pod_view

log = logging.getLogger(__name__)


class PodSource(Protocol):
    def pods(self) -> Sequence[PodView]:
        """The pods known now (cheap to call on every kubelet request)."""
        ...

    @property
    def loaded(self) -> bool:
        """True once a list was read; until then absence of a pod means nothing."""
        ...


class PodsFileError(ValueError):
    """The pods file cannot be used; names the file and the field."""


def parse_pods(data: object, names: ResourceNames = DEFAULT_RESOURCES,
               where: str = "pods") -> tuple[list[PodView], list[str]]:
    """Pods from a JSON list or a PodList; unusable items become warnings, not failures."""
    if isinstance(data, dict):
        if data.get("kind") not in (None, "PodList", "List") or "items" not in data:
            raise PodsFileError(f"{where}: expected a list of Pods or a PodList")
        items = data["items"]
    else:
        items = data
    if not isinstance(items, list):
        raise PodsFileError(f"{where}: expected a list of Pods or a PodList")
    pods, warnings = [], []
    for i, item in enumerate(items):
        try:
            view = pod_view(item, names)
        except PodError as e:
            warnings.append(f"{where}[{i}]: {e}; pod ignored")
            continue
        pods.append(view)
        warnings += [f"{where}[{i}] ({view}): {p}" for p in view.problems]
    return pods, warnings


class PodsFile:
    """A `PodSource` over one JSON file."""

    def __init__(self, path: str | os.PathLike[str],
                 names: ResourceNames = DEFAULT_RESOURCES) -> None:
        self.path = os.fspath(path)
        self.names = names
        self._stamp: tuple[int, int, int] | None = None
        self._pods: list[PodView] = []
        self._loaded = False
        self.generation = 0  # bumps on every successful re-read

    @property
    def loaded(self) -> bool:
        self.pods()
        return self._loaded

    def pods(self) -> Sequence[PodView]:
        try:
            st = os.stat(self.path)
        except OSError as e:
            if self._stamp is not None:
                log.warning("pods file %s: %s; keeping the last list", self.path,
                            e.strerror or e)
                self._stamp = None
            return self._pods
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            self._stamp = stamp
            self._reload()
        return self._pods

    def _reload(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            pods, warnings = parse_pods(data, self.names, self.path)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, PodsFileError) as e:
            log.warning("pods file %s unusable (%s); keeping the last list", self.path, e)
            return
        for w in warnings:
            log.warning("%s", w)
        self._pods = pods
        self._loaded = True
        self.generation += 1
