"""Discovery on sysfs captured from real machines (tests/discovery/real/README.md): the tree
read back here must give the document `railyard discover` printed on the machine, and the
matrix the GPU affinities `nvidia-smi topo -m` printed there."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from railyard.cli.main import app
from railyard.discovery.discover import discover
from railyard.records.topology import topology_to_json

REAL = Path(__file__).parent / "real"
MACHINES = sorted(p.name.removesuffix(".sysfs.tar.gz") for p in REAL.glob("*.sysfs.tar.gz"))


def unpacked(name: str, into: Path) -> Path:
    with tarfile.open(REAL / f"{name}.sysfs.tar.gz") as tar:
        tar.extractall(into, filter="tar")  # relative links inside the tree only
    return into


def gpu_affinities(table: str) -> dict[str, tuple[str, str]]:
    """GPU row -> (CPU Affinity, NUMA Affinity), from nvidia-smi's or our matrix."""
    lines = table.splitlines()
    header = lines[0].split("\t")
    cpu, numa = header.index("CPU Affinity"), header.index("NUMA Affinity")
    rows = [line.split("\t") for line in lines[1:lines.index("")]]
    return {r[0]: (r[cpu].strip(), r[numa].strip()) for r in rows if r[0].startswith("GPU")}


def test_every_capture_has_its_records():
    assert MACHINES, "no captured machine"
    for name in MACHINES:
        assert (REAL / f"{name}.discover.json").is_file()
        assert (REAL / f"{name}.nvidia-smi-topo.txt").is_file()


@pytest.mark.parametrize("name", MACHINES)
def test_the_capture_reads_back_as_discover_printed_it_there(name: str, tmp_path: Path):
    found = discover(unpacked(name, tmp_path))
    assert found.warnings == ()
    expected = json.loads((REAL / f"{name}.discover.json").read_text())
    assert topology_to_json(found.topology) == expected


@pytest.mark.parametrize("name", MACHINES)
def test_the_matrix_gives_the_gpu_affinities_nvidia_smi_gave(name: str, tmp_path: Path):
    root = unpacked(name, tmp_path)
    result = CliRunner().invoke(app, ["discover", "--sysfs-root", str(root),
                                      "--format", "matrix"])
    assert result.exit_code == 0, result.output
    theirs = gpu_affinities((REAL / f"{name}.nvidia-smi-topo.txt").read_text())
    assert theirs and gpu_affinities(result.output) == theirs


def test_capture_sysfs_keeps_what_discovery_reads(tmp_path: Path):
    """hack/capture-sysfs, run on a fixture tree (it copies a small part of it), must give a
    tree that discovery reads to the same document as the whole one."""
    import subprocess
    import sys

    from railyard.discovery.fixture import write_fixture
    from railyard.discovery.profiles import DGX_H100

    tree = tmp_path / "tree"
    write_fixture(DGX_H100, tree, 2, node="captured")
    out = tmp_path / "out"
    tool = Path(__file__).resolve().parents[2] / "hack" / "capture-sysfs"
    subprocess.run([sys.executable, str(tool), str(out), "--root", str(tree)], check=True,
                   capture_output=True, timeout=120)
    whole = topology_to_json(discover(tree).topology)
    assert json.loads((out / "discover.json").read_text()) == whole
    back = tmp_path / "back"
    with tarfile.open(out / "sysfs.tar.gz") as tar:
        tar.extractall(back, filter="tar")
        assert len(tar.getnames()) < sum(1 for _ in tree.rglob("*")), "copied it all"
    assert topology_to_json(discover(back).topology) == whole
