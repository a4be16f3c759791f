"""The node's pods as the device plugins see them: `PodView`, parsed once from a v1 Pod, and
where they come from (the `PodSource` seam and its pods-file implementation).

The resolver never sees raw Pods: `pod_view` validates the few fields it reads and keeps a
malformed allocation record as an error string (the pod is still a pod; it just has no usable
record), so one bad annotation never stops admission of the others.

The pods file is a JSON list of v1 Pods, or a PodList, written by someone else (a test, a
sidecar that mirrors the API server); it is input only. It is re-read whenever it changed
(an mtime/size check on every lookup, so a pod written just before kubelet asks is seen),
and a file that does not parse keeps the last good list and logs why. The Kubernetes API
source is `railyard.kubelet.apipods`, behind the same Protocol.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from railyard.allocation.names import ALLOCATION_ANNOTATION, DEFAULT_RESOURCES, ResourceNames
from railyard.allocation.request import Request, RequestError, parse_quantity, request_from_pod
from railyard.allocation.types import Allocation
from railyard.records.allocation import RecordError, decode_allocation
from railyard.records.fields import FieldError, clipped, pod_namespace
from railyard.records.signature import TRUST_ALL, RecordTrust

log = logging.getLogger(__name__)


class PodError(ValueError):
    """A Pod object the agent cannot use at all (no UID, no name); names the field."""

    def __init__(self, message: str) -> None:
        super().__init__(clipped(message))


@dataclass(frozen=True, slots=True)
class ContainerView:
    name: str
    devices: tuple[tuple[str, int], ...]  # (resource, count), managed resources only
    init: bool = False  # from spec.initContainers
    sidecar: bool = False  # an init container with restartPolicy Always: runs all along

    def count(self, resource: str) -> int:
        return sum(n for r, n in self.devices if r == resource)

    @property
    def passes_on(self) -> bool:
        """Kubelet lets later containers reuse this container's devices: it has finished
        before they start (an ordinary init container; not a sidecar)."""
        return self.init and not self.sidecar


@dataclass(frozen=True, slots=True)
class PodView:
    uid: str
    namespace: str
    name: str
    node_name: str | None
    phase: str  # "Pending" when the status says nothing
    deleting: bool
    created: str  # metadata.creationTimestamp (RFC 3339 sorts as text), "" when absent
    containers: tuple[ContainerView, ...]  # spec.containers
    allocation: Allocation | None  # the recorded decision (annotation), when valid
    allocation_error: str | None  # why the annotation could not be used
    request: Request | None  # the pod-level request; None when unparsable
    request_error: str | None
    raw: dict[str, Any]
    init_containers: tuple[ContainerView, ...] = ()  # spec.initContainers, sidecars included
    problems: tuple[str, ...] = ()  # fields read as absent because they were malformed
    # `allocation` is the node's pairing of Koordinator's device-allocated (decision 0095),
    # not yet a Railyard record on the pod: the write-back puts it there.
    from_koordinator: bool = False

    @property
    def admission_order(self) -> tuple[ContainerView, ...]:
        """The order kubelet allocates devices in: init containers, then app containers."""
        return self.init_containers + self.containers

    def container(self, name: str) -> ContainerView | None:
        return next((c for c in self.admission_order if c.name == name), None)

    def total(self, resource: str) -> int:
        """How many distinct devices of `resource` kubelet gives the pod.

        Kubelet's device manager hands a container the devices that finished init containers
        left behind first (`devicesToReuse`) and only the rest fresh; a sidecar's or an app
        container's devices are its own from then on. So app containers and sidecars add up,
        and an ordinary init container costs only what exceeds what is free to reuse.
        """
        total = reusable = 0
        for c in self.admission_order:
            n = c.count(resource)
            reused = min(n, reusable)
            total += n - reused
            reusable += n - reused if c.passes_on else -reused
        return total

    @property
    def pending(self) -> bool:
        return self.phase == "Pending" and not self.deleting

    @property
    def terminated(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def _container(c: Any, where: str, names: ResourceNames, init: bool = False) -> ContainerView:
    if not isinstance(c, dict) or not isinstance(c.get("name"), str):
        raise PodError(f"{where}.name: missing")
    res = c.get("resources") or {}
    counts: dict[str, int] = {}
    if isinstance(res, dict):
        for section in ("limits", "requests"):  # extended resources: requests == limits
            values = res.get(section) or {}
            if not isinstance(values, dict):
                continue
            for r in names.managed:
                if r in values:
                    try:
                        q = parse_quantity(values[r], f"{where}.resources.{section}[{r}]")
                    except RequestError:
                        continue
                    if q.denominator == 1 and q > 0:
                        counts[r] = int(q)
    return ContainerView(c["name"], tuple(sorted(counts.items())), init=init,
                         sidecar=init and c.get("restartPolicy") == "Always")


def _object(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """`parent[key]` when it is an object, else an empty one."""
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _list(parent: dict[str, Any], key: str) -> list[Any]:
    """`parent[key]` when it is a list, else an empty one."""
    value = parent.get(key)
    return value if isinstance(value, list) else []


def pod_view(pod: Any, names: ResourceNames = DEFAULT_RESOURCES,
             trust: RecordTrust = TRUST_ALL) -> PodView:
    """Parse a v1 Pod; PodError only when the pod cannot be identified at all. A record
    `trust` does not believe (decision 0087) is no record, its reason the allocation_error."""
    if not isinstance(pod, dict):
        raise PodError("pod: expected an object")
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        raise PodError("metadata: missing")
    for key in ("uid", "name"):
        if not isinstance(meta.get(key), str) or not meta[key]:
            raise PodError(f"metadata.{key}: missing")
    spec = _object(pod, "spec")
    status = _object(pod, "status")
    containers = _list(spec, "containers")
    views = tuple(_container(c, f"spec.containers[{i}]", names) for i, c in enumerate(containers))
    inits = _list(spec, "initContainers")
    init_views = tuple(_container(c, f"spec.initContainers[{i}]", names, init=True)
                       for i, c in enumerate(inits))
    annotations = _object(meta, "annotations")
    allocation = alloc_error = None
    raw_alloc = annotations.get(ALLOCATION_ANNOTATION)
    if raw_alloc is not None:
        if not isinstance(raw_alloc, str):
            alloc_error = f"{ALLOCATION_ANNOTATION}: expected a JSON string"
        else:
            try:
                allocation = decode_allocation(raw_alloc, ALLOCATION_ANNOTATION)
            except RecordError as e:
                alloc_error = str(e)
            why = trust.refusal(raw_alloc, meta["uid"]) if allocation is not None else None
            if why is not None:
                allocation, alloc_error = None, f"{ALLOCATION_ANNOTATION}: {why}"
    request = request_error = None
    try:
        request = request_from_pod(pod, names)
    except RequestError as e:
        request_error = str(e)
    try:
        namespace = pod_namespace(meta)
    except FieldError as e:
        raise PodError(str(e)) from None
    node = spec.get("nodeName")
    phase = status.get("phase")
    problems = []
    created = meta.get("creationTimestamp")
    if created is not None and not isinstance(created, str):
        # Candidates are ordered by it as text; one number here must not break that order.
        problems.append(f"metadata.creationTimestamp: expected an RFC 3339 string, got "
                        f"{type(created).__name__}; read as absent")
        created = None
    return PodView(
        uid=meta["uid"],
        namespace=namespace,
        name=meta["name"],
        node_name=node if isinstance(node, str) and node else None,
        phase=phase if isinstance(phase, str) and phase else "Pending",
        deleting=meta.get("deletionTimestamp") is not None,
        created=created or "",
        containers=views,
        allocation=allocation,
        allocation_error=alloc_error,
        request=request,
        request_error=request_error,
        raw=pod,
        init_containers=init_views,
        problems=tuple(problems),
    )


# ----------------------------------------------------------------------- where pods come from


class PodSource(Protocol):
    def pods(self) -> Sequence[PodView]:
        """The pods known now (cheap to call on every kubelet request)."""
        ...

    @property
    def loaded(self) -> bool:
        """True once a list was read; until then absence of a pod means nothing."""
        ...

    async def look_up(self) -> bool:
        """Read the pods once more, now, for a pod kubelet asks about that is not known yet;
        True when something new was found. Bounded in time and never raises."""
        ...


class PodsFileError(ValueError):
    """The pods file cannot be used; names the file and the field."""


def parse_pods(data: object, names: ResourceNames = DEFAULT_RESOURCES,
               where: str = "pods") -> tuple[list[PodView], list[str]]:
    """Pods from a JSON list or a PodList; unusable items become warnings, not failures."""
    if isinstance(data, dict):
        if data.get("kind") not in (None, "PodList", "List") or "items" not in data:
            raise PodsFileError(f"{where}: expected a list of Pods or a PodList")
        items = data["items"]
    else:
        items = data
    if not isinstance(items, list):
        raise PodsFileError(f"{where}: expected a list of Pods or a PodList")
    pods, warnings = [], []
    for i, item in enumerate(items):
        try:
            view = pod_view(item, names)
        except PodError as e:
            warnings.append(f"{where}[{i}]: {e}; pod ignored")
            continue
        pods.append(view)
        warnings += [f"{where}[{i}] ({view}): {p}" for p in view.problems]
    return pods, warnings


class PodsFile:
    """A `PodSource` over one JSON file."""

    def __init__(self, path: str | os.PathLike[str],
                 names: ResourceNames = DEFAULT_RESOURCES) -> None:
        self.path = os.fspath(path)
        self.names = names
        self._stamp: tuple[int, int, int] | None = None
        self._pods: list[PodView] = []
        self._loaded = False
        self.generation = 0  # bumps on every successful re-read

    @property
    def loaded(self) -> bool:
        self.pods()
        return self._loaded

    async def look_up(self) -> bool:
        return False  # every pods() call already re-reads a changed file

    def pods(self) -> Sequence[PodView]:
        try:
            st = os.stat(self.path)
        except OSError as e:
            if self._stamp is not None:
                log.warning("pods file %s: %s; keeping the last list", self.path,
                            e.strerror or e)
                self._stamp = None
            return self._pods
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            self._stamp = stamp
            self._reload()
        return self._pods

    def _reload(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            pods, warnings = parse_pods(data, self.names, self.path)
        # ValueError: also bad UTF-8 and an integer past int()'s 4,300 digits.
        except (OSError, ValueError, PodsFileError) as e:
            log.warning("pods file %s unusable (%s); keeping the last list", self.path, e)
            return
        except RecursionError:  # "[[[[…" deeper than the parser's stack
            log.warning("pods file %s unusable (nested too deeply); keeping the last list",
                        self.path)
            return
        for w in warnings:
            log.warning("%s", w)
        self._pods = pods
        self._loaded = True
        self.generation += 1
