"""Workload traces, as the simulator's arrivals draw from them: the openb pod-list format, or
the DLRM disaggregated-serving schema, told apart by the header.

Two openb lists ship inside the package (Alibaba `cluster-trace-gpu-v2023`, CC BY 4.0, see
`sim/data/ATTRIBUTION.md`); any CSV with the same columns works too. The DLRM schema is
Alibaba `cluster-trace-gpu-v2025` (Yang et al., NSDI '25): one row per instance, with a role
(`HN` GPU node, `CN` CPU node), a share of one RDMA NIC's bandwidth and a per-node limit per
application; no such trace ships with the package. Bad rows are reported with their physical
line(s) in the file and their column, never as a traceback.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Literal, Protocol

# Built-in trace names -> files in railyard/sim/data.
BUILTIN_TRACES = {
    "openb-default": "openb_pod_list_default.csv",
    "openb-multigpu20": "openb_pod_list_multigpu20.csv",
}
REQUIRED_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMN = "creation_time"
DELETION_COLUMN = "deletion_time"  # optional; with it pods leave (docs/simulator.md)
# The DLRM schema (cluster-trace-gpu-v2025), recognised by these columns in the header.
DLRM_COLUMNS = ("instance_sn", "role", "app_name", "cpu_request", "gpu_request",
                "rdma_request", "memory_request", "max_instance_per_node", "creation_time",
                "deletion_time")
DLRM_ROLES = ("HN", "CN")
MAX_GPUS_PER_POD = 64
MAX_VALUE = 2**63 - 1  # the largest number any column may hold (a signed 64-bit integer)


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file, line and column."""


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU; < 1000 on a one-GPU pod means a share of one GPU
    creation_time: int | None = None  # seconds from the trace start, when the trace has times
    deletion_time: int | None = None  # None: never leaves (no column, or an empty cell)
    # The DLRM schema's: the application, the role (HN: on a GPU node, CN: on a CPU node),
    # the share of one RDMA NIC's bandwidth (percent; None where the trace has no NIC
    # column) and the most instances of the application on one node (None: no limit).
    app: str | None = None
    role: str | None = None
    rdma_percent: int | None = None
    max_per_node: int | None = None

    @property
    def gpus(self) -> int:
        """GPUs the pod's request names: a share of one GPU names one, which the simulator
        shares with other shares (`sim.sharing`, decision 0094)."""
        return self.num_gpu

    @property
    def is_fractional(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < 1000

    @property
    def wants_devices(self) -> bool:
        """Whether it asks for anything Railyard manages: a GPU, or a share of an RDMA NIC."""
        return self.gpus > 0 or bool(self.rdma_percent)


@dataclass(frozen=True, slots=True)
class Trace:
    name: str  # the built-in name or the file path, for reports
    pods: tuple[TracePod, ...]
    has_times: bool
    has_deletions: bool = False  # a deletion_time column: pods can leave
    schema: Literal["openb", "dlrm"] = "openb"

    @property
    def has_lifetimes(self) -> bool:
        """Whether pods can be replayed at trace times, leaving at their deletion times."""
        return self.has_times and self.has_deletions

    @property
    def gpu_pods(self) -> tuple[TracePod, ...]:
        return tuple(p for p in self.pods if p.gpus > 0)


def load_trace(name_or_path: str) -> Trace:
    """A built-in trace by name (`openb-default`, `openb-multigpu20`) or a CSV file."""
    if name_or_path in BUILTIN_TRACES:
        ref = resources.files("railyard.sim") / "data" / BUILTIN_TRACES[name_or_path]
        return parse_trace(ref.read_text(encoding="utf-8"), name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(BUILTIN_TRACES)
        raise TraceError(f"trace {name_or_path!r}: neither a built-in trace ({known}) nor a file")
    try:  # -sig: spreadsheets save "CSV UTF-8" with a byte-order mark
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"trace {path}: cannot read: {e}") from None
    return parse_trace(text, str(path))


_WHOLE = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _shown(raw: str) -> str:
    """A cell for an error message: whole when short, else its start and its length."""
    if len(raw) <= 32:
        return repr(raw)
    return f"{raw[:24]!r}… ({len(raw)} characters)"


def _scaled(row: dict[str, str], column: str, where: str, scale: int, *,
            empty: int | None = None) -> int:
    """A decimal number × `scale`, rounded up to a whole number (a request is a least amount;
    a time stamp written as 475.00000000000006 is second 476 at the latest): the DLRM
    schema's vCPUs, GiB and seconds. An empty cell is `empty` when given."""
    raw = (row.get(column) or "").strip(" \t\r\n\v\f")
    if not raw and empty is not None:
        return empty
    if not _DECIMAL.fullmatch(raw):
        raise TraceError(f"{where}, column {column}: not a number: {_shown(raw)}")
    d = Decimal(raw)
    if d < 0 or d.adjusted() >= 15:
        raise TraceError(f"{where}, column {column}: {_shown(raw)} out of range")
    return int((d * scale).to_integral_value(rounding="ROUND_CEILING"))


def _int(row: dict[str, str], column: str, where: str, *, lo: int = 0,
         hi: int = MAX_VALUE) -> int:
    """A whole number in plain ASCII digits; some exports write it as a float ("1000.0").

    Stricter than `int()`, which also takes "1_0" (as 10) and non-ASCII digits, and which
    refuses more than 4,300 digits with an error of its own."""
    raw = (row.get(column) or "").strip(" \t\r\n\v\f")  # a CSV cell's padding, ASCII only
    value: int | None
    if _WHOLE.fullmatch(raw):
        value = int(raw) if len(raw.lstrip("+-").lstrip("0")) <= 19 else None
    elif _DECIMAL.fullmatch(raw):
        d = Decimal(raw)
        if d != d.to_integral_value():
            raise TraceError(f"{where}, column {column}: expected a whole number, "
                             f"got {_shown(raw)}")
        value = int(d) if d.adjusted() < 19 else None
    else:
        raise TraceError(f"{where}, column {column}: not a number: {_shown(raw)}")
    if value is None or value < lo or value > hi:
        shown = _shown(raw) if value is None else str(value)
        raise TraceError(f"{where}, column {column}: {shown} out of range ({lo}..{hi})")
    return value


def parse_trace(text: str, name: str) -> Trace:
    """Parse an openb pod list; with a `creation_time` column every row needs a time; a
    `deletion_time` cell may be empty (the pod never leaves)."""
    rows = csv.reader(io.StringIO(text, newline=""))
    try:
        return _parse(rows, name)
    except csv.Error as e:  # raised while reading the line the reader is on
        raise TraceError(f"trace {name}, line {rows.line_num}: not CSV: {e}") from None


class _Rows(Protocol):
    """A `csv.reader`: rows of cells, and the physical line it has read up to."""

    line_num: int

    def __iter__(self) -> Iterator[list[str]]: ...

    def __next__(self) -> list[str]: ...


def _parse(rows: _Rows, name: str) -> Trace:
    columns = [c.strip() for c in next(rows, [])]
    if all(c in columns for c in ("instance_sn", "rdma_request")):
        return _parse_dlrm(rows, name, columns)
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise TraceError(f"trace {name}: missing column(s) {', '.join(missing)} "
                         f"(expected {', '.join(REQUIRED_COLUMNS)}[, {TIME_COLUMN}])")
    # csv would keep the last of two equal names, silently: which one is meant is a guess.
    twice = [c for c in (*REQUIRED_COLUMNS, TIME_COLUMN, DELETION_COLUMN)
             if columns.count(c) > 1]
    if twice:
        raise TraceError(f"trace {name}: column(s) {', '.join(twice)} appear more than once "
                         "in the header")
    has_times = TIME_COLUMN in columns
    has_deletions = DELETION_COLUMN in columns
    pods: list[TracePod] = []
    line_after = rows.line_num
    for cells in rows:
        # A row's first and last physical lines: blank lines and quoted line breaks count.
        first, line_after = line_after + 1, rows.line_num
        if not cells:  # a blank line
            continue
        lines = f"line {first}" if first == line_after else f"lines {first}-{line_after}"
        where = f"trace {name}, {lines}"
        if len(cells) > len(columns):
            raise TraceError(f"{where}: {len(cells)} cells, header has {len(columns)}")
        row = dict(zip(columns, cells, strict=False))
        num_gpu = _int(row, "num_gpu", where, hi=MAX_GPUS_PER_POD)
        gpu_milli = _int(row, "gpu_milli", where, hi=1000)
        if num_gpu > 1 and gpu_milli < 1000:
            raise TraceError(f"{where}, column gpu_milli: a {num_gpu}-GPU pod cannot use a "
                             f"fraction of a GPU ({gpu_milli})")
        created = deleted = None
        if has_times:
            created = _int(row, TIME_COLUMN, where)
        if has_deletions and (row.get(DELETION_COLUMN) or "").strip():
            deleted = _int(row, DELETION_COLUMN, where)
            if created is not None and deleted < created:
                raise TraceError(f"{where}, column {DELETION_COLUMN}: {deleted} is before the "
                                 f"pod's creation_time {created}")
        pods.append(TracePod(
            name=(row.get("name") or "").strip() or f"row-{first}",
            cpu_milli=_int(row, "cpu_milli", where),
            memory_mib=_int(row, "memory_mib", where),
            num_gpu=num_gpu,
            gpu_milli=gpu_milli if num_gpu else 0,
            creation_time=created,
            deletion_time=deleted,
        ))
    if not any(p.gpus for p in pods):
        raise TraceError(f"trace {name}: no pod asks for a GPU; nothing to simulate")
    return Trace(name, tuple(pods), has_times, has_deletions)


def _rows(rows: _Rows, name: str,
          columns: list[str]) -> Iterator[tuple[int, str, dict[str, str]]]:
    """Each non-blank row as (first physical line, 'trace NAME, line(s) …', cells by column)."""
    line_after = rows.line_num
    for cells in rows:
        first, line_after = line_after + 1, rows.line_num
        if not cells:
            continue
        lines = f"line {first}" if first == line_after else f"lines {first}-{line_after}"
        where = f"trace {name}, {lines}"
        if len(cells) > len(columns):
            raise TraceError(f"{where}: {len(cells)} cells, header has {len(columns)}")
        yield first, where, dict(zip(columns, cells, strict=False))


def _parse_dlrm(rows: _Rows, name: str, columns: list[str]) -> Trace:
    """One instance per row (cluster-trace-gpu-v2025's `disaggregated_DLRM_trace.csv`).

    `cpu_request` is in vCPUs, `memory_request` in GiB (both rounded up to milli-CPUs and
    MiB), `gpu_request` whole GPUs, `rdma_request` a percentage of one RDMA NIC's bandwidth
    (0–100), `max_instance_per_node` −1 for no limit. An empty `creation_time` is before the
    trace started (0 here), an empty `deletion_time` after it ended (the pod never leaves).
    """
    missing = [c for c in DLRM_COLUMNS if c not in columns]
    if missing:
        raise TraceError(f"trace {name}: the DLRM schema (instance_sn, rdma_request) lacks "
                         f"column(s) {', '.join(missing)}")
    twice = [c for c in DLRM_COLUMNS if columns.count(c) > 1]
    if twice:
        raise TraceError(f"trace {name}: column(s) {', '.join(twice)} appear more than once "
                         "in the header")
    pods: list[TracePod] = []
    for first, where, row in _rows(rows, name, columns):
        role = (row.get("role") or "").strip()
        if role not in DLRM_ROLES:
            raise TraceError(f"{where}, column role: expected HN or CN, got {_shown(role)}")
        gpus = _int(row, "gpu_request", where, hi=MAX_GPUS_PER_POD)
        if role == "CN" and gpus:
            raise TraceError(f"{where}, column gpu_request: a CN (CPU node) instance asks for "
                             f"{gpus} GPU(s)")
        limit = (row.get("max_instance_per_node") or "").strip()
        per_node = None if limit == "-1" else _int(row, "max_instance_per_node", where, lo=1)
        created = _scaled(row, "creation_time", where, 1, empty=0)
        deleted = None
        if (row.get("deletion_time") or "").strip():
            deleted = _scaled(row, "deletion_time", where, 1)
            if deleted < created:
                raise TraceError(f"{where}, column deletion_time: before the instance's "
                                 "creation_time")
        pods.append(TracePod(
            name=(row.get("instance_sn") or "").strip() or f"row-{first}",
            cpu_milli=_scaled(row, "cpu_request", where, 1000),
            memory_mib=_scaled(row, "memory_request", where, 1024),
            num_gpu=gpus,
            gpu_milli=1000 if gpus else 0,
            creation_time=created,
            deletion_time=deleted,
            app=(row.get("app_name") or "").strip() or None,
            role=role,
            rdma_percent=_int(row, "rdma_request", where, hi=100),
            max_per_node=per_node,
        ))
    if not any(p.gpus for p in pods):
        raise TraceError(f"trace {name}: no instance asks for a GPU; nothing to simulate")
    return Trace(name, tuple(pods), has_times=True, has_deletions=True, schema="dlrm")
