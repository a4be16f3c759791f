"""Fixtures for CNI tests: a throwaway node (host side in its own netns), the installed shim,
the warm service over the node's state store, and a recording double for RDMA netlink."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cni_helpers import IS_ROOT, NOT_ROOT_REASON, Node, installed_shim, links

from railyard.cni.netns import Netns
from railyard.cni.rdma import RdmaError
from railyard.cni.service import RunningService, build_plugin, start


class RecordingRdma:
    """RDMA netlink double: one namespace holds each RDMA device, as in exclusive mode.

    `moves` records (device, from, to, host links at that moment) so tests can check what
    moved, in which order relative to the netdevs, and that it came back.
    """

    def __init__(self, mode: str = "shared", host_ns: str | None = None) -> None:
        self._mode = mode
        self.host_ns = host_ns
        self.where: dict[str, tuple[int, int]] = {}
        self.moves: list[tuple[str, str, str, set[str]]] = []

    def mode(self) -> str:
        return self._mode

    def place(self, device: str, netns: Netns) -> None:
        self.where[device] = netns.identity()

    def move(self, device: str, source: Netns, target: Netns) -> None:
        if self.where.get(device) != source.identity():
            raise RdmaError(f"RDMA device {device} is not in {source.label}")
        self.where[device] = target.identity()
        host_links = set(links(self.host_ns)) if self.host_ns else set()
        self.moves.append((device, source.label, target.label, host_links))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    if not IS_ROOT:
        pytest.skip(NOT_ROOT_REASON)
    n = Node(tmp_path)
    try:
        yield n
    finally:
        n.close()


@pytest.fixture(scope="session")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return installed_shim(tmp_path_factory.mktemp("cni-bin"))


@pytest.fixture
def rdma(node: Node) -> RecordingRdma:
    return RecordingRdma("shared", node.host)


@pytest.fixture
def service(node: Node, rdma: RecordingRdma, tmp_path: Path) -> Iterator[RunningService]:
    plugin = build_plugin(str(node.state_dir), sysfs_root=str(node.sysfs),
                          host_netns=node.host_path, device_info_dir=str(node.devinfo),
                          rdma=rdma, pod_resources_socket=None, store=node.store)
    running = start(plugin, str(tmp_path / "run" / "cni.sock"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def conf(service: RunningService) -> Callable[..., dict]:
    """A network config for the service under test; keyword arguments add or replace keys."""

    def make(**kw) -> dict:
        base = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni",
                "agentSocket": service.socket_path}
        base.update(kw)
        return base

    return make
