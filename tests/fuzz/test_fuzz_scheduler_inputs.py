"""Fuzz sweep, what kube-scheduler (or anyone reaching the extender's port) sends: a precise
error, no state change, bounded cost.

Covered (each fed mutations of a valid message and raw bytes):
- `scheduler.wire.decode` of `ExtenderArgs`, `ExtenderBindingArgs` and
  `ExtenderPreemptionArgs` → the message or `WireError`; then, as the handlers do,
  `pod_facts` (the Pod: UID, name, namespace, request), `node_list_names` and `victim_uids`
  → their value or `WireError`; a refused pod leaves the parsed-request cache as it was;
- the extender's HTTP handlers `/filter`, `/prioritize`, `/bind` and `/preempt`, served over
  real HTTP as kube-scheduler calls them: the answer is the protocol's (`Error` set, or 400)
  never a 500; filter, prioritize and preempt never change the ledger (`GET /allocations`),
  and a refused call leaves the pods seen (the cache a bind reads) as they were; a refused
  bind changes neither; each answer within HTTP_TIME_S.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fuzz_strategies import FUZZ, call, documents, raw_bytes, to_json, values
from hypothesis import given
from hypothesis import strategies as st

from railyard.allocation.request import Request
from railyard.scheduler import wire
from railyard.scheduler.cluster_file import cluster_from_spec
from railyard.scheduler.service import Extender, bound_port, start
from railyard.scheduler.state import ClusterState
from railyard.scheduler.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderPreemptionArgs,
    WireError,
    decode,
    node_list_names,
    pod_facts,
    victim_uids,
)
from support.pods import asking

NODES = ["dgx-h100-000", "dgx-h100-001", "hgx-h100-4nic-000"]
POD = asking("u1", gpus=2, vfs=2, hints={"numa": "preferred", "maxDistance": "SYS"})
VICTIM = asking("v1", gpus=1, vfs=1)
FILTER = {"Pod": POD, "Nodes": None, "NodeNames": NODES}
FILTER_NODES = {"Pod": POD, "NodeNames": None, "Nodes": {
    "kind": "NodeList", "apiVersion": "v1", "metadata": {},
    "items": [{"metadata": {"name": n}, "status": {}} for n in NODES]}}
BIND = {"PodName": "pod-u1", "PodNamespace": "default", "PodUID": "u1", "Node": NODES[1]}
PREEMPT = {"Pod": POD, "NodeNameToVictims": {NODES[0]: {"Pods": [VICTIM],
                                                      "NumPDBViolations": 0}},
           "NodeNameToMetaVictims": None}
PREEMPT_META = {"Pod": POD, "NodeNameToVictims": None, "NodeNameToMetaVictims": {
    NODES[0]: {"Pods": [{"UID": "v1"}], "NumPDBViolations": 1}}}

# One answer of the extender: decoding, a search of at most its budget (~0.5 s on an idle core,
# docs/reliability.md), the HTTP round trip; with room for a loaded CI machine.
HTTP_TIME_S = 3.0


def body_of(valid: Any) -> st.SearchStrategy[bytes]:
    """A message as kube-scheduler might garble it: mutated JSON, or damaged bytes."""
    return st.one_of(documents(valid).map(lambda d: to_json(d).encode("utf-8", "surrogatepass")),
                     raw_bytes(valid))


def _says_kind(kind: type) -> Any:
    return lambda e: str(e).startswith(f"{kind.__name__}: ")


def _says_pod(e: BaseException) -> bool:
    return str(e).startswith("Pod") and ": " in str(e)


# ----------------------------------------------------------------------- the wire, pure


def _facts(pod: Any) -> None:
    """pod_facts as the handlers call it, and no trace of a refused pod in the cache."""
    before = dict(wire._requests)
    out = call(lambda: pod_facts(pod), WireError, says=_says_pod)
    if out.refused:
        assert wire._requests == before


@FUZZ
@given(st.one_of(body_of(FILTER), body_of(FILTER_NODES)))
def test_filter_and_prioritize_args_are_a_message_or_a_wire_error_naming_the_field(body):
    out = call(lambda: decode(body, ExtenderArgs), WireError, says=_says_kind(ExtenderArgs))
    if out.refused:
        return
    args: ExtenderArgs = out.value
    _facts(args.Pod)
    if args.Nodes is not None:
        call(lambda: node_list_names(args.Nodes), WireError, says=_says_kind_nodes)


def _says_kind_nodes(e: BaseException) -> bool:
    return str(e).startswith("Nodes.items")


@FUZZ
@given(body_of(BIND))
def test_bind_args_are_a_message_or_a_wire_error_naming_the_field(body):
    out = call(lambda: decode(body, ExtenderBindingArgs), WireError,
               says=_says_kind(ExtenderBindingArgs))
    if not out.refused:
        assert all(isinstance(getattr(out.value, k), str) for k in BIND)


@FUZZ
@given(st.one_of(body_of(PREEMPT), body_of(PREEMPT_META)))
def test_preempt_args_are_a_message_or_a_wire_error_naming_the_field(body):
    out = call(lambda: decode(body, ExtenderPreemptionArgs), WireError,
               says=_says_kind(ExtenderPreemptionArgs))
    if out.refused:
        return
    args: ExtenderPreemptionArgs = out.value
    _facts(args.Pod)
    for node, v in (args.NodeNameToVictims or {}).items():
        call(lambda v=v, node=node: victim_uids(v, f"NodeNameToVictims[{node}]"), WireError,
             says=lambda e: str(e).startswith("NodeNameToVictims["))


@FUZZ
@given(values(POD).filter(lambda p: isinstance(p, dict)))  # msgspec decodes only an object
def test_a_pod_is_facts_or_a_wire_error_naming_the_field(pod):
    _facts(pod)


# ----------------------------------------------------------------------- over HTTP


class Served:
    """The extender over real HTTP on 127.0.0.1, its loop in a thread of its own, so that
    each hypothesis example is a plain blocking request."""

    def __init__(self, extender: Extender) -> None:
        self.extender = extender
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner = self._on_loop(start(extender, "127.0.0.1", 0))
        self.port = bound_port(self.runner)

    def _on_loop(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            return reply.status, reply.read()
        finally:
            conn.close()

    def ledger(self) -> Any:
        status, body = self.request("GET", "/allocations")
        assert status == 200
        return json.loads(body)

    def seen(self) -> dict[str, Any]:
        async def snapshot() -> dict[str, Any]:  # on the loop, between two requests
            return dict(self.extender.pods._pods)
        return self._on_loop(snapshot())

    def release(self, uid: str) -> None:
        async def release() -> None:
            self.extender.state.release(uid)
        self._on_loop(release())

    def close(self) -> None:
        self._on_loop(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    state = ClusterState(cluster_from_spec("dgx-h100:2,hgx-h100-4nic:1"))
    state.bind("big", "ml", "big", NODES[0], Request(gpus=4, vfs=4))  # a ledger with a pod
    s = Served(Extender(state))
    try:
        status, body = s.request("POST", "/filter", json.dumps(FILTER).encode())
        assert status == 200 and json.loads(body)["Error"] == "", body  # bind can find u1
        yield s
    finally:
        s.close()


def _answer(served: Served, path: str, body: bytes) -> tuple[int, Any, bool]:
    """POST `body`; (status, decoded answer, refused) within HTTP_TIME_S, never a 500."""
    out = call(lambda: served.request("POST", path, body), (), time_s=HTTP_TIME_S)
    status, raw = out.value
    assert status in (200, 400), (status, raw[:300])
    # An error may quote what the caller sent (a bind names the pod and node it was given),
    # never more: the answer costs what the request did.
    most = 2000 + 4 * len(body)
    if status == 400:  # prioritize and preempt: their answers have no Error field
        text = raw.decode()
        assert text.strip() and len(text) <= most and (": " in text), text[:300]
        return status, text, True
    answer = json.loads(raw)
    error = answer.get("Error", "") if isinstance(answer, dict) else ""
    assert len(error) <= most, error[:300]
    return status, answer, bool(error)


@FUZZ
@given(path=st.sampled_from(("/filter", "/prioritize")),
       body=st.one_of(body_of(FILTER), body_of(FILTER_NODES)))
def test_filter_and_prioritize_answer_bad_input_in_protocol_and_change_nothing(served, path,
                                                                               body):
    ledger, seen = served.ledger(), served.seen()
    _, _, refused = _answer(served, path, body)
    assert served.ledger() == ledger  # neither ever holds a device
    if refused:
        assert served.seen() == seen


@FUZZ
@given(st.one_of(body_of(PREEMPT), body_of(PREEMPT_META)))
def test_preempt_answers_bad_input_in_protocol_and_changes_nothing(served, body):
    ledger, seen = served.ledger(), served.seen()
    _, _, refused = _answer(served, "/preempt", body)
    assert served.ledger() == ledger
    if refused:
        assert served.seen() == seen


@FUZZ
@given(body_of(BIND))
def test_a_refused_bind_changes_nothing(served, body):
    ledger, seen = served.ledger(), served.seen()
    _, _, refused = _answer(served, "/bind", body)
    if refused:
        assert served.ledger() == ledger and served.seen() == seen
        return
    # Taken: the pod kube-scheduler named is held (or was already); back to the start.
    uid = json.loads(body)["PodUID"]
    assert uid in {p["uid"] for p in served.ledger()["pods"]}
    if uid not in {p["uid"] for p in ledger["pods"]}:
        served.release(uid)
    assert served.ledger() == ledger
