"""What the CNI service keeps on disk, under `<state_dir>/cni/`, so DEL works after any crash.

Node state beside the pod records (`railyard.node.state`), in the same folder and with the same
discipline: writes through `railyard.node.files`, locks through `railyard.node.locks`, failures
as `StateError(path, reason)` (the CNI turns them into its error codes).

- `attachments/<network>/<container id>:<ifname>.json`: one record per attachment, written
  before the first device moves and updated after each step, so a DEL (or the rollback of a
  failed ADD) knows every device's original name, MAC and MTU and which IPAM calls to undo.
- `in-use/<pci>.json`: which attachment (and network namespace) holds a device now; a device
  recorded in use by a namespace that still exists is never handed to another attachment.
- `locks/<pci>.lock`: flock per device, as sriov-cni does, taken in address order.
- `locks/attachments/<network>/<container id>:<ifname>.lock`: flock per attachment, held by
  ADD from before its grant lookup to its answer and by DEL and GC from before they read the
  record, so a DEL never overtakes the ADD of its attachment. Always taken before any device
  lock (never the other way round: no deadlock); removed with the attachment.

Every write is temp + rename, without fsync (decision 0042); records are msgspec structs,
decoded with validation.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import msgspec

from railyard.node.errors import LockBusy, StateError
from railyard.node.files import write_atomic
from railyard.node.locks import FileLocks, lock_removable

RECORD_VERSION = 1
FOLDER, ATTACHMENTS = "cni", "attachments"  # <state_dir>/cni/attachments/


class MovedDevice(msgspec.Struct, kw_only=True):
    """One device of an attachment: where it came from and what was done to it."""

    pci: str
    kind: str  # "vf" | "pf"
    ifname: str  # its name inside the pod
    original_name: str
    original_mac: str | None
    original_mtu: int
    original_up: bool
    mac_set: str | None = None  # the MAC ADD gave it, if the config asked for one
    original_parent: str | None = None  # the netdev's parent device (its PCI address) at ADD
    # Identities a pod cannot give a link of its own, for devices the kernel names no parent
    # for (decision 0082); None in older records, which fall back to ifindex and MAC.
    bus_info: str | None = None  # the PCI address its driver reported at ADD (ethtool -i)
    peer_index: int | None = None  # its veth peer's (lower device's) ifindex in the host
    # None in records older than these fields: DEL then leaves those settings as it finds them.
    original_altnames: list[str] | None = None
    original_flags: int | None = None  # the RESTORED_FLAGS bits (NOARP, PROMISC, …)
    original_txqlen: int | None = None
    original_group: int | None = None
    original_alias: str | None = None
    # Names it crosses between namespaces under, each chosen at random and recorded before
    # use: ADD's first, then a fresh one per DEL attempt (the last few), newest last.
    transit_names: list[str] = msgspec.field(default_factory=list)
    pod_index: int | None = None  # its ifindex in the pod once ADD named it there
    rdma_device: str | None = None
    rdma_moved: bool = False
    ipam_type: str | None = None
    ipam_version: str | None = None
    ipam_started: bool = False  # IPAM ADD was called: DEL must be forwarded
    ipam_result: dict | None = None
    device_info_path: str | None = None


class AttachmentRecord(msgspec.Struct, kw_only=True):
    version: int = RECORD_VERSION
    network: str
    container_id: str
    ifname: str
    netns: str
    netns_id: tuple[int, int] | None  # (st_dev, st_ino): the namespace, not just its path
    pod_uid: str | None
    pod_namespace: str | None
    pod_name: str | None
    cni_args: str = ""
    cni_path: list[str] = msgspec.field(default_factory=list)  # where IPAM was found, for DEL
    state: str = "adding"  # "adding" until ADD returns; "added" after
    devices: list[MovedDevice] = msgspec.field(default_factory=list)
    ipam_conf: dict | None = None  # the config IPAM saw (minus per-interface ipam), for DEL


class InUse(msgspec.Struct, kw_only=True):
    network: str
    container_id: str
    ifname: str
    netns: str
    netns_id: tuple[int, int] | None


_encoder = msgspec.json.Encoder()


def _write_atomic(path: Path, body: bytes) -> None:
    """Temp + rename, without fsync: these records must survive a crashed process, which
    rename alone guarantees; after a power loss no pod netns survives either, so a lost
    record has nothing left to restore (docs/decisions/0042)."""
    write_atomic(path, body)


def attached_pods(state_dir: str | os.PathLike[str]) -> set[str]:
    """The pods that any readable attachment record in `state_dir` names: the CNI may still
    have to DEL them, so the agent keeps their pod records (docs/agent.md). Creates nothing."""
    uids = set()
    for path in sorted((Path(state_dir) / FOLDER / ATTACHMENTS).glob("*/*.json")):
        try:
            rec = msgspec.json.decode(path.read_bytes(), type=AttachmentRecord)
        except (OSError, msgspec.DecodeError):
            continue
        if rec.pod_uid:
            uids.add(rec.pod_uid)
    return uids


class DeviceBusy(LockBusy):
    """Another call holds a device's lock for longer than this one would wait."""

    def __init__(self, path: str | os.PathLike[str], pci: str, timeout_s: float) -> None:
        super().__init__(path, f"device {pci} is busy (another CNI call holds its lock for "
                               f"more than {timeout_s:g} s)")
        self.pci = pci


class AttachmentBusy(LockBusy):
    """Another call holds an attachment's lock for longer than this one would wait."""

    def __init__(self, path: str | os.PathLike[str], network: str, container_id: str,
                 ifname: str, timeout_s: float) -> None:
        super().__init__(path, f"attachment ({container_id}, {ifname}) of network {network} "
                               f"is busy (another CNI call, an ADD or DEL still running, holds "
                               f"it for more than {timeout_s:g} s)")


class AttachmentStore:
    """The attachment records, in-use notes and device locks below one state folder."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.root = Path(state_dir) / FOLDER
        self.attachments = self.root / ATTACHMENTS
        self.in_use_dir = self.root / "in-use"
        self.locks_dir = self.root / "locks"
        for d in (self.attachments, self.in_use_dir, self.locks_dir):
            try:
                d.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as e:
                raise StateError(d, f"state folder: {e.strerror}") from None

    # ------------------------------------------------------------------ attachments

    def _path(self, network: str, container_id: str, ifname: str) -> Path:
        # Names were validated at the boundary: none holds '/' or ':'.
        return self.attachments / network / f"{container_id}:{ifname}.json"

    def load(self, network: str, container_id: str, ifname: str) -> AttachmentRecord | None:
        return self._read(self._path(network, container_id, ifname))

    def _read(self, path: Path) -> AttachmentRecord | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateError(path, str(e.strerror)) from None
        try:
            return msgspec.json.decode(data, type=AttachmentRecord)
        except msgspec.DecodeError as e:
            raise StateError(path, f"unreadable attachment record: {e}") from None

    def save(self, rec: AttachmentRecord) -> None:
        path = self._path(rec.network, rec.container_id, rec.ifname)
        try:
            path.parent.mkdir(exist_ok=True, mode=0o700)
            _write_atomic(path, _encoder.encode(rec))
        except OSError as e:
            raise StateError(path, str(e.strerror)) from None

    def remove(self, rec: AttachmentRecord) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(rec.network, rec.container_id, rec.ifname).unlink()

    def records(self, network: str) -> list[AttachmentRecord]:
        """Every readable record of one network (GC); unreadable files are skipped."""
        out = []
        folder = self.attachments / network
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            try:
                rec = self._read(path)
            except StateError:
                continue
            if rec is not None:
                out.append(rec)
        return out

    # ------------------------------------------------------------------ in use

    def in_use(self, pci: str) -> InUse | None:
        path = self.in_use_dir / f"{pci}.json"
        try:
            return msgspec.json.decode(path.read_bytes(), type=InUse)
        except FileNotFoundError:
            return None
        except (OSError, msgspec.DecodeError):
            return None  # an unreadable note protects nothing; the netns check still does

    def mark_in_use(self, pci: str, note: InUse) -> None:
        try:
            _write_atomic(self.in_use_dir / f"{pci}.json", _encoder.encode(note))
        except OSError as e:
            raise StateError(self.in_use_dir / f"{pci}.json",
                             f"in-use note for {pci}: {e.strerror}") from None

    def in_use_notes(self) -> list[tuple[str, InUse]]:
        out = []
        for path in sorted(self.in_use_dir.glob("*.json")):
            note = self.in_use(path.stem)
            if note is not None:
                out.append((path.stem, note))
        return out

    def drop_in_use(self, pci: str, note: InUse) -> bool:
        """Drop the device's note only while it is still `note` (compare-and-delete; call it
        under the device's lock, which every writer of notes holds). True when dropped."""
        if self.in_use(pci) != note:
            return False
        try:
            (self.in_use_dir / f"{pci}.json").unlink()
        except FileNotFoundError:
            return False
        return True

    def clear_in_use(self, pci: str, rec: AttachmentRecord) -> None:
        """Drop the note only if this attachment wrote it."""
        note = self.in_use(pci)
        if note is not None and (note.network, note.container_id, note.ifname) != (
                rec.network, rec.container_id, rec.ifname):
            return
        with contextlib.suppress(FileNotFoundError):
            (self.in_use_dir / f"{pci}.json").unlink()

    # ------------------------------------------------------------------ locks

    @contextlib.contextmanager
    def lock_attachment(self, network: str, container_id: str, ifname: str,
                        timeout_s: float) -> Iterator[None]:
        """Hold the attachment's lock for the `with` block; take it before any device lock.

        AttachmentBusy when another call holds it for `timeout_s`. The lock file is removed on
        the way out when the attachment has no record (never added, or deleted)."""
        folder = self.locks_dir / ATTACHMENTS / network
        path = folder / f"{container_id}:{ifname}.lock"
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise StateError(folder, f"state folder: {e.strerror}") from None
        try:
            held = lock_removable(path, timeout_s)
        except LockBusy:
            raise AttachmentBusy(path, network, container_id, ifname, timeout_s) from None
        try:
            yield
        finally:
            try:
                if not self._path(network, container_id, ifname).exists():
                    with contextlib.suppress(OSError):
                        path.unlink()  # under the lock: a waiter on it locks the path again
            finally:
                held.release()

    def lock_devices(self, pcis: list[str] | tuple[str, ...], timeout_s: float) -> FileLocks:
        """flock every device's lock file, in address order (no deadlock between two ADDs);
        held until the returned locks are released (or their `with` block ends).

        DeviceBusy when one stays held by another call for `timeout_s`; nothing stays held.
        """
        order = sorted(set(pcis))
        try:
            return FileLocks((self.locks_dir / f"{pci}.lock" for pci in order), timeout_s)
        except LockBusy as e:
            raise DeviceBusy(e.path, Path(e.path).stem, timeout_s) from None
