"""Workload traces in the openb pod-list format, as the simulator's arrivals draw from them.

Two lists ship inside the package (Alibaba `cluster-trace-gpu-v2023`, CC BY 4.0, see
`sim/data/ATTRIBUTION.md`); any CSV with the same columns works too. Bad rows are reported
with their physical line(s) in the file and their column, never as a traceback.
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
from typing import Protocol

# Built-in trace names -> files in railyard/sim/data.
BUILTIN_TRACES = {
    "openb-default": "openb_pod_list_default.csv",
    "openb-multigpu20": "openb_pod_list_multigpu20.csv",
}
REQUIRED_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMN = "creation_time"
DELETION_COLUMN = "deletion_time"  # optional; with it pods leave (docs/simulator.md)
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

    @property
    def gpus(self) -> int:
        """Whole GPUs Railyard gives the pod: it does not share GPUs, so a fraction is one."""
        return self.num_gpu

    @property
    def is_fractional(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < 1000


@dataclass(frozen=True, slots=True)
class Trace:
    name: str  # the built-in name or the file path, for reports
    pods: tuple[TracePod, ...]
    has_times: bool
    has_deletions: bool = False  # a deletion_time column: pods can leave

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
