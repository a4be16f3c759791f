"""Pair files on the node: each container's JSON pair map, mounted read-only into it.

Layout: `<state_dir>/pairs/<pod uid>/<container>.json`, written (temp + rename) by the agent
when kubelet is done allocating the container, before `Allocate` answers (the answer names it
as a mount at `/run/railyard/pairs.json`), and removed with the pod's record. The content is
`railyard.kubelet.pairmap.pair_file_json`; this module only keeps the files.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from railyard.node.errors import StateError
from railyard.node.files import write_atomic
from railyard.node.state import is_pod_uid
from railyard.records.fields import is_dns_label

FOLDER = "pairs"  # <state_dir>/pairs/


class PairFiles:
    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.root = Path(state_dir) / FOLDER

    def path(self, uid: str, container: str) -> Path:
        if not is_pod_uid(uid):
            raise StateError(str(self.root), f"{uid!r} is not a pod UID")
        # Container names are DNS labels (the API server checks); anything else is not a
        # file name we make, whatever a pods file says.
        if not is_dns_label(container):
            raise StateError(str(self.root), f"{container!r} is not a container name")
        return self.root / uid / f"{container}.json"

    def write(self, uid: str, container: str, body: str) -> Path:
        """Write the container's pair file (readable by any user in the container); its
        path on the node. OSError or StateError when it cannot be written."""
        path = self.path(uid, container)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, body.encode(), mode=0o644)
        return path

    def remove(self, uid: str) -> None:
        """Forget every pair file of the pod (none: nothing to do)."""
        if is_pod_uid(uid):
            shutil.rmtree(self.root / uid, ignore_errors=True)

    def pods(self) -> list[str]:
        """The UIDs that have pair files."""
        try:
            return sorted(p.name for p in self.root.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []
