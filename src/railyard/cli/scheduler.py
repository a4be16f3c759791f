"""`railyard scheduler`: run the kube-scheduler HTTP extender over a cluster file, or over
the API server (NodeTopology CRs and pods; `--kubeconfig`, else the pod's service account).

Imports stay inside the command so `railyard --help` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from railyard.allocation.names import DEFAULT_RESOURCES, ResourceNames
from railyard.cli.app import KubeBurst, KubeQps, app, check_kube_limits, fail

if TYPE_CHECKING:
    import ssl

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from railyard.scheduler.service import Extender

DEFAULT_LISTEN = "127.0.0.1:8888"


@dataclass(frozen=True, slots=True)
class LeaderElection:
    """The `--leader-elect-*` flags."""

    namespace: str
    name: str
    lease_duration_s: float
    renew_deadline_s: float
    retry_period_s: float


def parse_listen(text: str, option: str = "--listen") -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` (all interfaces) or `[v6addr]:PORT`."""
    host, sep, port_text = text.rpartition(":")
    if (not sep or not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5
            or not 0 <= int(port_text) <= 65535):
        raise ValueError(f"{option} {text!r}: expected HOST:PORT with a port 0..65535")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_text)


# The binds' client's connections (`railyard scheduler --kube-connections`). kube-scheduler
# sends binds without a bound on how many at once, and over HTTP/1.1 each Binding in flight
# holds a connection: with the client's 16, at 5,000 kwok nodes binds waited p99 2.5-2.9 s
# for one while on the wire they took p99 0.5 s (docs/benchmarks.md, issue 28 run 8).
BIND_CONNECTIONS = 64
MAX_CONNECTIONS = 1024  # each one a socket and a TLS session, here and at the API server


@app.command()
def scheduler(
    cluster_file: Annotated[Path | None, typer.Option(
        "--cluster-file", metavar="FILE",
        help="Run without a cluster: YAML or JSON: nodes[] {name, profile, vfsPerPf?} or "
             "{name, topology}, optional pods[] {namespace, name, uid, node, allocation}.")
    ] = None,
    kubeconfig: Annotated[Path | None, typer.Option(
        "--kubeconfig", metavar="FILE",
        help="Run on the cluster this kubeconfig names (without it and without "
             "--cluster-file: the pod's own service account).")] = None,
    # A bind is two requests (the Binding, its Event): 200 QPS keeps pace with the
    # kube-scheduler client of deploy/kube-scheduler-config.yaml (docs/benchmarks.md).
    kube_qps: KubeQps = 200.0,
    kube_burst: KubeBurst = 400,
    listen: Annotated[str, typer.Option(
        "--listen", metavar="HOST:PORT",
        help="Where kube-scheduler reaches the extender: this host only unless told "
             "(`:PORT` or 0.0.0.0:PORT: every interface).")] = DEFAULT_LISTEN,
    tls_cert_file: Annotated[Path | None, typer.Option(
        "--tls-cert-file", metavar="FILE",
        help="Serve HTTPS with this PEM certificate (chain); kube-scheduler's extender "
             "entry then needs enableHTTPS and tlsConfig.caFile (docs/decisions/0083).")
    ] = None,
    tls_key_file: Annotated[Path | None, typer.Option(
        "--tls-key-file", metavar="FILE", help="The PEM private key of --tls-cert-file.")
    ] = None,
    client_ca_file: Annotated[Path | None, typer.Option(
        "--client-ca-file", metavar="FILE",
        help="With TLS: every call but /healthz needs a client certificate this CA signed "
             "(kube-scheduler: tlsConfig.certFile and keyFile).")] = None,
    admin_token_file: Annotated[Path | None, typer.Option(
        "--admin-token-file", metavar="FILE",
        help="With --cluster-file: DELETE /pods/<uid> answers only callers sending "
             "`Authorization: Bearer <this file's token>`; without it, nobody.")] = None,
    state_file: Annotated[Path | None, typer.Option(
        "--state-file", metavar="FILE",
        help="Keep what was bound here; at start it is the record of bound pods (the "
             "cluster file's pods only seed a new one).")] = None,
    pod_cache: Annotated[int, typer.Option(
        "--pod-cache", metavar="N", help="Pods remembered between filter and bind.")
    ] = 10_000,
    leader_elect: Annotated[bool, typer.Option(
        "--leader-elect/--no-leader-elect",
        help="On the API: only the replica holding the Lease binds; the others answer "
             "filter and prioritize and refuse binds (docs/decisions/0074).")] = True,
    leader_elect_lease_duration: Annotated[float, typer.Option(
        "--leader-elect-lease-duration", metavar="SECONDS",
        help="How long a replica waits, from the last renewal it saw, to take over.")] = 15.0,
    leader_elect_renew_deadline: Annotated[float, typer.Option(
        "--leader-elect-renew-deadline", metavar="SECONDS",
        help="The leader stops binding when it has not renewed for this long.")] = 10.0,
    leader_elect_retry_period: Annotated[float, typer.Option(
        "--leader-elect-retry-period", metavar="SECONDS",
        help="Between two tries to acquire or renew.")] = 2.0,
    leader_elect_namespace: Annotated[str, typer.Option(
        "--leader-elect-namespace", metavar="NS")] = "kube-system",
    leader_elect_name: Annotated[str, typer.Option(
        "--leader-elect-name", metavar="NAME")] = "railyard-scheduler",
    vf_pool: Annotated[list[str] | None, typer.Option(
        "--vf-pool", metavar="RESOURCE",
        help="A VF pool besides railyard.dev/vf, by its resource name (repeat for each; the "
             "agents' vfPools and kube-scheduler's managedResources list the same names): "
             "pods asking for it are read as asking VFs of that pool (docs/decisions/0085).")
    ] = None,
    signing_key_file: Annotated[Path | None, typer.Option(
        "--signing-key-file", metavar="FILE",
        help="On the API: sign every record with this Ed25519 private key (PEM; openssl "
             "genpkey -algorithm ed25519) and believe only signed records: decisions signed "
             "with it, node truths signed with the key each node's NodeTopology publishes. "
             "Without it every record is trusted (docs/decisions/0087).")] = None,
    idle_node_reserve: Annotated[int, typer.Option(
        "--idle-node-reserve", metavar="K", min=0,
        help="The admission reserve: while at most K nodes of 8 or more GPUs are idle, a pod "
             "that would not fill one may not open one (0: off). Trades GPU allocation for "
             "room for the largest pods (docs/scheduler.md, docs/simulator.md).")] = 0,
    koordinator_annotation: Annotated[bool, typer.Option(
        "--koordinator-annotation",
        help="On the API: every bind also writes Koordinator's "
             "scheduling.koordinator.sh/device-allocated annotation (the same devices, no "
             "pairing) for koordlet on a cluster running both (docs/decisions/0095).")
    ] = False,
    filter_ranks: Annotated[bool, typer.Option(
        "--filter-ranks/--no-filter-ranks",
        help="Filter answers only the nodes that rank best for the pod, so kube-scheduler "
             "needs no prioritize call (deploy/kube-scheduler-config.yaml); off, filter "
             "keeps every node that fits and prioritize ranks them, for a configuration "
             "where kube-scheduler's own scores may outweigh Railyard's "
             "(deploy/kube-scheduler-config-prioritize.yaml; docs/decisions/0104).")] = True,
    kube_connections: Annotated[int, typer.Option(
        "--kube-connections", metavar="N",
        help="On the API: the binds' client's connections to the API server (each Binding "
             "in flight holds one; past them a bind waits). Each new one is a TLS handshake "
             "the API server pays for.")] = BIND_CONNECTIONS,
    allocated_events: Annotated[bool, typer.Option(
        "--allocated-events/--no-allocated-events",
        help="On the API: an `Allocated` Event on each pod bound with devices, naming its "
             "pairs for `kubectl describe`. Off by default: the record on the pod says the "
             "same, and the Event is one more API write per pod (docs/decisions/0116).")] = False,
    log_level: Annotated[str, typer.Option("--log-level", metavar="LEVEL")] = "info",
) -> None:
    """Run the scheduler extender: POST /filter /prioritize /bind /preempt, GET /healthz
    /metrics /allocations. With --cluster-file, nodes and pods come from the file, binds go
    to --state-file, and DELETE /pods/<uid> (with --admin-token-file's token) frees a pod;
    otherwise from the API server, where a bind writes the pod's Allocation and creates its
    Binding (docs/scheduler.md)."""
    import asyncio
    import logging

    from railyard.scheduler.access import AccessError, AdminToken
    from railyard.scheduler.cluster_file import ClusterFileError, load_cluster
    from railyard.scheduler.service import Extender, settle_heap
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
    tls = _tls(tls_cert_file, tls_key_file, client_ca_file)
    names = _names(vf_pool or [])
    if cluster_file is None:
        if state_file is not None:
            fail("--state-file needs --cluster-file (on a cluster the pods are the record)")
        if admin_token_file is not None:
            fail("--admin-token-file needs --cluster-file (on a cluster the pod watch frees "
                 "devices: there is no DELETE /pods/<uid>)")
        check_kube_limits(kube_qps, kube_burst)
        if not 1 <= kube_connections <= MAX_CONNECTIONS:
            fail(f"--kube-connections must be 1 to {MAX_CONNECTIONS}, got {kube_connections}")
        election = None
        if leader_elect:
            if not (0 < leader_elect_retry_period < leader_elect_renew_deadline
                    < leader_elect_lease_duration):
                fail("leader election needs 0 < --leader-elect-retry-period < "
                     "--leader-elect-renew-deadline < --leader-elect-lease-duration")
            election = LeaderElection(leader_elect_namespace, leader_elect_name,
                                      leader_elect_lease_duration, leader_elect_renew_deadline,
                                      leader_elect_retry_period)
        _serve_api(kubeconfig, host, port, listen, pod_cache, kube_qps, kube_burst, election,
                   tls, names, _signing_key(signing_key_file), idle_node_reserve,
                   koordinator_annotation, filter_ranks=filter_ranks,
                   allocated_events=allocated_events, connections=kube_connections)
        return
    if kubeconfig is not None:
        fail("give --cluster-file or --kubeconfig, not both")
    if signing_key_file is not None:
        fail("--signing-key-file needs the API (with --cluster-file every record is trusted)")
    if koordinator_annotation:
        fail("--koordinator-annotation needs the API (with --cluster-file binds go to "
             "--state-file, not to pods)")
    if allocated_events:
        fail("--allocated-events needs the API (with --cluster-file there are no Events)")
    token = None
    if admin_token_file is not None:
        try:
            token = AdminToken.from_file(admin_token_file)
        except AccessError as e:
            fail(str(e))
        if tls is None and not _loopback(host):
            logging.getLogger("railyard.scheduler").warning(
                "--admin-token-file without TLS on %s: the token crosses the network in "
                "clear; add --tls-cert-file and --tls-key-file", listen)
    sf = None
    try:
        cluster = load_cluster(cluster_file)
        state = ClusterState(cluster.topologies, idle_reserve=idle_node_reserve)
        if state_file is not None:
            sf, pods = StateFile.open(state_file, seed=cluster.pods)
            state.restore(pods)
            sf.compact()
        else:
            state.restore(cluster.pods)
    except (ClusterFileError, StateFileError) as e:
        fail(str(e))
    extender = Extender(state, sf, state_file=sf, pod_cache=pod_cache, admin_token=token,
                        names=names, filter_ranks=filter_ranks)
    settle_heap()

    try:
        asyncio.run(_serve(extender, host, port, "", tls))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        fail(f"cannot listen on {listen}: {e}")
    finally:
        if sf is not None:
            sf.close()


def _signing_key(path: Path | None) -> Ed25519PrivateKey | None:
    from railyard.node.keys import load_private_key
    from railyard.records.signature import SignatureKeyError

    if path is None:
        return None
    try:
        return load_private_key(path)
    except SignatureKeyError as e:
        fail(f"--signing-key-file {e}")


def _names(pools: list[str]) -> ResourceNames:
    """The resource names pods are read with: the defaults plus each --vf-pool."""
    from railyard.agent.config import extended_resource_problem

    for name in pools:
        why = extended_resource_problem(name)
        if why is not None:
            fail(f"--vf-pool {name!r}: not an extended resource name kubelet accepts: {why}")
        if name in DEFAULT_RESOURCES.managed:
            fail(f"--vf-pool {name!r}: already the GPU, default VF or PF resource")
    return replace(DEFAULT_RESOURCES, vf_pools=tuple(sorted(set(pools))))


def _tls(cert_file: Path | None, key_file: Path | None,
         client_ca_file: Path | None) -> ssl.SSLContext | None:
    """The TLS context the flags ask for; None: plain HTTP."""
    from railyard.scheduler.access import AccessError, server_tls

    if cert_file is None and key_file is None:
        if client_ca_file is not None:
            fail("--client-ca-file needs --tls-cert-file and --tls-key-file")
        return None
    if cert_file is None or key_file is None:
        fail("give --tls-cert-file and --tls-key-file together")
    try:
        return server_tls(cert_file, key_file, client_ca_file)
    except AccessError as e:
        fail(str(e))


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def _serve(extender: Extender, host: str, port: int, source: str,
                 tls: ssl.SSLContext | None) -> None:
    """Serve until SIGTERM or SIGINT; `source` says where the cluster comes from."""
    import asyncio
    import logging
    import signal

    from railyard.scheduler.service import start

    log = logging.getLogger("railyard.scheduler")
    runner = await start(extender, host, port, tls)
    scheme = "http" if tls is None else "https"
    log.info("extender listening on %s://%s:%d%s: %d nodes, %d pods bound",
             scheme, host, port, source, len(extender.state), extender.state.pod_count())
    try:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping")
    finally:
        await runner.cleanup()


def _serve_api(kubeconfig: Path | None, host: str, port: int, listen: str, pod_cache: int,
               qps: float, burst: int, election: LeaderElection | None,
               tls: ssl.SSLContext | None, names: ResourceNames = DEFAULT_RESOURCES,
               signing_key: Ed25519PrivateKey | None = None, idle_reserve: int = 0,
               koordinator: bool = False, *, filter_ranks: bool = True,
               allocated_events: bool = False, connections: int = BIND_CONNECTIONS) -> None:
    """The extender on the API server: list NodeTopologies and pods, then serve."""
    import asyncio
    import logging

    from railyard.kube.client import Client
    from railyard.kube.config import KubeConfigError, load
    from railyard.kube.lease import ApiLeases, Elector, default_identity
    from railyard.scheduler.cluster_api import ApiCluster
    from railyard.scheduler.service import Extender, settle_heap
    from railyard.scheduler.state import ClusterState

    log = logging.getLogger("railyard.scheduler")
    try:
        config = load(kubeconfig)
    except KubeConfigError as e:
        fail(str(e))

    async def serve() -> None:
        # The Lease has a client of its own (as kube-scheduler's leader election does): its
        # renewals never queue behind a burst of binds for the connections or the QPS. On
        # the shared client a 5,000-node benchmark lost the lease and refused 249 binds.
        # Events too (as kube-scheduler's broadcaster has): a burst of them never holds a
        # bind back (decision 0104).
        async with Client(config, qps=qps, burst=burst, connections=connections,
                          user_agent="railyard-scheduler", timed=True) as c, \
                Client(config, qps=5, burst=10, connections=2,
                       user_agent="railyard-scheduler-election") as lease_client, \
                Client(config, qps=max(1.0, qps / 2), burst=max(1, burst // 2), connections=4,
                       user_agent="railyard-scheduler-events") as events_client:
            state = ClusterState((), idle_reserve=idle_reserve)
            elector = None
            if election is not None:
                elector = Elector(
                    ApiLeases(lease_client, election.namespace, election.name),
                    default_identity(),
                    lease_duration_s=election.lease_duration_s,
                    renew_deadline_s=election.renew_deadline_s,
                    retry_period_s=election.retry_period_s)
                lease = f"{election.namespace}/{election.name}"
                identity = elector.identity
                elector.on_change = lambda leads: log.info(
                    "%s %s the lease %s", identity, "holds" if leads else "does not hold",
                    lease)
            cluster = ApiCluster(c, state, elector.is_leader if elector else None,
                                 signing_key, koordinator,
                                 elector.time_left if elector else None,
                                 allocated_events=allocated_events,
                                 events_client=events_client)
            await cluster.start()
            # No admin calls: the pod watch frees a pod's devices (docs/decisions/0083).
            extender = Extender(state, cluster.binder, pod_cache=pod_cache, leader=elector,
                                admin_calls=False, names=names, filter_ranks=filter_ranks)
            cluster.sync.on_pods_changed = lambda: extender.metrics.pods.set(state.pod_count())
            cluster.binder.observe_write = extender.metrics.write_timing
            settle_heap()
            campaign = asyncio.ensure_future(elector.run()) if elector else None
            try:
                await _serve(extender, host, port, f", on {config.server}", tls)
            finally:
                if campaign is not None and elector is not None:
                    campaign.cancel()
                    await asyncio.gather(campaign, return_exceptions=True)
                    await elector.release()
                await cluster.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    except TimeoutError as e:
        fail(f"{config.server}: {e}")
    except OSError as e:
        fail(f"cannot listen on {listen}: {e}")
