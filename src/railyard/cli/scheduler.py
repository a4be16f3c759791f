"""`railyard scheduler`: run the kube-scheduler HTTP extender over a cluster file.

Imports stay inside the command so `railyard --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from railyard.cli.app import app, fail


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` (all interfaces) or `[v6addr]:PORT`."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT with a port 0..65535")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_text)


@app.command()
def scheduler(
    cluster_file: Annotated[Path, typer.Option(
        "--cluster-file", metavar="FILE",
        help="YAML or JSON: nodes[] {name, profile, vfsPerPf?} or {name, topology}, "
             "optional pods[] {namespace, name, uid, node, allocation}.")],
    listen: Annotated[str, typer.Option(
        "--listen", metavar="HOST:PORT", help="Where kube-scheduler reaches the extender.")
    ] = "0.0.0.0:8888",
    state_file: Annotated[Path | None, typer.Option(
        "--state-file", metavar="FILE",
        help="Keep what was bound here; at start it is the record of bound pods (the "
             "cluster file's pods only seed a new one).")] = None,
    pod_cache: Annotated[int, typer.Option(
        "--pod-cache", metavar="N", help="Pods remembered between filter and bind.")
    ] = 10_000,
    log_level: Annotated[str, typer.Option("--log-level", metavar="LEVEL")] = "info",
) -> None:
    """Run the scheduler extender: POST /filter /prioritize /bind /preempt, GET /healthz
    /metrics /allocations, DELETE /pods/<uid>."""
    import asyncio
    import logging
    import signal

    from railyard.scheduler.cluster_file import ClusterFileError, load_cluster
    from railyard.scheduler.service import Extender, settle_heap, start
    from railyard.scheduler.state import ClusterState
    from railyard.scheduler.state_file import StateFile, StateFileError

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        fail(f"--log-level {log_level!r}: expected debug, info, warning or error")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if pod_cache < 1:
        fail("--pod-cache must be at least 1")
    try:
        host, port = parse_listen(listen)
    except ValueError as e:
        fail(str(e))
    sf = None
    try:
        cluster = load_cluster(cluster_file)
        state = ClusterState(cluster.topologies)
        if state_file is not None:
            sf, pods = StateFile.open(state_file, seed=cluster.pods)
            state.restore(pods)
            sf.compact()
        else:
            state.restore(cluster.pods)
    except (ClusterFileError, StateFileError) as e:
        fail(str(e))
    extender = Extender(state, sf, state_file=sf, pod_cache=pod_cache)
    settle_heap()
    log = logging.getLogger("railyard.scheduler")

    async def serve() -> None:
        runner = await start(extender, host, port)
        log.info("extender listening on %s:%d: %d nodes, %d pods holding devices",
                 host, port, len(state), len(state.pods()))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
            log.info("stopping")
        finally:
            await runner.cleanup()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    except OSError as e:
        fail(f"cannot listen on {listen}: {e}")
    finally:
        if sf is not None:
            sf.close()
