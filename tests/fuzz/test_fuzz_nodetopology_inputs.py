"""Fuzz sweep, what the agent of another node writes: its NodeTopology object. A precise
error, bounded cost.

Covered (each fed mutations of a valid object): `records.nodetopology_cr.spec_from_resource`
(the spec: the node's topology document) → `NodeTopology` or `NodeTopologyResourceError`
naming the field; `status_from_resource` and `status_from_json` (counts, unhealthy devices,
conditions) → the status or `NodeTopologyResourceError`. The API server holds the object to
the CRD's structural schema first (deploy/crds/), so these decoders see only JSON it
accepted; the sweep feeds them worse. The extender's reaction to a refused spec (the node is
forgotten) or status (the health it reported before is kept) is in
tests/scheduler/test_cluster_api.py.
"""

from __future__ import annotations

from fuzz_strategies import FUZZ, call, values
from hypothesis import given

from railyard.records.nodetopology_cr import (
    Condition,
    DeviceCounts,
    NodeTopologyResourceError,
    NodeTopologyStatus,
    UnhealthyDevice,
    node_topology_resource,
    spec_from_resource,
    status_from_json,
    status_from_resource,
    status_to_json,
)
from support.allocations import h100

MiB = 1 << 20
TOPOLOGY = h100(vfs_per_pf=2, node="node-a")
RESOURCE = node_topology_resource(TOPOLOGY, "9d2c0000-0000-4000-8000-000000000001")
STATUS = status_to_json(NodeTopologyStatus(
    gpus=DeviceCounts(8, 6, 2), nics=DeviceCounts(12, 10, 1), vfs=DeviceCounts(16, 12, 4),
    unhealthy=(UnhealthyDevice(TOPOLOGY.nics[0].pci_address, "link down"),),
    conditions=(Condition("Ready", "True", "Discovered", "8 GPUs, 12 NICs",
                          "2026-12-01T10:00:00Z"),),
    observed_generation=3))
OBJECT = {**RESOURCE, "status": STATUS}


def _names_the_field(e: BaseException) -> bool:
    return isinstance(e, NodeTopologyResourceError) and bool(e.reason) and (
        bool(e.path) or "expected" in e.reason)


def test_the_valid_object_is_taken_whole():
    assert spec_from_resource(OBJECT) == TOPOLOGY
    assert status_to_json(status_from_resource(OBJECT)) == STATUS


@FUZZ
@given(values(OBJECT))
def test_a_nodetopology_spec_is_a_topology_or_an_error_naming_the_field(obj):
    call(lambda: spec_from_resource(obj), NodeTopologyResourceError, says=_names_the_field,
         peak_bytes=16 * MiB)


@FUZZ
@given(values(OBJECT))
def test_a_nodetopology_status_is_a_status_or_an_error_naming_the_field(obj):
    call(lambda: status_from_resource(obj), NodeTopologyResourceError, says=_names_the_field,
         peak_bytes=4 * MiB)


@FUZZ
@given(values(STATUS))
def test_a_status_document_is_a_status_or_an_error_naming_the_field(doc):
    call(lambda: status_from_json(doc, "status"), NodeTopologyResourceError,
         says=_names_the_field, peak_bytes=4 * MiB)
