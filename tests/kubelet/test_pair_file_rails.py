"""The pair file's `rail` is the pair's rail as the record says (docs/pair-map.md,
docs/rails.md): filled when the node knows its rails, null when it does not."""

from __future__ import annotations

import json

from railyard.allocation.allocator import Allocator
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation
from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.kubelet.pairmap import container_pairs, pair_file_json


def pair_file(rails: bool, job_rails: tuple[int | None, ...] = ()) -> dict:
    t = build_topology(DGX_H100, 2, rails=rails)
    a = Allocator().allocate(t, Ledger(t), Request(gpus=2, vfs=2, rails=job_rails))
    assert isinstance(a, Allocation)
    held = container_pairs(a, [g.device_id for g in a.all_gpus],
                           [n.pci_address for n in a.all_nics])
    return json.loads(pair_file_json(held, namespace="ml", pod="p", uid="u", container="c"))


def test_the_pair_file_carries_each_pairs_rail():
    assert [p["rail"] for p in pair_file(True)["pairs"]] == [0, 1]
    assert [p["rail"] for p in pair_file(True, (4, 6))["pairs"]] == [4, 6]


def test_the_pair_file_says_null_where_the_node_knows_no_rails():
    assert [p["rail"] for p in pair_file(False)["pairs"]] == [None, None]
