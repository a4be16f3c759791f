"""`railyard agent`: the node agent (device plugins or the DRA driver, state store, optional
CNI service).

Runs until SIGTERM or SIGINT. Imports stay inside the command so `railyard --help` is fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from railyard.cli.app import KubeBurst, KubeQps, app, check_kube_limits, fail
from railyard.node.paths import KUBELET_DIR, STATE_DIR


@app.command()
def agent(
    node_name: Annotated[str, typer.Option(
        "--node-name", metavar="NAME", help="This node's Kubernetes name (spec.nodeName).")],
    pods_file: Annotated[Path | None, typer.Option(
        "--pods-file", metavar="FILE",
        help="JSON list of v1 Pods (or a PodList) on this node; re-read on change. Without "
             "it, the pods come from the API server (--kubeconfig, else in-cluster).")
    ] = None,
    kubeconfig: Annotated[Path | None, typer.Option(
        "--kubeconfig", metavar="PATH",
        help="Cluster mode: read this node's pods from the API server, publish its "
             "NodeTopology, write the node's decisions back to pods.")] = None,
    kube_qps: KubeQps = 50.0,
    kube_burst: KubeBurst = 100,
    sysfs_root: Annotated[Path, typer.Option(
        "--sysfs-root", metavar="DIR",
        help="Folder holding sys/ and proc/, or that sys/ itself.")] = Path("/"),
    kubelet_dir: Annotated[Path, typer.Option(
        "--kubelet-dir", metavar="DIR",
        help="Kubelet's root: device-plugins/, plugins_registry/, pod-resources/.")
    ] = Path(KUBELET_DIR),
    state_dir: Annotated[Path, typer.Option(
        "--state-dir", metavar="DIR", help="The node-local state store.")
    ] = Path(STATE_DIR),
    config: Annotated[Path | None, typer.Option(
        "--config", metavar="FILE",
        help="Agent config (JSON or YAML): resource names, pools, plugins; see docs/agent.md.")
    ] = None,
    cni_socket: Annotated[str | None, typer.Option(
        "--cni-socket", metavar="PATH",
        help="Also serve the CNI service on this unix socket, in this process.")] = None,
    metrics_listen: Annotated[str | None, typer.Option(
        "--metrics-listen", metavar="HOST:PORT",
        help="Serve Prometheus metrics (the agent's and its CNI service's) at "
             "http://HOST:PORT/metrics; ':PORT' listens on every interface. Off when not "
             "given (docs/observability.md).")] = None,
    signing_key_file: Annotated[Path | None, typer.Option(
        "--signing-key-file", metavar="FILE",
        help="Cluster mode: this node's Ed25519 key (PEM), made there on first start if "
             "absent: signs the node's truth written back to pods, its public half "
             "published on the NodeTopology (docs/decisions/0087).")] = None,
    extender_public_key_file: Annotated[list[Path] | None, typer.Option(
        "--extender-public-key-file", metavar="FILE",
        help="Cluster mode: the extender's Ed25519 public key (PEM; repeat while rotating). "
             "Given: only records signed for their pod are believed (needs "
             "--signing-key-file); not given: every record is trusted.")] = None,
    mode: Annotated[str | None, typer.Option(
        "--mode", metavar="extender|dra",
        help="extender (the default): device plugins serve the GPUs, VFs and PFs, steered to "
             "the extender's pairing. dra: the agent is the DRA driver railyard.dev: it "
             "publishes this node's ResourceSlices (every RDMA VF and whole PF, the GPUs with "
             "the config's dra.publishGpus), serves kubelet's DRA plugin, and registers no "
             "device plugin for what DRA serves; the CNI service, metrics and clean-up stay. "
             "Needs cluster mode. Overrides the config file's `mode` (docs/dra.md).")
    ] = None,
    log_level: Annotated[str, typer.Option(
        "--log-level", metavar="LEVEL",
        help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve RDMA VFs, PFs and GPUs to kubelet: as device plugins steered to the recorded
    pairing (--mode extender), or as the DRA driver railyard.dev (--mode dra)."""
    import asyncio
    import dataclasses
    import logging
    import signal

    from railyard.agent.agent import Agent, AgentOptions, run_until_stopped
    from railyard.agent.config import MODES, ConfigError, load_config
    from railyard.cli.scheduler import parse_listen
    from railyard.cli.source import sysfs_tree
    from railyard.discovery.sysfs import SysfsError
    from railyard.kube.client import Client
    from railyard.kube.config import KubeConfigError, load
    from railyard.kubelet.apipods import PodSourceError
    from railyard.kubelet.plugin import PluginError
    from railyard.kubelet.pods import PodsFile
    from railyard.node.errors import StateError
    from railyard.node.keys import load_public_key, node_signing_key
    from railyard.records.dra_slices import SliceLimitError
    from railyard.records.signature import SignatureKeyError

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        fail(f"--log-level: unknown level {log_level!r}")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if pods_file is not None and kubeconfig is not None:
        fail("--pods-file and --kubeconfig: give one (the pods come from one source)")
    check_kube_limits(kube_qps, kube_burst)
    if mode is not None and mode not in MODES:
        fail(f"--mode: expected {' or '.join(MODES)}, got {mode!r}")
    sysfs_root = sysfs_tree(sysfs_root)
    if pods_file is not None and (signing_key_file or extender_public_key_file):
        fail("--signing-key-file and --extender-public-key-file need cluster mode (with "
             "--pods-file every record is trusted)")
    if extender_public_key_file and signing_key_file is None:
        fail("--extender-public-key-file needs --signing-key-file: an extender that checks "
             "signatures believes only a node's truth signed with the node's key")
    try:
        signing_key = (node_signing_key(signing_key_file)
                       if signing_key_file is not None else None)
        extender_keys = tuple(load_public_key(f) for f in extender_public_key_file or ())
    except SignatureKeyError as e:
        fail(str(e))
    try:
        metrics_at = (parse_listen(metrics_listen, "--metrics-listen")
                      if metrics_listen is not None else None)
    except ValueError as e:
        fail(str(e))
    try:
        cfg = load_config(config)
        if mode is not None:
            cfg = dataclasses.replace(cfg, mode=mode)
        if cfg.mode == "dra" and pods_file is not None:
            fail("--mode dra needs cluster mode (--kubeconfig or in-cluster): the "
                 "ResourceSlices and claims are on the API server, not in --pods-file")
        kube = None
        if pods_file is None:
            try:
                kube = Client(load(kubeconfig), qps=kube_qps, burst=kube_burst,
                              user_agent=f"railyard-agent/{node_name}")
            except KubeConfigError as e:
                fail(f"{e} (give --kubeconfig PATH, or --pods-file FILE to run without a "
                     f"cluster)")
        node_agent = Agent(
            AgentOptions(node_name=node_name, sysfs_root=str(sysfs_root),
                         kubelet_dir=str(kubelet_dir), state_dir=str(state_dir),
                         cni_socket=cni_socket, metrics_listen=metrics_at,
                         signing_key=signing_key, extender_keys=extender_keys),
            PodsFile(pods_file, cfg.resources) if pods_file is not None else None, cfg,
            kube=kube)
    except (ConfigError, StateError) as e:
        fail(str(e))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_until_stopped(node_agent, stop)

    try:
        asyncio.run(main())
    except ConfigError as e:  # what only the node's devices reveal (a VF in two pools)
        fail(str(e))
    except PodSourceError as e:
        fail(f"cannot read this node's pods: {e}", code=1)
    except SliceLimitError as e:
        fail(f"this node's ResourceSlices: {e}", code=1)
    except (SysfsError, StateError, PluginError, OSError) as e:
        fail(str(e), code=1)
