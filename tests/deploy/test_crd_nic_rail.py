"""The NodeTopology CRD keeps a NIC's `rail` (docs/rails.md): a structural schema drops a
field it does not list, so `rail` must be a property, optional, in both copies of the CRD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.records.topology import topology_to_json

REPO = Path(__file__).resolve().parents[2]


def nic_schema(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["nics"]["items"]


@pytest.mark.parametrize("crd", ["deploy/crds", "deploy/chart/railyard/crds"])
def test_the_crd_keeps_a_nics_rail_and_does_not_require_it(crd):
    schema = nic_schema(REPO / crd / "nodetopologies.railyard.dev.yaml")
    written = topology_to_json(build_topology(DGX_H100, 0))["nics"][0]
    assert written["rail"] == 0
    assert "rail" in schema["properties"] and "rail" not in schema["required"]
    rail = schema["properties"]["rail"]
    assert rail == {"type": "integer", "minimum": 0, "maximum": 1023}


def test_the_rendered_manifests_carry_the_same_rail_property():
    docs = [d for d in yaml.safe_load_all((REPO / "deploy/manifests/railyard.yaml").read_text())
            if d and d.get("kind") == "CustomResourceDefinition"]
    (crd,) = docs
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["nics"]["items"]["properties"]["rail"]["maximum"] == 1023
