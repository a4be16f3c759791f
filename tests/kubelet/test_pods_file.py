"""The pods-file PodSource: re-read on change, input only, a bad file keeps the last list."""

from __future__ import annotations

import json
import os

import pytest

from railyard.kubelet.pods import PodsFile, PodsFileError, parse_pods


def pod(uid: str) -> dict:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "ns"},
            "spec": {"nodeName": "n", "containers": [{"name": "c"}]}}


def write(path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(data if isinstance(data, str) else json.dumps(data))
    os.replace(tmp, path)


def test_list_and_podlist_forms(tmp_path):
    f = tmp_path / "pods.json"
    write(f, [pod("a")])
    src = PodsFile(f)
    assert [p.uid for p in src.pods()] == ["a"] and src.loaded
    write(f, {"kind": "PodList", "items": [pod("a"), pod("b")]})
    assert [p.uid for p in src.pods()] == ["a", "b"]


def test_a_broken_file_keeps_the_last_good_list(tmp_path, caplog):
    f = tmp_path / "pods.json"
    write(f, [pod("a")])
    src = PodsFile(f)
    src.pods()
    write(f, "[{")
    assert [p.uid for p in src.pods()] == ["a"]
    assert "keeping the last list" in caplog.text


@pytest.mark.parametrize("text", [
    "[" + "9" * 5000 + "]",  # past int()'s 4,300-digit limit: a ValueError, not a decode error
    "[" * 100_000 + "]" * 100_000,  # past the parser's recursion limit: a RecursionError
], ids=["5000-digit-integer", "deeply-nested"])
def test_a_file_the_json_parser_cannot_hold_keeps_the_last_good_list(tmp_path, caplog, text):
    # Issue 19, class 7: both escaped the reader and failed kubelet's Allocate.
    f = tmp_path / "pods.json"
    write(f, [pod("a")])
    src = PodsFile(f)
    src.pods()
    write(f, text)
    assert [p.uid for p in src.pods()] == ["a"] and src.loaded
    assert "keeping the last list" in caplog.text


@pytest.mark.parametrize("namespace", [[], 0, False, {}, "", "Team-A", "ns\n", "a" * 64],
                         ids=["list", "zero", "false", "object", "empty", "upper-case",
                              "newline", "64-chars"])
def test_a_namespace_that_is_not_one_is_refused_not_read_as_default(namespace):
    # Issue 19, class 7: `[]`, `0` and `false` read as "default", so such a pod could take
    # the record of a pod of that name in the default namespace.
    bad = pod("b")
    bad["metadata"]["namespace"] = namespace
    pods, warnings = parse_pods([pod("a"), bad])
    assert [p.uid for p in pods] == ["a"]
    assert len(warnings) == 1 and warnings[0].startswith("pods[1]: metadata.namespace: "
                                                         "expected a namespace"), warnings


@pytest.mark.parametrize("namespace", [None, "MISSING"])
def test_a_pod_without_a_namespace_is_in_default(namespace):
    p = pod("a")
    if namespace is None:
        p["metadata"]["namespace"] = None
    else:
        del p["metadata"]["namespace"]
    (view,), _ = parse_pods([p])
    assert view.namespace == "default"


def test_a_missing_file_is_not_loaded(tmp_path):
    src = PodsFile(tmp_path / "nope.json")
    assert src.pods() == [] and not src.loaded


def test_pods_without_identity_are_skipped_with_a_warning():
    pods, warnings = parse_pods([pod("a"), {"metadata": {"name": "x"}}, 7])
    assert [p.uid for p in pods] == ["a"]
    assert warnings[0].startswith("pods[1]: metadata.uid")
    assert len(warnings) == 2


@pytest.mark.parametrize("data", [{"kind": "Pod"}, "pods", 3])
def test_not_a_list_of_pods(data):
    with pytest.raises(PodsFileError):
        parse_pods(data)


def test_a_non_string_creation_timestamp_is_read_as_absent_with_a_warning():
    odd = pod("odd")
    odd["metadata"]["creationTimestamp"] = 1767225600
    pods, warnings = parse_pods([odd, pod("ok")], where="pods.json")
    assert [(p.uid, p.created) for p in pods] == [("odd", ""), ("ok", "")]
    assert warnings == ["pods.json[0] (ns/odd): metadata.creationTimestamp: expected an "
                        "RFC 3339 string, got int; read as absent"]
