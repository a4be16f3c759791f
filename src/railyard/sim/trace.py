"""Workload traces in the openb pod-list format, as the simulator's arrivals draw from them.

Two lists ship inside the package (Alibaba `cluster-trace-gpu-v2023`, CC BY 4.0, see
`sim/data/ATTRIBUTION.md`); any CSV with the same columns works too. Bad rows are reported
with their line and column, never as a traceback.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# Built-in trace names -> files in railyard/sim/data.
BUILTIN_TRACES = {
    "openb-default": "openb_pod_list_default.csv",
    "openb-multigpu20": "openb_pod_list_multigpu20.csv",
}
REQUIRED_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMN = "creation_time"
MAX_GPUS_PER_POD = 64


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
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"trace {path}: cannot read: {e}") from None
    return parse_trace(text, str(path))


def _int(row: dict[str, str], column: str, where: str, *, lo: int = 0,
         hi: int | None = None) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        value = _integral_float(raw, column, where)
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise TraceError(f"{where}, column {column}: {value} out of range ({bound})")
    return value


def _integral_float(raw: str, column: str, where: str) -> int:
    """Some exports write whole numbers as floats ("1000.0")."""
    try:
        f = float(raw)
    except ValueError:
        raise TraceError(f"{where}, column {column}: not a number: {raw!r}") from None
    if not f.is_integer():
        raise TraceError(f"{where}, column {column}: expected a whole number, got {raw!r}")
    return int(f)


def parse_trace(text: str, name: str) -> Trace:
    """Parse an openb pod list; with a `creation_time` column every row needs a time."""
    try:
        return _parse(text, name)
    except csv.Error as e:
        raise TraceError(f"trace {name}: not a CSV file: {e}") from None


def _parse(text: str, name: str) -> Trace:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    columns = [c.strip() for c in (reader.fieldnames or [])]
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise TraceError(f"trace {name}: missing column(s) {', '.join(missing)} "
                         f"(expected {', '.join(REQUIRED_COLUMNS)}[, {TIME_COLUMN}])")
    reader.fieldnames = columns
    has_times = TIME_COLUMN in columns
    pods: list[TracePod] = []
    for line, row in enumerate(reader, start=2):
        where = f"trace {name}, line {line}"
        if None in row:  # more cells than header columns
            raise TraceError(f"{where}: {len(row[None]) + len(columns)} cells, header has "
                             f"{len(columns)}")
        num_gpu = _int(row, "num_gpu", where, hi=MAX_GPUS_PER_POD)
        gpu_milli = _int(row, "gpu_milli", where, hi=1000)
        if num_gpu > 1 and gpu_milli < 1000:
            raise TraceError(f"{where}, column gpu_milli: a {num_gpu}-GPU pod cannot use a "
                             f"fraction of a GPU ({gpu_milli})")
        created = None
        if has_times:
            created = _int(row, TIME_COLUMN, where)
        pods.append(TracePod(
            name=(row.get("name") or "").strip() or f"row-{line}",
            cpu_milli=_int(row, "cpu_milli", where),
            memory_mib=_int(row, "memory_mib", where),
            num_gpu=num_gpu,
            gpu_milli=gpu_milli if num_gpu else 0,
            creation_time=created,
        ))
    if not any(p.gpus for p in pods):
        raise TraceError(f"trace {name}: no pod asks for a GPU; nothing to simulate")
    return Trace(name, tuple(pods), has_times)
