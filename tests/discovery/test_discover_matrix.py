"""`railyard discover --format matrix`: the square matrix of `nvidia-smi topo -m` over GPUs and
NICs, read back as a script would read it (tab-separated cells)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from railyard.cli.main import app
from railyard.cli.matrix import format_matrix
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import (
    DGX_A100,
    GENERIC,
    PROFILES,
    GpuSpec,
    NicSpec,
    NumaSpec,
    ProfileSpec,
    RootSpec,
    SwitchSpec,
    build_topology,
    device_paths,
)
from railyard.topology.model import Distance, NodeTopology

runner = CliRunner()
CODES = {d.name for d in Distance}


@dataclass
class Matrix:
    labels: list[str]  # the column headers, GPU0… then NIC0…
    rows: dict[str, list[str]]  # row label → its cells, affinity columns included
    nic_legend: dict[str, str]  # NIC0 → mlx5_0
    text: str

    def cell(self, a: str, b: str) -> str:
        return self.rows[a][self.labels.index(b)]


def parse(text: str) -> Matrix:
    lines = text.splitlines()
    header = lines[0].split("\t")
    assert header[0] == "" and header[-2:] == ["CPU Affinity", "NUMA Affinity"]
    rows = {}
    for line in lines[1:lines.index("")]:
        label, *cells = line.split("\t")
        rows[label] = cells
    legend = lines[lines.index("NIC Legend:") + 2:]
    nic_legend = dict(line.strip().split(": ", 1) for line in legend[:legend.index("")])
    return Matrix(header[1:-2], rows, nic_legend, text)


def matrix_of(*args: str) -> Matrix:
    result = runner.invoke(app, ["discover", *args, "--format", "matrix"])
    assert result.exit_code == 0, result.output
    return parse(result.stdout)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_matrix_is_square_symmetric_with_x_on_the_diagonal(name: str) -> None:
    t = build_topology(PROFILES[name])
    m = matrix_of("--profile", name)
    assert m.labels == [f"GPU{g.index}" for g in t.gpus] + [f"NIC{i}" for i in range(len(t.nics))]
    assert list(m.rows) == m.labels
    for a in m.labels:
        assert m.cell(a, a) == " X "
        for b in m.labels:
            if a != b:
                assert m.cell(a, b) in CODES and m.cell(a, b) == m.cell(b, a), (a, b)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_each_gpu_nic_cell_is_the_topologys_distance(name: str) -> None:
    t = build_topology(PROFILES[name])
    m = matrix_of("--profile", name)
    for g in t.gpus:
        for i, n in enumerate(t.nics):
            want = t.distance[g.pci_address][n.pci_address]
            assert m.cell(f"GPU{g.index}", f"NIC{i}") == want.name


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_gpu_rows_carry_cpu_and_numa_affinity_and_nic_rows_end_at_the_matrix(name: str) -> None:
    t = build_topology(PROFILES[name])
    m = matrix_of("--profile", name)
    cpus = {n.id: n.cpus for n in t.numa_nodes}
    for g in t.gpus:
        assert m.rows[f"GPU{g.index}"][-2:] == [cpus[g.numa_node], str(g.numa_node)]
    for i in range(len(t.nics)):
        assert len(m.rows[f"NIC{i}"]) == len(m.labels)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_nic_legend_names_each_nics_rdma_device(name: str) -> None:
    t = build_topology(PROFILES[name])
    m = matrix_of("--profile", name)
    assert m.nic_legend == {f"NIC{i}": n.rdma_device for i, n in enumerate(t.nics)}
    assert "Legend:" in m.text and "  PIX  = " in m.text and "  SYS  = " in m.text


def test_dgx_h100_relates_gpus_by_root_complex_and_numa_node_and_nics_by_switch() -> None:
    m = matrix_of("--profile", "dgx-h100")
    assert m.cell("GPU0", "GPU1") == "NODE"  # one socket, separate root complexes
    assert m.cell("GPU0", "GPU4") == "SYS"  # across sockets
    assert m.nic_legend["NIC0"] == "mlx5_0" and m.nic_legend["NIC1"] == "mlx5_1"
    assert m.cell("NIC0", "NIC1") == "PIX"  # GPU0's compute NIC and a storage port: one switch
    assert m.cell("NIC1", "NIC2") == "PIX"  # the two ports of the storage card
    assert m.cell("GPU0", "NIC0") == "PIX"
    assert m.rows["GPU0"][-2:] == ["0-55,112-167", "0"]


def test_dgx_a100_gpus_share_their_switch_and_reach_nics_through_the_top_switch() -> None:
    m = matrix_of("--profile", "dgx-a100")
    assert m.cell("GPU0", "GPU1") == "PIX"
    assert m.cell("NIC0", "NIC1") == "PIX"
    assert m.cell("GPU0", "NIC0") == "PXB"


# Two cases the topology document alone cannot tell apart (each GPU under a switch of its own
# on one root complex): GPU0 and GPU1 meet in a top switch (PXB); GPU2 and GPU3 hang off two
# root ports and meet only in the host bridge (PHB).
TWO_SWITCHES = ProfileSpec(
    name="two-switches", hostname="two-switches",
    numa=(NumaSpec("0-7", 1 << 34),),
    roots=(
        RootSpec(0x10, 0, (
            SwitchSpec(0x11, (
                SwitchSpec(0x13, (GpuSpec(0x15), NicSpec(bus=0x16, netdev="ibp22s0",
                                                         rdma_device="mlx5_0", compute=True))),
                SwitchSpec(0x18, (GpuSpec(0x1a),)),
            )),
        )),
        RootSpec(0x40, 0, (
            SwitchSpec(0x41, (GpuSpec(0x43),)),
            SwitchSpec(0x48, (GpuSpec(0x4a),)),
        )),
    ),
)


def test_gpus_under_separate_switches_are_pxb_below_a_shared_switch_else_phb() -> None:
    t = build_topology(TWO_SWITCHES, 0)
    assert len({g.switch for g in t.gpus}) == 4 and len({g.pcie_root for g in t.gpus}) == 2
    m = parse(format_matrix(t, device_paths(TWO_SWITCHES)))
    assert m.cell("GPU0", "GPU1") == "PXB"
    assert m.cell("GPU2", "GPU3") == "PHB"
    assert m.cell("GPU0", "GPU2") == "NODE"
    assert m.cell("GPU0", "NIC0") == "PIX" and m.cell("GPU1", "NIC0") == "PXB"


@pytest.mark.parametrize("spec", [TWO_SWITCHES, DGX_A100], ids=lambda s: s.name)
def test_a_discovered_tree_gives_the_profiles_matrix(tree_dir: Path, spec: ProfileSpec) -> None:
    root = write_fixture(spec, tree_dir / "tree", 1)
    found = runner.invoke(app, ["discover", "--sysfs-root", str(root), "--format", "matrix"])
    assert found.exit_code == 0, found.output
    assert found.stdout == format_matrix(build_topology(spec, 1, rails=False),
                                         device_paths(spec))


def test_a_gpu_without_a_numa_node_says_n_a_unless_its_cpus_place_it() -> None:
    """numa_node -1 (no node from the firmware): N/A, unless discovery placed the GPU by its
    local CPUs, inside one node; then that node and its CPUs, as nvidia-smi prints them (seen
    on a real H200 VM: tests/discovery/real)."""
    t = build_topology(GENERIC, 0)
    t = replace(t, gpus=(replace(t.gpus[0], numa_node=None), t.gpus[1]))
    paths = device_paths(GENERIC)
    gpu0 = t.gpus[0].pci_address
    unplaced = {**paths, gpu0: (paths[gpu0][0], None)}
    m = parse(format_matrix(t, unplaced))
    assert m.rows["GPU0"][-2:] == ["N/A", "N/A"]
    node = paths[gpu0][1]
    assert node is not None
    cpus = next(n.cpus for n in t.numa_nodes if n.id == node)
    m = parse(format_matrix(t, paths))
    assert m.rows["GPU0"] == [" X ", "NODE", "PIX", "NODE", cpus, str(node)]


def test_a_node_without_gpus_or_nics_prints_no_matrix() -> None:
    empty = NodeTopology("bare", (), (), (), {})
    assert format_matrix(empty, {}) == "Node bare: 0 GPUs, 0 RDMA NICs, 0 VFs, 0 NUMA nodes\n"
