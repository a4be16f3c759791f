"""Benchmark: sysfs discovery of a dgx-h100 with 127 VFs per compute PF (1,016 VFs).

In one run: `discover()` in-process (median over repeats) and its peak Python memory
(tracemalloc), a plain recursive `os.walk` of the same tree as the baseline (what merely
visiting every entry costs), and the whole `railyard discover` process, start to exit.
The tree goes to /dev/shm when it exists: sysfs lives in memory too, so tmpfs is the closer
stand-in than a disk.

    python benchmarks/discovery.py                  # markdown section on stdout
    python benchmarks/discovery.py --write-docs     # and replace its section of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import tracemalloc
from pathlib import Path

from railyard.discovery.discover import discover
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import DGX_H100, build_topology

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SECTION = "## Discovery"
TARGET_IN_PROCESS_MS, TARGET_PROCESS_MS = 300, 1000


def timed_ms(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def _row(name: str, ms: list[float], target: str) -> str:
    cells = (statistics.median(ms), min(ms), max(ms))
    return f"| {name} | " + " | ".join(f"{v:.1f} ms" for v in cells) + f" | {target} |"


def _share(total: list[float], part: list[float]) -> str:
    return f"{statistics.median(total) - statistics.median(part):.0f}"


def walk(root: Path) -> int:
    entries = 0
    for _, dirs, files in os.walk(root):
        entries += len(dirs) + len(files)
    return entries


def railyard_command() -> list[str]:
    """The installed console script itself (not a pyenv shim), else `python -m`."""
    script = Path(sysconfig.get_path("scripts")) / "railyard"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "railyard.cli.main"]


def run(repeats: int, process_repeats: int, vfs: int) -> str:
    load = os.getloadavg()[0]
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    workdir = Path(tempfile.mkdtemp(prefix="railyard-bench-", dir=base))
    try:
        root = write_fixture(DGX_H100, workdir / "root", vfs)
        found = discover(root)  # warm the dentry cache the same way for both
        assert found.topology == build_topology(DGX_H100, vfs), "discovery differs from profile"
        n_vfs = sum(len(n.vfs) for n in found.topology.nics)
        entries = walk(root)

        discover_ms = timed_ms(lambda: discover(root), repeats)
        walk_ms = timed_ms(lambda: walk(root), repeats)
        tracemalloc.start()
        discover(root)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()

        command = [*railyard_command(), "discover", "--sysfs-root", str(root)]
        # Same-run references: a bare interpreter, and the CLI with no discovery at all.
        bare = [sys.executable, "-c", "pass"]
        no_discovery = [*railyard_command(), "discover", "--profile", "generic"]
        process_ms, bare_ms, cli_ms = [], [], []
        for cmd in (command, bare, no_discovery):
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)  # warm caches
        for _ in range(process_repeats):  # interleaved, so load affects all three alike
            for cmd, out in ((command, process_ms), (bare, bare_ms), (no_discovery, cli_ms)):
                out.extend(timed_ms(
                    lambda cmd=cmd: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL),
                    1))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    med, walk_med = statistics.median(discover_ms), statistics.median(walk_ms)
    uname = subprocess.run(["uname", "-a"], capture_output=True, text=True,
                           check=False).stdout.strip() or " ".join(platform.uname())
    shown = " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(command))
    shown = shown.replace(str(root), "<tree>")
    fs = "tmpfs (/dev/shm)" if base else "the temp folder's file system"
    return f"""{SECTION}

Discovery of `dgx-h100` with {vfs} VFs per compute PF: {len(found.topology.gpus)} GPUs,
{len(found.topology.nics)} RDMA NICs, {n_vfs} VFs; the fake tree has {entries:,} entries, on {fs}.
Baseline: a plain recursive `os.walk` of the same tree, measured in the same run.

- Machine: `{uname}`, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average
  {load:.1f} when the run began (other work on the machine widens min…max)
- Command: `python benchmarks/discovery.py --repeats {repeats}` (writes this section with
  `--write-docs`)

| measure | median | min | max | target |
|---|---|---|---|---|
{_row("`discover()` in-process", discover_ms, f"≤ {TARGET_IN_PROCESS_MS} ms")}
{_row("baseline `os.walk` of the tree", walk_ms, "")}
{_row(f"whole process `{shown}`", process_ms, f"≤ {TARGET_PROCESS_MS} ms")}
{_row("reference: `railyard discover --profile generic` (CLI, no discovery)", cli_ms, "")}
{_row("reference: `python -c pass` (interpreter start)", bare_ms, "")}

- Discovery / walk: **{med / walk_med:.2f}×** the time of merely visiting every entry (discovery
  reads only the files it needs and resolves links without `realpath`).
- Peak Python memory during one `discover()` (tracemalloc): **{peak / 2**20:.1f} MiB**.
- Per VF: {med * 1000 / max(n_vfs, 1):.0f} µs of the in-process median.
- Whole process minus the CLI without discovery (medians): {_share(process_ms, cli_ms)} ms —
  discovery, the JSON document and its printing; the rest is the interpreter and the CLI's
  imports and argument parsing (Typer, pinned below 0.29, whose pydantic import cost ~0.2 s:
  docs/decisions/0002).
"""


def write_docs(section: str) -> None:
    """Replace only the `## Discovery` section; other sections belong to other benchmarks."""
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    start = text.find(SECTION + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        rest = text[end + 1:] if end >= 0 else ""
        text = text[:start] + section + ("\n" + rest if rest else "")
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--process-repeats", type=int, default=7)
    parser.add_argument("--vfs-per-pf", type=int, default=127)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    section = run(args.repeats, args.process_repeats, args.vfs_per_pf)
    print(section)
    if args.write_docs:
        write_docs(section)


if __name__ == "__main__":
    main()
