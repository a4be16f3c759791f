"""`railyard simulate`: Railyard's extender and allocator against baseline policies, over a
simulated cluster and a real workload trace, with a report. Heavy imports stay inside the
command so the rest of the CLI starts fast.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from railyard.cli.app import app, fail

if TYPE_CHECKING:  # imported where used: the module loads with every `railyard` command
    from collections.abc import Sequence

    from rich.console import Console

    from railyard.sim.report import RunInfo
    from railyard.sim.run import SimResult

DEFAULT_CLUSTER = "dgx-h100:32,dgx-a100:16,hgx-h100-4nic:8"
# For a trace in the DLRM schema: GPU nodes for its HN instances, CPU nodes with RDMA NICs for
# its CN instances (docs/simulator.md, "The DLRM trace").
DEFAULT_DLRM_CLUSTER = "dgx-h100:16,cpu-rdma:64"
# The `sim` extra's top-level packages (pyproject.toml): an agent or extender install leaves
# them out (decision 0079), so their absence is a one-line hint, not a traceback.
SIM_EXTRA = frozenset({"numpy", "scipy", "matplotlib"})


@app.command()
def simulate(
    cluster: Annotated[str | None, typer.Option(
        "--cluster", metavar="SPEC|FILE",
        help="profile:count,… (dgx-h100, dgx-a100, hgx-h100-4nic, mi300x, cpu-rdma, generic; "
             "8 VFs per compute PF) or a cluster file as the extender reads it (its pods are "
             f"ignored). Default {DEFAULT_CLUSTER}; with a DLRM trace {DEFAULT_DLRM_CLUSTER}.")
    ] = None,
    trace: Annotated[str, typer.Option(
        "--trace", metavar="NAME|FILE",
        help="openb-default, openb-multigpu20, or a CSV in the openb pod-list format or in "
             "the DLRM disaggregated-serving schema (told apart by the header).")
    ] = "openb-default",
    policies: Annotated[str, typer.Option(
        "--policies", metavar="LIST",
        help="Comma list of railyard, random, numa, koordinator, best-fit, fgd (and "
             "railyard-spread).")] = "railyard,random,numa,koordinator,best-fit,fgd",
    seed: Annotated[int, typer.Option("--seed", help="Seeds every random choice.")] = 0,
    output: Annotated[Path, typer.Option(
        "--output", metavar="DIR",
        help="Where metrics.json, the PNGs and report.html go (created if missing, checked "
             "before simulating).")
    ] = Path("railyard-report"),
    strict: Annotated[bool, typer.Option(
        "--strict", help="Training pods (≥ 2 GPUs) require every pair within PXB.")] = False,
    vf_share: Annotated[float, typer.Option(
        "--vf-share", metavar="F", help="Share of one-GPU pods that want one VF (0..1).")
    ] = 0.25,
    load: Annotated[float, typer.Option(
        "--load", metavar="F",
        help="Draw pods until they request F × the cluster's GPUs in all (0 < F ≤ 10).")
    ] = 1.3,
    arrivals_mode: Annotated[str | None, typer.Option(
        "--arrivals", metavar="trace|draw",
        help="trace: the drawn pods arrive at their trace times, compressed until live demand "
             "reaches the cluster's GPUs, and leave after their trace lifetimes (the default "
             "for a trace with creation and deletion times); draw: they arrive one after "
             "another and never leave (the FGD paper's method; the only one without times).")
    ] = None,
    jobs: Annotated[int, typer.Option(
        "--jobs", metavar="N",
        help="Add N gangs beside the trace's pods: jobs of 2-4 pods of 2, 4 or 8 GPUs (a VF "
             "per GPU), each placed all-or-nothing; metrics then say how many kept one rail "
             "sequence (railConsistentJobShare; docs/simulator.md, \"Gangs\").")] = 0,
    reserve: Annotated[int | None, typer.Option(
        "--reserve", metavar="K", min=0,
        help="Also run railyard-reserve: Railyard with the extender's admission reserve of K "
             "idle nodes of 8+ GPUs (--idle-node-reserve), beside the policies asked, so the "
             "trade shows side by side (docs/simulator.md).")] = None,
    progress: Annotated[bool, typer.Option(
        "--progress/--no-progress", help="Show a progress bar.")] = True,
) -> None:
    """Simulate a cluster and a workload trace under each policy, and write a report."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from railyard.scheduler.cluster_file import ClusterFileError, cluster_from_spec, load_cluster

    try:
        from railyard.sim.arrivals import ARRIVAL_MODES, DemandRule, draw_arrivals, trace_arrivals
        from railyard.sim.gangs import MAX_JOBS, add_gangs
        from railyard.sim.report import (
            FOOTNOTES,
            RunInfo,
            bound_line,
            console_rows,
            headline,
            write_report,
        )
        from railyard.sim.run import DEFAULT_RESERVE, PolicyError, parse_policies
        from railyard.sim.run import simulate as run_simulation
        from railyard.sim.trace import TraceError, load_trace
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in SIM_EXTRA:
            raise
        fail(f"the simulator needs the sim extra ({missing} is not installed): "
             "pip install 'railyard[sim]'", code=1)

    started = time.perf_counter()
    console = Console(stderr=False)
    try:
        names = parse_policies(policies)
        if reserve is not None and "railyard-reserve" not in names:
            names.insert(names.index("railyard") + 1 if "railyard" in names else 0,
                         "railyard-reserve")
        rule = DemandRule(vf_share=vf_share, strict=strict)
        if not 0 < load <= 10:
            raise ValueError(f"--load must be within (0, 10], got {load}")
        if not 0 <= jobs <= MAX_JOBS:
            raise ValueError(f"--jobs must be within 0..{MAX_JOBS}, got {jobs}")
        workload = load_trace(trace)
        if cluster is None:
            cluster = DEFAULT_DLRM_CLUSTER if workload.schema == "dlrm" else DEFAULT_CLUSTER
        spec_path = Path(cluster)
        if spec_path.is_file():
            topologies = list(load_cluster(spec_path))
        elif spec_path.suffix in (".yaml", ".yml", ".json") or "/" in cluster:
            raise ValueError(f"cluster file {cluster}: no such file")
        else:
            topologies = list(cluster_from_spec(cluster))
        mode = arrivals_mode or ("trace" if workload.has_lifetimes else "draw")
        if mode not in ARRIVAL_MODES:
            raise ValueError(f"--arrivals must be one of {', '.join(ARRIVAL_MODES)}, got {mode!r}")
        if mode == "trace" and not workload.has_lifetimes:
            raise ValueError(f"--arrivals trace: trace {workload.name} has no creation_time and "
                             "deletion_time columns (use --arrivals draw)")
    except (PolicyError, ClusterFileError, TraceError, ValueError) as exc:
        fail(str(exc))
    cluster_gpus = sum(len(t.gpus) for t in topologies)
    if cluster_gpus == 0:
        fail(f"cluster {cluster!r} has no GPUs to simulate")
    try:  # a bad --output is bad input too: found now, not after minutes of simulating
        output.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output):
            pass
    except OSError as exc:
        fail(f"cannot write the report to {output}: {exc}")
    compression: float | None = None
    if mode == "trace":
        arrivals, compression = trace_arrivals(workload, cluster_gpus, seed, rule, load)
    else:
        arrivals = draw_arrivals(workload, cluster_gpus, seed, rule, load)
    arrivals = add_gangs(arrivals, jobs, seed)

    columns = (TextColumn("[bold]{task.description:<16}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        tasks = {n: bar.add_task(n, total=len(arrivals)) for n in names}
        try:
            result = run_simulation(topologies, arrivals, names, seed,
                                    progress=lambda n: bar.advance(tasks[n]),
                                    reserve=DEFAULT_RESERVE if reserve is None else reserve)
        except ImportError as exc:  # the extender's allocator is missing from this install
            fail(f"cannot run the railyard policy: {exc}")
    info = RunInfo(
        cluster=cluster, trace=workload.name, seed=seed, vf_share=vf_share, strict=strict,
        load=load, arrival_mode=mode, compression=compression, arrivals=len(arrivals),
        multi_gpu_arrivals=sum(a.is_multi_gpu for a in arrivals),
        fractional_pods=sum(a.pod.is_fractional for a in arrivals),
        cpu_only_rows=sum(1 for p in workload.pods if not p.wants_devices),
        nodes=len(topologies), trace_schema=workload.schema,
        wall_s=time.perf_counter() - started,
    )
    try:
        if progress:
            with console.status("writing the report"):
                report = write_report(result, info, output)
        else:
            report = write_report(result, info, output)
    except OSError as exc:
        fail(f"cannot write the report to {output}: {exc}")
    # The answer first (is Railyard better, by how much, why), then the table behind it.
    if lead := headline(result):
        console.print(lead, highlight=False)
    print_table(console, result, info, console_rows(result), FOOTNOTES)
    if bound := bound_line(result):
        console.print(bound, highlight=False)
    # soft_wrap: the path stays on one line, whole, for copying.
    console.print(f"report: [bold]{report}[/bold]  (metrics.json and PNGs alongside)",
                  soft_wrap=True, highlight=False)


def print_table(console: Console, result: SimResult, info: RunInfo,
                rows: list[tuple[str, list[str]]], footnotes: Sequence[str]) -> None:
    from rich import box
    from rich.table import Table

    table = Table(title=f"{info.arrivals} pods ({info.multi_gpu_arrivals} multi-GPU) on "
                        f"{info.nodes} nodes, {result.cluster_gpus} GPUs · seed {info.seed}",
                  title_justify="left", caption="\n".join(f"· {n}" for n in footnotes),
                  caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("")
    for name in result.results:
        table.add_column(name, justify="right",
                         style="bold cyan" if name == "railyard" else None)
    for label, values in rows:
        table.add_row(label, *values)
    console.print(table)
