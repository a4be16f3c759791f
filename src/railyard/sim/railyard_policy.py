"""The `railyard` policy: the extender's own ClusterState and joint allocator, not a copy.

Each pod goes through what kube-scheduler asks the extender: filter every node, score the
ones that fit, bind to the best (ties at random, as kube-scheduler's selectHost breaks them),
and the bind re-allocates under the node lock and records the Allocation in the ledger.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from railyard.allocation.ledger import Ledger
from railyard.allocation.request import Request
from railyard.allocation.types import Allocation, Infeasible
from railyard.scheduler.state import ClusterState
from railyard.topology.model import NodeTopology

if TYPE_CHECKING:
    from railyard.allocation.allocator import Packing

SIM_NAMESPACE = "railyard-sim"
# A fixed stamp: the record's time is not part of any result, and a seed must reproduce all.
SIM_DECIDED_AT = "1970-01-01T00:00:00Z"


class RailyardPolicy:
    name = "railyard"

    def __init__(self, topologies: Sequence[NodeTopology], seed: int,
                 packing: Packing = "binpack", idle_reserve: int = 0) -> None:
        from railyard.allocation.allocator import Allocator

        self.state = ClusterState(topologies, allocator=Allocator(packing=packing),
                                  idle_reserve=idle_reserve)
        self._names = self.state.node_names()
        self.rng = random.Random(f"railyard-sim/{seed}/policy/{self.name}")

    def ledgers(self) -> Mapping[str, Ledger]:
        return {n: self.state.ledger(n) for n in self._names}

    def place(self, uid: str, request: Request, nodes: Sequence[str] | None = None, *,
              job: str | None = None) -> Allocation | Infeasible:
        # A gang's pod: its job's rail sequence, as the extender hands it (docs/rails.md).
        request = self.state.job_request(request, job)
        outcome = self.state.filter(request, self._names if nodes is None else nodes)
        if not outcome.fits:
            reasons = {**outcome.failed, **outcome.unresolvable}
            first = next(iter(reasons.values()), "no nodes")
            return Infeasible(f"no node fits ({len(reasons)} rejected; e.g. {first})")
        scores = self.state.scores(request, outcome.fits)
        best = max(scores.values())
        node = self.rng.choice([n for n in outcome.fits if scores[n] == best])
        return self.state.bind(uid, SIM_NAMESPACE, uid, node, request,
                               decided_at=SIM_DECIDED_AT, job=job)

    def release(self, uid: str) -> None:
        """The pod was deleted: the extender's release, as its pod watch calls it."""
        self.state.release(uid)
