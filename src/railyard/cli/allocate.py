"""`railyard allocate`: what the allocator would give a pod on one node, as a what-if.

Prints the Allocation JSON (the records codec, the same document the pod annotation holds),
or the reason it does not fit with exit code 1; bad input exits 2 naming the field.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from railyard.cli.app import app, fail

if TYPE_CHECKING:
    from railyard.allocation.ledger import Ledger
    from railyard.topology.model import NodeTopology


class Output(StrEnum):
    railyard = "railyard"
    koordinator = "koordinator"


@app.command()
def allocate(
    request: Annotated[str, typer.Option(
        "--request", metavar="SPEC",
        help="What the pod asks for: gpus=2,vfs=2[,pfs=0,cpus=8,memory=64Gi].")],
    sysfs_root: Annotated[Path | None, typer.Option(
        "--sysfs-root", metavar="DIR",
        help="Folder holding sys/ and proc/ (a fixture tree or /), or that sys/ itself.")
    ] = None,
    profile: Annotated[str | None, typer.Option(
        "--profile", metavar="NAME",
        help="A built-in hardware profile (dgx-h100, dgx-a100, hgx-h100-4nic, mi300x, "
             "generic).")] = None,
    hints: Annotated[str | None, typer.Option(
        "--hints", metavar="JSON",
        help='Placement hints as in the railyard.dev/request annotation, e.g. '
             '\'{"maxDistance": "PXB", "numa": "single", "pairing": "shared"}\'.')] = None,
    used: Annotated[Path | None, typer.Option(
        "--used", metavar="FILE",
        help="What is already held: {\"pods\": [{\"uid\", \"allocation\"}]} (the extender's "
             "GET /allocations) or a list of Allocation objects. Entries for other nodes "
             "are skipped.")] = None,
    node: Annotated[str | None, typer.Option(
        "--node", metavar="NAME", help="The node's name (default: the profile's or the "
                                       "tree's hostname).")] = None,
    vfs_per_pf: Annotated[int | None, typer.Option(
        "--vfs-per-pf", metavar="N", help="VFs per compute PF, with --profile (default 8).")
    ] = None,
    output: Annotated[Output, typer.Option(
        "--output", help="railyard: the Allocation record; koordinator: Koordinator's "
                         "device-allocated annotation.")] = Output.railyard,
) -> None:
    """Allocate GPUs, RDMA VFs/PFs, CPUs and memory on one node, with GPU↔NIC pairs."""
    from railyard.allocation.allocator import Allocator
    from railyard.allocation.request import RequestError, parse_request_spec
    from railyard.allocation.types import Infeasible
    from railyard.cli.source import node_topology

    try:
        req = parse_request_spec(request, hints)
    except RequestError as exc:
        where = "--hints" if exc.field.startswith("hints") else "--request"
        fail(f"{where}: {exc}")
    topology = node_topology(sysfs_root, profile, vfs_per_pf, node=node)
    ledger = _ledger(topology, used) if used is not None else None
    if ledger is None:
        from railyard.allocation.ledger import Ledger

        ledger = Ledger(topology)
    result = Allocator().allocate(topology, ledger, req)
    if isinstance(result, Infeasible):
        kind = "unresolvable" if result.unresolvable else "infeasible"
        print(f"{kind}: {result.reason}")
        raise typer.Exit(1)
    if output is Output.koordinator:
        from railyard.records.koordinator import device_allocated_to_json

        print(json.dumps(device_allocated_to_json(result, topology), indent=2))
    else:
        from railyard.records.allocation import allocation_to_json

        print(json.dumps(allocation_to_json(result), indent=2))


def _ledger(topology: NodeTopology, path: Path) -> Ledger:
    """The ledger of what `path` says is held on this node; exit 2 naming the bad entry."""
    from railyard.allocation.ledger import Ledger, LedgerConflict
    from railyard.records.allocation import RecordError, allocation_from_json

    try:
        data: Any = json.loads(path.read_text())
    except OSError as exc:
        fail(f"--used: cannot read {path}: {exc.strerror or exc}")
    except ValueError as exc:  # bad JSON, bad UTF-8, an integer too long to convert
        fail(f"--used: {path} is not valid JSON: {exc}")
    except RecursionError:  # "[[[[…" nested deeper than the parser's stack
        fail(f"--used: {path} is not valid JSON: nested too deeply")
    entries: list[tuple[str, Any, str]] = []
    if isinstance(data, dict) and isinstance(data.get("pods"), list):
        for i, pod in enumerate(data["pods"]):
            where = f"used.pods[{i}]"
            if not isinstance(pod, dict):
                fail(f"{where}: expected an object")
            uid = pod.get("uid")
            if not isinstance(uid, str) or not uid:
                fail(f"{where}.uid: expected a non-empty string")
            if pod.get("allocation") is not None:
                entries.append((uid, pod["allocation"], f"{where}.allocation"))
    elif isinstance(data, list):
        entries = [(f"used-{i}", a, f"used[{i}]") for i, a in enumerate(data)]
    else:
        fail('--used: expected {"pods": [...]} or a list of Allocation objects')
    ledger = Ledger(topology)
    others: set[str] = set()
    for uid, raw, where in entries:
        try:
            alloc = allocation_from_json(raw, where)
        except RecordError as exc:
            fail(f"--used: {exc}")
        if alloc.node != topology.node:
            others.add(alloc.node)
            continue
        try:
            ledger.add(uid, alloc)
        except LedgerConflict as exc:
            fail(f"--used: {where}: {exc}")
    if entries and not len(ledger):
        print(f"railyard: warning: --used holds no allocation for node {topology.node!r} "
              f"(it names {', '.join(sorted(others))}); pass --node to pick one",
              file=sys.stderr)
    return ledger
