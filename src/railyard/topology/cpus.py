"""Kernel CPU lists ("0-55,112-167") to sets of CPU ids and back."""

from __future__ import annotations

import re
from collections.abc import Iterable

# Far above any kernel's CPU count (NR_CPUS tops out at 8,192); cpulists also come from
# user-editable records, so a larger id is refused rather than expanded ("0-4000000000").
MAX_CPU = 65535
# One element, ASCII digits only: int() alone would also take "1_0", "+3" and "１".
_ELEMENT = re.compile(r"([0-9]+)(?:-([0-9]+))?", re.ASCII)


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel cpulist, as the kernel writes it (one final newline allowed, no other
    white space); an empty string is the empty list.

    Raises ValueError naming the bad element, so callers can say which file or field held it;
    ids beyond MAX_CPU are refused before any range is expanded.
    """
    cpus: list[int] = []
    text = text.removesuffix("\n")  # the kernel ends its files with one; nothing else is taken
    if not text:
        return cpus
    for part in text.split(","):
        m = _ELEMENT.fullmatch(part)
        if m is None:
            raise ValueError(f"bad CPU list element {part[:40]!r} in {text[:40]!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if max(len(lo), len(hi)) > len(str(MAX_CPU)) or max(int(lo), int(hi)) > MAX_CPU:
            raise ValueError(f"bad CPU list element {part[:40]!r} in {text[:40]!r}: "
                             f"CPU ids end at {MAX_CPU}")
        first, last = int(lo), int(hi)
        if last < first:
            raise ValueError(f"bad CPU list element {part[:40]!r} in {text[:40]!r}")
        cpus.extend(range(first, last + 1))
    return sorted(set(cpus))


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
