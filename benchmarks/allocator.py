"""Per-node allocation time: the exact allocator, cold and memoised, beside greedy first-fit.

    PYTHONPATH=src python3 benchmarks/allocator.py [--repeat N] [--sweep]

For each profile (dgx-h100, dgx-a100, hgx-h100-4nic), each request of k GPUs with k VFs
(k = 1, 2, 4, 8) and each node state (empty; half used: every other GPU and half of each
PF's VFs held), it times:
  cold      a fresh search (the node's shape is already built, the memo is empty),
  memo      `allocate` answered from the memo (signature, lookup, free VFs/CPUs, record),
  score     `node_score` answered from the memo (what the extender asks per node),
  greedy    first-fit: lowest free GPUs, each with the first PF that has a free VF.
Medians and 99th percentiles in microseconds, measured in the same run.
`--required-rails` gives each request a `rails: required` sequence, the node's last k rails
in descending order: a sequence the best choice without it never keeps, so every cold
decision is a search with the sequence (greedy ignores it).
`--sweep` instead times one cold search for every request of 0–8 GPUs × 0–12 VFs × 0–2 whole
PFs × (0 or 16 CPUs) × numa preferred|single on four profiles, empty and half used, and lists
the slowest.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, GpuRef, Infeasible, NicRef, Pair
from railyard.discovery.profiles import build_topology, profile
from railyard.topology.model import NodeTopology

PROFILES = ("dgx-h100", "dgx-a100", "hgx-h100-4nic")
SIZES = (1, 2, 4, 8)


def half_used(t: NodeTopology) -> Ledger:
    """Every other GPU and half of each PF's VFs in use: a fragmented, realistic node."""
    gpus = tuple(GpuRef.of(g) for g in t.gpus[1::2])
    nics = tuple(NicRef.of_vf(n, v) for n in t.nics for v in n.vfs[: len(n.vfs) // 2])
    return Ledger(t, [("busy", Allocation(t.node, (), None, (), nics=nics, gpus=gpus))])


def greedy(t: NodeTopology, ledger: Ledger, r: Request) -> Allocation | Infeasible:
    """First fit, the baseline: no pairing quality, no NUMA, no lookahead."""
    gpus = [g for g in t.gpus if g.pci_address not in ledger.used_gpus][: r.gpus]
    if len(gpus) < r.gpus:
        return Infeasible("not enough GPUs")
    taken: set[str] = set()
    pairs = []
    for g in gpus:
        for n in t.nics:
            if n.pci_address in ledger.used_pfs:
                continue
            vf = next((v for v in n.vfs if v.pci_address not in ledger.used_vfs
                       and v.pci_address not in taken), None)
            if vf is not None:
                taken.add(vf.pci_address)
                pairs.append(Pair(GpuRef.of(g), NicRef.of_vf(n, vf),
                                  t.distance[g.pci_address][n.pci_address]))
                break
        else:
            return Infeasible("not enough VFs")
    return Allocation(t.node, (), None, (), pairs=tuple(pairs))


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.99))]


def required_rails(t: NodeTopology, k: int) -> tuple[int, ...]:
    """The node's last k rails, descending: pair 0 (the lowest GPU) on the highest rail."""
    rails = sorted({n.rail for n in t.nics if n.rail is not None}, reverse=True)
    return tuple(rails[:k])


def run(repeat: int, rails: bool = False) -> list[dict]:
    rows = []
    for name in PROFILES:
        t = build_topology(profile(name), vfs_per_pf=8, node=name)
        shape_us = timed(lambda t=t: Allocator().shape(t), 5)
        for state, ledger in (("empty", Ledger(t)), ("half", half_used(t))):
            for k in SIZES:
                r = Request(gpus=k, vfs=k)
                if rails:
                    r = Request(gpus=k, vfs=k, rails=required_rails(t, k),
                                rail_policy="required")
                alloc = Allocator()
                alloc.shape(t)

                def cold(alloc=alloc, ledger=ledger, r=r, t=t) -> None:
                    alloc._memo.clear()
                    alloc._plans.clear()
                    alloc.allocate(t, ledger, r)

                result = alloc.allocate(t, ledger, r)
                row = {
                    "profile": name, "state": state, "k": k,
                    "outcome": ("infeasible" if isinstance(result, Infeasible)
                                else max(p.distance for p in result.pairs).name),
                    "cold": timed(cold, repeat),
                    "memo": timed(lambda a=alloc, lg=ledger, r=r, t=t: a.allocate(t, lg, r),
                                  repeat * 5),
                    "score": timed(lambda a=alloc, lg=ledger, r=r, t=t: a.node_score(t, lg, r),
                                   repeat * 5),
                    "greedy": timed(lambda lg=ledger, r=r, t=t: greedy(t, lg, r), repeat * 5),
                    "shape": shape_us,
                }
                g = greedy(t, ledger, r)
                row["greedy_outcome"] = ("infeasible" if isinstance(g, Infeasible)
                                         else max(p.distance for p in g.pairs).name)
                rows.append(row)
    return rows


def sweep(top: int = 10) -> None:
    """One cold search per request shape: where the exact search is slow."""
    times = []
    for name in (*PROFILES, "mi300x"):
        t = build_topology(profile(name), vfs_per_pf=8, node=name)
        for state, ledger in (("empty", Ledger(t)), ("half", half_used(t))):
            for k, v, p, c, numa in itertools.product(range(9), (0, 1, 2, 3, 4, 8, 12), (0, 1, 2),
                                                      (0, 16), ("preferred", "single")):
                r = Request(gpus=k, vfs=v, pfs=p, exclusive_cpus=c, numa=numa)
                alloc = Allocator()
                alloc.shape(t)
                t0 = time.perf_counter()
                alloc.allocate(t, ledger, r)
                times.append(((time.perf_counter() - t0) * 1e3,
                              f"{name} {state} gpus={k},vfs={v},pfs={p},cpus={c} numa={numa}"))
    times.sort(reverse=True)
    print(f"{len(times)} requests; median {statistics.median(x for x, _ in times):.2f} ms; "
          f"over 50 ms: {sum(1 for x, _ in times if x > 50)}")
    for ms, what in times[:top]:
        print(f"{ms:8.1f} ms  {what}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200, help="cold runs per case (memo: ×5)")
    ap.add_argument("--sweep", action="store_true", help="time every request shape once")
    ap.add_argument("--required-rails", action="store_true",
                    help="each request with a required rail sequence its best choice "
                         "without it does not keep")
    args = ap.parse_args()
    if args.sweep:
        sweep()
        return
    rows = run(args.repeat, args.required_rails)
    print("| profile | state | GPUs+VFs | worst pair (exact / greedy) | cold median / p99 "
          "| memo allocate median / p99 | memo score median | greedy median / p99 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        def mp(xs: list[float]) -> str:
            return f"{statistics.median(xs):.0f} / {p99(xs):.0f}"
        print(f"| {r['profile']} | {r['state']} | {r['k']}+{r['k']} "
              f"| {r['outcome']} / {r['greedy_outcome']} | {mp(r['cold'])} | {mp(r['memo'])} "
              f"| {statistics.median(r['score']):.1f} | {mp(r['greedy'])} |")
    shapes = {r["profile"]: statistics.median(r["shape"]) for r in rows}
    print()
    print("Shape build (once per topology object), median µs: "
          + ", ".join(f"{k} {v:.0f}" for k, v in shapes.items()))


if __name__ == "__main__":
    main()
