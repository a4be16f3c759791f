"""Reading a sysfs root without tracebacks: every failure becomes a warning naming the path.

Discovery reads a few thousand small files; on a live machine any of them may vanish between
listing and reading (a VF moving into a pod, a driver unbinding). `Sysfs` turns each such
failure into a `SysfsWarning` and answers None, so one bad device never hides the others.
The small text formats of sysfs and procfs are parsed here too, as pure functions.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

from railyard.topology.model import PCI_ADDRESS_RE

# A PCI function folder name: domain (4+ hex digits; VMD domains use 5), bus, device.function.
BDF_RE = PCI_ADDRESS_RE
# A root complex folder under sys/devices: pci<domain>:<bus>.
ROOT_COMPLEX_RE = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}", re.ASCII)  # fullmatch


class SysfsError(Exception):
    """A failure that stops discovery as a whole (e.g. the root is not a sysfs tree)."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


def tree_root(path: str | os.PathLike[str]) -> str:
    """The folder holding `sys/` for a sysfs tree given either as that folder or as its `sys`.

    Every option that takes a sysfs tree (`--sysfs-root`, the box's `--node-sysfs`) goes
    through this one rule, so a user never has to guess which of the two is meant: `/` and
    `/sys`, or a fixture's root and its `sys/`, mean the same tree.
    """
    given = os.path.abspath(path)
    if not os.path.isdir(given):
        raise SysfsError(given, "no such folder")
    if os.path.isdir(os.path.join(given, "sys", "devices")):
        return given
    if os.path.basename(given) == "sys" and os.path.isdir(os.path.join(given, "devices")):
        return os.path.dirname(given)
    raise SysfsError(given, "not a sysfs tree: expected a folder holding sys/devices (such as "
                            "/ or a fixture's root) or the sys folder itself (holding devices/)")


@dataclass(frozen=True, slots=True)
class SysfsWarning:
    """Something discovery could not read; the rest of the node was still discovered."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def read_attribute(path: str) -> str:
    """A small attribute file, stripped. One read() is enough: sysfs attributes fit a page."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, 65536)
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").strip()


def describe_error(path: str, exc: OSError) -> str:
    """Why `path` could not be read, in words a user can act on."""
    if exc.errno == errno.ENOENT:
        try:
            return f"dangling symlink to {os.readlink(path)}"
        except OSError:  # not a link, or it vanished too
            return "missing (absent or vanished while reading)"
    if exc.errno == errno.ENODEV:
        return "device vanished while reading"
    return exc.strerror or type(exc).__name__


class Sysfs:
    """Reads files under one root; collects warnings instead of raising.

    Methods take absolute path strings (not `Path`s: discovery builds a few thousand paths
    and string joins are several times cheaper). `optional=True` marks files whose absence
    is normal (an unbound device has no `driver`), so only other errors are reported.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(root)
        self.warnings: list[SysfsWarning] = []

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def warn(self, path: str, reason: str) -> None:
        self.warnings.append(SysfsWarning(path, reason))

    def _fail(self, path: str, exc: OSError, optional: bool) -> None:
        if optional and exc.errno == errno.ENOENT and not os.path.islink(path):
            return
        # An attribute the driver does not implement (phys_port_name on IPoIB or mlx4
        # netdevs) exists but fails its read with EOPNOTSUPP: for an optional one, absent.
        if optional and exc.errno == errno.EOPNOTSUPP:
            return
        self.warn(path, describe_error(path, exc))

    def read(self, path: str, *, optional: bool = False) -> str | None:
        """A small attribute file, stripped; None (and a warning) when it cannot be read."""
        try:
            return read_attribute(path)
        except OSError as exc:
            self._fail(path, exc, optional)
            return None

    def read_bytes(self, path: str, *, optional: bool = False,
                   limit: int = 32768) -> bytes | None:
        """A binary attribute (a function's `vpd`), at most `limit` bytes (PCI VPD is ≤ 32 KiB)."""
        try:
            with open(path, "rb") as f:
                return f.read(limit)
        except OSError as exc:
            self._fail(path, exc, optional)
            return None

    def read_text(self, path: str, *, optional: bool = False) -> str | None:
        """A whole procfs file of any size."""
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError as exc:
            self._fail(path, exc, optional)
            return None

    def read_int(self, path: str, *, base: int = 10, optional: bool = False) -> int | None:
        text = self.read(path, optional=optional)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:
            self.warn(path, f"expected an integer, found {text[:40]!r}")
            return None

    def listdir(self, path: str, *, optional: bool = False) -> list[str]:
        try:
            return os.listdir(path)
        except OSError as exc:
            self._fail(path, exc, optional)
            return []

    def readlink(self, path: str, *, optional: bool = False) -> str | None:
        try:
            return os.readlink(path)
        except OSError as exc:
            self._fail(path, exc, optional)
            return None

    def resolve_link(self, path: str, *, optional: bool = False) -> str | None:
        """Where a symlink points, as a normalised absolute path (no existence check).

        sysfs links are relative and the folders they cross are real directories, so joining
        and normalising equals realpath() at a fraction of the syscalls.
        """
        target = self.readlink(path, optional=optional)
        if target is None:
            return None
        return os.path.normpath(os.path.join(os.path.dirname(path), target))


# --------------------------------------------------------------------- pure text parsers


def bdf_key(address: str) -> tuple[int, int, int, int]:
    """Numeric sort key of a PCI address (string order breaks on 5-digit VMD domains)."""
    domain, bus, devfn = address.split(":")
    dev, fn = devfn.split(".")
    return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)


def routing_id(address: str) -> int:
    _, bus, dev, fn = bdf_key(address)
    return (bus << 8) | (dev << 3) | fn


def parse_meminfo_total_bytes(text: str) -> int | None:
    """`Node 0 MemTotal:  1056466412 kB` → bytes; None when the line is missing."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "MemTotal:":
            try:
                value = int(fields[3])
            except ValueError:
                return None
            unit = fields[4] if len(fields) > 4 else ""
            return value * 1024 if unit == "kB" else value
    return None


def parse_nvidia_uuid(text: str) -> str | None:
    """The `GPU UUID:` line of /proc/driver/nvidia/gpus/<bdf>/information."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "GPU UUID":
            value = value.strip()
            return value or None
    return None


def parse_default_route_ifaces(text: str) -> list[str]:
    """Interfaces carrying an IPv4 default route in /proc/net/route (destination 0, mask 0)."""
    out: list[str] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        is_default = len(fields) >= 8 and fields[1] == "00000000" and fields[7] == "00000000"
        if is_default and fields[0] not in out:
            out.append(fields[0])
    return out


def parse_port_state(text: str) -> str:
    """`4: ACTIVE` → `ACTIVE` (sysfs prints the number, then the name)."""
    _, sep, name = text.partition(":")
    return name.strip() if sep else text.strip()


# PCI Vital Product Data resource tags (PCI Local Bus 3.0 §6.4, PCIe Base §6.28).
_VPD_LARGE = 0x80  # large resource: tag byte, 16-bit little-endian length
_VPD_READ_ONLY = 0x90  # VPD-R, the read-only keyword list
_VPD_ENDS = frozenset({0x78, 0x79})  # small / large end tag


def parse_vpd_keyword(data: bytes, keyword: str) -> str | None:
    """The value of `keyword` (two ASCII letters, `V3`) in a function's VPD-R section; None when
    the data holds no such keyword, is cut short or is not ASCII. Any bytes are safe input."""
    want = keyword.encode("ascii")
    at = 0
    while at < len(data):
        tag = data[at]
        if tag in _VPD_ENDS:
            return None
        if tag & _VPD_LARGE:
            if at + 3 > len(data):
                return None
            length = int.from_bytes(data[at + 1:at + 3], "little")
            body_at = at + 3
        else:
            length = tag & 0x07
            body_at = at + 1
        body = data[body_at:body_at + length]
        if len(body) < length:
            return None
        if tag == _VPD_READ_ONLY:
            k = 0
            while k + 3 <= len(body):
                size = body[k + 2]
                value = body[k + 3:k + 3 + size]
                if len(value) < size:
                    break
                if body[k:k + 2] == want:
                    try:
                        text = value.decode("ascii").strip("\x00 ")
                    except UnicodeDecodeError:
                        return None
                    return text or None
                k += 3 + size
        at = body_at + length
    return None


def parent_pcie_parts(devices_dir: str, parent_dir: str) -> tuple[str, list[str]] | None:
    """Split the folder a PCI function sits in into (root complex, functions from the top down).

    `parent_dir` is the resolved folder holding the function (a bridge, or the root complex
    itself). Components that are neither (ACPI or VMBus folders above a Hyper-V root, say)
    are skipped; the deepest `pci<dom>:<bus>` folder is the root complex, because a VMD
    domain nests a second one below a root port. None when it is not under sys/devices/pci….
    """
    if parent_dir == devices_dir or not parent_dir.startswith(devices_dir + os.sep):
        return None
    root: str | None = None
    functions: list[str] = []
    for part in parent_dir[len(devices_dir) + 1:].split(os.sep):
        if ROOT_COMPLEX_RE.fullmatch(part):
            root, functions = part, []
        elif BDF_RE.fullmatch(part):
            functions.append(part)
    if root is None:
        return None
    return root, functions
