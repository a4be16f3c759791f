"""One decision as one log line, in logfmt (`key=value ...`), the same form in every component.

`decision_line("bind", pod="ns/p", node="n1", allocation=a, why="...")` →
`decision=bind pod=ns/p node=n1 decidedBy=scheduler pairs=GPU-1>0000:1b:00.2:PIX,...
worst=PIX sum=0 why="..."`. Keys are fixed words, values are quoted only when they hold a
space, a quote or `=`, so `grep decision=bind` and logfmt parsers (Loki, `hl`, `lnav`) read
it. Pure: the callers log it (docs/observability.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from railyard.allocation.types import Allocation

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                   "-_./:,>+@[]()#")


def logfmt_value(value: object) -> str:
    """A value as logfmt writes it: bare when it is plain, else a JSON-style quoted string."""
    text = value if isinstance(value, str) else str(value)
    if text and all(c in _PLAIN for c in text):
        return text
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
               .replace("\r", "\\r").replace("\t", "\\t"))
    return f'"{escaped}"'


def logfmt(fields: Iterable[tuple[str, object]]) -> str:
    """`key=value` pairs joined by spaces; a None value is left out."""
    return " ".join(f"{k}={logfmt_value(v)}" for k, v in fields if v is not None)


def pairs_field(a: Allocation) -> str:
    """The pairs as `GPU>NIC:DISTANCE`, comma-separated in pair order; GPUs by device ID,
    NICs by PCI address (the IDs kubelet and the CNI name them by)."""
    return ",".join(f"{p.gpu.device_id}>{p.nic.pci_address}:{p.distance.name}"
                    for p in a.pairs)


def allocation_fields(a: Allocation) -> list[tuple[str, object]]:
    """What a line says of an Allocation: who decided, the pairs, the worst and summed
    distance, the unpaired NICs and GPUs when there are any, and the preferred and achieved
    affinity when the pod asked for one."""
    worst = a.worst_distance
    return [
        ("decidedBy", a.decided_by),
        ("pairs", pairs_field(a) or None),
        ("worst", worst.name if worst is not None else None),
        ("sum", sum(int(p.distance) for p in a.pairs) if a.pairs else None),
        ("nics", ",".join(n.pci_address for n in a.nics) or None),
        ("gpus", ",".join(g.device_id for g in a.gpus) or None),
        # A pod that asked `preferDistance` (decision 0091): what it preferred and got.
        *(() if a.affinity is None else (
            ("preferred", a.affinity.preferred.name), ("achieved", a.affinity.achieved.name),
            ("fallback", "true" if a.affinity.fell_back else "false"))),
    ]


def decision_line(decision: str, *, allocation: Allocation | None = None,
                  why: str | None = None, **fields: object) -> str:
    """`decision=<decision>`, the given fields in order, the Allocation's fields, then `why`
    (last: it is the free text)."""
    out: list[tuple[str, object]] = [("decision", decision), *fields.items()]
    if allocation is not None:
        out += allocation_fields(allocation)
    out.append(("why", why or None))
    return logfmt(out)
