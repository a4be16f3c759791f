"""Kernel CPU lists ("0-55,112-167") to sets of CPU ids and back."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

# Far above any kernel's CPU count (NR_CPUS tops out at 8,192); cpulists also come from
# user-editable records, so a larger id is refused rather than expanded ("0-4000000000").
MAX_CPU = 65535
# One element, ASCII digits only: int() alone would also take "1_0", "+3" and "１".
_ELEMENT = re.compile(r"([0-9]+)(?:-([0-9]+))?", re.ASCII)
_MAX_DIGITS = len(str(MAX_CPU))


def cpu_ranges(text: str) -> list[tuple[int, int]]:
    """The (first, last) of each element of a kernel cpulist, in the order written, nothing
    expanded; one final newline allowed (the kernel ends its files with one), no other white
    space. ValueError naming the bad element; ids beyond MAX_CPU are refused."""
    return list(iter_cpu_ranges(text))


def iter_cpu_ranges(text: str) -> Iterator[tuple[int, int]]:
    """`cpu_ranges` one element at a time, so a reader may stop at the first it refuses."""
    text = text.removesuffix("\n")
    if not text:
        return
    for part in text.split(","):
        m = _ELEMENT.fullmatch(part)
        if m is None:
            raise ValueError(f"bad CPU list element {part[:40]!r} in {text[:40]!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if max(len(lo), len(hi)) > _MAX_DIGITS or max(int(lo), int(hi)) > MAX_CPU:
            raise ValueError(f"bad CPU list element {part[:40]!r} in {text[:40]!r}: "
                             f"CPU ids end at {MAX_CPU}")
        first, last = int(lo), int(hi)
        if last < first:
            raise ValueError(f"bad CPU list element {part[:40]!r} in {text[:40]!r}")
        yield first, last


def parse_cpulist(text: str) -> list[int]:
    """The sorted CPU ids of a kernel cpulist (see `cpu_ranges`); "" is the empty list.

    Ranges are merged before any is expanded, so the cost is that of the ids (at most
    MAX_CPU + 1), never that of the text: "0-65535" written 30,000 times in a record would
    otherwise be two billion ids (issue 19).
    """
    cpus: list[int] = []
    end = -1  # every id up to `end` is in `cpus`
    for first, last in sorted(cpu_ranges(text)):
        if last > end:
            cpus.extend(range(max(first, end + 1), last + 1))
            end = last
    return cpus


def format_cpulist(cpus: Iterable[int]) -> str:
    """The shortest kernel cpulist for a set of CPU ids."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)
