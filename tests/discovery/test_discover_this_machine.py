"""Discovery of the real `/` of whatever machine runs the tests: never an error."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from railyard.discovery.discover import discover

pytestmark = pytest.mark.skipif(not os.path.isdir("/sys/devices"), reason="no /sys mounted")


def test_this_machine_is_discovered_without_error() -> None:
    found = discover(Path("/"))
    t = found.topology
    assert t.node == socket.gethostname()
    assert t.numa_nodes, "every Linux with sysfs lists at least one NUMA node"
    assert all(n.memory_bytes > 0 for n in t.numa_nodes)


@pytest.mark.skipif(os.path.exists("/sys/class/infiniband"), reason="this machine has RDMA")
def test_machine_without_rdma_has_no_nics() -> None:
    assert discover(Path("/")).topology.nics == ()


def test_gpus_found_are_nvidia_or_amd_in_pci_order() -> None:
    gpus = discover(Path("/")).topology.gpus
    assert all(g.vendor in ("0x10de", "0x1002") for g in gpus)
    assert [g.index for g in gpus] == list(range(len(gpus)))
