"""The kube-scheduler HTTP extender: filter, prioritize, bind, preempt, plus admin endpoints.

Thin: decode the message (wire), ask the ClusterState, encode the answer. The asyncio loop
reads requests and writes answers; what asks the allocator (filter, prioritize, preempt, a
bind's allocation) runs in one worker thread, one call at a time, so a long search never
stalls `/healthz` or the other requests (docs/decisions/0077). A small filter or prioritize,
or a bind, whose answers are already known (the node groups, the allocator's memo) is
answered on the loop: it never searches there. A bind's allocate + ledger add
is atomic with respect to other binds (the state's node lock), and the only awaits besides the
worker are the writes (`ClusterWriter`), made after the devices are held and undone if they
fail. Slow or oversized requests are shed (`connections`). TLS, client certificates and the
admin call's token are opt-in (`access`, docs/decisions/0083).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import ssl
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Protocol, TypeVar

from aiohttp import web

from railyard.allocation.names import DEFAULT_RESOURCES, ResourceNames
from railyard.allocation.types import Infeasible
from railyard.records.logline import decision_line
from railyard.scheduler import metrics as m
from railyard.scheduler.access import AdminToken, client_certificates
from railyard.scheduler.cluster_file import BoundPod, pod_to_json
from railyard.scheduler.connections import GuardedSite, HttpLimits, read_body, refusals
from railyard.scheduler.metrics import Metrics
from railyard.scheduler.state import ClusterState, FilterOutcome, NeedsSearch
from railyard.scheduler.state_file import StateFile
from railyard.scheduler.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderPreemptionArgs,
    HostPriority,
    PodFacts,
    WireError,
    decode,
    encode,
    node_list_names,
    pod_facts,
    victim_uids,
)

log = logging.getLogger("railyard.scheduler")

DEFAULT_POD_CACHE = 10_000
JSON = "application/json"
LINGER_S = 1.0
# A filter or prioritize this small, all of whose answers the node groups or the allocator's
# memo hold, is answered on the loop: a thread hop costs more than that work (~0.1–0.3 ms,
# docs/decisions/0077), and decoding 256 KiB and mapping the names it holds takes about a
# millisecond. Anything else goes to the worker.
ON_LOOP_BYTES = 256 << 10
_T = TypeVar("_T")


class ClusterWriter(Protocol):
    """Where a bind is recorded: the Allocation on the pod, then the Binding.

    Today the state file (`StateFile`); the Kubernetes client implements the same call later
    (annotation `railyard.dev/allocation`, then `pods/binding`). Raises on failure.
    """

    async def bind(self, pod: BoundPod) -> None: ...


class WriteOutcomeUnknown(Exception):
    """A writer's write may still land (the request failed in a way that may have come after
    the server applied it, and reading back found the pod not bound yet, or could not read
    it): the devices stay held, as for a pod that may be running with them. kube-scheduler's
    retry of the bind comes to the same node (filter offers a holding pod only its node) and
    writes again; the pod's watch events settle it meanwhile, and the writer frees the
    devices once the write can no longer land if the pod is still unbound."""


class Leadership(Protocol):
    """Whether this replica may write (`railyard.kube.lease.Elector`, decision 0074)."""

    holder: str

    def is_leader(self) -> bool: ...


class PodCache:
    """Pods seen in filter/prioritize/preempt, by UID: bind carries only names and the UID.

    Bounded (least recently seen goes first) so a flood of pods cannot grow memory forever.
    """

    def __init__(self, capacity: int = DEFAULT_POD_CACHE) -> None:
        self.capacity = capacity
        self._pods: OrderedDict[str, PodFacts] = OrderedDict()
        self._lock = threading.Lock()  # the worker puts, the loop gets

    def put(self, facts: PodFacts) -> None:
        with self._lock:
            self._pods[facts.uid] = facts
            self._pods.move_to_end(facts.uid)
            while len(self._pods) > self.capacity:
                self._pods.popitem(last=False)

    def get(self, uid: str) -> PodFacts | None:
        with self._lock:
            return self._pods.get(uid)

    def __len__(self) -> int:
        return len(self._pods)


def _search_worker() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="railyard-search")


def _names(args: ExtenderArgs) -> list[str]:
    """The node names of filter/prioritize args: `NodeNames` (nodeCacheCapable) or the
    names of the `Nodes` list's items."""
    if args.NodeNames is not None:
        return args.NodeNames
    if args.Nodes is not None:
        return node_list_names(args.Nodes)
    raise WireError("ExtenderArgs: neither NodeNames nor Nodes given")


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(body), status=status, content_type=JSON)


def _filter_reply(*, nodes: Any = None, names: list[str] | None = None,
                  failed: dict[str, str] | None = None,
                  unresolvable: dict[str, str] | None = None, error: str = "") -> web.Response:
    return _json({"Nodes": nodes, "NodeNames": names, "FailedNodes": failed or {},
                  "FailedAndUnresolvableNodes": unresolvable or {}, "Error": error})


def filter_line(facts: PodFacts, asked: int, out: FilterOutcome) -> str:
    """A filter's one line: how many of the nodes asked about fit, how many are blocked or
    unresolvable, and the commonest reason among those that do not fit."""
    reasons = Counter([*out.failed.values(), *out.unresolvable.values()])
    why = reasons.most_common(1)[0][0] if reasons else None
    return decision_line("filter", pod=f"{facts.namespace}/{facts.name}", uid=facts.uid,
                         nodes=asked, fit=len(out.fits), blocked=len(out.failed),
                         unresolvable=len(out.unresolvable), why=why)


class _JobTurn:
    """One job's bind turn (`Extender._job_turn`): the lock, and how many binds hold or wait
    for it (the entry goes when none does)."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class Extender:
    """The extender's handlers over one ClusterState."""

    def __init__(self, state: ClusterState, writer: ClusterWriter | None = None, *,
                 state_file: StateFile | None = None, metrics: Metrics | None = None,
                 pod_cache: int = DEFAULT_POD_CACHE, leader: Leadership | None = None,
                 limits: HttpLimits | None = None, admin_token: AdminToken | None = None,
                 admin_calls: bool = True, names: ResourceNames = DEFAULT_RESOURCES,
                 filter_ranks: bool = True) -> None:
        self.state = state
        # Filter answers only the nodes that rank best for the pod (decision 0104): the
        # ranking rides on filter, so kube-scheduler needs no prioritize call, and its own
        # scores only break Railyard's ties.
        self.filter_ranks = filter_ranks
        # The resource names pods are read with; `vf_pools` from --vf-pool (decision 0085).
        self.names = names
        # `DELETE /pods/<uid>` exists only where nothing else frees a pod's devices (the
        # cluster-file mode; with the API the pod watch does), and answers only a caller
        # bearing `admin_token` (none: refused to all).
        self.admin_calls = admin_calls
        self.admin_token = admin_token
        self.limits = limits or HttpLimits()
        # The one thread that asks the cluster state questions that search: one at a time,
        # as on the loop before, so the allocator's memo is never written by two threads.
        self._worker = _search_worker()
        self.leader = leader  # None: the only replica (cluster-file mode), always binds
        self.writer = writer
        self.state_file = state_file
        self.metrics = metrics or Metrics()
        self.pods = PodCache(pod_cache)
        # Binds whose writes are in flight, by UID: a retry of the same bind waits for the
        # first one's outcome instead of allocating twice.
        self._inflight: dict[str, asyncio.Task[str]] = {}
        # Per job whose rails steer its pods: the lock its binds take turns deciding under
        # (`_job_turn`).
        self._job_turns: dict[str, _JobTurn] = {}
        # Releases being recorded, by UID: a bind waits for one, so it never answers "already
        # bound" for devices about to be freed.
        self._releasing: dict[str, asyncio.Future[None]] = {}
        self.metrics.pods.set(len(state.pods()))

    def app(self, *, client_certs: bool = False) -> web.Application:
        """The routes; with `client_certs`, every call but `/healthz` needs a verified client
        certificate (`access.client_certificates`)."""
        middlewares = [refusals(self.metrics.shed)]
        if client_certs:
            middlewares.append(client_certificates())
        app = web.Application(client_max_size=self.limits.max_body_bytes,
                              middlewares=middlewares)
        app.on_cleanup.append(self._stop_worker)
        app.cleanup_ctx.append(self.metrics.probe_loop_lag)
        app.router.add_post("/filter", self.filter)
        app.router.add_post("/prioritize", self.prioritize)
        app.router.add_post("/bind", self.bind)
        app.router.add_post("/preempt", self.preempt)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.get_metrics)
        app.router.add_get("/allocations", self.allocations)
        if self.admin_calls:
            app.router.add_delete("/pods/{uid}", self.delete_pod)
        return app

    async def _stop_worker(self, app: web.Application) -> None:
        # A search in flight finishes within its budget; nothing waits for it. A fresh
        # executor (its thread starts on first use) serves the extender if it is served again.
        self._worker.shutdown(wait=False, cancel_futures=True)
        self._worker = _search_worker()

    async def _in_worker(self, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` in the worker thread; the loop goes on answering meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def _body(self, request: web.Request) -> bytes:
        return await read_body(request, self.limits)

    # ------------------------------------------------------------------ filter

    async def filter(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        try:
            body = await self._body(request)
            if len(body) > ON_LOOP_BYTES:
                return await self._in_worker(self._filter_body, body)
            call = self._filter_call(body)
            if isinstance(call, web.Response):
                return call
            try:
                return self._filter(call, search=False)
            except NeedsSearch:
                return await self._in_worker(self._filter, call)
        finally:
            self.metrics.latency["filter"].observe(time.perf_counter() - t0)

    def _filter_body(self, body: bytes) -> web.Response:
        call = self._filter_call(body)
        return call if isinstance(call, web.Response) else self._filter(call)

    def _filter_call(self, body: bytes) -> tuple[ExtenderArgs, PodFacts, list[str]] | web.Response:
        """The decoded call, or the answer to a bad one."""
        try:
            args = decode(body, ExtenderArgs)
            return args, pod_facts(args.Pod, self.pods.get, self.names), _names(args)
        except WireError as e:
            self.metrics.failure("filter", m.BAD_REQUEST)
            return _filter_reply(error=str(e))

    def _filter(self, call: tuple[ExtenderArgs, PodFacts, list[str]],
                search: bool = True) -> web.Response:
        """Ask the state, encode. In the worker; on the loop without `search`, which raises
        NeedsSearch (before any count or change) when an answer is not known yet."""
        args, facts, names = call
        request = self.state.job_request(facts.request, facts.job)  # docs/rails.md
        # Ranked, the nodes that fit but score below the best are left out, not failed: the
        # others fit, and a pod that fits somewhere is never a case for preemption.
        out = self.state.filter(request, names, uid=facts.uid, search=search,
                                ranked=self.filter_ranks)
        self.pods.put(facts)
        if self.state.pod(facts.uid) is not None:
            self.metrics.failure("filter", m.ALREADY_BOUND, len(out.unresolvable))
        else:
            unknown = sum(1 for n in out.unresolvable if n not in self.state)
            self.metrics.failure("filter", m.UNKNOWN_NODE, unknown)
            self.metrics.failure("filter", m.UNRESOLVABLE, len(out.unresolvable) - unknown)
        self.metrics.failure("filter", m.BLOCKED, len(out.failed))
        if log.isEnabledFor(logging.DEBUG):  # per pod, never per node: filter is the hot path
            log.debug("%s", filter_line(facts, len(names), out))
        if args.NodeNames is not None:
            return _filter_reply(names=out.fits, failed=out.failed,
                                 unresolvable=out.unresolvable)
        node_list = args.Nodes or {}
        fits = set(out.fits)
        kept = [item for item, name in zip(node_list.get("items") or [], names, strict=True)
                if name in fits]
        return _filter_reply(nodes={**node_list, "items": kept}, failed=out.failed,
                             unresolvable=out.unresolvable)

    # ------------------------------------------------------------------ prioritize

    async def prioritize(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        try:
            body = await self._body(request)
            if len(body) > ON_LOOP_BYTES:
                return await self._in_worker(self._prioritize_body, body)
            call = self._prioritize_call(body)
            if isinstance(call, web.Response):
                return call
            try:
                return self._prioritize(call, search=False)
            except NeedsSearch:
                return await self._in_worker(self._prioritize, call)
        finally:
            self.metrics.latency["prioritize"].observe(time.perf_counter() - t0)

    def _prioritize_body(self, body: bytes) -> web.Response:
        call = self._prioritize_call(body)
        return call if isinstance(call, web.Response) else self._prioritize(call)

    def _prioritize_call(self, body: bytes) -> tuple[PodFacts, list[str]] | web.Response:
        try:
            args = decode(body, ExtenderArgs)
            return pod_facts(args.Pod, self.pods.get, self.names), _names(args)
        except WireError as e:
            # HostPriorityList has no Error field: say it with the status.
            self.metrics.failure("prioritize", m.BAD_REQUEST)
            return web.Response(status=400, text=str(e))

    def _prioritize(self, call: tuple[PodFacts, list[str]], search: bool = True) -> web.Response:
        facts, names = call
        request = self.state.job_request(facts.request, facts.job)  # docs/rails.md
        scores = self.state.scores(request, names, uid=facts.uid, search=search)
        self.pods.put(facts)
        return _json(list(map(HostPriority, scores.keys(), scores.values())))

    # ------------------------------------------------------------------ bind

    async def bind(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        try:
            try:
                args = decode(await self._body(request), ExtenderBindingArgs)
            except WireError as e:
                self.metrics.failure("bind", m.BAD_REQUEST)
                return _json({"Error": str(e)})
            error = await self.bind_pod(args)
            self._log_bind(args, error)
            response = _json({"Error": error})
            if error and self.leader is not None and not self.leader.is_leader():
                # Behind the chart's Service, kube-proxy balances connections, not requests:
                # kube-scheduler's kept-alive connection would bring every retry back to this
                # follower. Closed, the retry dials again and may reach the leader (decision
                # 0074; seen with the chart's two replicas on the box, decision 0092).
                response.force_close()
            return response
        finally:
            self.metrics.latency["bind"].observe(time.perf_counter() - t0)

    def _log_bind(self, args: ExtenderBindingArgs, error: str) -> None:
        """The bind's one line (docs/observability.md): the pod's devices, or why not."""
        if not log.isEnabledFor(logging.INFO):
            return
        pod = f"{args.PodNamespace}/{args.PodName}"
        if error:
            log.info("%s", decision_line("bind", outcome="refused", pod=pod, uid=args.PodUID,
                                         node=args.Node, why=error))
            return
        held = self.state.pod(args.PodUID)
        log.info("%s", decision_line("bind", outcome="bound", pod=pod, uid=args.PodUID,
                                     node=args.Node,
                                     allocation=held.allocation if held else None,
                                     why=None if held and held.allocation else
                                     "no Railyard devices asked for"))

    async def bind_pod(self, args: ExtenderBindingArgs) -> str:
        """Bind one pod; the empty string on success, else the error for kube-scheduler."""
        uid = args.PodUID
        who = f"pod {args.PodNamespace}/{args.PodName} ({uid})"
        if self.leader is not None and not self.leader.is_leader():
            # Refused, not forwarded (decision 0074): kube-scheduler puts the pod back in its
            # queue and binds it on a later try, by which time a leader answers.
            self.metrics.failure("bind", m.NOT_LEADER)
            holder = self.leader.holder or "nobody yet"
            return (f"cannot bind {who}: this Railyard extender is not the leader (the lease "
                    f"is held by {holder}); kube-scheduler will retry")
        releasing = self._releasing.get(uid)
        if releasing is not None:
            await asyncio.shield(releasing)
        pending = self._inflight.get(uid)
        if pending is not None:
            error = await asyncio.shield(pending)
            if error or (held := self.state.pod(uid)) is None or held.node == args.Node:
                return error
            return f"{who} is already bound to {held.node!r}"
        held = self.state.pod(uid)
        if held is not None:
            if held.node == args.Node:
                return ""  # a retry of a bind that succeeded: nothing more to do
            self.metrics.failure("bind", m.ALREADY_BOUND)
            return f"{who} is already bound to {held.node!r}"
        facts = self.pods.get(uid)
        if facts is None:
            self.metrics.failure("bind", m.NOT_SEEN)
            return (f"{who} was not seen in a filter call (extender restarted?); "
                    "kube-scheduler will retry")
        if (facts.namespace, facts.name) != (args.PodNamespace, args.PodName):
            # The record would name one pod and hold devices for another's request.
            self.metrics.failure("bind", m.BAD_REQUEST)
            return (f"cannot bind {who}: filter saw UID {uid} as pod "
                    f"{facts.namespace}/{facts.name}")
        if args.Node not in self.state:
            self.metrics.failure("bind", m.UNKNOWN_NODE)
            return f"cannot bind {who}: node {args.Node!r} is not known to Railyard"

        # The bind runs as its own task: a caller that goes away (shutdown, a cancelled
        # handler) must not cut the record short and leave devices held without one.
        task = asyncio.ensure_future(self._bind_settled(args, facts, who))
        self._inflight[uid] = task
        return await asyncio.shield(task)

    async def _bind_settled(self, args: ExtenderBindingArgs, facts: PodFacts, who: str) -> str:
        try:
            return await self._bind(args, facts, who)
        except Exception as e:  # never leave a waiter hanging; report, don't crash
            log.exception("bind of %s failed", who)
            return f"binding {who} failed: {e}"
        finally:
            del self._inflight[args.PodUID]

    async def _bind(self, args: ExtenderBindingArgs, facts: PodFacts, who: str) -> str:
        if not facts.request.wants_devices:
            # None of our resources, but bound once all the same: the record says where
            # (with the API, the Binding also refuses a pod that has a node).
            refused = self.state.bind_without_devices(args.PodUID, args.PodNamespace,
                                                      args.PodName, args.Node)
            if refused is not None:
                self.metrics.failure("bind", m.ALREADY_BOUND)
                return refused.reason
            pod = BoundPod(args.PodNamespace, args.PodName, args.PodUID, args.Node, None)
            error = await self._write(pod, who)
            if not error:
                self.metrics.pods.set(self.state.pod_count())
            return error
        r = facts.request
        steered = facts.job if r.takes_job_rails else None
        t0 = time.perf_counter()
        async with self._job_turn(steered):
            # The job's rails as of now: a pod of the job bound since this one's filter
            # counts. One bind of a job at a time reads them and commits (docs/rails.md):
            # two in flight at once would each pick rails without the other's.
            request = self.state.job_request(r, facts.job)
            bind = (args.PodUID, args.PodNamespace, args.PodName, args.Node, request)
            try:  # on the loop when the allocator's memo holds the answer (filter asked it)
                result = self.state.bind(*bind, search=False, job=facts.job)
                self.metrics.bind_decided["memo"].inc()
            except NeedsSearch:
                self.metrics.bind_decided["worker"].inc()
                result = await self._in_worker(partial(self.state.bind, job=facts.job),
                                               *bind)
        t1 = time.perf_counter()
        self.metrics.bind_phase["decide"].observe(t1 - t0)
        if isinstance(result, Infeasible):
            self.metrics.failure("bind", m.UNRESOLVABLE if result.unresolvable else m.BLOCKED)
            return f"cannot bind {who} to {args.Node}: {result.reason}"
        pod = BoundPod(args.PodNamespace, args.PodName, args.PodUID, args.Node, result,
                       facts.job)
        error = await self._write(pod, who)
        self.metrics.bind_phase["write"].observe(time.perf_counter() - t1)
        if not error:
            self.metrics.allocations.inc()
            self.metrics.achieved(result)
            self.metrics.pods.set(self.state.pod_count())
        return error

    @contextlib.asynccontextmanager
    async def _job_turn(self, job: str | None) -> AsyncIterator[None]:
        """This job's turn to decide a bind (None: no job whose rails steer; no wait). The
        lock lives while some bind of the job holds or waits for it."""
        if job is None:
            yield
            return
        turn = self._job_turns.get(job)
        if turn is None:
            turn = self._job_turns[job] = _JobTurn()
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if not turn.users:
                del self._job_turns[job]

    async def _write(self, pod: BoundPod, who: str) -> str:
        if self.writer is None:
            return ""
        try:
            await self.writer.bind(pod)
        except WriteOutcomeUnknown as e:  # it may have landed: releasing could double-grant
            self.metrics.failure("bind", m.WRITE_FAILED)
            log.warning("recording %s on %s may or may not have landed: %s", who, pod.node, e)
            return f"recording {who} on {pod.node} failed (its devices stay held): {e}"
        except Exception as e:  # any other writer failure: undo, let kube-scheduler retry
            self.state.release(pod.uid)
            self.metrics.failure("bind", m.WRITE_FAILED)
            log.warning("recording %s on %s failed: %s", who, pod.node, e)
            return f"recording {who} on {pod.node} failed (nothing held): {e}"
        return ""

    # ------------------------------------------------------------------ preempt

    async def preempt(self, request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        try:
            return await self._in_worker(self._preempt, await self._body(request))
        finally:
            self.metrics.latency["preempt"].observe(time.perf_counter() - t0)

    def _preempt(self, body: bytes) -> web.Response:
        try:
            args = decode(body, ExtenderPreemptionArgs)
            facts = pod_facts(args.Pod, self.pods.get, self.names)
            candidates: dict[str, tuple[list[str], int]] = {}
            if args.NodeNameToMetaVictims is not None:
                for node, v in args.NodeNameToMetaVictims.items():
                    candidates[node] = ([p.UID for p in v.Pods or []], v.NumPDBViolations)
            elif args.NodeNameToVictims is not None:
                for node, vv in args.NodeNameToVictims.items():
                    uids = victim_uids(vv, f"NodeNameToVictims[{node}]")
                    candidates[node] = (uids, vv.NumPDBViolations)
        except WireError as e:
            # ExtenderPreemptionResult has no Error field: say it with the status.
            self.metrics.failure("preempt", m.BAD_REQUEST)
            return web.Response(status=400, text=str(e))
        self.pods.put(facts)
        # Per node: kube-scheduler's list whole, or the node left out. kube-scheduler
        # fails the whole preemption on a node answered with no victims ("expected at
        # least one victim pod on node"), and needs every pod it listed for its own
        # filters (docs/decisions/0026). The set is its own, so is its PDB count.
        out: dict[str, Any] = {}
        mark = self.state.search_mark()
        for node, (uids, pdb) in candidates.items():
            if not uids:
                continue
            if facts.request.wants_devices:
                if self.state.over_budget(mark):
                    continue  # not decided within the call's budget: no eviction there
                if self.state.victims(facts.request, node, uids) is None:
                    continue  # evicting them all still leaves no room for the devices
            out[node] = {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}
        return _json({"NodeNameToMetaVictims": out})

    # ------------------------------------------------------------------ admin

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def get_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": Metrics.content_type})

    async def allocations(self, request: web.Request) -> web.Response:
        return _json({"pods": [pod_to_json(p) for p in self.state.pods()]})

    def _admin_refusal(self, request: web.Request) -> web.Response | None:
        """None when the caller bears the admin token; else the answer that refuses it."""
        if self.admin_token is not None and self.admin_token.allows(
                request.headers.get("Authorization")):
            return None
        log.warning("%s %s from %s refused: %s", request.method, request.path, request.remote,
                    "no admin token configured" if self.admin_token is None
                    else "no or wrong bearer token")
        if self.admin_token is None:
            return _json({"error": "admin calls are off: start the extender with "
                                   "--admin-token-file to allow them"}, 403)
        if "Authorization" not in request.headers:
            return web.Response(status=401, headers={"WWW-Authenticate": "Bearer"},
                                content_type=JSON, body=encode(
                                    {"error": "an admin call needs Authorization: Bearer "
                                              "<the --admin-token-file token>"}))
        return _json({"error": "the bearer token is not the extender's admin token"}, 403)

    async def delete_pod(self, request: web.Request) -> web.Response:
        """`DELETE /pods/<uid>`: the pod left; free its devices (cluster-file mode, where
        nothing else does). Only for a caller bearing the admin token."""
        if (refusal := self._admin_refusal(request)) is not None:
            return refusal  # before anything: nothing waited on, nothing freed
        t0 = time.perf_counter()
        try:
            uid = request.match_info["uid"]
            # Until neither is in flight: a bind may start while this waits on a release.
            while True:
                if (pending := self._inflight.get(uid)) is not None:
                    await asyncio.shield(pending)  # the release must follow the bind's record
                elif (releasing := self._releasing.get(uid)) is not None:
                    await asyncio.shield(releasing)  # one release at a time per pod
                else:
                    break
            pod = self.state.pod(uid)
            if pod is None:
                return _json({"error": f"no pod with uid {uid!r} is bound by Railyard"}, 404)
            done = asyncio.get_running_loop().create_future()
            self._releasing[uid] = done
            try:
                if self.state_file is not None:
                    try:
                        await self.state_file.release(uid)
                    except Exception as e:  # nothing freed: the record still says it is held
                        log.warning("recording the release of %s failed: %s", uid, e)
                        return _json({"error": f"recording the release failed: {e}"}, 503)
                self.state.release(uid)
            finally:
                del self._releasing[uid]
                done.set_result(None)
            self.metrics.pods.set(self.state.pod_count())
            return _json({"released": pod_to_json(pod)})
        finally:
            self.metrics.latency["release"].observe(time.perf_counter() - t0)


def settle_heap() -> None:
    """Move everything loaded so far (topologies, ledgers, restored allocations: ~200,000
    objects at 5,000 nodes) out of the garbage collector's sight. A full collection over
    them takes ~300 ms (measured, docs/decisions/0025) and would land inside a filter call.

    After each later full collection, what survived is frozen too, so the next one again
    scans only what was created since.
    """
    gc.collect()
    gc.freeze()
    if _freeze_after_full_collection not in gc.callbacks:
        gc.callbacks.append(_freeze_after_full_collection)


def _freeze_after_full_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()  # everything left was reachable a moment ago


async def start(extender: Extender, host: str, port: int,
                tls: ssl.SSLContext | None = None) -> web.AppRunner:
    """Serve `extender` on host:port (port 0: any free port); stop with `runner.cleanup()`.
    Each connection is held to `extender.limits` (`connections.Guard`). With `tls`
    (`access.server_tls`), HTTPS; when it asks for client certificates, every call but
    `/healthz` needs one."""
    limits = extender.limits
    client_certs = tls is not None and tls.verify_mode != ssl.CERT_NONE
    runner = web.AppRunner(extender.app(client_certs=client_certs),
                           access_log=None,  # a log line per call costs
                           keepalive_timeout=limits.idle_timeout_s,
                           # After refusing a body, read what is still coming for at most
                           # this long (so the client sees the answer, not a reset), then
                           # close: aiohttp's default, 10 s, would hold a slow client on.
                           lingering_time=LINGER_S)
    await runner.setup()
    site = GuardedSite(runner, host, port, limits, extender.metrics.shed, tls)
    await site.start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port the first site listens on (useful after binding port 0)."""
    for site in runner.sites:
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            return server.sockets[0].getsockname()[1]
    raise RuntimeError("the extender is not listening")
