"""Fixtures for CNI tests: a throwaway node (host side in its own netns), the installed shim,
the warm service over the node's state store, and a recording double for RDMA netlink."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from railyard.cni.service import RunningService, build_plugin, start
from support.cni import IS_ROOT, NOT_ROOT_REASON, Node, RecordingRdma, installed_shim


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


@pytest.fixture
def exclusive(node: Node, tmp_path: Path) -> Iterator[tuple[RecordingRdma, str]]:
    """A service whose kernel runs RDMA in exclusive mode (the recording double), and its
    socket path."""
    rdma = RecordingRdma("exclusive", node.host)
    plugin = build_plugin(str(node.state_dir), sysfs_root=str(node.sysfs),
                          host_netns=node.host_path, device_info_dir=str(node.devinfo),
                          rdma=rdma, pod_resources_socket=None, store=node.store)
    running = start(plugin, str(tmp_path / "x.sock"))
    try:
        yield rdma, running.socket_path
    finally:
        running.stop()

