"""`railyard cni serve` (the warm CNI service alone, without the agent) and `railyard cni
install` (put the shim into a CNI bin folder). Imports stay inside the commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from railyard.cli.app import app, fail
from railyard.node.paths import CNI_BIN_DIR, CNI_DEVINFO_DIR, CNI_SOCKET, POD_RESOURCES_SOCKET

cni_app = typer.Typer(help="The CNI plugin: serve the warm service, install the shim.",
                      no_args_is_help=True)
app.add_typer(cni_app, name="cni")


@cni_app.command("serve")
def serve(
    state_dir: Annotated[Path, typer.Option(
        "--state-dir", metavar="DIR", help="The node state store (the agent's --state-dir).")],
    socket_path: Annotated[str, typer.Option(
        "--socket", metavar="PATH", help="Unix socket the shim calls.")] = CNI_SOCKET,
    sysfs_root: Annotated[str, typer.Option(
        "--sysfs-root", metavar="DIR",
        help="Folder holding sys/, or that sys/ itself (a fixture tree in tests).")] = "/",
    host_netns: Annotated[str | None, typer.Option(
        "--host-netns", metavar="PATH",
        help="Namespace devices come from and return to; default: this process's.")] = None,
    devinfo_dir: Annotated[str | None, typer.Option(
        "--devinfo-dir", metavar="DIR",
        help=f"Multus device-info folder; default: {CNI_DEVINFO_DIR}.")] = None,
    pod_resources: Annotated[str | None, typer.Option(
        "--pod-resources", metavar="PATH",
        help="kubelet's PodResources socket, to confirm grants; '' to not ask kubelet; "
             f"default: {POD_RESOURCES_SOCKET}.")] = None,
    node_name: Annotated[str | None, typer.Option(
        "--node-name", metavar="NAME",
        help="The node whose records grant devices (the agent's --node-name); "
             "default: the hostname.")] = None,
) -> None:
    """Serve CNI calls from the railyard-cni shim until interrupted."""
    import logging
    import os

    from railyard.cli.source import sysfs_tree

    sysfs_root = str(sysfs_tree(Path(sysfs_root)))
    socket_folder = os.path.dirname(os.path.abspath(socket_path))
    if not os.path.isdir(os.path.dirname(socket_folder)):
        fail(f"--socket {socket_path}: the folder above {socket_folder} does not exist "
             "(only the socket's own folder is made)")

    from railyard.cni.netns import NetnsError
    from railyard.cni.service import serve as run_service
    from railyard.node.errors import StateError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        run_service(
            str(state_dir), socket_path, sysfs_root=sysfs_root, host_netns=host_netns,
            device_info_dir=devinfo_dir or CNI_DEVINFO_DIR,
            pod_resources_socket=(POD_RESOURCES_SOCKET if pod_resources is None
                                  else pod_resources or None),
            node=node_name or None,
            ready=lambda: print(f"railyard cni: serving on {socket_path}", flush=True),
        )
    except KeyboardInterrupt:
        pass
    except (StateError, NetnsError, OSError) as e:
        fail(str(e), 1)


@cni_app.command("install")
def install(
    bin_dir: Annotated[Path, typer.Option(
        "--bin-dir", metavar="DIR", help="The runtime's CNI bin folder.")] = Path(CNI_BIN_DIR),
    interpreter: Annotated[str | None, typer.Option(
        "--interpreter", metavar="PATH",
        help="python3 the shim runs under; default: this one (needed for standalone mode).")
    ] = None,
) -> None:
    """Install the railyard-cni shim (stdlib-only) into the CNI bin folder."""
    from railyard.cni.install import install_shim

    try:
        path = install_shim(bin_dir, interpreter)
    except (ValueError, OSError) as e:
        fail(str(e), 1)
    print(path)
