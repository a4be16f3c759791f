"""The simulator's report: metrics.json, charts as PNG, and one self-contained report.html.

Charts are drawn with matplotlib's Agg backend (no display needed) and embedded into the
HTML as base64 PNGs, so the report opens anywhere without a network.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from railyard.sim.judge import CLASS_FACTOR
from railyard.sim.metrics import CELL_FREE, CELL_PAIRED, PolicyMetrics
from railyard.sim.run import HEATMAP_SNAPSHOT, SimResult
from railyard.topology.model import Distance

POLICY_COLOURS = {
    "railyard": "#0b7a75",
    "railyard-spread": "#62b6b1",
    "random": "#9a9a9a",
    "numa": "#8c6bb1",
    "koordinator": "#e08e0b",
    "best-fit": "#3f6fb0",
    "fgd": "#c2185b",
}
CLASS_COLOURS = {
    Distance.PIX: "#1a9850",
    Distance.PXB: "#91cf60",
    Distance.PHB: "#fee08b",
    Distance.NODE: "#fc8d59",
    Distance.SYS: "#d73027",
}
FREE_COLOUR = "#eeeeee"
NO_NIC_COLOUR = "#9ecae1"
DPI = 130


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What was run, for the report's header and notes."""

    cluster: str
    trace: str
    seed: int
    vf_share: float
    strict: bool
    load: float  # arrivals were drawn until they requested this × the cluster's GPUs
    arrivals: int
    multi_gpu_arrivals: int
    fractional_pods: int
    cpu_only_rows: int
    nodes: int
    wall_s: float | None = None
    arrival_mode: str = "draw"  # "trace" (trace times, with departures) or "draw" (none)
    compression: float | None = None  # trace mode: what the creation times were divided by
    trace_schema: str = "openb"  # or "dlrm"


def _colour(policy: str) -> str:
    return POLICY_COLOURS.get(policy, "#555555")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _vcpus(x: float | None) -> str:
    """vCPUs or vCPU-hours, whole ("–": the run has no lifetimes to count hours over)."""
    return "–" if x is None else f"{x:,.0f}"


def _load_pct(load: float) -> str:
    """A load as the user gave it: 1.3 → "130%", 0.333 → "33.3%"."""
    return f"{100 * load:.4g}%"


def _demand_note(info: RunInfo) -> str:
    if info.trace_schema == "dlrm":
        return ("RDMA demand as the trace states it (DLRM schema): an instance with an "
                "<code>rdma_request</code> above 0 wants one VF carrying that share of its "
                "PF's bandwidth (<code>nicBandwidthOvercommit</code>: the most, at any moment, "
                "by which the shares on the PFs exceed 100%, summed over PFs; no policy "
                "enforces shares yet). HN instances run on GPU nodes, CN instances on CPU "
                "nodes; <code>max_instance_per_node</code> is honoured by every policy.")
    strict = ("Training pods carry <code>maxDistance: PXB</code> (--strict)." if info.strict
              else "No hard <code>maxDistance</code> (run with --strict to add PXB to training "
                   "pods).")
    return (f"RDMA demand (the trace has no NIC column): pods with ≥ 2 GPUs are training pods "
            f"wanting one VF per GPU; {100 * info.vf_share:.0f}% of one-GPU pods (a seeded "
            f"draw) want one VF; the rest want none. {strict} {info.fractional_pods} drawn "
            f"pods asked for a share of one GPU and shared GPUs (at most 1000 milli-GPUs "
            f"each); {info.cpu_only_rows} CPU-only trace rows were left out.")


def _arrivals_note(info: RunInfo) -> str:
    if info.arrival_mode != "trace":
        return "Pods stay once placed (no departures; <code>--arrivals draw</code>)."
    c = info.compression
    how = ("all at once (even so, live demand never reached the cluster's GPUs)"
           if c is not None and c == float("inf") else
           f"at their creation times divided by {c:.4g}" if c is not None else
           "at their creation times")
    return (f"Pods arrive {how} and leave after their trace lifetimes (deletion − creation; "
            "<code>--arrivals trace</code>).")


def reached_full_load(result: SimResult) -> bool:
    """Whether arrivals reached 100% of the cluster's GPUs (every policy sees the same ones)."""
    return any(HEATMAP_SNAPSHOT in r.metrics.snapshots for r in result.results.values())


def heatmap_moment(result: SimResult) -> str:
    """When the heatmap was taken: at 100% load, or at the end of a run that stopped short."""
    if reached_full_load(result):
        return "when the GPUs requested by live pods reach 100% of the cluster's"
    arrived = max((r.metrics.arrived_load for r in result.results.values()), default=0.0)
    return f"at the end of the run (arrivals reached {_pct(arrived)} of the cluster's GPUs)"


# ------------------------------------------------------------------------ the table

TABLE_COLUMNS = (
    "policy", "pods placed", "vCPUs placed", "vCPU-hours placed", "GPU alloc. at 1st failure",
    "at 100% load", "at end",
    "multi-GPU placed", "GDR-capable multi-GPU", "est. collective eff.",
    "pairs PIX/PXB/PHB/NODE/SYS", "pods by worst pair PIX/PXB/PHB/NODE/SYS",
    "stranded NICs at 50% / 100% load",
    "NIC bandwidth over-commit", "latency p50 / p99 ms",
)


def table_rows(result: SimResult) -> list[list[str]]:
    """One row per policy, as the console table and the HTML table show it."""
    rows = []
    for name, r in result.results.items():
        m = r.metrics.as_json()
        eff = m["collectiveEfficiencyMultiGpu"]
        pairs = m["pairsByDistance"]
        rows.append([
            name,
            f"{m['podsPlaced']}/{m['podsArrived']}",
            _vcpus(m["vcpuPlaced"]),
            _vcpus(m["vcpuHoursPlaced"]),
            _pct(m["gpuAllocationRatioAtFirstFailure"]) if m["podsFailed"] else "no failure",
            _pct(m.get("atFullLoad", {}).get("gpuAllocationRatio")),
            _pct(m["gpuAllocationRatioAtEnd"]),
            f"{m['multiGpuPodsPlaced']}/{m['multiGpuPodsArrived']}",
            f"{m['gdrCapableMultiGpuPods']}/{m['multiGpuPodsArrived']} "
            f"({_pct(m['gdrCapablePodShare'])})",
            "–" if eff is None else f"{eff:.2f}",
            "/".join(str(pairs[d.name]) for d in Distance),
            "/".join(str(m["podsByWorstPair"][d.name]) for d in Distance),
            f"{m.get('atHalfLoad', {}).get('strandedNics', '–')} / "
            f"{m.get('atFullLoad', {}).get('strandedNics', '–')}",
            f"{m['nicBandwidthOvercommit']}%",
            f"{m['decisionLatencyP50Ms']:.2f} / {m['decisionLatencyP99Ms']:.2f}",
        ])
    return rows


def console_rows(result: SimResult) -> list[tuple[str, list[str]]]:
    """The comparison transposed (a metric per row, a policy per column): narrow enough for
    an 80-column terminal with five policies."""
    ms = [r.metrics.as_json() for r in result.results.values()]

    def row(label: str, f: Callable[[dict[str, Any]], str]) -> tuple[str, list[str]]:
        return label, [f(m) for m in ms]

    def eff(m: dict) -> str:
        v = m["collectiveEfficiencyMultiGpu"]
        return "–" if v is None else f"{v:.2f}"

    def pairs(m: dict, ds: tuple[Distance, ...]) -> str:
        return "/".join(str(m["pairsByDistance"][d.name]) for d in ds)

    def worst(m: dict, ds: tuple[Distance, ...]) -> str:
        return "/".join(str(m["podsByWorstPair"][d.name]) for d in ds)

    def at(key: str, metric: str, fmt: Callable[[Any], str] = str
           ) -> Callable[[dict[str, Any]], str]:
        return lambda m: fmt(m[key][metric]) if key in m else "–"

    return [
        row("pods placed", lambda m: f"{m['podsPlaced']}/{m['podsArrived']}"),
        row("vCPUs placed", lambda m: _vcpus(m["vcpuPlaced"])),
        row("vCPU-hours placed", lambda m: _vcpus(m["vcpuHoursPlaced"])),
        row("GPU allocation ratio", lambda m: ""),
        row("  at 1st failure",
            lambda m: _pct(m["gpuAllocationRatioAtFirstFailure"]) if m["podsFailed"] else "none"),
        row("  at 100% load", at("atFullLoad", "gpuAllocationRatio", _pct)),
        row("  at end", lambda m: _pct(m["gpuAllocationRatioAtEnd"])),
        row("multi-GPU pods placed",
            lambda m: f"{m['multiGpuPodsPlaced']}/{m['multiGpuPodsArrived']}"),
        row("  GDR-capable (≤ PXB)",
            lambda m: f"{m['gdrCapableMultiGpuPods']}/{m['multiGpuPodsArrived']}"),
        row("  est. collective eff.", eff),
        row("pairs PIX/PXB", lambda m: pairs(m, (Distance.PIX, Distance.PXB))),
        row("pairs PHB/NODE/SYS",
            lambda m: pairs(m, (Distance.PHB, Distance.NODE, Distance.SYS))),
        row("pods by worst pair", lambda m: ""),
        row("  PIX/PXB (GDR)", lambda m: worst(m, (Distance.PIX, Distance.PXB))),
        row("  PHB/NODE/SYS",
            lambda m: worst(m, (Distance.PHB, Distance.NODE, Distance.SYS))),
        row("stranded NICs", lambda m: ""),
        row("  at 50% load", at("atHalfLoad", "strandedNics")),
        row("  at 100% load", at("atFullLoad", "strandedNics")),
        row("NIC bandwidth over-commit", lambda m: f"{m['nicBandwidthOvercommit']}%"),
        row("latency p50 ms", lambda m: f"{m['decisionLatencyP50Ms']:.2f}"),
        row("latency p99 ms", lambda m: f"{m['decisionLatencyP99Ms']:.2f}"),
    ]


FOOTNOTES = (
    "Shared GPUs: a pod asking a share of one GPU shares it with others (shares sum to at "
    "most 1000 milli-GPUs); GPU allocation counts a share as its milli/1000.",
    "CPU-only openb pods are left out: they ask for nothing Railyard manages. CPUs and "
    "memory are simulated: a pod is offered only nodes with room for its requests.",
    "Policies without pairing are judged by the best matching of the GPUs and VFs they "
    "chose (the best NCCL could do with them).",
    "vCPUs placed: the CPUs of every pod placed when it arrived; vCPU-hours placed: each "
    "placed pod's vCPUs × the hours it ran (arrival to departure, or to the run's last "
    "event), on the replay clock; \u2013 for a run without lifetimes (pods drawn to stay).",
    "GDR-capable: every GPU of the pod has its own NIC within PXB, so NCCL uses GPUDirect "
    "RDMA for every rank. Shares are of the multi-GPU pods that arrived.",
)


# ------------------------------------------------------------------------ charts


def chart_allocation(result: SimResult, path: Path) -> None:
    """GPU allocation ratio and GDR-capable training pods as load grows; each policy's first
    failure marked."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.6), dpi=DPI,
                                  gridspec_kw={"width_ratios": [1.35, 1]})
    top = max((r.metrics.curve[-1][0] for r in result.results.values() if r.metrics.curve),
              default=1.3)
    ax.plot([0, 1], [0, 1], color="#cccccc", lw=1, ls=":", zorder=1)
    # Marked only within the axes: a label beyond a run that stopped short of 100% would
    # stretch the figure (and tight_layout gives up).
    for a, y in ((ax, 0.02), (ax2, 0.985)) if top * 1.01 >= 1.0 else ():
        a.axvline(1.0, color="#bbbbbb", lw=0.8, ls="--", zorder=1)
        a.text(1.0, y, " 100% load", color="#888888", fontsize=8,  # where it crosses no curve
               va="bottom" if y < 0.5 else "top", transform=a.get_xaxis_transform())
    for name, r in result.results.items():
        curve = r.metrics.curve
        xs = [0.0] + [c[0] for c in curve]
        mine = name == "railyard"
        # Railyard drawn wide and underneath, so a baseline on the same line stays visible.
        style = {"color": _colour(name), "lw": 3.4 if mine else 1.5, "zorder": 2 if mine else 3,
                 "alpha": 0.9 if mine else 1.0, "label": name}
        ax.plot(xs, [0.0] + [c[1] for c in curve], **style)
        ax2.plot(xs, [0] + [c[2] for c in curve], drawstyle="steps-post", **style)
        k = r.metrics.first_failure_at
        if k is not None:
            ax.plot([curve[k][0]], [curve[k][1]], marker="o", ms=6.5, mfc="white",
                    mec=_colour(name), mew=1.8, zorder=4)
    ax.set_xlim(0, top * 1.01)
    ax.set_ylim(0, 1.04)
    ax.set_xlabel("GPUs requested so far / cluster GPUs (arrived load)")
    ax.set_ylabel("GPUs allocated / cluster GPUs")
    ax.set_title("GPU allocation as load grows  (○ first unplaceable pod)", fontsize=10.5,
                 loc="left")
    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.legend(loc="upper left", frameon=False, fontsize=9)
    multi = max((r.metrics.multi_arrived for r in result.results.values()), default=0)
    ax2.set_xlim(0, top * 1.01)
    ax2.set_ylim(0, max(multi, 1) * 1.05)
    ax2.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax2.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax2.set_xlabel("arrived load")
    ax2.set_ylabel("multi-GPU pods with every pair ≤ PXB, so far")
    ax2.set_title(f"GDR-capable training pods (of {multi} arriving)", fontsize=10.5,
                  loc="left")
    for a in (ax, ax2):
        a.grid(alpha=0.25)
        _despine(a)
    fig.tight_layout()
    _save(fig, path)


def chart_pairs(result: SimResult, path: Path) -> None:
    """Left: GPU↔NIC pairs by distance class; right: multi-GPU pods and their outcome."""
    names = list(result.results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11.5, 0.55 * len(names) + 2.2), dpi=DPI,
                                   gridspec_kw={"width_ratios": [1.25, 1]})
    ys = range(len(names))
    for i, name in enumerate(names):
        pairs = result.results[name].metrics.pairs
        total = sum(pairs.values()) or 1
        left = 0.0
        for d in Distance:
            share = pairs.get(d.name, 0) / total
            if share:
                ax1.barh(i, share, left=left, color=CLASS_COLOURS[d], edgecolor="white",
                         lw=0.6)
                if share >= 0.06:
                    ax1.text(left + share / 2, i, f"{d.name}\n{100 * share:.0f}%",
                             ha="center", va="center", fontsize=7,
                             color="white" if d in (Distance.PIX, Distance.SYS) else "#333")
            left += share
        ax1.text(1.01, i, f"{sum(pairs.values())} pairs", va="center", fontsize=8,
                 color="#666")
    ax1.set_yticks(list(ys), names)
    ax1.invert_yaxis()
    ax1.set_xlim(0, 1.16)
    ax1.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax1.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax1.set_title("GPU↔NIC pairs by distance class (PIX/PXB: GPUDirect RDMA)", fontsize=10,
                  loc="left")
    _despine(ax1)

    parts = ((CLASS_COLOURS[Distance.PIX], "GDR-capable (all pairs ≤ PXB)"),
             (CLASS_COLOURS[Distance.NODE], "placed, some rank without GDR"),
             ("#d9d9d9", "not placed"))
    for i, name in enumerate(names):
        m = result.results[name].metrics
        counts = (m.multi_gdr, m.multi_placed - m.multi_gdr, m.multi_arrived - m.multi_placed)
        left = 0
        for n, (colour, _) in zip(counts, parts, strict=True):
            if n:
                ax2.barh(i, n, left=left, color=colour, edgecolor="white", lw=0.6)
                ax2.text(left + n / 2, i, str(n), ha="center", va="center", fontsize=8,
                         color="#222")
            left += n
        eff = statistics_mean(m.multi_efficiency)
        if eff is not None:
            ax2.text(m.multi_arrived * 1.02, i, f"eff. {eff:.2f}", va="center", fontsize=8,
                     color="#555")
    ax2.set_yticks(list(ys), [""] * len(names))
    ax2.invert_yaxis()
    most = max((r.metrics.multi_arrived for r in result.results.values()), default=1)
    ax2.set_xlim(0, max(most, 1) * 1.22)
    ax2.set_title("Multi-GPU (training) pods", fontsize=10, loc="left")
    ax2.set_xlabel("pods (eff. = estimated collective bandwidth, 1.00 = aligned)", fontsize=8)
    ax2.legend(handles=[Patch(color=c, label=lbl) for c, lbl in parts], frameon=False,
               fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3)
    _despine(ax2)
    ax1.legend(handles=[Patch(color=CLASS_COLOURS[d], label=d.name) for d in Distance],
               frameon=False, fontsize=7.5, loc="upper center", bbox_to_anchor=(0.45, -0.1),
               ncol=5)
    fig.tight_layout()
    _save(fig, path)


def chart_heatmap(result: SimResult, path: Path) -> None:
    """Each GPU of a sample of nodes at 100% load (or at the end of a shorter run): free, held
    without a NIC, or paired (by class); GPUs of multi-GPU pods carry the pod's GPU count."""
    names = list(result.results)
    cols = min(3, len(names))
    rows_n = (len(names) + cols - 1) // cols
    n_nodes = len(result.nodes)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.3 * cols, 0.3 * n_nodes * rows_n + 1.7),
                             dpi=DPI, squeeze=False)
    colours = [FREE_COLOUR, NO_NIC_COLOUR, *(CLASS_COLOURS[d] for d in Distance)]
    cmap = ListedColormap(colours)
    norm = BoundaryNorm([x - 0.5 for x in range(len(colours) + 1)], cmap.N)
    for k, name in enumerate(names):
        ax = axes[k // cols][k % cols]
        grid = result.results[name].heatmap
        width = max((len(r) for r in grid), default=1)
        padded = [r + [(CELL_FREE, 0)] * (width - len(r)) for r in grid]
        ax.imshow([[c for c, _ in r] for r in padded], cmap=cmap, norm=norm, aspect="auto",
                  interpolation="nearest")
        for y, r in enumerate(padded):
            for x, (code, size) in enumerate(r):
                if size >= 2:
                    dark = code in (CELL_PAIRED[Distance.PIX], CELL_PAIRED[Distance.SYS])
                    ax.text(x, y, str(size), ha="center", va="center", fontsize=6.5,
                            fontweight="bold", color="white" if dark else "#222")
        ax.set_xticks(range(width), [str(i) for i in range(width)], fontsize=7)
        ax.set_yticks(range(n_nodes), result.nodes if k % cols == 0 else [""] * n_nodes,
                      fontsize=7)
        ax.set_xticks([x - 0.5 for x in range(1, width)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, n_nodes)], minor=True)
        ax.grid(which="minor", color="white", lw=1.5)
        ax.tick_params(which="both", length=0)
        ax.set_title(name, fontsize=10, color=_colour(name), loc="left", fontweight="bold")
        ax.set_xlabel("GPU index", fontsize=7)
        for side in ax.spines.values():
            side.set_visible(False)
    for k in range(len(names), rows_n * cols):
        axes[k // cols][k % cols].axis("off")
    handles = [Patch(facecolor=FREE_COLOUR, edgecolor="#bbbbbb", label="free"),
               Patch(color=NO_NIC_COLOUR, label="held, no NIC")]
    handles += [Patch(color=CLASS_COLOURS[d], label=f"paired {d.name}") for d in Distance]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False,
               fontsize=8)
    fig.suptitle(f"GPUs of a sample of nodes {heatmap_moment(result)} "
                 "(digits: GPUs of a multi-GPU pod)", fontsize=10.5, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    _save(fig, path)


def statistics_mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _despine(ax: Axes) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=DPI, facecolor="white")
    plt.close(fig)


CHARTS = (
    ("allocation.png", chart_allocation, "Allocation and GDR-capable training pods as load grows"),
    ("pairs.png", chart_pairs, "Pairs by distance class, and multi-GPU pods"),
    ("heatmap.png", chart_heatmap, "A sample of nodes"),
)
REPORT_FILES = (*(f for f, _, _ in CHARTS), "report.html", "bounds.json",
                "metrics.json")  # in move order


# ------------------------------------------------------------------------ writing


def write_report(result: SimResult, info: RunInfo, outdir: Path) -> Path:
    """Write the chart PNGs, report.html and metrics.json into `outdir`; return the HTML.

    Everything is written into a temporary folder inside `outdir` first and then renamed
    into place, metrics.json last: an interrupted or failed report leaves the previous one
    whole, never a truncated chart or this run's metrics beside the last run's charts.
    """
    outdir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".railyard-report-", dir=outdir))
    try:
        images = {}
        for filename, draw, title in CHARTS:
            draw(result, tmp / filename)
            if filename == "heatmap.png":
                title = f"{title} {heatmap_moment(result)}"
            images[filename] = (title,
                                base64.b64encode((tmp / filename).read_bytes()).decode("ascii"))
        (tmp / "report.html").write_text(render_html(result, info, images), encoding="utf-8")
        (tmp / "bounds.json").write_text(json.dumps(bounds_json(result), indent=2) + "\n",
                                         encoding="utf-8")
        metrics = json.dumps(result.metrics_json(), indent=2, sort_keys=False) + "\n"
        (tmp / "metrics.json").write_text(metrics, encoding="utf-8")
        for name in REPORT_FILES:
            os.replace(tmp / name, outdir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return outdir / "report.html"


def bounds_json(result: SimResult) -> dict[str, Any]:
    """`bounds.json`: the offline upper bounds, their class and assumptions."""
    if result.bounds is None:
        missing = {"value": None, "method": "none", "note": "not computed for this run"}
        return {"gpuAllocationRatio": missing, "gdrCapablePodShare": missing}
    return result.bounds.as_json()


def bound_line(result: SimResult) -> str:
    """One line for the console and the report: the bounds, or why there are none."""
    b = result.bounds
    if b is None:
        return ""
    gpu, gdr = b.gpu_allocation_ratio, b.gdr_capable_pod_share
    multi = max((r.metrics.multi_arrived for r in result.results.values()), default=0)
    gpu_text = "not computed" if gpu.value is None else f"≤ {_pct(gpu.value)}"
    gdr_text = ("not computed" if gdr.count is None else f"≤ {gdr.count}/{multi}")
    return (f"Offline bound (any policy, same arrivals; bounds.json): GPU allocation {gpu_text}, "
            f"GDR-capable multi-GPU pods {gdr_text}.")


@dataclass(frozen=True, slots=True)
class Comparison:
    """Railyard against the best baseline on one measure, for the headline."""

    what: str  # the measure, in words
    ours: float
    best_name: str  # the best baseline on this measure
    best: float
    higher_is_better: bool
    kind: str  # "share" (0..1), "factor" (0..1, said as a multiple) or "count"
    why: str  # why Railyard wins there, when it does

    @property
    def margin(self) -> float:
        """How far Railyard is ahead (negative: behind), in the measure's own unit."""
        return self.ours - self.best if self.higher_is_better else self.best - self.ours

    @property
    def won(self) -> bool:
        return self.margin > 1e-9

    @property
    def lost(self) -> bool:
        return self.margin < -1e-9

    def value(self) -> str:
        """Railyard's value alone."""
        return (_pct(self.ours) if self.kind == "share" else
                f"{self.ours:.2f}" if self.kind == "factor" else f"{self.ours:g}")

    def said(self) -> str:
        """`<ours> vs <best> for <baseline> (<by how much>)`."""
        if self.kind == "share":
            gap = f"{100 * abs(self.ours - self.best):.1f} points"
            # A multiple only where it says more than the points do.
            by = (f"{self.ours / self.best:.1f}× the share, +{gap}"
                  if self.won and self.best and self.ours >= 1.5 * self.best
                  else f"+{gap}" if self.won else f"−{gap}")
            return f"{_pct(self.ours)} vs {_pct(self.best)} for {self.best_name} ({by})"
        if self.kind == "factor":
            return (f"{self.ours:.2f} vs {self.best:.2f} for {self.best_name} "
                    f"({self.ours - self.best:+.2f})")
        return f"{self.ours:g} vs {self.best:g} for {self.best_name}"


def comparisons(result: SimResult) -> list[Comparison]:
    """The measures the headline weighs, most telling first: with gangs, whether a job's
    pods keep one rail sequence; then GPUDirect RDMA for multi-GPU pods and the collective
    bandwidth it buys; then how well GPUs are packed, NICs left usable, and pods placed.
    Each against the best baseline on that measure; a measure no pod exercised is left out.
    Empty without Railyard or without a baseline."""
    res = result.results
    base = {n: r.metrics for n, r in res.items() if not n.startswith("railyard")}
    if "railyard" not in res or not base:
        return []
    ry = res["railyard"].metrics
    out: list[Comparison] = []

    def add(what: str, value: Callable[[PolicyMetrics], float | None], higher: bool,
            kind: str, why: str) -> None:
        ours = value(ry)
        theirs = {n: v for n, m in base.items() if (v := value(m)) is not None}
        if ours is None or not theirs:
            return
        pick = max if higher else min
        name = pick(theirs, key=lambda n: theirs[n])
        out.append(Comparison(what, ours, name, theirs[name], higher, kind, why))

    if ry.job_sizes:
        add("gangs whose pods all keep one rail sequence", lambda m: (
            m.rail_consistent_job_share if m.rail_consistent_job_share is not None else
            (0.0 if m.job_sizes else None)), True, "share",
            "each later pod of a job is given the rail sequence of the pods placed before "
            "it, so NCCL's rank i stays on one leaf; the baselines hand out NICs without "
            "knowing rails")
        add("gangs placed whole", lambda m: float(m.gangs_placed) if m.job_sizes else None,
            True, "count",
            "it places a gang's pods on the best pairs with its rails, bin-packing so that "
            "whole nodes stay free for large pods")
    if ry.multi_arrived:
        add("multi-GPU pods with GPUDirect RDMA on every rank", lambda m: m.gdr_pod_share,
            True, "share",
            "it picks GPUs and NICs together and pairs each GPU with its own NIC within PXB "
            "(the worst pair comes first in its key); the baselines pick GPUs and VFs "
            "separately, and NCCL can only use what they picked")
    if sum(ry.worst_pairs.values()):
        add("pods with a GPU↔NIC pair whose worst pair allows GPUDirect RDMA (≤ PXB)",
            _gdr_worst_share, True, "share",
            "its key puts the worst pair first, so every pod gets the best worst pair a "
            "node has; the baselines' VFs land wherever the draw puts them")
    if ry.multi_arrived:
        add("estimated collective bandwidth of multi-GPU pods",
            lambda m: statistics_mean(m.multi_efficiency), True, "factor",
            "no rank loses GPUDirect RDMA and the pairs are spread over distinct PFs")
    add("GPUs allocated at peak demand" if HEATMAP_SNAPSHOT in ry.snapshots
        else "GPUs allocated at the end", lambda m: m.headline_allocation_ratio, True,
        "share", "it bin-packs within the best affinity tier, keeping idle nodes whole")
    add("NICs stranded (free VFs no free GPU can use with GDR) at peak demand",
        lambda m: (float(m.snapshots[HEATMAP_SNAPSHOT]["strandedNics"])
                   if HEATMAP_SNAPSHOT in m.snapshots else None), False, "count",
        "the last item of its key keeps free GPUs beside NICs with free VFs")
    add("pods placed", lambda m: float(m.placed), True, "count",
        "it packs GPUs without stranding the NICs that larger pods need")
    return out


def _gdr_worst_share(m: PolicyMetrics) -> float | None:
    """Of the placed pods with pairs, the share whose worst pair is PIX or PXB
    (`podsByWorstPair`)."""
    total = sum(m.worst_pairs.values())
    if not total:
        return None
    return (m.worst_pairs[Distance.PIX.name] + m.worst_pairs[Distance.PXB.name]) / total


def headline(result: SimResult) -> str:
    """Whether Railyard did better than the best baseline, by how much and why, first; then
    where it is level or behind; then the GPU allocation it reached. '' without Railyard and
    a baseline."""
    found = comparisons(result)
    if not found:
        return ""
    ry = result.results["railyard"].metrics
    wins = [c for c in found if c.won]
    level = [c for c in found if not c.won and not c.lost]
    behind = [c for c in found if c.lost]
    if wins:
        lead, *more = wins
        text = (f"Railyard is ahead on {len(wins)} of {len(found)} measures. Above all, "
                f"{lead.what}: {lead.said()} — because {lead.why}.")
        if more:
            text += " Also ahead: " + "; ".join(f"{c.what}, {c.said()}" for c in more) + "."
    else:
        text = (f"Railyard is not ahead of the best baseline on any of {len(found)} "
                "measures in this run.")
    if level:
        text += " Level on " + "; ".join(f"{c.what} ({c.value()}, {c.best_name} too)"
                                         for c in level) + "."
    if behind:
        text += " Behind on " + "; ".join(f"{c.what}: {c.said()}" for c in behind) + "."
    base = {n: r.metrics for n, r in result.results.items() if not n.startswith("railyard")}
    alloc_name, alloc_m = max(base.items(), key=lambda kv: kv[1].headline_allocation_ratio)
    moment = ("when live pods' requests reached the cluster's GPUs"
              if HEATMAP_SNAPSHOT in ry.snapshots else "at the end")
    return (f"{text} Railyard had {_pct(ry.headline_allocation_ratio)} of the cluster's "
            f"{ry.cluster_gpus} GPUs allocated {moment} (best baseline: {alloc_name}, "
            f"{_pct(alloc_m.headline_allocation_ratio)}).")


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2rem auto;
max-width:1180px;color:#222;line-height:1.45;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.15rem;margin-top:2rem}
.sub{color:#666;margin-top:0}.lead{font-size:1.05rem;background:#eef7f6;border-left:4px solid
#0b7a75;padding:.6rem .9rem}
table{border-collapse:collapse;font-size:.84rem;margin:.5rem 0}
th,td{padding:.35rem .55rem;border-bottom:1px solid #e4e4e4;text-align:right;white-space:nowrap}
th{background:#f6f6f6;font-weight:600}td:first-child,th:first-child{text-align:left}
tr.railyard td{font-weight:600;background:#f3faf9}
img{max-width:100%;border:1px solid #eee;margin:.4rem 0}
.notes li{margin:.25rem 0}code{background:#f4f4f4;padding:0 .2rem}
.foot{color:#777;font-size:.8rem;margin-top:2.5rem}
"""


def _bound_html(result: SimResult) -> str:
    if result.bounds is None:
        return ""
    esc = html.escape
    items = "".join(
        f"<li><code>{key}</code> ≤ {esc(str(b['value']))} ({esc(b['method'])}"
        f"{'; ' + esc(b['note']) if b.get('note') else ''})</li>"
        for key, b in bounds_json(result).items() if isinstance(b, dict))
    assumptions = "".join(f"<li>{esc(a)}</li>" for a in result.bounds.as_json()["assumptions"])
    return (f"<h2>Offline bound</h2><p>{esc(bound_line(result))} Class: "
            f"{esc(result.bounds.as_json()['class'])}.</p><ul>{items}</ul>"
            f"<p>Assumptions:</p><ul class=\"notes\">{assumptions}</ul>")


def render_html(result: SimResult, info: RunInfo, images: dict[str, tuple[str, str]]) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in TABLE_COLUMNS)
    body = []
    for row in table_rows(result):
        cls = ' class="railyard"' if row[0] == "railyard" else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
    charts = "".join(
        f"<h2>{esc(title)}</h2><img alt=\"{esc(title)}\" src=\"data:image/png;base64,{b64}\">"
        for title, b64 in images.values()
    )
    factors = ", ".join(f"{d.name} {CLASS_FACTOR[d]:.2f}" for d in Distance)
    wall = f" · simulated in {info.wall_s:.1f} s" if info.wall_s is not None else ""
    lead = headline(result)
    notes = "".join(f"<li>{esc(n)}</li>" for n in FOOTNOTES)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Railyard simulation report</title>
<style>{_CSS}</style></head><body>
<h1>Railyard simulation</h1>
<p class="sub">cluster <code>{esc(info.cluster)}</code> ({info.nodes} nodes,
{result.cluster_gpus} GPUs) · trace <code>{esc(info.trace)}</code> · seed {info.seed} ·
{info.arrivals} pods ({info.multi_gpu_arrivals} multi-GPU){wall}</p>
{f'<p class="lead">{esc(lead)}</p>' if lead else ''}
<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>
{_bound_html(result)}
{charts}
<h2>How to read this</h2>
<ul class="notes">
<li>Arrivals: pods drawn from the trace with replacement (seeded) until the GPUs they request
reach {_load_pct(info.load)} of the cluster's GPUs (<code>--load {info.load:g}</code>) in all
(the FGD paper grows load to 130%); in trace order when the trace has creation times.
{_arrivals_note(info)} Every policy faces the same sequence. GPU allocation
(<code>gpuAllocationRatio</code>) is taken when the GPUs requested by live pods first reach
the cluster's.</li>
<li>{_demand_note(info)}</li>
<li>Estimated collective efficiency of a training pod: the slowest rank's class factor
({factors}), divided by the number of the pod's ranks sharing its PF (NCCL merges VFs of one
port). Sources: GPUDirect RDMA up to PXB (NCCL_NET_GDR_LEVEL); ~16 vs ~24 GB/s for a
CPU-attached NIC; "~half the performance" without GDR; a cross-NUMA setup halved bus bandwidth
(see docs/simulator.md). Other pods' traffic is not modelled.</li>
<li>Stranded NICs: PFs with free VFs on a node that still has free GPUs, none of them within
PXB (those GPUs cannot use the NIC with GPUDirect RDMA); counted when arrivals reach 50% and
100% of the cluster's GPUs (“–” where this run's arrivals stopped short of that; at the end of
a run past 100% the cluster is usually full).</li>
{notes}
</ul>
<p class="foot">Workload: Alibaba cluster-trace-gpu-v2023 (openb), CC BY 4.0 — Weng et al.,
"Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC '23. Generated by <code>railyard simulate</code>.</p>
</body></html>
"""
