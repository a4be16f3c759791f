"""The NodeTopology custom resource's codec: spec ↔ the topology model through the discovery
document's codec, status ↔ a small value, with errors that name the field."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.discovery.profiles import DGX_H100, HGX_H100_4NIC, build_topology
from railyard.records.nodetopology_cr import (
    API_VERSION,
    KIND,
    Condition,
    DeviceCounts,
    NodeTopologyResourceError,
    NodeTopologyStatus,
    UnhealthyDevice,
    node_topology_resource,
    spec_from_resource,
    status_from_resource,
    status_to_json,
)

STATUS = NodeTopologyStatus(
    gpus=DeviceCounts(total=8, free=6, held=2),
    nics=DeviceCounts(total=8, free=8, held=0),
    vfs=DeviceCounts(total=16, free=12, held=2),
    unhealthy=(UnhealthyDevice("0000:18:00.2", "link down"),
               UnhealthyDevice("0000:18:00.3", "link down")),
    conditions=(Condition("Published", "True", "Discovered", "8 GPUs, 8 NICs",
                          "2026-01-01T00:00:00Z"),),
    observed_generation=3,
)


@pytest.mark.parametrize("spec", [DGX_H100, HGX_H100_4NIC], ids=lambda s: s.hostname)
def test_a_resource_round_trips_its_topology_and_names_its_owner(spec):
    topology = build_topology(spec, 2, node="node-7")
    obj = node_topology_resource(topology, "uid-1")
    assert (obj["apiVersion"], obj["kind"], obj["metadata"]["name"]) == (API_VERSION, KIND,
                                                                          "node-7")
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-7", "uid": "uid-1"}]
    assert spec_from_resource(obj) == topology
    assert status_from_resource(obj) is None


def test_status_round_trips_and_shows_free_of_total_and_health():
    document = status_to_json(STATUS)
    assert document["summary"] == {"gpus": "6/8", "nics": "8/8", "vfs": "12/16"}
    assert document["health"] == "Degraded"
    assert status_from_resource({"status": document}) == STATUS
    healthy = NodeTopologyStatus(STATUS.gpus, STATUS.nics, STATUS.vfs)
    assert status_to_json(healthy)["health"] == "Healthy"


@given(total=st.integers(0, 1000), free=st.integers(0, 1000), held=st.integers(0, 1000))
def test_counts_that_do_not_add_up_are_refused_both_ways(total, free, held):
    fits = free + held <= total
    document = status_to_json(STATUS)
    document["vfs"] = {"total": total, "free": free, "held": held}
    if fits:
        decoded = status_from_resource({"status": document})
        assert decoded is not None and decoded.vfs == DeviceCounts(total, free, held)
    else:
        with pytest.raises(NodeTopologyResourceError, match=r"^status\.vfs: free"):
            status_from_resource({"status": document})
        with pytest.raises(ValueError):
            DeviceCounts(total, free, held)


def test_an_error_in_the_spec_names_the_field_under_spec():
    obj = node_topology_resource(build_topology(DGX_H100, 1, node="n"), None)
    bad = copy.deepcopy(obj)
    bad["spec"]["nics"][0]["pciAddress"] = "18:00.0"
    with pytest.raises(NodeTopologyResourceError, match=r"^spec\.nics\[0\]\.pciAddress: "):
        spec_from_resource(bad)
    bad = copy.deepcopy(obj)
    bad["metadata"]["name"] = "other"
    with pytest.raises(NodeTopologyResourceError, match=r"^spec\.node: expected the object"):
        spec_from_resource(bad)


@pytest.mark.parametrize(("key", "value", "says"), [
    ("conditions", [{"type": "X", "status": "Maybe", "reason": "R",
                     "lastTransitionTime": "t"}], r"status\.conditions\[0\]\.status"),
    ("unhealthyDevices", [{"pciAddress": "gpu0", "reason": "r"}],
     r"status\.unhealthyDevices\[0\]\.pciAddress"),
    ("gpus", {"total": 1, "free": -1, "held": 0}, r"status\.gpus\.free"),
])
def test_a_bad_status_field_is_named(key, value, says):
    document = status_to_json(STATUS)
    document[key] = value
    with pytest.raises(NodeTopologyResourceError, match=says):
        status_from_resource({"status": document})
