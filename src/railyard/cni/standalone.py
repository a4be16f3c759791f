"""Standalone mode: the shim does the work itself, in its own process, with no agent.

Chosen by `"standalone": true` in the network config; for tests and small installs. Node-side
settings come from the plugin's environment, which the runtime's owner sets and a
network-config author cannot: `RAILYARD_CNI_STATE_DIR` (the node state store; default the
agent's, /var/lib/railyard — a config's `stateDir` must name that same folder, since whoever
can leave files on the node could otherwise grant a pod any device), `RAILYARD_CNI_SYSFS_ROOT`
(default /), `RAILYARD_CNI_HOST_NETNS` (default: our own netns),
`RAILYARD_CNI_DEVINFO_DIR` (default Multus's), `RAILYARD_CNI_POD_RESOURCES` (kubelet's socket;
empty: do not ask kubelet), `RAILYARD_CNI_NODE_NAME` (the node whose records are trusted;
default the hostname, kubelet's own default node name).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from railyard.cni.grants import NODE_NAME_ENV, default_node_name
from railyard.cni.netns import NetnsError
from railyard.cni.plugin import Plugin
from railyard.cni.rdma import RdmaError
from railyard.cni.spec import (
    LATEST_VERSION,
    CniError,
    Code,
    load_config,
    parse_netconf,
    reply_version,
)
from railyard.node.errors import StateError
from railyard.node.paths import CNI_DEVINFO_DIR, POD_RESOURCES_SOCKET, STATE_DIR

STATE_DIR_ENV = "RAILYARD_CNI_STATE_DIR"


def node_state_dir(configured: str | None, env: Mapping[str, str]) -> str:
    """The node's state folder; a config may repeat it, never choose another."""
    own = env.get(STATE_DIR_ENV) or STATE_DIR
    if configured is not None and os.path.realpath(configured) != os.path.realpath(own):
        raise CniError(Code.INVALID_CONFIG,
                       f"stateDir {configured} is not this node's state folder "
                       f"({STATE_DIR_ENV}={own}); standalone mode reads only the node's own",
                       "nothing was moved")
    return own


def plugin_from_env(state_dir: str, env: Mapping[str, str]) -> Plugin:
    from railyard.cni.service import build_plugin

    return build_plugin(
        state_dir,
        sysfs_root=env.get("RAILYARD_CNI_SYSFS_ROOT") or "/",
        host_netns=env.get("RAILYARD_CNI_HOST_NETNS") or None,
        device_info_dir=env.get("RAILYARD_CNI_DEVINFO_DIR") or CNI_DEVINFO_DIR,
        pod_resources_socket=env.get("RAILYARD_CNI_POD_RESOURCES", POD_RESOURCES_SOCKET) or None,
        node=env.get(NODE_NAME_ENV) or default_node_name(),
    )


def run(env: Mapping[str, str], stdin: bytes) -> tuple[int, bytes, bytes]:
    """One call, in process: (exit code, stdout, stderr)."""
    version = LATEST_VERSION
    try:
        data = load_config(stdin)
        version = reply_version(data)
        conf = parse_netconf(data)
        state_dir = node_state_dir(conf.state_dir, env)
        try:
            plugin = plugin_from_env(state_dir, env)
        except StateError as e:
            raise CniError(Code.IO, f"{STATE_DIR_ENV}: {e}") from None
        except NetnsError as e:  # only RAILYARD_CNI_HOST_NETNS names a namespace here
            raise CniError(Code.IO, f"RAILYARD_CNI_HOST_NETNS: {e.strerror}") from None
        except (OSError, RdmaError) as e:  # the node cannot serve the call; never a traceback
            raise CniError(Code.IO, f"cannot start the plugin: {e}") from None
    except CniError as e:
        return 1, (json.dumps(e.to_json(version)) + "\n").encode(), b""
    try:
        reply = plugin.handle(env, stdin)
    finally:
        plugin.close()
    return reply.code, reply.stdout, reply.stderr
