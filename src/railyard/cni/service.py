"""The warm CNI service: a unix socket the `railyard-cni` shim forwards each call to.

One thread per call (network-namespace hops are per thread, and calls for different pods must
not wait on each other; calls touching the same device serialise on its lock). Only root, or
the service's own user, may call: the socket is 0600 and the peer's credentials are checked.
The agent starts it in-process (`start(...)` in a thread, or `serve(...)` blocking); `railyard
cni serve` runs it alone.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any

from railyard.cni.grants import (
    KubeletPodResources,
    LivePods,
    StoreGrants,
    default_node_name,
)
from railyard.cni.metrics import CniMetrics
from railyard.cni.plugin import Plugin, Reply, Settings
from railyard.cni.rdma import RdmaNetlink, RdmaNetns
from railyard.cni.shim import (
    MAGIC,
    decode_env,
    encode_reply,
    error_json,
    recv_blob,
    recv_exact,
)
from railyard.cni.spec import Code
from railyard.node.paths import CNI_DEVINFO_DIR, CNI_SOCKET, POD_RESOURCES_SOCKET
from railyard.node.state import StateStore

log = logging.getLogger(__name__)

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def build_plugin(state_dir: str | os.PathLike[str], *, sysfs_root: str | os.PathLike[str] = "/",
                 host_netns: str | None = None,
                 device_info_dir: str | os.PathLike[str] = CNI_DEVINFO_DIR,
                 rdma: RdmaNetns | None = None,
                 pod_resources_socket: str | os.PathLike[str] | None = POD_RESOURCES_SOCKET,
                 store: StateStore | None = None, node: str | None = None,
                 pods: LivePods | None = None, metrics: CniMetrics | None = None) -> Plugin:
    """The plugin over the node state store in `state_dir` (the agent's `--state-dir`).

    Only records for `node` grant anything: default the store's own node (the agent builds
    its store with `--node-name`), else the hostname. `pods` (the agent's pod list) keeps a
    namespace/name lookup off records of pods known to be gone.
    """
    store = store or StateStore(state_dir)
    plugin = Plugin(
        os.fspath(state_dir),
        StoreGrants(store, node or store.node or default_node_name(), pods=pods),
        rdma or RdmaNetlink(),
        settings=Settings(sysfs_root=os.path.abspath(sysfs_root), host_netns=host_netns,
                          device_info_dir=os.fspath(device_info_dir)),
        pod_devices=(KubeletPodResources(os.fspath(pod_resources_socket))
                     if pod_resources_socket else None),
    )
    plugin.metrics = metrics  # calls by command and outcome (docs/observability.md)
    return plugin


class _Handler(socketserver.BaseRequestHandler):
    server: CniServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        try:
            pid, uid, _gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            if uid not in (0, os.getuid()):
                log.warning("cni service: refusing a call from uid %d (pid %d)", uid, pid)
                sock.sendall(encode_reply(1, error_json(Code.INVALID_ENV,
                                                        "caller is not root"), b""))
                return
            sock.settimeout(30.0)
            if recv_exact(sock, len(MAGIC)) != MAGIC:
                return
            env = decode_env(recv_blob(sock))
            stdin = recv_blob(sock)
            sock.settimeout(None)
        except (OSError, ConnectionError) as e:
            log.warning("cni service: bad request: %s", e)
            return
        reply = self.server.call(env, stdin)
        with contextlib.suppress(OSError):
            sock.sendall(encode_reply(reply.code, reply.stdout, reply.stderr))


class CniServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    # Calls in flight finish before server_close() returns (block_on_close): closing the
    # plugin under a running ADD would leave its rollback without a host namespace.
    daemon_threads = False
    allow_reuse_address = False
    # socketserver's default backlog is 5: a burst of pod starts would find it full, and a
    # connect to a full unix socket fails at once.
    request_queue_size = socket.SOMAXCONN

    def __init__(self, socket_path: str, plugin: Plugin) -> None:
        self.socket_path = socket_path
        self.plugin = plugin
        folder = os.path.dirname(os.path.abspath(socket_path))
        if not os.path.isdir(folder):
            # The socket's own folder (/run/railyard) is made; nothing above it is: a typo in
            # the path must not grow a tree of folders as root.
            if not os.path.isdir(os.path.dirname(folder)):
                raise FileNotFoundError(
                    errno.ENOENT, f"socket {socket_path}: the folder above {folder} does not "
                    "exist", os.path.dirname(folder))
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o755)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)  # a socket left by a previous run
        old = os.umask(0o177)
        try:
            super().__init__(socket_path, _Handler)
        finally:
            os.umask(old)

    def call(self, env: Mapping[str, str], stdin: bytes) -> Reply:
        return self.plugin.handle(env, stdin)

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)


class RunningService:
    """A service running on a background thread; `stop()` closes the socket, waits for the
    calls in flight, then closes the plugin."""

    def __init__(self, server: CniServer) -> None:
        self.server = server
        self.thread = threading.Thread(target=server.serve_forever, name="railyard-cni",
                                       kwargs={"poll_interval": 0.2}, daemon=True)
        self.thread.start()

    @property
    def socket_path(self) -> str:
        return self.server.socket_path

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
        self.server.plugin.close()


def start(plugin: Plugin, socket_path: str = CNI_SOCKET) -> RunningService:
    """Serve on a background thread (the agent's in-process hook)."""
    return RunningService(CniServer(socket_path, plugin))


def serve(state_dir: str, socket_path: str = CNI_SOCKET, *,
          ready: Callable[[], None] | None = None, **settings: Any) -> None:
    """Serve until interrupted; `settings` go to `build_plugin`."""
    plugin = build_plugin(state_dir, **settings)
    server = CniServer(socket_path, plugin)
    log.info("cni service: listening on %s (RDMA netns mode %s)", socket_path, plugin.rdma_mode)
    if ready is not None:
        ready()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        plugin.close()
