"""Kernel CPU lists ("0-55,112-167") to sets of CPU ids and back."""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel cpulist; an empty string is the empty list.

    Raises ValueError naming the bad element, so callers can say which file held it.
    """
    cpus: list[int] = []
    text = text.strip()
    if not text:
        return cpus
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                first, last = int(lo), int(hi)
                if last < first or first < 0:
                    raise ValueError
                cpus.extend(range(first, last + 1))
            else:
                cpu = int(lo)
                if cpu < 0:
                    raise ValueError
                cpus.append(cpu)
        except ValueError:
            raise ValueError(f"bad CPU list element {part!r} in {text!r}") from None
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
