"""Cold searches for the request shapes a pod author can pick to make the exact search large.

    PYTHONPATH=src python3 benchmarks/hostile_search.py [--top N]
    PYTHONPATH=src python3 benchmarks/hostile_search.py --shapes 'dgx-h100 2 32 1 one-to-one PIX'

Many VFs beside whole PFs multiply the ways to spread the VFs over PFs, and pairing and
`maxDistance` hints take away the incumbent that prunes them. The sweep times one cold
decision (`allocate` on a fresh allocator, the node's shape already built) for every shape of
1, 2, 4 or 8 GPUs × 16–40 VFs × 0–3 whole PFs × pairing (default, shared, one-to-one) ×
maxDistance (none, PIX, NODE) on four empty profiles (8 VFs per compute PF), and lists the
slowest, with the states each explored and whether it spent the budget (docs/decisions/0077).
`--shapes` times the given shapes only ('PROFILE GPUS VFS PFS PAIRING|- MAXDISTANCE|-'),
each under `--cap` seconds: run it on a tree without the budget to see what it saved.
"""

from __future__ import annotations

import argparse
import itertools
import signal
import time
from types import FrameType

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Infeasible
from railyard.discovery.profiles import build_topology, profile
from railyard.topology.model import Distance

PROFILES = ("dgx-h100", "dgx-a100", "hgx-h100-4nic", "mi300x")


class _Capped(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _Capped


def decide(name: str, r: Request, cap_s: float | None = None) -> tuple[float, str, int | None]:
    """(seconds, outcome, states explored or None) of one cold decision."""
    t = build_topology(profile(name), vfs_per_pf=8, node=name)
    alloc = Allocator()
    alloc.shape(t)
    if cap_s:
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, cap_s)
    t0 = time.perf_counter()
    try:
        out = alloc.allocate(t, Ledger(t), r)
    except _Capped:
        return time.perf_counter() - t0, f"still searching at {cap_s:g} s", None
    finally:
        if cap_s:
            signal.setitimer(signal.ITIMER_REAL, 0)
    took = time.perf_counter() - t0
    refusal = out.refusal if isinstance(out, Infeasible) else None
    if refusal is not None and getattr(refusal, "search_budget_spent", False):
        outcome = "budget spent"
    else:
        outcome = "infeasible" if isinstance(out, Infeasible) else "allocation"
    return took, outcome, getattr(alloc, "explored", None)


def parse(shape: str) -> tuple[str, Request]:
    name, gpus, vfs, pfs, pairing, maxd = shape.split()
    return name, Request(gpus=int(gpus), vfs=int(vfs), pfs=int(pfs),
                         pairing_hint=None if pairing == "-" else pairing,  # type: ignore[arg-type]
                         max_distance=None if maxd == "-" else Distance[maxd])


def label(name: str, r: Request) -> str:
    return (f"{name} {r.gpus} {r.vfs} {r.pfs} {r.pairing_hint or '-'} "
            f"{r.max_distance.name if r.max_distance is not None else '-'}")


def show(rows: list[tuple[float, str, int | None, str]]) -> None:
    print("| shape (profile GPUs VFs PFs pairing maxDistance) | cold decision | outcome | states |")
    print("|---|---|---|---|")
    for took, outcome, explored, what in rows:
        states = f"{explored:,}" if explored is not None else "—"
        print(f"| `{what}` | {took:.2f} s | {outcome} | {states} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=12, help="how many of the slowest to list")
    ap.add_argument("--shapes", nargs="*", help="time these shapes only")
    ap.add_argument("--cap", type=float, default=120.0, help="seconds per shape (--shapes)")
    args = ap.parse_args()
    if args.shapes:
        rows = []
        for shape in args.shapes:
            name, r = parse(shape)
            rows.append((*decide(name, r, args.cap), label(name, r)))
        show(rows)
        return
    rows = []
    for name, k, v, p, pairing, maxd in itertools.product(
            PROFILES, (1, 2, 4, 8), (16, 24, 32, 40), (0, 1, 2, 3),
            (None, "shared", "one-to-one"), (None, Distance.PIX, Distance.NODE)):
        r = Request(gpus=k, vfs=v, pfs=p, pairing_hint=pairing,  # type: ignore[arg-type]
                    max_distance=maxd)
        rows.append((*decide(name, r), label(name, r)))
    rows.sort(key=lambda row: -row[0])
    spent = sum(1 for row in rows if row[1] == "budget spent")
    print(f"{len(rows)} shapes; {spent} spent the budget; slowest {rows[0][0]:.2f} s")
    show(rows[: args.top])


if __name__ == "__main__":
    main()
