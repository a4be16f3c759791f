"""DRA ResourceSlices of one node, read raw: the agent only looks for drivers that serve GPUs
beside it (decision 0090), so no typed model of the (still moving) resource.k8s.io API.

The API server serves the `resource.k8s.io` versions of its release: the newest is asked
first and a 404 moves on to the next; none served means no DRA on the cluster.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from railyard.kube.client import ApiError, ApiUnavailable, Client

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
