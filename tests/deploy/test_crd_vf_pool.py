"""The NodeTopology CRD keeps a VF's `pool` (docs/decisions/0085): a structural schema makes
the API server drop a field it does not list, so every key the codec writes for a VF must
be a property, `pool` optional, and its pattern must take a resource name. (The box's API
server applies this schema in tests/box/test_kube_nodetopology.py.)"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.records.topology import topology_to_json

REPO = Path(__file__).resolve().parents[2]


def vf_schema(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["nics"]["items"]["properties"]["vfs"]["items"]


@pytest.mark.parametrize("crd", ["deploy/crds", "deploy/chart/railyard/crds"])
def test_the_crd_keeps_a_vfs_pool_and_does_not_require_it(crd):
    schema = vf_schema(REPO / crd / "nodetopologies.railyard.dev.yaml")
    t = build_topology(DGX_H100, vfs_per_pf=2)
    nic = t.nics[0]
    t = replace(t, nics=(replace(nic, vfs=(replace(nic.vfs[0], pool="railyard.dev/vf-rail"),
                                           *nic.vfs[1:])), *t.nics[1:]))
    written = topology_to_json(t)["nics"][0]["vfs"][0]
    assert set(written) <= set(schema["properties"])
    assert "pool" not in schema["required"]
    pool = schema["properties"]["pool"]
    assert pool["type"] == "string" and len("example.com/vf_storage") <= pool["maxLength"]
    pattern = re.compile(pool["pattern"])
    assert pattern.search("railyard.dev/vf-rail") and pattern.search("example.com/vf_storage")
    assert not pattern.search("no-slash") and not pattern.search("a/b/c")
