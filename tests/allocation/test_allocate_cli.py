"""`railyard allocate` as users run it: JSON out, reasons with exit 1, bad input exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from railyard.allocation.types import Allocation
from railyard.cli.main import app
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import GENERIC
from railyard.records.allocation import allocation_from_json, allocation_to_json

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["allocate", *args])


def test_profile_request_prints_the_allocation_record():
    result = run("--profile", "hgx-h100-4nic", "--request", "gpus=2,vfs=2")
    assert result.exit_code == 0, result.output
    a = allocation_from_json(json.loads(result.stdout))
    assert [p.distance.name for p in a.pairs] == ["PIX", "PIX"]
    assert a.node == "hgx-h100-4nic"


def test_node_name_and_hints_apply():
    result = run("--profile", "dgx-h100", "--node", "gpu-17", "--request",
                 "gpus=2,vfs=1,cpus=4", "--hints", '{"pairing": "shared"}')
    assert result.exit_code == 0, result.output
    a = allocation_from_json(json.loads(result.stdout))
    assert a.node == "gpu-17"
    assert len(a.pairs) == 2 and len({p.nic.pci_address for p in a.pairs}) == 1
    assert a.cpus == "0-3"


def test_infeasible_prints_the_reason_and_exits_1():
    result = run("--profile", "dgx-a100", "--request", "gpus=2,vfs=2",
                 "--hints", '{"maxDistance": "PIX"}')
    assert result.exit_code == 1
    assert result.stdout.startswith("unresolvable: maxDistance PIX")


def _used_file(tmp_path: Path, allocations: list[Allocation], *, pods: bool) -> Path:
    docs = [allocation_to_json(a) for a in allocations]
    data = ({"pods": [{"uid": f"u{i}", "namespace": "ns", "name": f"p{i}", "node": a.node,
                       "allocation": d} for i, (a, d) in enumerate(zip(allocations, docs,
                                                                         strict=True))]}
            if pods else docs)
    path = tmp_path / "used.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("pods", [True, False])
def test_used_file_holds_devices_in_both_shapes(tmp_path: Path, pods: bool):
    first = run("--profile", "generic", "--request", "gpus=1,vfs=1")
    held = allocation_from_json(json.loads(first.stdout))
    path = _used_file(tmp_path, [held], pods=pods)
    second = run("--profile", "generic", "--request", "gpus=1,vfs=1", "--used", str(path))
    assert second.exit_code == 0, second.output
    other = allocation_from_json(json.loads(second.stdout))
    assert other.pairs[0].gpu != held.pairs[0].gpu
    full = run("--profile", "generic", "--request", "gpus=2", "--used", str(path))
    assert full.exit_code == 1 and full.stdout.startswith("infeasible: ")


def test_used_file_for_another_node_warns_and_holds_nothing(tmp_path: Path):
    held = allocation_from_json(json.loads(
        run("--profile", "generic", "--node", "other", "--request", "gpus=2").stdout))
    path = _used_file(tmp_path, [held], pods=True)
    result = run("--profile", "generic", "--request", "gpus=2", "--used", str(path))
    assert result.exit_code == 0
    assert "no allocation for node 'generic'" in result.stderr


@pytest.mark.parametrize(("args", "field"), [
    (["--profile", "generic", "--request", "gpus=two"], "--request: gpus"),
    (["--profile", "generic", "--request", "gpu=1"], "--request: gpu"),
    (["--profile", "generic", "--request", "gpus=1", "--hints", "{"], "--hints"),
    (["--profile", "generic", "--request", "gpus=1", "--hints", '{"maxDistance": "FAR"}'],
     "hints.maxDistance"),
    (["--profile", "nope", "--request", "gpus=1"], "--profile"),
    (["--request", "gpus=1"], "--sysfs-root"),
    (["--profile", "generic", "--vfs-per-pf", "999", "--request", "gpus=1"], "--vfs-per-pf"),
])
def test_bad_input_exits_2_naming_the_field(args: list[str], field: str):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert field in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("content", "field"), [
    ("not json", "--used"),
    ('{"pods": [{"uid": "", "allocation": {}}]}', "used.pods[0].uid"),
    ('[{"version": 1, "node": "generic"}]', "used[0].decidedBy"),
    ("42", "--used"),
    ('{"pods": [{"uid": "a", "allocation": {"version": ' + "1" * 5000 + "}}]}", "--used"),
])
def test_bad_used_file_exits_2_naming_the_entry(tmp_path: Path, content: str, field: str):
    path = tmp_path / "used.json"
    path.write_text(content)
    result = run("--profile", "generic", "--request", "gpus=1", "--used", str(path))
    assert result.exit_code == 2, result.output
    assert field in result.stderr


def test_overlapping_used_entries_exit_2(tmp_path: Path):
    held = allocation_from_json(json.loads(
        run("--profile", "generic", "--request", "gpus=1,vfs=1").stdout))
    path = _used_file(tmp_path, [held, held], pods=False)
    result = run("--profile", "generic", "--request", "gpus=1", "--used", str(path))
    assert result.exit_code == 2
    assert "used[1]" in result.stderr and "already held" in result.stderr


def test_sysfs_root_gives_the_same_answer_as_the_profile(tmp_path: Path):
    root = write_fixture(GENERIC, tmp_path / "tree", vfs_per_pf=2)
    from_tree = run("--sysfs-root", str(root), "--request", "gpus=1,vfs=1")
    from_profile = run("--profile", "generic", "--vfs-per-pf", "2", "--request", "gpus=1,vfs=1")
    assert from_tree.exit_code == 0, from_tree.output
    # Discovery cannot see cabling: the profile's pairs carry its rails, the tree's none.
    profile_doc = json.loads(from_profile.stdout)
    assert [p.pop("rail") for p in profile_doc["pairs"]] == [0]
    assert json.loads(from_tree.stdout) == profile_doc


def test_koordinator_output_lists_gpus_and_rdma():
    result = run("--profile", "dgx-h100", "--request", "gpus=1,vfs=1", "--output", "koordinator")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["gpu"][0]["minor"] == 0
    assert doc["rdma"][0] == {"minor": 0, "id": "0000:18:00.0",
                              "resources": {"koordinator.sh/rdma": "1"},
                              "extension": {"vfs": [{"minor": -1, "busID": "0000:18:00.1"}]}}
