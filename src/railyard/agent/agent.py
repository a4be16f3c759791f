"""The node agent: discovery, the device plugins, health, the state store and the CNI hook.

`Agent.start()` discovers the node, serves one plugin per enabled resource and registers it,
watches kubelet's socket folder (a kubelet restart deletes our sockets: serve and register
again at once), re-scans device health every `healthIntervalS`, checks each admission
against PodResources, and forgets records of pods that are gone. Tests drive it directly;
`railyard agent` runs it until SIGTERM.

In cluster mode (a `kube` client, decision 0072) the pods come from the API server
(`kubelet.apipods`), the node's NodeTopology is published at start and whenever its status
changes, node-decided records are written back to their pods (`kubelet.writeback`), and
device health changes become Events on the Node (`kubelet.health_events`, `kube.events`).

In DRA mode (`mode: dra`, cluster mode only; decision 0111) the agent is the DRA driver
railyard.dev: it publishes the node's ResourceSlices (at start, on every health change, each
time kubelet registers its DRA plugin, and every SLICES_RESYNC_S), serves kubelet's DRA plugin
with the health scan's word, and registers no device plugin for the kinds DRA serves; the CNI
service, the metrics, the clean-up and the NodeTopology stay as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from railyard.agent.config import MODE_DRA, AgentConfig, ConfigError
from railyard.cni.grants import Grant, Grants
from railyard.cni.metrics import CniMetrics
from railyard.cni.spec import PodArgs
from railyard.kube.client import ApiError, ApiUnavailable, Client
from railyard.kube.events import NORMAL, WARNING, EventSender, event_body, event_time
from railyard.kube.koordinator_device import DevicePublished, publish_device
from railyard.kube.nodetopology import path_of, publish
from railyard.kube.objects import NodeTopologyObject, Object
from railyard.kube.resourceslices import SlicesPublished, node_slices, publish_slices
from railyard.kubelet.admission import Admission, utc_now
from railyard.kubelet.apipods import ApiPods
from railyard.kubelet.health_events import (
    HEALTHY,
    UNHEALTHY,
    HealthChanges,
    healthy_message,
    unhealthy_message,
)
from railyard.kubelet.inventory import (
    PluginDevice,
    PoolOverlap,
    SysfsProbe,
    assign_pools,
    offered_devices,
)
from railyard.kubelet.metrics import AgentMetrics, MetricsServer
from railyard.kubelet.othergpus import (
    CORRECTED_EVENT,
    DRA_EVENT,
    Correction,
    dra_message,
    gpu_drivers,
)
from railyard.kubelet.pairmap import PAIRS_FILE
from railyard.kubelet.plugin import KUBELET_SOCKET, DeviceList, KubeletPaths, PluginEndpoint
from railyard.kubelet.podresources import PodResourcesClient
from railyard.kubelet.pods import PodSource, PodView
from railyard.kubelet.report import node_status
from railyard.kubelet.resolver import Kind
from railyard.kubelet.response import ContainerGrant, Mount, devinfo_file_name
from railyard.kubelet.selectors import DeviceFacts
from railyard.kubelet.watch import FolderWatch
from railyard.kubelet.writeback import AllocationWriteBack
from railyard.node.attachments import attached_pods
from railyard.node.errors import StateError
from railyard.node.files import write_atomic
from railyard.node.pairfiles import PairFiles
from railyard.node.paths import KUBELET_DIR, STATE_DIR
from railyard.node.state import PodKey, PodRecord, StateStore
from railyard.records.dra_slices import node_slices as build_slices
from railyard.records.koordinator_device import MANAGED_BY, MANAGED_BY_LABEL
from railyard.records.nodetopology_cr import (
    NodeTopologyResourceError,
    NodeTopologyStatus,
    status_from_resource,
)
from railyard.records.signature import (
    NODE_KEY_ANNOTATION,
    TRUST_ALL,
    RecordTrust,
    public_key_text,
)
from railyard.topology.model import NodeTopology

if TYPE_CHECKING:
    from railyard.kubelet.dra_plugin import DraPlugin
    from railyard.kubelet.dra_status import ClaimStatusWriter

log = logging.getLogger(__name__)

RETRY_S = 0.5  # Register retry while kubelet.sock is missing
SOCKET_POLL_S = 2.0  # safety net behind inotify
GC_INTERVAL_S = 10.0
PUBLISH_INTERVAL_S = 1.0  # at most one NodeTopology status write per interval
PUBLISH_RETRY_S = 5.0
EVENTS_NAMESPACE = "default"  # a Node's Events, as kubelet writes them
EVENT_COMPONENT = "railyard-agent"
STATE_REBUILT = "RailyardNodeStateRebuilt"  # the Node Event when records were made again
# The pod Event when its claim's network data could not be written (kubelet.dra_status).
CLAIM_STATUS_NOT_WRITTEN = "RailyardClaimStatusNotWritten"
EVENTS_DRAIN_S = 1.0  # at stop, Events in flight get this long before the client closes
CHECK_BEFORE_S = 5.0  # the PodResources check a CNI ADD or a container start waits for
# DRA mode: our slices are listed again this often (and written if they differ): kubelet
# deletes a driver's slices 30 s after its plugin stops answering, and anyone may edit them.
SLICES_RESYNC_S = 60.0
SLICES_RETRY_S = 5.0


@dataclass(frozen=True, slots=True)
class AgentOptions:
    node_name: str
    sysfs_root: str = "/"
    kubelet_dir: str = KUBELET_DIR
    state_dir: str = STATE_DIR
    cni_socket: str | None = None
    # HOST:PORT of /metrics (docs/observability.md); None: not served.
    metrics_listen: tuple[str, int] | None = None
    # Signed records (decision 0087), cluster mode: the node's own key signs its truth and
    # is published on its NodeTopology; with the extender's public keys, only records
    # signed for their pod are believed. Neither: every record is trusted.
    signing_key: Ed25519PrivateKey | None = None
    extender_keys: tuple[Ed25519PublicKey, ...] = ()

    def record_trust(self) -> RecordTrust:
        if not self.extender_keys:
            return TRUST_ALL
        own = self.signing_key.public_key() if self.signing_key is not None else None
        node = self.node_name
        return RecordTrust.keys(self.extender_keys, lambda n: own if n == node else None)


class Agent:
    """`pods`: where the node's pods come from; None in cluster mode, where they are read
    from the API server through `kube` (which the agent then owns and closes)."""

    def __init__(self, options: AgentOptions, pods: PodSource | None,
                 config: AgentConfig | None = None, topology: NodeTopology | None = None,
                 *, kube: Client | None = None) -> None:
        self.options = options
        self.config = config or AgentConfig()
        self.kube = kube
        self._api_pods: ApiPods | None = None
        if pods is None:
            if kube is None:
                raise ValueError("the agent needs a pods source or an API client")
            pods = self._api_pods = ApiPods(kube, options.node_name, self.config.resources,
                                            trust=options.record_trust())
        self.pods: PodSource = pods
        self._topology = topology
        self.paths = KubeletPaths(options.kubelet_dir)
        self.probe = SysfsProbe(options.sysfs_root)
        # Deferred durability keeps fsync off kubelet's admission path (decision 0032); what a
        # power loss could lose is rebuilt from PodResources by the check at start.
        self.store = StateStore(options.state_dir, node=options.node_name,
                                durability="deferred")
        self.pair_files = PairFiles(options.state_dir)
        self.lists: dict[Kind, DeviceList] = {}
        self.endpoints: dict[Kind, PluginEndpoint] = {}
        self.admission: Admission | None = None
        self.podresources = PodResourcesClient(self.paths.pod_resources_socket)
        self._tasks: list[asyncio.Task] = []
        self._watches: list[FolderWatch] = []
        self._sync_task: asyncio.Task | None = None
        self._verify_task: asyncio.Task | None = None
        self._dra_task: asyncio.Task | None = None
        self._kubelet_back = False
        self._dirty = False
        self._cni: object | None = None
        self.unhealthy: dict[str, str] = {}
        self.write_back = (AllocationWriteBack(kube, self.store, self.pods,
                                               options.signing_key)
                           if kube is not None else None)
        self.published: NodeTopologyStatus | None = None  # the status the API server has
        # The unhealthy set the Koordinator Device last written reports (decision 0095).
        self._device_published: frozenset[str] | None = None
        self._found: NodeTopologyStatus | None = None  # what it held when we started
        self._report = asyncio.Event()  # something the status counts may have changed
        # Events on the Node for health changes (cluster mode only), from the first
        # publication on: what the NodeTopology found then already says needs no Event.
        self.events = EventSender(kube) if kube is not None else None
        self.health_changes: HealthChanges | None = None
        self._node_uid: str | None = None
        # Prometheus metrics (the CNI service's join its registry); served on
        # `metrics_listen` from start to stop.
        self.metrics = AgentMetrics(options.node_name)
        self.metrics_server: MetricsServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # start()'s, for other threads
        # DRA mode: kubelet's DRA plugin, and a wake-up for the slice publisher.
        self.dra: DraPlugin | None = None
        self._slices_due = asyncio.Event()
        self.slices_published: SlicesPublished | None = None  # the last round's outcome
        self._dra_offered: frozenset[str] | None = None  # VFs and PFs the slices publish
        self.claim_status: ClaimStatusWriter | None = None  # claims' network data (0113)

    # ------------------------------------------------------------------ start / stop

    @property
    def topology(self) -> NodeTopology:
        assert self._topology is not None, "start() first"
        return self._topology

    def _discover(self) -> NodeTopology:
        if self._topology is None:
            from railyard.discovery.discover import discover

            found = discover(self.options.sysfs_root)
            for w in found.warnings:
                log.warning("discovery: %s", w)
            self._topology = found.topology
        return replace(self._topology, node=self.options.node_name)

    def _pooled(self, topology: NodeTopology, facts: dict[str, DeviceFacts]) -> NodeTopology:
        """Each VF's pool from `vfPools` (docs/decisions/0085); a VF two pools match stops
        the start with a config error naming both."""
        cfg = self.config
        if not cfg.vf_pools:
            return topology
        try:
            return assign_pools(topology, [(p.resource, p.selectors) for p in cfg.vf_pools],
                                cfg.resources.vf, facts)
        except PoolOverlap as e:
            raise ConfigError("vfPools", str(e)) from None

    def _railed(self, topology: NodeTopology) -> NodeTopology:
        """Each NIC's rail from the `rails` config (docs/rails.md); names this node lacks
        are warned about (one config serves many nodes), not fatal."""
        if self.config.rails is None:
            return topology
        from railyard.topology.rails import assign_rails

        railed, unknown = assign_rails(topology, self.config.rails)
        if unknown:
            log.warning("rails: no NIC on this node is named %s", ", ".join(unknown))
        return railed

    def _honour_koordinator(self) -> None:
        """`koordinator.honourDeviceAllocated` (decision 0095): Koordinator's records become
        pod records, in cluster mode and only while every record is trusted (its records
        carry no signature: a node that checks signatures never believes one)."""
        if not self.config.koordinator.honour_device_allocated:
            return
        if self._api_pods is None:
            log.warning("koordinator.honourDeviceAllocated: only in cluster mode (the chart's "
                        "admission policy guards the annotation there); ignored")
            return
        if self.options.record_trust().enforced:
            log.warning("koordinator.honourDeviceAllocated: ignored, this agent believes only "
                        "signed records and Koordinator's device-allocated is never signed")
            return
        from railyard.kubelet.koordinator import KoordinatorRecords

        self._api_pods.adopt_records(KoordinatorRecords(self.topology))
        log.info("honouring Koordinator's device-allocated on pods without a Railyard record")

    def _inventory(self, facts: dict[str, DeviceFacts]) -> dict[Kind, tuple[PluginDevice, ...]]:
        cfg = self.config
        routed = self.probe.routed_netdevs()
        dra = cfg.dra_kinds  # served by DRA: no device plugin
        wanted: list[tuple[Kind, bool, tuple]] = [("gpu", cfg.gpu_plugin and "gpu" not in dra,
                                                   ())]
        wanted += [("vf" if p.resource == cfg.resources.vf else p.resource,
                    cfg.vf_plugin and "vf" not in dra, p.selectors) for p in cfg.pools]
        wanted.append(("pf", cfg.pf_plugin and "pf" not in dra, cfg.pf_pool))
        return {kind: offered_devices(self.topology, kind, pool=pool, facts=facts, routed=routed)
                for kind, on, pool in wanted if on}

    async def start(self) -> None:
        if self.config.mode == MODE_DRA and self.kube is None:
            raise ConfigError("mode", "DRA mode needs cluster mode: ResourceSlices and claims "
                                      "are on the API server")
        if self._api_pods is not None:  # first: an unreadable pods source stops the start
            await self._api_pods.start()
        self._topology = self._discover()
        names = self.config.resources
        facts = self.probe.facts(self._topology)
        self._topology = self._pooled(self._topology, facts)
        self._topology = self._railed(self._topology)
        self._honour_koordinator()
        for kind, devices in self._inventory(facts).items():
            self.lists[kind] = DeviceList(devices)
        self.admission = Admission(self.topology, self.store, self.pods, names,
                                   offered=self._healthy_offered,
                                   on_allocated=self._after_allocate,
                                   served=tuple(self.lists), pair_map=self.config.pair_map,
                                   observer=self.metrics, on_corrected=self._on_corrected)
        self._loop = asyncio.get_running_loop()
        self.metrics.devices(self._device_status)
        await self._scan_health()
        for kind, listed in self.lists.items():
            resource = self.admission.resource_of(kind)
            # GPUs from another plugin: kubelet asks before each container starts, when
            # every device of the pod is in PodResources (decision 0090).
            self.endpoints[kind] = PluginEndpoint(
                resource, listed, self.admission, self.paths, self.metrics,
                before_start=self._before_start if "gpu" not in self.lists else None)
            log.info("%s: %d devices offered", resource, len(listed.devices))
        watched = {ep.folder for ep in self.endpoints.values()}
        if not self.paths.watcher_mode:
            watched.add(self.paths.device_plugins)
        for folder in sorted(watched):
            os.makedirs(folder, exist_ok=True)
            w = FolderWatch(folder, self._on_folder_change)
            w.start()
            self._watches.append(w)
        for ep in self.endpoints.values():
            await ep.serve()
        self._kick()  # register in the background: kubelet may not be up yet
        self._tasks += [
            asyncio.create_task(self._health_loop(), name="health"),
            asyncio.create_task(self._socket_poll(), name="socket-poll"),
            asyncio.create_task(self._gc_loop(), name="gc"),
        ]
        await self._start_cni()
        await self._serve_metrics()
        if self.config.mode == MODE_DRA:
            await self._start_dra()
        if self.kube is not None:
            if not await self.publish_topology():
                self._report.set()  # the loop tries again
            found = self._found.unhealthy if self._found is not None else ()
            self.health_changes = HealthChanges(
                self.topology, {d.pci_address: d.reason for d in found})
            self._raise_health_events()
            self._tasks.append(asyncio.create_task(self._publish_loop(), name="publish"))
            # Once, beside the loops (it ends: `_tasks` are loops that never should). In DRA
            # mode other drivers' GPUs are expected: claims pair them (decision 0109).
            if self.config.mode != MODE_DRA:
                self._dra_task = asyncio.create_task(self.look_for_dra(), name="dra")
        self._verify_task = asyncio.create_task(self._check_at_start())  # what a crash lost

    async def stop(self) -> None:
        """Stop every part, each even when one before it failed; then raise the first error.

        Every failure is logged with the part it came from: one close that raises (an fsync
        error at the store's last flush, a broken API connection) must not leave the plugin
        sockets, the CNI service or the kube client open behind it.
        """
        for w in self._watches:
            w.stop()
        for t in [*self._tasks, self._sync_task, self._verify_task, self._dra_task]:
            if t is not None:
                t.cancel()
        for t in [*self._tasks, self._sync_task, self._verify_task, self._dra_task]:
            if t is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        first: Exception | None = None

        async def part(what: str, stop: Callable[[], object]) -> None:
            nonlocal first
            try:
                if inspect.iscoroutinefunction(stop):
                    await stop()
                else:
                    await asyncio.to_thread(stop)  # a thread to join, a last fsync
            except Exception as e:
                log.error("stopping the agent: %s: %s", what, e, exc_info=True)
                first = first or e

        for kind, ep in self.endpoints.items():
            await part(f"{kind} plugin endpoint", ep.stop)
        if self.dra is not None:
            # Our slices stay: a restart publishes them again well inside the 30 s after
            # which kubelet deletes them itself.
            await part("DRA plugin", self.dra.stop)
        if self.metrics_server is not None:
            await part("metrics server", self.metrics_server.stop)
        await part("state store", self.store.close)
        if self.events is not None and self.events.pending:  # a last health change's Event
            await asyncio.wait(self.events.pending, timeout=EVENTS_DRAIN_S)
            self.events.cancel()
        if self._api_pods is not None:
            await part("pod watch", self._api_pods.stop)
        if self.kube is not None:
            await part("API client", self.kube.close)
        if self._cni is not None:
            stop = getattr(self._cni, "stop", None) or getattr(self._cni, "close", None)
            self._cni = None
            if stop is not None:
                await part("CNI service", stop)  # the CNI service joins its thread
        if first is not None:
            raise first

    async def _start_cni(self) -> None:
        """Start the CNI service in-process on `--cni-socket`, over this agent's state store.

        Uses `railyard.cni.service.build_plugin(...)` + `start(plugin, socket_path)` (a
        background thread, stopped with the agent).
        """
        path = self.options.cni_socket
        if not path:
            return
        try:
            from railyard.cni import service as cni_service
        except ImportError as e:
            log.warning("--cni-socket %s given but the CNI service is not available: %s", path, e)
            return
        # The pod list lets a name-only CNI call skip records of pods known to be gone.
        plugin = cni_service.build_plugin(
            self.options.state_dir, sysfs_root=self.options.sysfs_root, store=self.store,
            device_info_dir=self.config.cni_devinfo_dir,
            pod_resources_socket=self.paths.pod_resources_socket, pods=self.pods,
            metrics=CniMetrics(self.options.node_name, self.metrics.registry))
        if self.config.mode == MODE_DRA and self.kube is not None:
            # After a DRA pod's ADD: its claim's status.devices names each NIC's interface,
            # MAC and addresses (KEP-4817), written on this loop, off the ADD's path (0113).
            from railyard.kubelet.dra_status import ClaimStatusWriter

            writer = self.claim_status = ClaimStatusWriter(
                self.kube, self.options.state_dir, asyncio.get_running_loop(),
                node=self.options.node_name, registry=self.metrics.registry,
                not_written=self._say_claim_status_not_written)
            plugin.on_added = lambda pod, interfaces: writer.interfaces_added(pod.uid,
                                                                              interfaces)
        if "gpu" not in self.lists:
            # GPUs from another plugin: kubelet has given every container its GPUs by the
            # time the runtime calls ADD, so check the record against PodResources first
            # and the NICs are moved and named in the pairs of the GPUs received (0090).
            plugin.grants = CheckedGrants(plugin.grants, self._verify_from_thread)
        self._cni = await asyncio.to_thread(cni_service.start, plugin, path)
        log.info("CNI service on %s", path)

    def _say_claim_status_not_written(self, pod: PodKey, message: str) -> None:
        """A Warning Event on the pod whose claim's network data was not written."""
        self._warn_pod(pod, CLAIM_STATUS_NOT_WRITTEN, message)

    def _warn_pod(self, pod: PodKey, reason: str, message: str) -> None:
        """A Warning Event on a pod, sent in the background (no-op without events)."""
        if self.events is None:
            return
        node = self.options.node_name
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace,
                    "name": pod.name, "uid": pod.uid}
        self.events.send(event_body(involved, pod.namespace, reason, message, type_=WARNING,
                                    component=EVENT_COMPONENT, instance=node, host=node,
                                    now=event_time()))

    async def _serve_metrics(self) -> None:
        listen = self.options.metrics_listen
        if listen is None:
            return
        server = MetricsServer(self.metrics.registry, *listen)
        await server.start()
        self.metrics_server = server
        log.info("metrics on http://%s:%d/metrics", server.host, server.port)

    def _device_status(self) -> NodeTopologyStatus | None:
        """What the device gauges read at a scrape: the status the NodeTopology reports."""
        return self.node_status() if self.admission is not None else None

    # ------------------------------------------------------------------ registration

    def _on_folder_change(self, names: set[str]) -> None:
        ours = {os.path.basename(ep.socket_path) for ep in self.endpoints.values()}
        if KUBELET_SOCKET in names and os.path.exists(self.paths.kubelet_socket):
            self._kubelet_back = True
        if names & (ours | {KUBELET_SOCKET, ""}):
            self._kick()

    def _kick(self) -> None:
        self._dirty = True  # a running pass looks again before it ends
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = asyncio.create_task(self._sync())

    async def _sync(self) -> None:
        """Serve every plugin whose socket is gone and register until kubelet accepts."""
        while True:
            self._dirty = False
            back, self._kubelet_back = self._kubelet_back, False
            done = [await ep.ensure(register_again=back) for ep in self.endpoints.values()]
            if all(done) and not self._dirty and not self._kubelet_back:
                return
            if not all(done):
                await asyncio.sleep(RETRY_S)

    async def _socket_poll(self) -> None:
        while True:
            await asyncio.sleep(SOCKET_POLL_S)
            if any(not os.path.exists(ep.socket_path) for ep in self.endpoints.values()):
                self._kick()

    # ------------------------------------------------------------------ health

    def _healthy_offered(self, kind: Kind) -> frozenset[str]:
        dl = self.lists.get(kind)
        if dl is None:
            return frozenset()
        return dl.ids() - dl.unhealthy

    async def _scan_health(self) -> None:
        # On the event loop, one PF (and its VFs) at a time: a slice takes ~1.5 ms with 127
        # VFs, so a kubelet call waits at most that long (a thread would hold the GIL for up
        # to the 5 ms switch interval at a time).
        bad = self.probe.unhealthy_gpus(self.topology)
        for nic in self.topology.nics:
            await asyncio.sleep(0)
            bad.update(self.probe.unhealthy_nic(nic))
        for dev, why in bad.items():
            if self.unhealthy.get(dev) != why:
                log.warning("unhealthy: %s: %s", dev, why)
        for dev in self.unhealthy.keys() - bad.keys():
            log.info("healthy again: %s", dev)
        if bad != self.unhealthy:
            self._report.set()
        self.unhealthy = bad
        for dl in self.lists.values():
            await dl.update(unhealthy=frozenset(bad))
        if self.dra is not None and await self.dra.health.update(bad.keys()):
            self._slices_due.set()  # the taints follow the health stream
        self._raise_health_events()  # after kubelet's lists: an Event is never in their way

    def _raise_health_events(self) -> None:
        """An Event on the Node for the devices that went bad and one for those that came
        back since the last told (kubelet.health_events), written in the background."""
        if self.health_changes is None or self.events is None:
            return
        news = self.health_changes.update(self.unhealthy, time.monotonic())
        if news.unhealthy:
            self._tell_node(WARNING, UNHEALTHY, unhealthy_message(news.unhealthy))
        if news.healthy:
            self._tell_node(NORMAL, HEALTHY, healthy_message(news.healthy))

    def _tell_node(self, type_: str, reason: str, message: str) -> None:
        """An Event on this agent's Node, sent in the background (no-op without events)."""
        if self.events is None:
            return
        node = self.options.node_name
        involved = {"apiVersion": "v1", "kind": "Node", "name": node}
        self.events.send(event_body(involved, EVENTS_NAMESPACE, reason, message, type_=type_,
                                    component=EVENT_COMPONENT, instance=node, host=node,
                                    now=event_time()),
                         fill=self._node_uid_into)

    async def _node_uid_into(self, body: dict) -> None:
        """The Node's uid into an Event's involvedObject, read once (nodes `get`)."""
        if self._node_uid is None:
            assert self.kube is not None
            node = await self.kube.get(f"/api/v1/nodes/{self.options.node_name}", Object)
            self._node_uid = node.metadata.uid or None
        if self._node_uid:
            body["involvedObject"]["uid"] = self._node_uid

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            try:
                await self._scan_health()
            except Exception:
                log.exception("health scan failed")

    # ------------------------------------------------------------------ DRA mode

    async def _start_dra(self) -> None:
        """Our slices built once (a node the API server would refuse stops the start), the
        DRA plugin served and registered, and the slice publisher started."""
        from railyard.kubelet.dra_plugin import DraPlugin
        from railyard.kubelet.dra_prepare import api_preparer

        assert self.kube is not None
        kube, node = self.kube, self.options.node_name
        self._dra_offered = self.dra_offered()
        self.wanted_slices()  # raises SliceLimitError now rather than in the loop
        preparer = api_preparer(self.topology, self.store, kube,
                                state_dir=self.options.state_dir, cdi_dir=self.config.dra.cdi_dir,
                                names=self.config.resources, pair_map=self.config.pair_map,
                                slices=lambda: node_slices(kube, node))
        self.dra = DraPlugin(preparer, self.paths)
        await self.dra.health.update(self.unhealthy.keys())
        await self.dra.start()
        self._slices_due.set()
        self._tasks.append(asyncio.create_task(self._slices_loop(), name="slices"))
        log.info("DRA mode: driver %s, %d devices in %d ResourceSlices", preparer.driver,
                 sum(len(s["spec"].get("devices", [])) for s in self.wanted_slices()),
                 len(self.wanted_slices()))

    def dra_offered(self) -> frozenset[str]:
        """The VFs and PFs our slices publish, by PCI address: what the config offers (the
        pools' selectors, `vfPlugin`, `pfPlugin`), as the device plugins would; a PF left out
        (a storage NIC, `pfPlugin: false`) is never in a claim."""
        cfg = self.config
        facts = self.probe.facts(self.topology)
        routed = self.probe.routed_netdevs()
        kinds: list[tuple[Kind, tuple]] = [
            ("vf" if p.resource == cfg.resources.vf else p.resource, p.selectors)
            for p in cfg.pools if cfg.vf_plugin]
        if cfg.pf_plugin:
            kinds.append(("pf", cfg.pf_pool))
        return frozenset(
            d.pci_address for kind, pool in kinds
            for d in offered_devices(self.topology, kind, pool=pool, facts=facts, routed=routed))

    def wanted_slices(self) -> list[dict]:
        return build_slices(self.topology, frozenset(self.unhealthy),
                            publish_gpus=self.config.dra.publish_gpus,
                            offered=self._dra_offered)

    async def publish_own_slices(self) -> bool:
        """Our slices made what the node has now; False when the API server was not written."""
        assert self.kube is not None
        try:
            outcome = await publish_slices(self.kube, self.options.node_name,
                                           self.wanted_slices())
        except (ApiError, ApiUnavailable) as e:
            log.warning("ResourceSlices of %s not published: %s", self.options.node_name, e)
            return False
        if outcome is not SlicesPublished.UNCHANGED:
            log.info("ResourceSlices of %s %s (%d unhealthy devices)",
                     self.options.node_name, outcome.value, len(self.unhealthy))
        self.slices_published = outcome
        return True

    async def _slices_loop(self) -> None:
        """Publish when due: at start, on a health change, when kubelet registers the plugin
        again (a kubelet restart), and every SLICES_RESYNC_S (kubelet wipes them 30 s after
        our plugin stopped answering; an agent down that long finds them gone)."""
        assert self.dra is not None
        registered = self.dra.registration.registered
        while True:
            waits = [asyncio.ensure_future(self._slices_due.wait()),
                     asyncio.ensure_future(registered.wait())]
            try:
                await asyncio.wait(waits, timeout=SLICES_RESYNC_S,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            self._slices_due.clear()
            registered.clear()  # set again by kubelet's next registration
            try:
                ok = await self.publish_own_slices()
            except Exception:
                log.exception("ResourceSlices publication failed")
                ok = False
            if not ok:
                self._slices_due.set()
                await asyncio.sleep(SLICES_RETRY_S)

    # ------------------------------------------------------------------ after Allocate

    def _after_allocate(self, pod: PodView | None, grant: ContainerGrant) -> None:
        """Device-info files for Multus (pod or not), the container's pair file and its
        mount, then a PodResources check soon."""
        folder = Path(self.config.devinfo_dir)
        for name, body in grant.devinfo.items():
            try:
                folder.mkdir(parents=True, exist_ok=True)
                write_atomic(folder / name, body.encode(), mode=0o644)
            except OSError as e:
                log.warning("device-info file %s: %s", folder / name, e.strerror or e)
        pf = grant.pair_file
        if pf is not None:
            # Before Allocate answers: kubelet bind-mounts the file when it creates the
            # container. Without it the container still starts, with every variable.
            try:
                path = self.pair_files.write(pf.uid, pf.container, pf.body)
            except (OSError, StateError) as e:
                log.warning("%s: pair file for %s not written (%s); the container gets no "
                            "%s", pod, pf.container, e, PAIRS_FILE)
            else:
                grant.mounts.append(Mount(PAIRS_FILE, str(path.resolve()), read_only=True))
        self._report.set()
        if self._verify_task is None or self._verify_task.done():
            self._verify_task = asyncio.get_running_loop().create_task(self._verify_later())

    async def _verify_later(self) -> None:
        await asyncio.sleep(self.config.verify_delay_s)
        await self._check()

    async def _check(self) -> None:
        """PodResources' word into the store, then the node's truth to the pods."""
        await self.verify()
        if self.write_back is not None:
            self._report.set()
            await self.write_back.write()

    async def _check_at_start(self) -> None:
        """The first check; records it had to make again are said: the node state folder was
        lost (or the agent is new beside running pods)."""
        had = {r.uid for r in self.store.all()}
        await self._check()
        rebuilt = [r for r in self.store.all() if r.uid not in had]
        if rebuilt:
            self._say_rebuilt(rebuilt)

    def _say_rebuilt(self, rebuilt: list[PodRecord]) -> None:
        """Log and tell on the Node (Warning `RailyardNodeStateRebuilt`) which pods' records
        came back from kubelet's PodResources and the API, and what could not: the CNI's
        record of devices an ADD moved, which only the ADD knew."""
        pods = ", ".join(str(r.pod) for r in rebuilt)
        attached = attached_pods(self.options.state_dir)
        unmoored = [r for r in rebuilt if r.allocation.all_nics and r.uid not in attached]
        message = (f"node state rebuilt from kubelet's PodResources and the API for "
                   f"{len(rebuilt)} pod(s): {pods}")
        if unmoored:
            named = ", ".join(str(r.pod) for r in unmoored)
            message += (f"; no CNI attachment record of the NICs of {named}: "
                        f"if an ADD moved them into the pod, its DEL cannot put them back "
                        f"(a VF returns to the host when the pod's network namespace goes, "
                        f"under the name the pod gave it)")
        log.warning("%s", message)
        self._tell_node(WARNING, STATE_REBUILT, message)

    async def look_for_dra(self) -> list[str]:
        """The DRA drivers with a ResourceSlice of this node that serve GPUs; when there
        are any, said once (a warning and a Node Event, `RailyardGpusAlsoServedByDra`): a
        pod claiming GPUs through DRA gets them outside Railyard's pairing and accounting."""
        assert self.kube is not None
        node = self.options.node_name
        drivers = gpu_drivers(await node_slices(self.kube, node) or [], node)
        if drivers:
            message = dra_message(drivers, self.config.resources.gpu, self.config.gpu_plugin)
            log.warning("%s", message)
            self._tell_node(WARNING, DRA_EVENT, message)
        return drivers

    def _on_corrected(self, c: Correction) -> None:
        """A record the check is correcting (in the check's thread, under the decision lock,
        just before the record is written): the containers' pair files made again before
        anything else can read them, then the Event and the write-back on the loop (decision
        0090). A crash before the record is written makes the next check do it all again,
        the Event included: said twice, never lost."""
        for f in c.files:
            try:
                self.pair_files.write(f.uid, f.container, f.body)
            except (OSError, StateError) as e:
                log.warning("%s/%s: pair file for %s not written again (%s)", c.namespace,
                            c.name, f.container, e)
        message = c.message()
        log.warning("%s", message)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._say_corrected, c, message)

    def _say_corrected(self, c: Correction, message: str) -> None:
        """The Warning Event on the pod, and its truth written back soon (cluster mode)."""
        if self.write_back is not None and (self._verify_task is None
                                            or self._verify_task.done()):
            self._verify_task = asyncio.get_running_loop().create_task(self._check())
        self._warn_pod(PodKey(c.uid, c.namespace, c.name), CORRECTED_EVENT, message)

    async def _before_start(self, resource: str, device_ids: Sequence[str]) -> None:
        """kubelet's PreStartContainer: the check, so that a correction (and the pair file
        made again) lands before the runtime creates the container and mounts the file."""
        try:
            warnings = await asyncio.wait_for(self.verify(), CHECK_BEFORE_S)
        except TimeoutError:
            log.warning("%s: PodResources check before a container start of %s timed out; "
                        "the record stands", resource, list(device_ids))
        else:
            log.info("%s: PodResources checked before the start of a container of %s (%d "
                     "warnings)", resource, ",".join(device_ids), len(warnings))

    def _verify_from_thread(self) -> None:
        """`verify` on the agent's loop, from another thread (the CNI service's); bounded,
        and a failure only logged: the ADD goes on with the record as it is."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self.verify(), loop)
        try:
            future.result(timeout=CHECK_BEFORE_S)
        except Exception as e:
            future.cancel()
            log.warning("PodResources check before a CNI call failed (%r); the record stands",
                        e)

    async def verify(self) -> list[str]:
        """Compare the store with PodResources now; the warnings it logged."""
        assert self.admission is not None
        try:
            assigned = await self.podresources.list()
        except Exception as e:  # kubelet without the socket, or restarting
            log.info("PodResources unavailable (%s); not verified", e)
            return []
        # In a worker thread: it waits for a GetPreferredAllocation that is searching.
        return await asyncio.to_thread(self.admission.check, assigned)

    # ------------------------------------------------------------------ forgetting

    def gc(self) -> list[str]:
        """Drop records of pods that are gone, but not while the CNI still has an attachment
        record of the pod: until its DEL the pod's devices are still in its namespace."""
        if not self.pods.loaded:
            return []
        live = {p.uid for p in self.pods.pods()}
        removed = []
        names = self.config.resources
        records = self.store.all()
        gone = [r for r in records if r.uid not in live]
        if gone:
            attached = attached_pods(self.options.state_dir)
            gone = [r for r in gone if r.uid not in attached]
        # Kubelet frees a finished pod's devices while its object stays, so another pod may
        # hold a VF by now; its Allocate rewrote the device-info file, which is its own.
        gone_uids = {r.uid for r in gone}
        kept = {n.pci_address for r in records if r.uid not in gone_uids
                for n in r.allocation.all_nics}
        if gone:
            self._report.set()
        for r in gone:
            self.store.remove(r.uid)
            removed.append(r.uid)
            for n in r.allocation.all_nics:
                if n.pci_address in kept:
                    continue
                resource = names.resource_of_pool(n.pool) if n.kind == "vf" else names.pf
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.config.devinfo_dir,
                                           devinfo_file_name(resource, n.pci_address)))
            self.pair_files.remove(r.uid)
            log.info("forgot %s: the pod is gone", r.pod)
        # Pair files whose pod has neither a record nor a live object (an agent stopped
        # between writing one and recording the pod, or a record removed by hand).
        recorded = {r.uid for r in records} - gone_uids
        for uid in self.pair_files.pods():
            if uid not in live and uid not in recorded:
                self.pair_files.remove(uid)
        return removed

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(GC_INTERVAL_S)
            self._report.set()  # pods that finished since: their devices are free again
            try:
                self.gc()
            except Exception:
                log.exception("state store clean-up failed")


    # ------------------------------------------------------------------ NodeTopology

    def node_status(self) -> NodeTopologyStatus:
        # Kubelet frees a finished pod's devices while its object (and our record) stays.
        done = {p.uid for p in self.pods.pods() if p.terminated}
        return node_status(self.topology, [r for r in self.store.all() if r.uid not in done],
                           self.unhealthy, utc_now(), previous=self.published or self._found)

    async def _status_found(self) -> NodeTopologyStatus | None:
        """The status a NodeTopology of this node already has (an agent before us wrote
        it): its condition times carry over, so a restart alone writes nothing."""
        assert self.kube is not None
        try:
            found = await self.kube.get(path_of(self.options.node_name), NodeTopologyObject)
            return status_from_resource(msgspec.to_builtins(found))
        except (ApiError, ApiUnavailable, NodeTopologyResourceError, msgspec.DecodeError):
            return None

    async def publish_topology(self) -> bool:
        """Create or update this node's NodeTopology (spec and status) when the status
        differs from the last one written; False when the API server could not be written."""
        assert self.kube is not None
        if self.published is None and self._found is None:
            self._found = await self._status_found()
        status = self.node_status()
        if status == self.published:
            return await self.publish_koordinator_device()
        try:
            key = self.options.signing_key
            outcome = await publish(self.kube, self.topology, status, {} if key is None else
                                    {NODE_KEY_ANNOTATION: public_key_text(key.public_key())})
        except (ApiError, ApiUnavailable) as e:
            log.warning("NodeTopology %s not published: %s", self.options.node_name, e)
            return False
        self.published = status
        log.info("NodeTopology %s %s: GPUs %s, NICs %s, VFs %s free, %s",
                 self.options.node_name, outcome.value, status.gpus.summary,
                 status.nics.summary, status.vfs.summary, status.health)
        return await self.publish_koordinator_device()

    async def publish_koordinator_device(self) -> bool:
        """Koordinator's Device CR of this node, when `koordinator.publishDevices` is on
        (decision 0095): written again only when the health it reports changed; False when the
        API server could not be written."""
        if self.kube is None or not self.config.koordinator.publish_devices:
            return True
        unhealthy = frozenset(self.unhealthy)
        if unhealthy == self._device_published:
            return True
        try:
            outcome = await publish_device(self.kube, self.topology, unhealthy)
        except (ApiError, ApiUnavailable) as e:
            log.warning("Koordinator Device %s not published: %s", self.options.node_name, e)
            return False
        self._device_published = unhealthy
        if outcome is DevicePublished.FOREIGN:
            log.warning("Koordinator Device %s exists without the %s=%s label: %s",
                        self.options.node_name, MANAGED_BY_LABEL, MANAGED_BY, outcome.value)
        else:
            log.info("Koordinator Device %s %s", self.options.node_name, outcome.value)
        return True

    async def _publish_loop(self) -> None:
        while True:
            await self._report.wait()
            self._report.clear()
            try:
                ok = await self.publish_topology()
            except Exception:
                log.exception("NodeTopology publication failed")
                ok = False
            if not ok:
                self._report.set()  # try again after a pause
            await asyncio.sleep(PUBLISH_INTERVAL_S if ok else PUBLISH_RETRY_S)


class CheckedGrants:
    """The CNI's grants, each looked up after `before` (the PodResources check)."""

    def __init__(self, grants: Grants, before: Callable[[], None]) -> None:
        self.grants, self.before = grants, before

    def grant(self, pod: PodArgs) -> Grant | None:
        self.before()
        return self.grants.grant(pod)


async def run_until_stopped(agent: Agent, stop: asyncio.Event) -> None:
    try:
        await agent.start()
    except BaseException:
        await agent.stop()  # what started before the failure: sockets, the API session
        raise
    try:
        await stop.wait()
    finally:
        await agent.stop()
