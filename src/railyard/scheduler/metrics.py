"""Prometheus metrics of the extender: latency per verb, allocations, failures by reason.

Each service owns its registry (tests start many services in one process). Reasons are a
short fixed vocabulary, never the allocator's free text, to keep label cardinality low.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from railyard.allocation.types import Allocation
from railyard.kube.client import RequestTiming

VERBS = ("filter", "prioritize", "bind", "preempt", "release")
# Failure reasons: what an operator can act on.
BAD_REQUEST = "bad_request"  # malformed JSON, pod without UID, bad annotation
UNKNOWN_NODE = "unknown_node"  # a node we have no topology for
BLOCKED = "blocked"  # devices held by other pods (preemption may help)
UNRESOLVABLE = "unresolvable"  # the node can never host the request
NOT_SEEN = "not_seen"  # bind for a pod we never filtered (extender restarted)
ALREADY_BOUND = "already_bound"  # a UID bound elsewhere: its bind, or per node in filter
WRITE_FAILED = "write_failed"  # recording the binding failed; ledger rolled back
NOT_LEADER = "not_leader"  # a bind reached a replica that does not hold the Lease

# decide and write, then write's Binding create split on this side of the wire: the wait for
# the client's rate limit, for a connection, and the request from a connection in hand.
BIND_PHASES = ("decide", "write", "limit", "connection", "wire")

# Filter is expected in the low milliseconds; bind includes an fsync. Finer from 0.5 to 5 s:
# kube-scheduler's bind timeout is 5 s, and the 5,000-node bind tail lies there.
_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5,
            2.0, 2.5, 3.0, 4.0, 5.0)
# How late the loop runs a callback that is due: every delay of the loop's work adds to it.
_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LAG_PROBE_S = 0.1


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        latency = Histogram(
            "railyard_extender_request_duration_seconds",
            "Time to answer one kube-scheduler extender call, by verb.",
            ["verb"], buckets=_BUCKETS, registry=self.registry)
        self.latency = {v: latency.labels(v) for v in VERBS}
        # Where a bind's time goes (issue 28: why binds queued): `decide` from the bind's
        # start to its devices held (a job's turn, and the worker's queue when the memo
        # missed), `write` the Binding create (the client's rate limit included), and that
        # create in three parts (`write_timing`).
        phase = Histogram(
            "railyard_extender_bind_phase_seconds",
            "Time of each phase of a bind that holds devices: decide (the allocation, "
            "queueing included), write (the Binding create, its rate limit included); and of "
            "every Binding create that succeeded: limit (the wait for the client's rate "
            "limit), connection (for a free connection or a new one), wire (from a "
            "connection in hand to the answer read).",
            ["phase"], buckets=_BUCKETS, registry=self.registry)
        self.bind_phase = {ph: phase.labels(ph) for ph in BIND_PHASES}
        self.loop_lag = Histogram(
            "railyard_extender_loop_lag_seconds",
            f"How late the event loop ran a {LAG_PROBE_S:g} s timer: time its other work "
            "held every ready callback back (an answer read, a request handled).",
            buckets=_LAG_BUCKETS, registry=self.registry)
        decided = Counter(
            "railyard_extender_bind_decisions",
            "Binds that held devices, by where the allocation was decided: memo (on the "
            "loop, filter's answer still valid) or worker (searched again in the worker).",
            ["where"], registry=self.registry)
        self.bind_decided = {w: decided.labels(w) for w in ("memo", "worker")}
        self.allocations = Counter(
            "railyard_extender_allocations", "Pods bound with a Railyard allocation.",
            registry=self.registry)
        self._failures = Counter(
            "railyard_extender_failures",
            "Calls (bind, preempt, bad requests) and filtered nodes that failed, by reason.",
            ["verb", "reason"], registry=self.registry)
        self.pods = Gauge("railyard_extender_bound_pods",
                          "Pods currently holding Railyard devices.", registry=self.registry)
        # Per pod, not per pair: the worst pair is the one a collective waits for. Labels are
        # the five classes and three preference outcomes (decision 0091).
        self._achieved = Counter(
            "railyard_extender_affinity_achieved",
            "Pods bound with GPU-NIC pairs, by their worst pair's class (level: PIX, PXB, PHB, "
            "NODE, SYS) and preferDistance outcome (preference: met, fallback, none).",
            ["level", "preference"], registry=self.registry)
        self._shed = Counter(
            "railyard_extender_shed_clients",
            "Requests refused or connections closed because a client was too slow or sent "
            "too much, by reason (header_timeout, body_timeout, body_too_large).",
            ["reason"], registry=self.registry)

    def achieved(self, allocation: Allocation) -> None:
        """Count a bound pod with pairs by its worst pair, and whether it met a preference."""
        worst = allocation.worst_distance
        if worst is None:
            return
        affinity = allocation.affinity
        preference = ("none" if affinity is None else
                      "fallback" if affinity.fell_back else "met")
        self._achieved.labels(worst.name, preference).inc()

    def write_timing(self, timing: RequestTiming) -> None:
        """One Binding create's time on this side of the wire, by part."""
        self.bind_phase["limit"].observe(timing.limit_s)
        self.bind_phase["connection"].observe(timing.connection_s)
        self.bind_phase["wire"].observe(timing.wire_s)

    async def probe_loop_lag(self, _app: object = None) -> AsyncIterator[None]:
        """Time a timer on the running loop for as long as the context lasts (an aiohttp
        `cleanup_ctx`): a loop busy elsewhere shows here, apart from the API server's time."""
        loop = asyncio.get_running_loop()

        async def probe() -> None:
            while True:
                due = loop.time() + LAG_PROBE_S
                await asyncio.sleep(LAG_PROBE_S)
                self.loop_lag.observe(max(0.0, loop.time() - due))

        task = asyncio.ensure_future(probe())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def failure(self, verb: str, reason: str, count: int = 1) -> None:
        if count:
            self._failures.labels(verb, reason).inc(count)

    def shed(self, reason: str) -> None:
        self._shed.labels(reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
