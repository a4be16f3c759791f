"""The shapes of API objects the client decodes, as msgspec Structs: only the fields Railyard
reads, so a pod costs what we use of it, not the whole object (decision 0071). Unknown fields
are skipped by the decoder without building them."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

import msgspec


class OwnerReference(msgspec.Struct, rename="camel", omit_defaults=True):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(msgspec.Struct, rename="camel", omit_defaults=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    owner_references: list[OwnerReference] = []
    deletion_timestamp: str | None = None


class HasMeta(Protocol):
    """What the reflector needs of an object: its metadata."""

    @property
    def metadata(self) -> ObjectMeta: ...


class Object(msgspec.Struct):
    """Any object, metadata only (bookmarks, deletions, objects read for their name)."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")


T = TypeVar("T")


class ObjectList(msgspec.Struct, Generic[T]):
    metadata: ListMeta
    items: list[T] = []


class WatchEvent(msgspec.Struct):
    """One line of a watch stream; `object` is decoded by type once the event type is known
    (a BOOKMARK carries only metadata, an ERROR a Status)."""

    type: str
    object: msgspec.Raw


class Status(msgspec.Struct, omit_defaults=True):
    """The API's error body (metav1.Status)."""

    code: int = 0
    reason: str = ""
    message: str = ""


# A small pod, as the services read it: resource limits, node, phase, annotations.


class ResourceRequirements(msgspec.Struct, omit_defaults=True):
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}


class Container(msgspec.Struct, omit_defaults=True):
    name: str
    resources: ResourceRequirements = msgspec.field(default_factory=ResourceRequirements)


class PodSpec(msgspec.Struct, rename="camel", omit_defaults=True):
    node_name: str = ""
    scheduler_name: str = ""
    containers: list[Container] = []
    init_containers: list[Container] = []


class PodStatus(msgspec.Struct, omit_defaults=True):
    phase: str = ""


class Pod(msgspec.Struct, omit_defaults=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class NodeTopologyObject(msgspec.Struct, omit_defaults=True):
    """A NodeTopology CR as it comes off the wire; `records.nodetopology_cr` decodes its
    spec and status into the topology model."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: dict[str, Any] = {}
    status: dict[str, Any] = {}
