"""The node's pods from the API server: the `PodSource` of cluster mode, a reflector on
`spec.nodeName=<node>` (list, then watch; `railyard.kube`, decision 0071). The pods file stays
for tests and running without a cluster.

A pod is bound before kubelet admits it, so the watch has usually delivered it by the time
kubelet's first device call comes; when it has not, `look_up` reads the node's pods once
directly, bounded in time, and the call goes on with what it learnt (decision 0072).
`pods()` is a snapshot replaced whole on every change: the CNI service reads it from its
own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from railyard.allocation.names import DEFAULT_RESOURCES, ResourceNames
from railyard.kube.client import ApiError, ApiUnavailable, Client
from railyard.kube.objects import ObjectMeta
from railyard.kube.reflector import Change, Reflector, key_of
from railyard.kubelet.pods import PodError, PodView, pod_view
from railyard.records.signature import TRUST_ALL, RecordTrust

log = logging.getLogger(__name__)

PODS = "/api/v1/pods"
START_TIMEOUT_S = 30.0  # the first list: past this, the agent does not start
LOOK_UP_TIMEOUT_S = 2.0  # one direct read while kubelet waits on a device call


class PodSourceError(Exception):
    """The node's pods cannot be read at start; the message names the server and why."""


# Only what `pod_view` reads (decision 0071: a pod costs what we use of it).


class PodMeta(ObjectMeta):
    creation_timestamp: str | None = None


class PodContainer(msgspec.Struct, rename="camel", omit_defaults=True):
    name: str
    resources: dict[str, Any] = {}
    restart_policy: str | None = None


class NodePodSpec(msgspec.Struct, rename="camel", omit_defaults=True):
    node_name: str = ""
    containers: list[PodContainer] = []
    init_containers: list[PodContainer] = []


class NodePodStatus(msgspec.Struct, omit_defaults=True):
    phase: str = ""


class NodePod(msgspec.Struct, omit_defaults=True):
    metadata: PodMeta = msgspec.field(default_factory=PodMeta)
    spec: NodePodSpec = msgspec.field(default_factory=NodePodSpec)
    status: NodePodStatus = msgspec.field(default_factory=NodePodStatus)


class ApiPods:
    """A `PodSource` over the API server. `start()` lists once (a failure is
    `PodSourceError`), then watches on a task of its own until `stop()`."""

    def __init__(self, client: Client, node: str, names: ResourceNames = DEFAULT_RESOURCES,
                 *, look_up_timeout_s: float = LOOK_UP_TIMEOUT_S,
                 trust: RecordTrust = TRUST_ALL) -> None:
        self.client, self.node, self.names = client, node, names
        self.trust = trust  # which records to believe (decision 0087)
        self.params = {"fieldSelector": f"spec.nodeName={node}"}
        self.look_up_timeout_s = look_up_timeout_s
        self.reflector: Reflector[NodePod] = Reflector(client, PODS, NodePod,
                                                       on_change=self._on_change,
                                                       params=self.params)
        self._views: dict[str, PodView] = {}
        self._snapshot: tuple[PodView, ...] = ()
        self._task: asyncio.Task[None] | None = None
        self._look_up: asyncio.Task[bool] | None = None
        self.look_ups = 0  # direct reads made for pods the watch had not delivered
        # Applied to each view once set (`adopt_records`): Koordinator's records (0095).
        self.adopt: Callable[[PodView], PodView] | None = None

    @property
    def loaded(self) -> bool:
        return self.reflector.synced.is_set()

    def pods(self) -> Sequence[PodView]:
        return self._snapshot

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        where = f"pods of node {self.node} from {self.client.config.server}"
        try:
            items, version = await asyncio.wait_for(
                self.client.list(PODS, NodePod, params=self.params), timeout_s)
        except (ApiError, ApiUnavailable, msgspec.DecodeError) as e:
            raise PodSourceError(f"{where}: {e}") from None
        except TimeoutError:
            raise PodSourceError(f"{where}: no answer within {timeout_s:.0f} s") from None
        # Seed the reflector with this list: it then watches from the list's version.
        self.reflector.store = {key_of(p.metadata): p for p in items}
        self.reflector.resource_version = version
        for key, p in self.reflector.store.items():
            self._set(key, p)
        self._publish()
        self.reflector.synced.set()
        self._task = asyncio.create_task(self.reflector.run(), name="pods-watch")
        log.info("%d pods on %s from %s", len(items), self.node, self.client.config.server)

    async def stop(self) -> None:
        for task in (self._task, self._look_up):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._look_up = None

    async def look_up(self) -> bool:
        """Read the node's pods directly once (calls at the same time share one read); True
        when it found a pod the watch had not delivered. Never raises: kubelet is waiting."""
        if self._look_up is None or self._look_up.done():
            self._look_up = asyncio.create_task(self._read_now())
        try:
            return await asyncio.shield(self._look_up)
        except Exception as e:
            log.warning("pods of %s: direct read failed (%s); answering with what the watch "
                        "delivered", self.node, e)
            return False

    async def _read_now(self) -> bool:
        self.look_ups += 1
        items, _ = await asyncio.wait_for(self.client.list(PODS, NodePod, params=self.params),
                                          self.look_up_timeout_s)
        new = 0
        for p in items:
            key = key_of(p.metadata)
            if key not in self._views:
                # Into the reflector's store too: a re-list then reports it gone when it is.
                self.reflector.store.setdefault(key, p)
                new += self._set(key, p)
        if new:
            self._publish()
            log.info("pods of %s: %d pod(s) read directly before the watch delivered them",
                     self.node, new)
        return bool(new)

    def adopt_records(self, adopt: Callable[[PodView], PodView]) -> None:
        """Pass every view, those known now and those to come, through `adopt` (set once the
        node is discovered: the pods are listed before, decision 0095)."""
        self.adopt = adopt
        self._views = {key: adopt(view) for key, view in self._views.items()}
        self._publish()

    # ------------------------------------------------------------------ changes

    def _on_change(self, change: Change[NodePod]) -> None:
        if change.type == "DELETED":
            self._views.pop(change.key, None)
        else:
            self._set(change.key, change.object)
        self._publish()

    def _set(self, key: str, pod: NodePod) -> int:
        try:
            view = pod_view(msgspec.to_builtins(pod), self.names, self.trust)
        except PodError as e:
            log.warning("pod %s: %s; pod ignored", key, e)
            self._views.pop(key, None)
            return 0
        for problem in view.problems:
            log.warning("pod %s: %s", view, problem)
        self._views[key] = view if self.adopt is None else self.adopt(view)
        return 1

    def _publish(self) -> None:
        self._snapshot = tuple(self._views.values())
