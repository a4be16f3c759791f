"""Prometheus metrics of the node agent: its devices, its admissions, kubelet's calls.

Named as the extender's are (`railyard.scheduler.metrics`), under `railyard_agent_`. Each agent
owns its registry (tests run many in one process). The device gauges are read when scraped,
from the same status the NodeTopology reports (`kubelet.report.node_status`), so they cannot
disagree with it; the counters are fed by `Admission` (an `AdmissionObserver`) and the
plugins' servicer. Every series carries `node` (the agent's own: a dashboard filters by it
without relabelling); the other labels are small fixed vocabularies: kind, state, outcome,
method and the resource name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from railyard.kubelet.outcome import REFUSED, Admitted, Corrected
from railyard.records.nodetopology_cr import DeviceCounts, NodeTopologyStatus

# kubelet's calls, the `method` label (their gRPC names).
ALLOCATE = "Allocate"
PREFERRED = "GetPreferredAllocation"
# Allocate answers from the state store in about a millisecond; GetPreferredAllocation may
# search up to the allocator's budget (about half a second, docs/decisions/0077).
_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class DeviceGauges(Collector):
    """`railyard_agent_devices{node, kind, state}`: free, held and unhealthy GPUs, VFs and
    PFs (NICs), read from `status()` at each scrape; nothing before the agent started."""

    NAME = "railyard_agent_devices"

    def __init__(self, node: str, status: Callable[[], NodeTopologyStatus | None]) -> None:
        self.node = node
        self.status = status

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            self.NAME, "Devices of this node by kind and state: free, held by a pod's record, "
                       "or unhealthy (a device both held and unhealthy counts as held).",
            labels=["node", "kind", "state"])

    def describe(self) -> Iterator[Metric]:  # registering calls this, not collect()
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        status = self.status()
        if status is not None:
            kinds: tuple[tuple[str, DeviceCounts], ...] = (
                ("gpu", status.gpus), ("vf", status.vfs), ("pf", status.nics))
            for kind, c in kinds:
                for state, n in (("free", c.free), ("held", c.held),
                                 ("unhealthy", c.total - c.free - c.held)):
                    family.add_metric([self.node, kind, state], n)
        yield family


class AgentMetrics:
    """The agent's registry; `devices(...)` adds the scrape-time gauges once it can count."""

    def __init__(self, node: str, registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry if registry is not None else CollectorRegistry()
        self._admissions = Counter(
            "railyard_agent_admissions",
            "Allocate calls by outcome: record (kubelet's IDs are the record's), node (the "
            "node decided), unmatched (no pending pod matched), refused (the call failed).",
            ["node", "resource", "outcome"], registry=self.registry)
        self._corrections = Counter(
            "railyard_agent_node_truth_corrections",
            "Records the PodResources check rewrote to what kubelet really assigned "
            "(decidedBy: node).", ["node"], registry=self.registry)
        self._latency = Histogram(
            "railyard_agent_kubelet_request_duration_seconds",
            "Time to answer one of kubelet's device plugin calls, by method and resource.",
            ["node", "method", "resource"], buckets=_BUCKETS, registry=self.registry)

    def devices(self, status: Callable[[], NodeTopologyStatus | None]) -> None:
        self.registry.register(DeviceGauges(self.node, status))

    def admitted(self, a: Admitted) -> None:
        self._admissions.labels(self.node, a.resource, a.outcome).inc()

    def refused(self, resource: str) -> None:
        self._admissions.labels(self.node, resource, REFUSED).inc()

    def corrected(self, c: Corrected) -> None:
        self._corrections.labels(self.node).inc()

    def observe(self, method: str, resource: str, seconds: float) -> None:
        self._latency.labels(self.node, method, resource).observe(seconds)



class MetricsServer:
    """`GET /metrics` (and `/healthz`) of a registry on HOST:PORT, on the agent's loop."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound = runner.addresses[0]  # the port asked for, or the one :0 was given
        self.port = bound[1]

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
