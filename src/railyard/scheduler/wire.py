"""kube-scheduler's extender messages (extender/v1) as msgspec types, plus the Pod facts we use.

The Go structs have no json tags, so the keys are the Go field names, capitalised
(k8s.io/kube-scheduler/extender/v1; docs/scheduler.md). msgspec decodes the large Pod and
node lists in C and reports type errors with a JSON path, which becomes the `Error` a user reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec

from railyard.allocation.jobs import job_of
from railyard.allocation.names import DEFAULT_RESOURCES, ResourceNames
from railyard.allocation.request import Request, RequestError, request_from_pod
from railyard.records.fields import FieldError, clipped, pod_namespace


class WireError(ValueError):
    """A request kube-scheduler (or someone) sent that we cannot use; message names the field."""

    def __init__(self, message: str) -> None:
        super().__init__(clipped(message))


# The most nodes one call may name: kube-scheduler supports clusters of 5,000 nodes and sends
# at most the nodes its own filters passed (by default a share of them); 15,000 is the
# largest cluster offered anywhere. Each name costs work and a line of the answer, so a
# longer list is refused before any (docs/decisions/0078).
MAX_NODE_NAMES = 15_000
NodeNames = Annotated[list[str], msgspec.Meta(max_length=MAX_NODE_NAMES)]


class ExtenderArgs(msgspec.Struct):
    """filter and prioritize: `Nodes` (a v1 NodeList) or `NodeNames`, the other one null."""

    Pod: dict[str, Any] | None = None
    Nodes: dict[str, Any] | None = None
    NodeNames: NodeNames | None = None


class ExtenderBindingArgs(msgspec.Struct):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class MetaPod(msgspec.Struct):
    UID: str


# A count of PodDisruptionBudgets a preemption would violate: never negative.
PdbViolations = Annotated[int, msgspec.Meta(ge=0)]


class MetaVictims(msgspec.Struct):
    Pods: list[MetaPod] | None = None
    NumPDBViolations: PdbViolations = 0


class Victims(msgspec.Struct):
    Pods: list[dict[str, Any]] | None = None
    NumPDBViolations: PdbViolations = 0


class ExtenderPreemptionArgs(msgspec.Struct):
    Pod: dict[str, Any] | None = None
    NodeNameToVictims: Annotated[dict[str, Victims],
                                 msgspec.Meta(max_length=MAX_NODE_NAMES)] | None = None
    NodeNameToMetaVictims: Annotated[dict[str, MetaVictims],
                                     msgspec.Meta(max_length=MAX_NODE_NAMES)] | None = None


T = TypeVar("T")

_decoders: dict[type, msgspec.json.Decoder] = {t: msgspec.json.Decoder(t) for t in
             (ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs)}
encode = msgspec.json.Encoder().encode


def decode(body: bytes, kind: type[T]) -> T:
    try:
        return _decoders[kind].decode(body)
    except msgspec.ValidationError as e:
        raise WireError(f"{kind.__name__}: {e}") from None
    except msgspec.DecodeError as e:
        raise WireError(f"{kind.__name__}: malformed JSON: {e}") from None
    except RecursionError as e:  # msgspec recurses per level of an untyped (Pod) object
        raise WireError(f"{kind.__name__}: malformed JSON: {e}") from None


@dataclass(frozen=True, slots=True)
class PodFacts:
    uid: str
    namespace: str
    name: str
    request: Request
    resource_version: str | None = None  # same UID and version: same pod, same request
    job: str | None = None  # its job (`allocation.jobs.job_of`): one rail sequence per job


class HostPriority(msgspec.Struct):
    Host: str
    Score: int


def pod_facts(pod: dict[str, Any] | None,
              seen: Callable[[str], PodFacts | None] | None = None,
              names: ResourceNames = DEFAULT_RESOURCES) -> PodFacts:
    """UID, namespace, name and the parsed Railyard request of a v1 Pod (`names`: the
    resource names, VF pools included, the extender was told).

    `seen` looks up facts parsed before by UID; when the pod's resourceVersion is the same,
    the object is the same (kube-scheduler sends one Pod to filter, then prioritize) and
    parsing is skipped.
    """
    if pod is None:
        raise WireError("Pod: missing")
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        raise WireError("Pod.metadata: missing or not an object")
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        raise WireError("Pod.metadata.uid: missing (bind is keyed by UID)")
    version = meta.get("resourceVersion")
    version = version if isinstance(version, str) and version else None
    if seen is not None and version is not None:
        known = seen(uid)
        if known is not None and known.resource_version == version:
            return known
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise WireError("Pod.metadata.name: missing")
    try:
        namespace = pod_namespace(meta)
    except FieldError as e:
        raise WireError(f"Pod.{e}") from None
    raw = _request_key(pod)
    key = (names, raw) if raw is not None else None
    request = _requests.get(key) if key is not None else None
    if request is None:
        try:
            request = request_from_pod(pod, names)
        except RequestError as e:
            raise WireError(f"Pod {namespace}/{name}: {e}") from None
        if key is not None:
            if len(_requests) >= _REQUEST_CACHE:
                _requests.clear()
            _requests[key] = request
    return PodFacts(uid, namespace, name, request, version,
                    job_of(namespace, meta.get("labels")))


# Parsed requests by everything `request_from_pod` reads (container and init container
# resources, which init containers are sidecars, annotations): pods of one Job or
# Deployment are alike, and parsing quantities (exact fractions) costs ~0.4 ms a pod, more
# than the rest of a filter call.
_requests: dict[tuple[ResourceNames, bytes], Request] = {}
_REQUEST_CACHE = 4096


def _request_key(pod: dict[str, Any]) -> bytes | None:
    """What decides the pod's Request, as bytes; None when the pod is too odd to key (then
    it is parsed, and its errors reported, every time)."""
    try:
        spec = pod["spec"]
        meta = pod["metadata"]
        return encode((
            [c.get("resources") for c in spec["containers"]],
            [(c.get("resources"), c.get("restartPolicy"))
             for c in spec.get("initContainers") or ()],
            meta.get("annotations"),
        ))
    except (KeyError, TypeError, AttributeError, msgspec.EncodeError, RecursionError):
        return None


def node_list_names(nodes: dict[str, Any]) -> list[str]:
    """Names of a v1 NodeList's items, in order."""
    items = nodes.get("items")
    if items is None:
        return []
    if not isinstance(items, list):
        raise WireError("Nodes.items: expected a list")
    if len(items) > MAX_NODE_NAMES:
        raise WireError(f"Nodes.items: {len(items)} nodes, more than the {MAX_NODE_NAMES} "
                        f"one call may name")
    names = []
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise WireError(f"Nodes.items[{i}].metadata.name: missing")
        names.append(name)
    return names


def victim_uids(v: Victims, where: str) -> list[str]:
    uids = []
    for i, pod in enumerate(v.Pods or []):
        meta = pod.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if not isinstance(uid, str) or not uid:
            raise WireError(f"{where}.Pods[{i}].metadata.uid: missing")
        uids.append(uid)
    return uids
