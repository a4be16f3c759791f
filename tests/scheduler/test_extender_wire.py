"""kube-scheduler's messages: decoded as it sends them; anything else is a named WireError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_helpers import args, node_list, pod

from railyard.scheduler.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderPreemptionArgs,
    Victims,
    WireError,
    decode,
    node_list_names,
    pod_facts,
    victim_uids,
)


def test_cache_mode_args_decode_with_null_nodes():
    a = decode(json.dumps(args(pod("u1", gpus=2, vfs=2), ["n1", "n2"])).encode(), ExtenderArgs)
    assert a.Nodes is None and a.NodeNames == ["n1", "n2"]
    f = pod_facts(a.Pod)
    assert (f.uid, f.namespace, f.name) == ("u1", "default", "pod-u1")
    assert (f.request.gpus, f.request.vfs, f.request.pfs) == (2, 2, 0)


def test_node_list_names_come_from_item_metadata_in_order():
    assert node_list_names(node_list(["b", "a"])) == ["b", "a"]
    assert node_list_names({"items": None}) == []
    with pytest.raises(WireError, match=r"Nodes.items\[1\].metadata.name: missing"):
        node_list_names({"items": [{"metadata": {"name": "a"}}, {"metadata": {}}]})


def test_binding_args_need_all_four_fields():
    ok = {"PodName": "p", "PodNamespace": "d", "PodUID": "u", "Node": "n"}
    assert decode(json.dumps(ok).encode(), ExtenderBindingArgs).Node == "n"
    with pytest.raises(WireError, match="PodUID"):
        decode(json.dumps({k: v for k, v in ok.items() if k != "PodUID"}).encode(),
               ExtenderBindingArgs)


def test_preemption_args_in_both_forms():
    meta = {"Pod": pod("u"), "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "v1"}, {"UID": "v2"}], "NumPDBViolations": 1}}}
    a = decode(json.dumps(meta).encode(), ExtenderPreemptionArgs)
    assert [p.UID for p in a.NodeNameToMetaVictims["n1"].Pods] == ["v1", "v2"]
    full = {"Pod": pod("u"), "NodeNameToVictims": {"n1": {"Pods": [pod("v1")]}}}
    a = decode(json.dumps(full).encode(), ExtenderPreemptionArgs)
    assert victim_uids(a.NodeNameToVictims["n1"], "x") == ["v1"]
    with pytest.raises(WireError, match=r"x.Pods\[0\].metadata.uid: missing"):
        victim_uids(Victims(Pods=[{"metadata": {}}]), "x")


@pytest.mark.parametrize("form", ["NodeNameToMetaVictims", "NodeNameToVictims"])
def test_a_negative_pdb_violation_count_is_refused_with_its_path(form):
    body = {"Pod": pod("u"), form: {"n1": {"Pods": [], "NumPDBViolations": -1}}}
    with pytest.raises(WireError, match=rf">= 0 - at `\$.{form}\[...\].NumPDBViolations`"):
        decode(json.dumps(body).encode(), ExtenderPreemptionArgs)


@pytest.mark.parametrize("body, message", [
    (b"{", "malformed JSON"),
    (b"[]", "Expected `object`"),
    (b'{"NodeNames": [1]}', r"\$.NodeNames\[0\]"),
    (b'{"Pod": 3}', r"\$.Pod"),
])
def test_malformed_args_are_a_wire_error_with_the_path(body, message):
    with pytest.raises(WireError, match=message):
        decode(body, ExtenderArgs)


def without_uid() -> dict:
    p = pod("x")
    del p["metadata"]["uid"]
    return p


@pytest.mark.parametrize("p, message", [
    (None, "Pod: missing"),
    ({"spec": {}}, "Pod.metadata: missing"),
    (without_uid(), "Pod.metadata.uid: missing"),
    (pod("u", hints={"maxDistance": "FAR"}), r"railyard.dev/request\]\.maxDistance"),
    (pod("u") | {"spec": {"containers": []}}, "spec.containers: missing or empty"),
    (pod("u") | {"spec": {"containers": [{"resources": {"limits": {
        "railyard.dev/vf": "1.5"}}}]}}, "whole numbers"),
    # Fraction("1e99999999") alone would hold the event loop for minutes.
    (pod("u") | {"spec": {"containers": [{"resources": {"limits": {
        "nvidia.com/gpu": "1e99999999"}}}]}}, "exponent out of range"),
    (pod("u") | {"metadata": {"uid": "u", "name": "p", "annotations": {
        "railyard.dev/request": '{"numa": ' + "1" * 5000 + "}"}}}, "not valid JSON"),
])
def test_bad_pod_is_a_wire_error_naming_the_field(p, message):
    with pytest.raises(WireError, match=message):
        pod_facts(p)


def test_a_deeply_nested_body_is_a_wire_error():
    # msgspec raises RecursionError (not DecodeError) for an untyped object nested too deep.
    body = b'{"Pod": {"spec": ' + b"[" * 5000 + b"]" * 5000 + b"}}"
    with pytest.raises(WireError, match="ExtenderArgs: malformed JSON"):
        decode(body, ExtenderArgs)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.builds(
    lambda d: json.dumps(d).encode(),
    st.dictionaries(st.sampled_from(["Pod", "Nodes", "NodeNames", "x"]),
                    st.none() | st.integers() | st.lists(st.text(max_size=4), max_size=3)
                    | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))))
def test_any_bytes_decode_or_raise_wire_error(body):
    try:
        a = decode(body, ExtenderArgs)
    except WireError:
        return
    try:
        pod_facts(a.Pod)
        if a.Nodes is not None:
            node_list_names(a.Nodes)
    except WireError as e:
        assert str(e)


pod_like = st.recursive(
    st.none() | st.integers(-3, 3) | st.text(max_size=6) | st.sampled_from(["2", "1Gi", "x"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["metadata", "spec", "containers", "resources", "limits", "requests",
                         "uid", "name", "annotations", "nvidia.com/gpu", "railyard.dev/vf",
                         "initContainers"]), inner, max_size=4),
    max_leaves=15)


@settings(max_examples=300, deadline=None)
@given(pod_like)
def test_any_pod_shape_gives_facts_or_a_wire_error(p):
    try:
        pod_facts(p if isinstance(p, dict) else {"metadata": p})
    except WireError as e:
        assert str(e)


def test_same_uid_and_resource_version_reuses_the_parsed_request():
    p = pod("u1", gpus=2, vfs=2)
    p["metadata"]["resourceVersion"] = "7"
    first = pod_facts(p)
    changed = pod("u1", gpus=4, vfs=4)
    changed["metadata"]["resourceVersion"] = "7"
    assert pod_facts(changed, {"u1": first}.get) is first
    changed["metadata"]["resourceVersion"] = "8"
    assert pod_facts(changed, {"u1": first}.get).request.gpus == 4
    del changed["metadata"]["resourceVersion"]  # no version: always parsed
    assert pod_facts(changed, {"u1": first}.get).request.gpus == 4


@settings(max_examples=40, deadline=None)
@given(gpus=st.integers(0, 8), vfs=st.integers(0, 8),
       numa=st.sampled_from([None, "single", "preferred", "none"]))
def test_cached_requests_equal_parsing_each_pod_afresh(gpus, vfs, numa):
    from railyard.allocation.request import request_from_pod

    hints = None if numa is None else {"numa": numa}
    for uid in ("a", "b"):  # the second pod of the same shape comes from the cache
        p = pod(uid, gpus, vfs, hints=hints)
        assert pod_facts(p).request == request_from_pod(p)


def test_a_bad_pod_is_reported_every_time_not_cached():
    bad = pod("x", 1, 1)
    bad["spec"]["containers"][0]["resources"]["limits"]["railyard.dev/vf"] = "lots"
    for _ in range(2):
        with pytest.raises(WireError, match=r"railyard\.dev/vf"):
            pod_facts(bad)


def test_a_sidecar_and_an_ordinary_init_container_with_equal_resources_are_not_confused():
    # The parsed-request cache is keyed by what decides the request: restartPolicy too.
    def with_init(uid: str, policy: str | None) -> dict:
        p = pod(uid, gpus=1, vfs=1)
        init = {"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        if policy is not None:
            init["restartPolicy"] = policy
        p["spec"]["initContainers"] = [init]
        return p

    assert pod_facts(with_init("a", None)).request.gpus == 1
    assert pod_facts(with_init("b", "Always")).request.gpus == 2
    assert pod_facts(with_init("c", None)).request.gpus == 1


@pytest.mark.parametrize("namespace", [[], 0, False, {}, "", "Team-A", "ns\n", "a" * 64])
def test_a_pod_namespace_that_is_not_one_is_a_wire_error_not_default(namespace):
    # Issue 19, class 7: `[]`, `0`, `false` and "" were read as "default" by the extender.
    p = pod("u1", gpus=1, vfs=1)
    p["metadata"]["namespace"] = namespace
    with pytest.raises(WireError, match=r"^Pod\.metadata\.namespace: expected a namespace"):
        pod_facts(p)


@pytest.mark.parametrize("namespace", [None, "MISSING"])
def test_a_pod_without_a_namespace_is_in_default_for_the_extender(namespace):
    p = pod("u1", gpus=1, vfs=1)
    if namespace is None:
        p["metadata"]["namespace"] = None
    else:
        p["metadata"].pop("namespace", None)
    assert pod_facts(p).namespace == "default"
