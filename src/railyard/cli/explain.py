"""`railyard explain NAMESPACE/NAME`: why a pod got what it got, or why it is Pending.

Asks the live cluster, through Railyard's own client: the pod (its record, decoded by the one
codec), the pod's Events (kube-scheduler's FailedScheduling messages carry the extender's
reasons per node; Railyard's own Events), and the NodeTopology of its node (health, what is
free) — or, for a pod on no node yet, every node's NodeTopology in brief. Reading only:
`gather` fetches, `render` is a pure function of what it fetched (docs/observability.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from railyard.cli.app import app, fail

# Nodes listed for a pod on no node yet; the rest are counted.
MAX_NODES = 10


class EventSource(msgspec.Struct, omit_defaults=True):
    component: str = ""
    host: str = ""


class Event(msgspec.Struct, rename="camel", omit_defaults=True):
    """A core v1 Event, the fields `explain` reads."""

    reason: str = ""
    message: str = ""
    type: str = ""
    count: int = 0
    first_timestamp: str | None = None
    last_timestamp: str | None = None
    event_time: str | None = None
    source: EventSource = msgspec.field(default_factory=EventSource)
    reporting_component: str = ""

    @property
    def when(self) -> str:
        return self.last_timestamp or self.event_time or self.first_timestamp or ""

    @property
    def component(self) -> str:
        return self.reporting_component or self.source.component


class PodCondition(msgspec.Struct, omit_defaults=True):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""


class PodStatus(msgspec.Struct, omit_defaults=True):
    phase: str = ""
    conditions: list[PodCondition] = []


class PodConditions(msgspec.Struct, omit_defaults=True):
    """What `explain` reads of a pod beyond the services' small pod: its conditions."""

    status: PodStatus = msgspec.field(default_factory=PodStatus)


@dataclass
class Facts:
    """What the cluster said about one pod; `None`/empty where it said nothing."""

    pod: Any  # railyard.kube.objects.Pod
    status: PodStatus
    events: list[Event] = field(default_factory=list)
    node_topology: dict[str, Any] | None = None  # the pod's node's NodeTopology object
    node_topology_error: str | None = None
    nodes: list[dict[str, Any]] = field(default_factory=list)  # every NodeTopology, if pending


def parse_pod_name(text: str, default_namespace: str) -> tuple[str, str]:
    namespace, sep, name = text.rpartition("/")
    if not sep:
        namespace = default_namespace
    if not name or "/" in namespace:
        raise ValueError(f"POD {text!r}: expected NAMESPACE/NAME or NAME")
    return namespace or default_namespace, name


async def gather(client: Any, namespace: str, name: str) -> Facts:
    """The pod, its Events and the NodeTopology (or all of them, for a pod on no node)."""
    from railyard.kube.client import ApiError
    from railyard.kube.nodetopology import COLLECTION, path_of
    from railyard.kube.objects import NodeTopologyObject, Pod

    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    raw = await client.request("GET", path)
    pod = msgspec.json.decode(raw, type=Pod)
    facts = Facts(pod, msgspec.json.decode(raw, type=PodConditions).status)
    selector = (f"involvedObject.uid={pod.metadata.uid}" if pod.metadata.uid
                else f"involvedObject.name={name},involvedObject.kind=Pod")
    events, _ = await client.list(f"/api/v1/namespaces/{namespace}/events", Event,
                                  params={"fieldSelector": selector})
    facts.events = sorted(events, key=lambda e: e.when)
    node = pod.spec.node_name
    if node:
        try:
            got = await client.get(path_of(node), NodeTopologyObject)
            facts.node_topology = msgspec.to_builtins(got)
        except ApiError as e:
            facts.node_topology_error = (f"no NodeTopology {node}: is the agent running there?"
                                         if e.not_found else str(e))
    else:
        listed, _ = await client.list(COLLECTION, NodeTopologyObject)
        facts.nodes = [msgspec.to_builtins(o) for o in listed]
    return facts


def _railyard_resources(pod: Any, managed: tuple[str, ...]) -> list[str]:
    want: dict[str, int] = {}
    for c in pod.spec.containers:
        for r, v in c.resources.limits.items():
            if r in managed and str(v).isdigit():
                want[r] = want.get(r, 0) + int(v)
    return [f"{r}={n}" for r, n in sorted(want.items())]


def _node_status(obj: dict[str, Any]) -> tuple[Any, str]:
    """A NodeTopology's status decoded by its codec, and the line that says it."""
    from railyard.records.nodetopology_cr import NodeTopologyResourceError, status_from_resource

    try:
        st = status_from_resource(obj)
    except NodeTopologyResourceError as e:
        return None, f"status unreadable: {e}"
    if st is None:
        return None, "no status published yet"
    text = (f"GPUs {st.gpus.summary} free, VFs {st.vfs.summary} free, NICs {st.nics.summary} "
            f"free; {st.health}")
    if st.unhealthy:
        text += ": " + ", ".join(f"{d.pci_address} ({d.reason})" for d in st.unhealthy)
    return st, text


def _affinity_line(record: Any) -> str:
    """The pod's `preferDistance` and what it achieved (decision 0091)."""
    a = record.affinity
    line = (f"affinity: preferred {a.preferred.name}, achieved {a.achieved.name}: "
            + (f"fell back (the node had no placement within {a.preferred.name} free)"
               if a.fell_back else "met"))
    worst = record.worst_distance
    if worst is not None and worst != a.achieved:  # the node re-paired the record since
        line += f"; the pairs recorded now have worst {worst.name}"
    return line


def render(facts: Facts) -> list[str]:
    """The explanation, one line each; a pure function of `facts`."""
    from railyard.allocation.names import ALLOCATION_ANNOTATION, DEFAULT_RESOURCES
    from railyard.records.allocation import RecordError, decode_allocation

    pod = facts.pod
    meta = pod.metadata
    node = pod.spec.node_name
    out = [f"pod {meta.namespace}/{meta.name} (uid {meta.uid or '?'}): "
           f"{facts.status.phase or 'no phase'}, "
           + (f"on node {node}" if node else "on no node yet")
           + f", scheduler {pod.spec.scheduler_name or 'default-scheduler'}"]
    wants = _railyard_resources(pod, DEFAULT_RESOURCES.managed)
    out.append("asks for " + (", ".join(wants) if wants else
                              "no Railyard resource (" + ", ".join(
                                  sorted(DEFAULT_RESOURCES.managed)) + ")"))
    raw = meta.annotations.get(ALLOCATION_ANNOTATION)
    record = None
    if raw is None:
        out.append(f"record: none ({ALLOCATION_ANNOTATION} is not set)"
                   + (": the pod bypassed the extender, or asks for no Railyard device"
                      if node else ""))
    else:
        try:
            record = decode_allocation(raw, ALLOCATION_ANNOTATION)
        except RecordError as e:
            out.append(f"record: unreadable: {e}")
    if record is not None:
        who = ("the extender (decidedBy: scheduler)" if record.decided_by == "scheduler" else
               "the node's agent (decidedBy: node): the node's truth, rewritten where kubelet "
               "gave other devices than the extender recorded, or the pod had no usable record")
        out.append(f"record: decided by {who}"
                   + (f" at {record.decided_at}" if record.decided_at else "")
                   + f", node {record.node}, NUMA {list(record.numa_nodes)}"
                   + (f", CPUs {record.cpus}" if record.cpus else ""))
        for i, p in enumerate(record.pairs):
            nic = p.nic
            name = nic.rdma_device or nic.netdev or ""
            out.append(f"  pair {i}: GPU {p.gpu.index} ({p.gpu.pci_address}) <-> "
                       f"{nic.kind.upper()} {nic.pci_address}"
                       + (f" [{name}]" if name else "") + f" {p.distance.name}")
        for nic in record.nics:
            out.append(f"  unpaired {nic.kind.upper()} {nic.pci_address}")
        for g in record.gpus:
            out.append(f"  unpaired GPU {g.index} ({g.pci_address})")
        worst = record.worst_distance
        if worst is not None:
            out.append(f"  worst pair distance {worst.name}, sum "
                       f"{sum(int(p.distance) for p in record.pairs)}")
        if record.affinity is not None:
            out.append("  " + _affinity_line(record))
        if node and record.node != node:
            out.append(f"  the record names node {record.node}, but the pod is on {node}")
    if node:
        if facts.node_topology is not None:
            st, text = _node_status(facts.node_topology)
            out.append(f"node {node}: {text}")
            bad = {d.pci_address for d in st.unhealthy} if st is not None else set()
            named = ({g.pci_address for g in record.all_gpus}
                     | {n.pci_address for n in record.all_nics}) if record else set()
            if bad & named:
                out.append(f"  the record names unhealthy devices: {sorted(bad & named)}")
        elif facts.node_topology_error:
            out.append(f"node {node}: {facts.node_topology_error}")
    else:
        cond = [c for c in facts.status.conditions if c.type == "PodScheduled"]
        if cond and cond[0].status == "False":
            out.append(f"not scheduled: {cond[0].reason}: {cond[0].message}")
        out.append(f"{len(facts.nodes)} node(s) publish a NodeTopology"
                   + (":" if facts.nodes else ": no agent runs, or none has published"))
        for o in facts.nodes[:MAX_NODES]:
            out.append(f"  {o.get('metadata', {}).get('name', '?')}: {_node_status(o)[1]}")
        if len(facts.nodes) > MAX_NODES:
            out.append(f"  ... and {len(facts.nodes) - MAX_NODES} more")
    scheduling = [e for e in facts.events if e.reason == "FailedScheduling"]
    ours = [e for e in facts.events if e.component.startswith("railyard")]
    if scheduling:
        out.append("kube-scheduler (the extender's reasons per node are in its message):")
        out += [f"  {e.when} FailedScheduling"
                + (f" (x{e.count})" if e.count > 1 else "") + f": {e.message}"
                for e in scheduling[-5:]]
    bound = [e for e in facts.events if e.reason == "Scheduled"]
    if bound:
        out.append(f"kube-scheduler: {bound[-1].message}")
    if ours:
        out.append("Railyard's events:")
        out += [f"  {e.when} {e.type} {e.reason} ({e.component}): {e.message}" for e in ours]
    return out


@app.command()
def explain(
    pod: Annotated[str, typer.Argument(
        metavar="POD", help="NAMESPACE/NAME (or NAME in the kubeconfig context's namespace).")],
    kubeconfig: Annotated[Path | None, typer.Option(
        "--kubeconfig", metavar="PATH",
        help="The cluster's kubeconfig; without it, the in-cluster service account.")] = None,
) -> None:
    """Why a pod got its devices, or why it is Pending: its record, the node's truth, the
    extender's reasons (kube-scheduler's events), its node's NodeTopology."""
    import asyncio

    from railyard.kube.client import ApiError, ApiUnavailable, Client
    from railyard.kube.config import KubeConfigError, load

    try:
        config = load(kubeconfig)
    except KubeConfigError as e:
        fail(f"{e} (give --kubeconfig PATH)")
    try:
        namespace, name = parse_pod_name(pod, config.namespace)
    except ValueError as e:
        fail(str(e))

    async def main() -> Facts:
        async with Client(config, user_agent="railyard-explain") as client:
            return await gather(client, namespace, name)

    try:
        facts = asyncio.run(main())
    except ApiError as e:
        fail(f"pod {namespace}/{name} not found" if e.not_found and "/pods/" in str(e)
             else str(e), code=1)
    except ApiUnavailable as e:
        fail(f"cannot reach the API server: {e}", code=1)
    for line in render(facts):
        print(line)
