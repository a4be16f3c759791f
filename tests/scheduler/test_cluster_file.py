"""Cluster files and specs: every node shape users can write, every mistake named by field."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_helpers import hand_allocation

from railyard.discovery.profiles import build_topology, profile
from railyard.records.allocation import allocation_to_json
from railyard.records.topology import topology_to_json
from railyard.scheduler.cluster_file import (
    BoundPod,
    ClusterFileError,
    cluster_from_json,
    cluster_from_spec,
    load_cluster,
    pod_from_json,
    pod_to_json,
)

H100 = build_topology(profile("dgx-h100"), node="gpu-1")


def test_spec_names_nodes_by_profile_and_number_in_order():
    c = cluster_from_spec("dgx-h100:3,dgx-a100:2")
    assert [t.node for t in c] == ["dgx-h100-000", "dgx-h100-001", "dgx-h100-002",
                                   "dgx-a100-000", "dgx-a100-001"]
    assert len(c) == 5 and c.pods == ()


def test_spec_pads_to_four_digits_past_a_thousand_nodes():
    c = cluster_from_spec("hgx-h100-4nic:1001")
    assert c.topologies[0].node == "hgx-h100-4nic-0000"
    assert c.topologies[-1].node == "hgx-h100-4nic-1000"


def test_spec_nodes_of_one_profile_share_their_device_tuples():
    a, b = cluster_from_spec("dgx-h100:2")
    assert a.gpus is b.gpus and a.nics is b.nics and a.node != b.node
    assert a.shape_key == b.shape_key


def test_spec_honours_vfs_per_pf():
    (t,) = cluster_from_spec("dgx-h100:1", vfs_per_pf=2)
    assert max(len(n.vfs) for n in t.nics) == 2


@pytest.mark.parametrize("spec, message", [
    ("", "expected profile:count"),
    ("dgx-h100:0", "count must be a positive integer"),
    ("dgx-h100:x", "count must be a positive integer"),
    ("dgx-h100:100001", "at most 100,000 nodes per profile"),
    ("nonesuch:3", "unknown profile 'nonesuch'"),
    ("dgx-h100:2,dgx-h100:1", "given twice"),
])
def test_bad_spec_is_refused_naming_the_part(spec, message):
    with pytest.raises(ClusterFileError, match=message):
        cluster_from_spec(spec)


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.sampled_from(["dgx-h100", "dgx-a100", "hgx-h100-4nic", "mi300x"]),
                       st.integers(1, 40), min_size=1))
def test_spec_gives_the_asked_counts_with_unique_names(counts):
    spec = ",".join(f"{p}:{n}" for p, n in counts.items())
    c = cluster_from_spec(spec)
    names = [t.node for t in c]
    assert len(names) == len(set(names)) == sum(counts.values())
    for p, n in counts.items():
        assert sum(1 for x in names if x.rsplit("-", 1)[0] == p) == n


def test_yaml_file_with_profiles_topologies_and_pods(tmp_path):
    alloc = hand_allocation(H100, [(0, 0, 0)])
    doc = {
        "nodes": [
            {"name": "a", "profile": "dgx-a100"},
            {"name": "b", "profile": "dgx-h100", "vfsPerPf": 4},
            {"name": "gpu-1", "topology": topology_to_json(H100)},
            {"name": "renamed", "topology": topology_to_json(H100)},
        ],
        "pods": [{"namespace": "ml", "name": "p", "uid": "u1", "node": "gpu-1",
                  "allocation": allocation_to_json(alloc)}],
    }
    f = tmp_path / "cluster.yaml"
    f.write_text(yaml.safe_dump(doc))
    c = load_cluster(f)
    assert [t.node for t in c] == ["a", "b", "gpu-1", "renamed"]
    assert max(len(n.vfs) for n in c.topologies[1].nics) == 4
    assert c.topologies[2] == H100
    assert c.topologies[3].gpus == H100.gpus
    assert c.pods == (BoundPod("ml", "p", "u1", "gpu-1", alloc),)


def test_json_file_reads_the_same_as_yaml(tmp_path):
    doc = {"nodes": [{"name": "a", "profile": "mi300x"}]}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    assert load_cluster(tmp_path / "c.json") == load_cluster(tmp_path / "c.yaml")


def alloc_json(node: str = "gpu-1") -> dict:
    return allocation_to_json(hand_allocation(H100, [(0, 0, 0)])) | {"node": node}


@pytest.mark.parametrize("doc, message", [
    ([], "cluster: expected an object"),
    ({"nodes": {}}, "cluster.nodes: expected a list"),
    ({"nodes": [], "extra": 1}, "cluster.extra: unknown key"),
    ({"nodes": [{"profile": "dgx-h100"}]}, r"nodes\[0\].name: missing"),
    ({"nodes": [{"name": "a"}]}, r"nodes\[0\]: give exactly one of"),
    ({"nodes": [{"name": "a", "profile": "dgx-h100", "topology": {}}]}, "exactly one"),
    ({"nodes": [{"name": "a", "profile": "x"}]}, r"nodes\[0\].profile: unknown profile"),
    ({"nodes": [{"name": "a", "profile": "dgx-h100", "vfsPerPf": 500}]}, "vfsPerPf"),
    ({"nodes": [{"name": "a", "profile": "dgx-h100", "vfsPerPf": True}]}, "vfsPerPf"),
    ({"nodes": [{"name": "a", "profile": "dgx-h100", "cpus": 3}]}, r"nodes\[0\].cpus: unknown"),
    ({"nodes": [{"name": "a", "topology": {"version": 1}}]},
     r"nodes\[0\]\.topology\.numaNodes: missing"),
    ({"nodes": [{"name": "a", "profile": "dgx-h100"}, {"name": "a", "profile": "dgx-a100"}]},
     r"nodes\[1\].name: duplicate node 'a'"),
    ({"nodes": [], "pods": {}}, "cluster.pods: expected a list"),
    ({"nodes": [], "pods": [{"namespace": "n", "name": "p", "uid": "u", "node": "x"}]},
     r"pods\[0\].node: unknown node 'x'"),
    ({"nodes": [{"name": "gpu-1", "profile": "dgx-h100"}],
      "pods": [{"namespace": "n", "name": "p", "uid": "u", "node": "gpu-1",
                "allocation": alloc_json("other")}]},
     r"pods\[0\].allocation.node: 'other' differs"),
    ({"nodes": [{"name": "gpu-1", "profile": "dgx-h100"}],
      "pods": [{"namespace": "n", "name": "p", "uid": "u", "node": "gpu-1",
                "allocation": alloc_json() | {"pairs": "x"}}]},
     r"pods\[0\].allocation.pairs: expected a list"),
    ({"nodes": [{"name": "gpu-1", "profile": "dgx-h100"}],
      "pods": [{"namespace": "n", "name": "p", "uid": "u", "node": "gpu-1"},
               {"namespace": "n", "name": "q", "uid": "u", "node": "gpu-1"}]},
     r"pods\[1\].uid: duplicate uid 'u'"),
])
def test_bad_cluster_document_is_refused_naming_the_field(doc, message):
    with pytest.raises(ClusterFileError, match=message):
        cluster_from_json(doc)


def test_unreadable_or_unparsable_file_names_the_path(tmp_path):
    with pytest.raises(ClusterFileError, match="cannot read"):
        load_cluster(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [\n")
    with pytest.raises(ClusterFileError, match=r"bad\.yaml: neither JSON nor YAML"):
        load_cluster(bad)


def test_pod_record_round_trips():
    p = BoundPod("ml", "p", "u1", "gpu-1", hand_allocation(H100, [(1, 0, 3), (2, 3, 0)]))
    assert pod_from_json(json.loads(json.dumps(pod_to_json(p))), "pod") == p


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["nodes", "pods", "name", "profile", "topology", "vfsPerPf", "uid",
                         "node", "namespace", "allocation"]) | st.text(max_size=5),
        inner, max_size=5),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_document_is_a_cluster_or_a_named_error(doc):
    try:
        cluster_from_json(doc)
    except ClusterFileError as e:
        assert str(e)


@pytest.mark.parametrize("text", [
    '{"nodes": [{"name": "a", "profile": "dgx-h100", "vfsPerPf": ' + "1" * 5000 + "}]}",
    "nodes:\n- name: a\n  profile: dgx-h100\n  vfsPerPf: " + "1" * 5000 + "\n",
])
def test_an_over_long_integer_is_a_cluster_file_error_naming_the_path(tmp_path, text):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    with pytest.raises(ClusterFileError, match=str(path)):
        load_cluster(path)


def test_a_deeply_nested_cluster_file_is_a_cluster_file_error(tmp_path):
    # Python's json raises RecursionError past ~1,000 levels, not a decode error.
    path = tmp_path / "cluster.json"
    path.write_text('{"nodes": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(ClusterFileError, match=str(path)):
        load_cluster(path)
