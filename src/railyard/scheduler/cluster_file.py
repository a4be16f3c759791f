"""Cluster files: the nodes (by hardware profile or discovered topology) and bound pods.

Until the Kubernetes source exists, this is what feeds the extender's `ClusterState`; the
simulator builds the same thing from a short spec ("dgx-h100:32,dgx-a100:16"). Every
problem is reported as a `ClusterFileError` naming the field, before any state is built.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from railyard.allocation.types import Allocation
from railyard.discovery.profiles import DEFAULT_VFS_PER_PF, MAX_VFS_PER_PF, build_topology, profile
from railyard.records.allocation import RecordError, allocation_from_json, allocation_to_json
from railyard.records.fields import FieldError, Fields
from railyard.topology.model import NodeTopology

MAX_SPEC_NODES = 100_000  # per profile in a short spec; the extender is measured at 5,000


class ClusterFileError(FieldError):
    """A cluster file or spec that cannot be used: `path` names the field (or the spec's part,
    or the pod), `document` the file."""


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A pod the scheduler bound, with the Allocation it holds (None: no Railyard devices)."""

    namespace: str
    name: str
    uid: str
    node: str
    allocation: Allocation | None
    # Its job (`railyard.allocation.jobs.job_of`), whose pods share one rail sequence.
    job: str | None = None


@dataclass(frozen=True, slots=True)
class Cluster:
    """Node topologies plus pods already bound. Iterating yields the topologies, so a
    `Cluster` can be handed straight to `ClusterState(...)`."""

    topologies: tuple[NodeTopology, ...]
    pods: tuple[BoundPod, ...] = ()

    def __iter__(self) -> Iterator[NodeTopology]:
        return iter(self.topologies)

    def __len__(self) -> int:
        return len(self.topologies)


# ------------------------------------------------------------------------ pods


def pod_to_json(p: BoundPod) -> dict[str, Any]:
    """The `{namespace, name, uid, node, allocation}` form of cluster files, state files and
    `GET /allocations`."""
    out = {
        "namespace": p.namespace, "name": p.name, "uid": p.uid, "node": p.node,
        "allocation": allocation_to_json(p.allocation) if p.allocation is not None else None,
    }
    if p.job is not None:  # absent: no job, as every file before rails says
        out["job"] = p.job
    return out


def pod_from_json(v: Any, where: str) -> BoundPod:
    f = Fields(v, where, ClusterFileError)
    f.only(("namespace", "name", "uid", "node", "allocation", "job"))
    node = f.string("node", nonempty=True)
    raw = f.get("allocation")
    alloc = None
    if raw is not None:
        try:
            alloc = allocation_from_json(raw, f.at("allocation"))
        except RecordError as e:
            raise ClusterFileError(e.path, e.reason) from None
        if alloc.node != node:
            f.fail("allocation.node", f"{alloc.node!r} differs from the pod's node {node!r}")
    job = f.string("job", nonempty=True) if f.get("job") is not None else None
    return BoundPod(f.string("namespace", nonempty=True), f.string("name", nonempty=True),
                    f.string("uid", nonempty=True), node, alloc, job)


# ------------------------------------------------------------------------ nodes


def _profile_topology(name: str, vfs_per_pf: int, node: str,
                      built: dict[tuple[str, int], NodeTopology]) -> NodeTopology:
    """Build each (profile, vfs) once and rename it: thousands of nodes then share one set
    of immutable device tuples (and the allocator's shape key is the same for all of them)."""
    key = (name, vfs_per_pf)
    base = built.get(key)
    if base is None:
        base = built[key] = build_topology(profile(name), vfs_per_pf=vfs_per_pf, node=node)
    return base if base.node == node else dataclasses.replace(base, node=node)


def _node_from_json(v: Any, where: str,
                    built: dict[tuple[str, int], NodeTopology]) -> NodeTopology:
    f = Fields(v, where, ClusterFileError)
    f.only(("name", "profile", "vfsPerPf", "topology"))
    name = f.string("name", nonempty=True)
    if ("profile" in f) == ("topology" in f):
        f.fail("", "give exactly one of 'profile' or 'topology'")
    if "profile" in f:
        vfs = f.integer("vfsPerPf", 0, MAX_VFS_PER_PF, default=DEFAULT_VFS_PER_PF)
        profile_name = f.string("profile", nonempty=True)
        try:
            return _profile_topology(profile_name, vfs, name, built)
        except ValueError as e:
            f.fail("profile", str(e))
    if "vfsPerPf" in f:
        f.fail("vfsPerPf", "only meaningful with 'profile'")
    # The codec of `railyard discover --format json`; imported here so profile-only
    # cluster files work whatever state that module is in.
    from railyard.records.topology import TopologyFormatError, topology_from_json

    try:
        topo = topology_from_json(f.get("topology"))
    except TopologyFormatError as e:
        raise ClusterFileError(e.under(f.at("topology")).path, e.reason) from None
    except (ValueError, KeyError, TypeError) as e:
        f.fail("topology", str(e))
    return topo if topo.node == name else dataclasses.replace(topo, node=name)


def cluster_from_json(data: Any, where: str = "cluster") -> Cluster:
    """Validate a parsed cluster document: unique node names, pods on known nodes."""
    f = Fields(data, where, ClusterFileError)
    f.only(("nodes", "pods"))
    built: dict[tuple[str, int], NodeTopology] = {}
    topologies: list[NodeTopology] = []
    seen: set[str] = set()
    for i, n in enumerate(f.array("nodes")):
        t = _node_from_json(n, f"nodes[{i}]", built)
        if t.node in seen:
            raise ClusterFileError(f"nodes[{i}].name", f"duplicate node {t.node!r}")
        seen.add(t.node)
        topologies.append(t)
    pods: list[BoundPod] = []
    uids: set[str] = set()
    pods_raw = f.array("pods") if f.get("pods") is not None else []  # null: no pods
    for i, p in enumerate(pods_raw):
        pod = pod_from_json(p, f"pods[{i}]")
        if pod.node not in seen:
            raise ClusterFileError(f"pods[{i}].node", f"unknown node {pod.node!r}")
        if pod.uid in uids:
            raise ClusterFileError(f"pods[{i}].uid", f"duplicate uid {pod.uid!r}")
        uids.add(pod.uid)
        pods.append(pod)
    return Cluster(tuple(topologies), tuple(pods))


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster file, YAML or JSON (chosen by content: JSON is tried first)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ClusterFileError("", f"cannot read: {e}", document=str(p)) from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON (or too long an integer, too deep): YAML
        try:
            data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except (yaml.YAMLError, ValueError, RecursionError) as e:  # ValueError: long integer
            raise ClusterFileError("", f"neither JSON nor YAML: {e}", document=str(p)) from None
    try:
        return cluster_from_json(data)
    except ClusterFileError as e:
        raise e.in_document(str(p)) from None


def cluster_from_spec(spec: str, vfs_per_pf: int = DEFAULT_VFS_PER_PF) -> Cluster:
    """`"dgx-h100:32,dgx-a100:16"` → nodes `dgx-h100-000` … `dgx-h100-031`, `dgx-a100-000` …

    Numbers are zero-padded to at least three digits (more when a profile has ≥ 1,000 nodes),
    so names sort in creation order.
    """
    topologies: list[NodeTopology] = []
    built: dict[tuple[str, int], NodeTopology] = {}
    seen: set[str] = set()
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise ClusterFileError(f"cluster spec {spec!r}", "expected profile:count[,profile:count…]")
    for part in parts:
        name, sep, count_text = part.partition(":")
        name = name.strip()
        try:
            count = int(count_text) if sep else 1
        except ValueError:
            count = -1
        if count < 1:
            raise ClusterFileError(f"cluster spec part {part!r}",
                                   "count must be a positive integer")
        if count > MAX_SPEC_NODES:
            # A typo ("dgx-h100:5000000") would otherwise build millions of nodes in memory.
            raise ClusterFileError(f"cluster spec part {part!r}",
                                   f"at most {MAX_SPEC_NODES:,} nodes per profile")
        if name in seen:
            raise ClusterFileError(f"cluster spec part {part!r}", f"profile {name!r} given twice")
        seen.add(name)
        width = max(3, len(str(count - 1)))
        for i in range(count):
            try:
                t = _profile_topology(name, vfs_per_pf, f"{name}-{i:0{width}d}", built)
            except ValueError as e:
                raise ClusterFileError(f"cluster spec part {part!r}", str(e)) from None
            topologies.append(t)
    return Cluster(tuple(topologies))
