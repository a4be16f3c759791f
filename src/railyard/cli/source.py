"""Where a command's node topology comes from: a built-in profile or a sysfs tree.

`discover` and `allocate` take the same `--sysfs-root` / `--profile` / `--vfs-per-pf` options;
this is their one reading of them, with the same checks and messages.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from railyard.cli.app import fail

if TYPE_CHECKING:
    from railyard.topology.model import NodeTopology, PciePath

    # Each GPU's and PF's PCIe path and the NUMA node its distances are measured with.
    Paths = dict[str, tuple[PciePath, int | None]]


def sysfs_tree(value: Path, option: str = "--sysfs-root") -> Path:
    """The folder holding sys/ for a tree given as that folder or as its `sys` (discovery's
    one rule, `tree_root`); exits 2 with one line naming what was expected otherwise."""
    from railyard.discovery.sysfs import SysfsError, tree_root

    try:
        return Path(tree_root(value))
    except SysfsError as exc:
        fail(f"{option} {exc}")


def node_topology(sysfs_root: Path | None, profile: str | None, vfs_per_pf: int | None, *,
                  node: str | None = None, default_root: Path | None = None) -> NodeTopology:
    """The topology the options name; exits 2 with one line on bad options or a bad tree.

    With `default_root`, giving neither option discovers that root; without it, exactly one
    option is required.
    """
    return node_topology_and_paths(sysfs_root, profile, vfs_per_pf, node=node,
                                   default_root=default_root)[0]


def node_topology_and_paths(
    sysfs_root: Path | None, profile: str | None, vfs_per_pf: int | None, *,
    node: str | None = None, default_root: Path | None = None,
) -> tuple[NodeTopology, Paths]:
    """`node_topology`, with the PCIe paths its distances were measured from."""
    if sysfs_root is not None and profile is not None:
        fail("--sysfs-root and --profile exclude each other")
    if sysfs_root is None and profile is None:
        if default_root is None:
            fail("give exactly one of --sysfs-root DIR and --profile NAME")
        sysfs_root = default_root
    if vfs_per_pf is not None and profile is None:
        fail("--vfs-per-pf: applies to --profile only (a sysfs tree says how many VFs it has)")
    if profile is not None:
        from railyard.discovery.profiles import DEFAULT_VFS_PER_PF, build_topology, device_paths
        from railyard.discovery.profiles import profile as find_profile

        try:
            spec = find_profile(profile)
        except ValueError as exc:
            fail(f"--profile: {exc}")
        try:
            built = build_topology(spec, DEFAULT_VFS_PER_PF if vfs_per_pf is None else vfs_per_pf,
                                   node=node)
        except ValueError as exc:
            fail(f"--vfs-per-pf: {exc}")
        return built, device_paths(spec)

    from railyard.discovery.discover import discover
    from railyard.discovery.sysfs import SysfsError

    assert sysfs_root is not None
    sysfs_root = sysfs_tree(sysfs_root)
    try:
        found = discover(sysfs_root)
    except SysfsError as exc:
        fail(f"--sysfs-root: cannot discover: {exc}")
    for warning in found.warnings:
        print(f"railyard: warning: {warning}", file=sys.stderr)
    return (replace(found.topology, node=node) if node else found.topology), found.paths
