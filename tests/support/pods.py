"""The one v1 Pod builder for tests: a pod as kube-scheduler sends it to the extender, or as a
pods file lists it for the agent (bound to a node, with a phase and a recorded allocation)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.allocation.types import Allocation
from railyard.records.allocation import encode_allocation


def pod(uid: str, containers: Mapping[str, Mapping[str, int | str]], *,
        name: str | None = None, namespace: str = "default", node: str | None = None,
        phase: str | None = None, created: str | None = None,
        alloc: Allocation | None = None, annotation: str | None = None,
        hints: dict | None = None, scheduler_name: str | None = None,
        image: str | None = None) -> dict[str, Any]:
    """`containers`: container name → resource limits (device counts, or quantities such as
    "4" CPUs and "16Gi"), in order. `alloc` (or a raw `annotation`) is the recorded decision,
    `hints` the pod's request annotation; fields left None stay out of the object."""
    annotations: dict[str, str] = {}
    if alloc is not None:
        annotations[ALLOCATION_ANNOTATION] = encode_allocation(alloc)
    if annotation is not None:
        annotations[ALLOCATION_ANNOTATION] = annotation
    if hints is not None:
        annotations["railyard.dev/request"] = json.dumps(hints)
    meta: dict[str, Any] = {"name": name or uid, "namespace": namespace, "uid": uid,
                            "annotations": annotations}
    if created is not None:
        meta["creationTimestamp"] = created
    spec: dict[str, Any] = {"containers": [
        {"name": c, **({"image": image} if image else {}),
         "resources": {"limits": {r: str(n) for r, n in limits.items()}}}
        for c, limits in containers.items()]}
    if scheduler_name is not None:
        spec["schedulerName"] = scheduler_name
    if node is not None:
        spec["nodeName"] = node
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if phase is not None:
        out["status"] = {"phase": phase}
    return out


def asking(uid: str, gpus: int = 0, vfs: int = 0, pfs: int = 0, *, name: str | None = None,
           namespace: str = "default", hints: dict | None = None) -> dict[str, Any]:
    """A pod as kube-scheduler sends it to the extender: one container asking for the given
    devices (limits, as users write them) beside 4 CPUs and 16Gi, not yet bound."""
    limits: dict[str, int | str] = {"cpu": "4", "memory": "16Gi"}
    for resource, n in (("nvidia.com/gpu", gpus), ("railyard.dev/vf", vfs),
                        ("railyard.dev/pf", pfs)):
        if n:
            limits[resource] = n
    return pod(uid, {"main": limits}, name=name or f"pod-{uid}", namespace=namespace,
               hints=hints, scheduler_name="default-scheduler", image="nccl-tests")
