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
        help="Folder holding sys/ and proc/ (a fixture tree), or that sys/ itself; "
             "default: this machine, /.")] = None,
    profile: Annotated[str | None, typer.Option(
        "--profile", metavar="NAME",
        help="Show a built-in hardware profile instead of discovering (dgx-h100, dgx-a100, "
             "hgx-h100-4nic, mi300x, cpu-rdma, generic, gb300-dd, xe8640).")] = None,
    vfs_per_pf: Annotated[int | None, typer.Option(
        "--vfs-per-pf", metavar="N", help="VFs per compute PF, with --profile (default 8).")
    ] = None,
    format: Annotated[Format, typer.Option(
        "--format", help="json: the topology document; matrix: GPUs and NICs against each "
                         "other as `nvidia-smi topo -m` prints them, with the legend.")
    ] = Format.json,
    rails: Annotated[str | None, typer.Option(
        "--rails", metavar="SCHEME|JSON",
        help="Each NIC's fabric rail, as the agent's `rails` config gives it: pci-order, or "
             "a JSON map of PF PCI address, netdev or RDMA device to rail (docs/rails.md). "
             "Profiles have rails already; discovery alone cannot see cabling.")] = None,
) -> None:
    """Discover GPUs, RDMA NICs (PFs and VFs), NUMA nodes and their PCIe distances."""
    from railyard.cli.source import node_topology_and_paths

    topology, paths = node_topology_and_paths(sysfs_root, profile, vfs_per_pf,
                                              default_root=Path("/"))
    if rails is not None:
        topology = _with_rails(topology, rails)
    if format is Format.json:
        import json

        from railyard.records.topology import topology_to_json

        print(json.dumps(topology_to_json(topology), indent=2))
    else:
        from railyard.cli.matrix import format_matrix

        print(format_matrix(topology, paths), end="")


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


def _with_rails(topology: NodeTopology, text: str) -> NodeTopology:
    """`--rails`: parsed as the agent's config parses `rails`; a name no NIC has is an error
    here (one node, one command line)."""
    import json

    from railyard.agent.config import ConfigError, parse_rails
    from railyard.records.fields import Fields
    from railyard.topology.rails import assign_rails

    try:
        value = text if text == "pci-order" else json.loads(text)
        scheme = parse_rails(Fields({"rails": value}, "", ConfigError))
    except (ValueError, ConfigError) as exc:
        fail(f"--rails: {exc}")
    assert scheme is not None
    railed, unknown = assign_rails(topology, scheme)
    if unknown:
        fail(f"--rails: no NIC of {topology.node} is named {', '.join(unknown)}")
    return railed
