"""Prometheus metrics of the CNI service: calls by command and outcome, and their latency.

Named as the extender's and the agent's are, under `railyard_cni_`. In the agent the service
shares the agent's registry (one `/metrics`); `railyard cni serve` alone has its own. Labels
are the node (as the agent's), the CNI command (ADD, DEL, CHECK, GC, STATUS, VERSION) and
ok/error.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

OK = "ok"
ERROR = "error"
# An ADD moves devices between namespaces (~20 ms each on VMs) and waits for IPAM plugins.
_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class CniMetrics:
    def __init__(self, node: str, registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry if registry is not None else CollectorRegistry()
        self._calls = Counter(
            "railyard_cni_requests", "CNI calls answered, by command and outcome (ok, error).",
            ["node", "command", "outcome"], registry=self.registry)
        self._latency = Histogram(
            "railyard_cni_request_duration_seconds", "Time to answer one CNI call, by command.",
            ["node", "command"], buckets=_BUCKETS, registry=self.registry)

    def observe(self, command: str, ok: bool, seconds: float) -> None:
        self._calls.labels(self.node, command, OK if ok else ERROR).inc()
        self._latency.labels(self.node, command).observe(seconds)
