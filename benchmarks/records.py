"""Benchmark: the codecs' decoders on what the hot paths read.

`decode_allocation` runs on the device plugin's and the extender's paths (a pod's annotation,
once per pod and call); a pod record is read by the agent and the CNI service; a topology
document by `railyard scheduler` at start, once per node. Each is timed in-process, median of
`--repeats` rounds of `--calls` decodes (and the least disturbed round), on a dgx-h100
(8 GPUs, 8 VFs, one per GPU).

    python benchmarks/records.py
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

from railyard.allocation.allocator import allocate
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation
from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.node.state import Consumed, PodKey, PodRecord, record_from_json, record_to_json
from railyard.records.allocation import decode_allocation, encode_allocation, format_decided_at
from railyard.records.topology import topology_from_json, topology_to_json


def per_call_us(fn: Callable[[], object], calls: int, repeats: int) -> tuple[float, float]:
    """Median and minimum over rounds, µs per call: on a shared machine the minimum is the
    round least disturbed by other work, the figure to compare between runs."""
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds), min(rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=15)
    opts = ap.parse_args()
    topo = build_topology(DGX_H100, vfs_per_pf=16, node="node-a")
    result = allocate(topo, Ledger(topo), Request(gpus=8, vfs=8))
    assert isinstance(result, Allocation), result
    alloc = dataclasses.replace(result,
                                decided_at=format_decided_at(datetime(2026, 1, 1, tzinfo=UTC)))
    text = encode_allocation(alloc)
    record = record_to_json(PodRecord(PodKey("u-1", "ml", "p"), alloc,
                                      (Consumed("main", "railyard.dev/vf", ("a", "b")),)))
    topo_doc = json.loads(json.dumps(topology_to_json(topo)))
    rows = [
        ("decode_allocation (8 pairs, annotation text)",
         per_call_us(lambda: decode_allocation(text), opts.calls, opts.repeats)),
        ("record_from_json (pod record, parsed)",
         per_call_us(lambda: record_from_json(record), opts.calls, opts.repeats)),
        ("topology_from_json (dgx-h100, 16 VFs per PF, parsed)",
         per_call_us(lambda: topology_from_json(topo_doc), max(1, opts.calls // 20),
                     opts.repeats)),
    ]
    print("| decoder | µs per call, median | min |\n|---|---|---|")
    for name, (median, least) in rows:
        print(f"| {name} | {median:.1f} | {least:.1f} |")


if __name__ == "__main__":
    main()
