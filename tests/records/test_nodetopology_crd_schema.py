"""Every field the NodeTopology codec writes is one the CRD's schema declares: the API server
prunes unknown fields of a structural schema without a word, so a field missing there is
lost between the agent and the extender (as `nics[].dataDirect` was)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from railyard.discovery.profiles import PROFILES, build_topology
from railyard.records.fields import MAX_ERROR_CHARS, FieldError, Fields
from railyard.records.nodetopology_cr import (
    DeviceCounts,
    NodeTopologyStatus,
    UnhealthyDevice,
    node_topology_resource,
    status_to_json,
)

CRD = Path(__file__).parents[2] / "deploy/crds/nodetopologies.railyard.dev.yaml"


def pruned(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The paths of `value` a structural schema would prune (fields it does not declare)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(value, dict):
        declared = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if not path and key in ("apiVersion", "kind", "metadata"):
                continue  # the API server's own, whatever the schema says
            if declared is not None and key in declared:
                out += pruned(item, declared[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += pruned(item, extra, f"{path}.{key}")
            else:
                out.append(f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += pruned(item, schema["items"], f"{path}[{i}]")
    return out


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_field_the_agent_writes_survives_the_api_servers_pruning(schema, name):
    topology = build_topology(PROFILES[name], vfs_per_pf=2, node="n1")
    # A VF of a second pool, as an agent with vfPools publishes it.
    nics = list(topology.nics)
    for i, nic in enumerate(nics):
        if nic.vfs:
            vfs = (dataclasses.replace(nic.vfs[0], pool="example.com/vf_storage"),
                   *nic.vfs[1:])
            nics[i] = dataclasses.replace(nic, vfs=vfs)
            break
    topology = dataclasses.replace(topology, nics=tuple(nics))
    resource = node_topology_resource(topology, node_uid="5c9e0a3e-0000-4000-8000-00000000000a")
    counts = DeviceCounts(total=2, free=1, held=0)
    status = status_to_json(NodeTopologyStatus(
        gpus=counts, nics=counts, vfs=counts,
        unhealthy=(UnhealthyDevice(topology.nics[0].pci_address, "link down"),)))
    assert pruned({**resource, "status": status}, schema) == []


def test_the_check_finds_a_field_the_schema_lacks(schema):
    assert pruned({"spec": {"node": "n1", "surprise": 1}}, schema) == [".spec.surprise"]


def test_a_field_error_quoting_a_huge_value_says_at_most_a_kibibyte():
    # The fuzz sweep (random draws): the one field reader's errors quoted a caller's value
    # whole, 4 KiB to 70 KiB back into kube-scheduler's answers and the logs.
    with pytest.raises(FieldError) as e:
        Fields({"status": "True" * 5000}, "status").one_of("status", ("True", "False"))
    assert len(str(e.value)) <= MAX_ERROR_CHARS and "more characters)" in str(e.value)
