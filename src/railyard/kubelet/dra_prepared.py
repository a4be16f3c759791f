"""Prepared claims on the node: claim UID → the pod it was prepared for and what prepare made.

Kubelet's unprepare names the claim only, and may come after the agent restarted or lost its
memory, so what prepare made is written down first, in the node's state folder
(`<state_dir>/dra/claims/<claim uid>.json`, temp + fsync + rename), and removed last, after
everything it names is gone (decision 0109). One document per claim, one codec, here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from railyard.kubelet.dra_claim import ClaimRef
from railyard.node.errors import StateError
from railyard.node.files import fsync_dir, write_atomic
from railyard.node.state import PodKey, is_pod_uid
from railyard.records.fields import FieldError, Fields

log = logging.getLogger(__name__)

FOLDER = "dra/claims"  # under the state folder
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """A device of the claim and the CDI IDs prepare answered for it."""

    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    claim: ClaimRef
    pod: PodKey
    devices: tuple[PreparedDevice, ...]


def prepared_to_json(p: PreparedClaim) -> dict[str, Any]:
    return {
        "version": FORMAT_VERSION,
        "claim": {"namespace": p.claim.namespace, "name": p.claim.name, "uid": p.claim.uid},
        "pod": {"uid": p.pod.uid, "namespace": p.pod.namespace, "name": p.pod.name},
        "devices": [{"request": d.request, "pool": d.pool, "device": d.device,
                     "cdiDeviceIds": list(d.cdi_ids)} for d in p.devices],
    }


def prepared_from_json(v: Any, where: str) -> PreparedClaim:
    f = Fields(v, where, FieldError)
    if f.get("version") != FORMAT_VERSION:
        f.fail("version", f"unsupported {f.get('version')!r} (this reads {FORMAT_VERSION})")
    c, p = f.object("claim"), f.object("pod")
    devices = tuple(PreparedDevice(d.string("request"), d.string("pool"), d.string("device"),
                                   tuple(d.strings("cdiDeviceIds")))
                    for d in f.objects("devices"))
    return PreparedClaim(ClaimRef(c.string("namespace"), c.string("uid"), c.string("name")),
                         PodKey(p.string("uid"), p.string("namespace"), p.string("name")),
                         devices)


class PreparedClaims:
    """The prepared-claim documents of one node; every write is durable before it returns."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.folder = Path(state_dir) / FOLDER

    def path(self, claim_uid: str) -> Path:
        if not is_pod_uid(claim_uid):  # Kubernetes UIDs of any object: the same rule
            raise StateError(str(self.folder), f"{claim_uid!r} is not a claim UID")
        return self.folder / f"{claim_uid}.json"

    def get(self, claim_uid: str) -> PreparedClaim | None:
        path = self.path(claim_uid)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateError(path, e.strerror or str(e)) from None
        try:
            return prepared_from_json(json.loads(data), "prepared claim")
        except (ValueError, FieldError) as e:
            raise StateError(path, str(e)) from None

    def put(self, p: PreparedClaim) -> None:
        path = self.path(p.claim.uid)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(prepared_to_json(p), indent=1).encode(), fsync=True)
            fsync_dir(self.folder)
        except OSError as e:
            raise StateError(path, e.strerror or str(e)) from None

    def remove(self, claim_uid: str) -> None:
        path = self.path(claim_uid)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            fsync_dir(self.folder)

    def all(self) -> list[PreparedClaim]:
        """Every readable document (an unreadable one is logged and skipped)."""
        out = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                p = self.get(path.stem)
            except StateError as e:
                log.warning("prepared claims: skipping %s", e)
                continue
            if p is not None:
                out.append(p)
        return out
