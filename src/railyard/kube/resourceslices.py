"""DRA ResourceSlices of one node, read raw: the agent looks for drivers that serve GPUs
beside it (decision 0090), and in DRA mode publishes its own (`publish_slices`, decision
0111), so no typed model of the (still moving) resource.k8s.io API.

The API server serves the `resource.k8s.io` versions of its release: the newest is asked
first and a 404 moves on to the next; none served means no DRA on the cluster.
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any

import msgspec

from railyard.kube.client import ApiError, ApiUnavailable, Client
from railyard.kube.objects import Object
from railyard.records.dra_names import DRIVER

log = logging.getLogger(__name__)

VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first


def path_of(version: str) -> str:
    return f"/apis/resource.k8s.io/{version}/resourceslices"


async def node_slices(client: Client, node: str) -> list[Any] | None:
    """The ResourceSlices whose `spec.nodeName` is `node`, as JSON values; [] when the API
    server serves no DRA; None when they could not be read (forbidden, unreachable)."""
    for version in VERSIONS:
        try:
            body = await client.request("GET", path_of(version),
                                        params={"fieldSelector": f"spec.nodeName={node}"})
        except ApiError as e:
            if e.not_found:
                continue  # this version is not served: an older one may be
            log.info("ResourceSlices not read (%s)", e)
            return None
        except ApiUnavailable as e:
            log.info("ResourceSlices not read (%s)", e)
            return None
        try:
            listed = msgspec.json.decode(body)
        except msgspec.DecodeError:
            listed = None
        items = listed.get("items") if isinstance(listed, dict) else None
        if not isinstance(items, list):
            log.info("ResourceSlices: %s did not answer a list", path_of(version))
            return None
        return items
    return []


# ----------------------------------------------------------------------- our own slices

COLLECTION = path_of("v1")
ATTEMPTS = 3


class SlicesPublished(Enum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


def _ours(node: str) -> dict[str, str]:
    """Exactly our slices of this node: kubelet wipes a driver's slices by the same two
    fields (spec.driver, spec.nodeName), and no other driver's slice can match them."""
    return {"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"}


async def own_slices(client: Client, node: str) -> list[dict[str, Any]]:
    """Our ResourceSlices of `node` as the API server holds them."""
    body = await client.request("GET", COLLECTION, params=_ours(node))
    listed = msgspec.json.decode(body)
    items = listed.get("items") if isinstance(listed, dict) else None
    return [i for i in items or () if isinstance(i, dict)]


# Fields of ours whose absence says something (a taint gone, a counter no longer consumed),
# and maps whose every key is ours (an attribute or a counter dropped): a stored one that we
# no longer write is a change, not a server default.
_OWN_FIELDS = frozenset({"devices", "sharedCounters", "attributes", "consumesCounters",
                         "taints", "capacity"})
_OWN_MAPS = frozenset({"attributes", "counters", "labels"})


def _holds(stored: Any, wanted: Any, whole: bool = False) -> bool:
    """`stored` says exactly what `wanted` does, where the server may add defaults and stamps
    (a taint's `timeAdded`): only what we write is compared, but a field or map key of ours
    that we no longer write (`_OWN_FIELDS`, `_OWN_MAPS`) differs; lists item by item."""
    if isinstance(wanted, dict):
        if not isinstance(stored, dict):
            return False
        extra = set(stored) - set(wanted)
        if extra and (whole or extra & _OWN_FIELDS):
            return False
        return all(_holds(stored.get(k), v, k in _OWN_MAPS) for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(stored, list) and len(stored) == len(wanted) and all(
            _holds(s, w) for s, w in zip(stored, wanted, strict=True))
    return bool(stored == wanted)


def _spec_without_generation(spec: Any) -> Any:
    if not isinstance(spec, dict):
        return spec
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        pool = {}
    return {**spec, "pool": {k: v for k, v in pool.items() if k != "generation"}}


def _generation(obj: dict[str, Any]) -> int:
    g = (obj.get("spec") or {}).get("pool", {}).get("generation")
    return g if isinstance(g, int) else 0


def unchanged(stored: list[dict[str, Any]], wanted: list[dict[str, Any]]) -> bool:
    """The API server already holds exactly `wanted` (names, specs, labels), all of one
    generation: nothing to write."""
    by_name = {s.get("metadata", {}).get("name"): s for s in stored}
    if set(by_name) != {w["metadata"]["name"] for w in wanted}:
        return False
    if len({_generation(s) for s in stored}) > 1:
        return False
    return all(_holds(_spec_without_generation(by_name[w["metadata"]["name"]].get("spec")),
                      _spec_without_generation(w["spec"]))
               and _holds(by_name[w["metadata"]["name"]].get("metadata"),
                          {"labels": w["metadata"].get("labels", {})})
               for w in wanted)


async def publish_slices(client: Client, node: str,
                         wanted: list[dict[str, Any]]) -> SlicesPublished:
    """Make our slices of `node` exactly `wanted` (`records.dra_slices.node_slices`, any
    generation): nothing written when they already are; else every one written at one
    generation above the highest stored, stale ones deleted. A conflict (someone wrote
    or deleted one meanwhile) reads them again and tries again."""
    for _ in range(ATTEMPTS - 1):
        try:
            return await _publish_once(client, node, wanted)
        except ApiError as e:
            if not (e.conflict or e.not_found):
                raise
            log.info("ResourceSlices of %s changed while written (%s); reading them again",
                     node, e)
    return await _publish_once(client, node, wanted)


async def _publish_once(client: Client, node: str,
                        wanted: list[dict[str, Any]]) -> SlicesPublished:
    if any(w["spec"].get("driver") != DRIVER or w["spec"].get("nodeName") != node
           for w in wanted):
        raise ValueError(f"publish_slices writes {DRIVER}'s slices of node {node} only")
    stored = await own_slices(client, node)
    if unchanged(stored, wanted):
        return SlicesPublished.UNCHANGED
    generation = max((_generation(s) for s in stored), default=0) + 1
    by_name = {s.get("metadata", {}).get("name"): s for s in stored}
    owner: list[dict[str, Any]] | None = None
    for w in wanted:
        name = w["metadata"]["name"]
        body = {**w, "spec": {**w["spec"], "pool": {**w["spec"]["pool"],
                                                    "generation": generation}}}
        old = by_name.get(name)
        if old is None:
            if owner is None:
                owner = await _node_owner(client, node)
            body["metadata"] = {**body["metadata"], "ownerReferences": owner}
            await client.create(COLLECTION, body, Object)
        else:
            meta = old.get("metadata", {})
            body["metadata"] = {**body["metadata"],
                                "resourceVersion": meta.get("resourceVersion"),
                                "ownerReferences": meta.get("ownerReferences") or []}
            await client.put(f"{COLLECTION}/{name}", body, Object)
    for name in set(by_name) - {w["metadata"]["name"] for w in wanted}:
        try:
            await client.delete(f"{COLLECTION}/{name}")
        except ApiError as e:
            if not e.not_found:
                raise
    return SlicesPublished.UPDATED if stored else SlicesPublished.CREATED


async def _node_owner(client: Client, node: str) -> list[dict[str, Any]]:
    """The Node as the slices' owner, so they go when it goes (as kubelet's own helper for
    DRA drivers does)."""
    obj = await client.get(f"/api/v1/nodes/{node}", Object)
    return [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": obj.metadata.uid,
             "controller": True}]
