"""`railyard discover` (what this node, a fake tree or a profile holds) and `railyard fixture`
(write a profile as a fake sysfs tree). Imports stay inside the commands: the whole process
must start and finish in well under a second.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from railyard.cli.app import app, fail

if TYPE_CHECKING:
    from railyard.topology.model import NodeTopology


class Format(StrEnum):
    json = "json"
    matrix = "matrix"


@app.command()
def discover(
    sysfs_root: Annotated[Path | None, typer.Option(
        "--sysfs-root", metavar="DIR",
        help="Folder holding sys/ and proc/ (a fixture tree); default: this machine, /.")] = None,
    profile: Annotated[str | None, typer.Option(
        "--profile", metavar="NAME",
        help="Show a built-in hardware profile instead of discovering (dgx-h100, dgx-a100, "
             "hgx-h100-4nic, mi300x, generic).")] = None,
    vfs_per_pf: Annotated[int | None, typer.Option(
        "--vfs-per-pf", metavar="N", help="VFs per compute PF, with --profile (default 8).")
    ] = None,
    format: Annotated[Format, typer.Option(
        "--format", help="json: the topology document; matrix: GPU × NIC distance table.")
    ] = Format.json,
) -> None:
    """Discover GPUs, RDMA NICs (PFs and VFs), NUMA nodes and their PCIe distances."""
    from railyard.cli.source import node_topology

    topology = node_topology(sysfs_root, profile, vfs_per_pf, default_root=Path("/"))
    if format is Format.json:
        import json

        from railyard.records.topology import topology_to_json

        print(json.dumps(topology_to_json(topology), indent=2))
    else:
        print(format_matrix(topology), end="")


@app.command()
def fixture(
    outdir: Annotated[Path, typer.Argument(metavar="OUTDIR", help="Empty or new folder.")],
    profile: Annotated[str, typer.Option("--profile", metavar="NAME",
                                         help="Hardware profile to write.")],
    vfs_per_pf: Annotated[int, typer.Option("--vfs-per-pf", metavar="N",
                                            help="VFs per compute PF (0-127).")] = 8,
) -> None:
    """Write a hardware profile as a fake sysfs tree (sys/ and proc/) that discovery reads."""
    from railyard.discovery.fixture import write_fixture
    from railyard.discovery.profiles import profile as find_profile

    try:
        spec = find_profile(profile)
        write_fixture(spec, outdir, vfs_per_pf)
    except (ValueError, OSError) as exc:
        fail(str(exc))
    print(f"wrote {spec.name} ({vfs_per_pf} VFs per compute PF) to {outdir}")


# ----------------------------------------------------------------------------- matrix

_LEGEND = """\
Legend:
  PIX  = at most one PCIe switch between the devices
  PXB  = several PCIe switches, no host bridge
  PHB  = through a PCIe host bridge (one root complex)
  NODE = different root complexes on one NUMA node
  SYS  = across the socket interconnect (different NUMA nodes)
"""


def format_matrix(t: NodeTopology) -> str:
    """A GPU × NIC table in the manner of `nvidia-smi topo -m`, with NUMA and CPU columns."""
    cpus_of = {n.id: n.cpus for n in t.numa_nodes}
    headers = ["", *(f"NIC{i}" for i in range(len(t.nics))), "NUMA", "CPU Affinity"]
    rows = [headers]
    for g in t.gpus:
        numa = "N/A" if g.numa_node is None else str(g.numa_node)
        cpus = cpus_of.get(g.numa_node, "N/A") if g.numa_node is not None else "N/A"
        rows.append([
            f"GPU{g.index}",
            *(t.distance[g.pci_address][n.pci_address].name for n in t.nics),
            numa,
            cpus or "N/A",
        ])
    widths = [max(len(r[c]) for r in rows) for c in range(len(headers))]
    lines = [f"Node {t.node}: {len(t.gpus)} GPUs, {len(t.nics)} RDMA NICs, "
             f"{sum(len(n.vfs) for n in t.nics)} VFs, {len(t.numa_nodes)} NUMA nodes", ""]
    if t.gpus:
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                  for r in rows]
        lines.append("")
    if t.gpus:
        lines.append("GPU Legend:")
        lines += [f"  GPU{g.index}: {g.pci_address}  {g.vendor}:{g.device}"
                  f"  {g.uuid or 'no UUID'}" for g in t.gpus]
        lines.append("")
    if t.nics:
        lines.append("NIC Legend:")
        for i, n in enumerate(t.nics):
            vfs = f"{len(n.vfs)}/{n.total_vfs} VFs"
            extra = "  default route" if n.default_route else ""
            lines.append(
                f"  NIC{i}: {n.rdma_device or '-'}  {n.pci_address}  {n.netdev or '-'}"
                f"  {n.link_layer or '-'} {n.port_state or '-'}  {vfs}{extra}"
            )
        lines.append("")
    if t.gpus and t.nics:
        lines.append(_LEGEND)
    return "\n".join(lines)
