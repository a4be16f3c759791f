"""The CNI service's one line per ADD and DEL (docs/observability.md): the pod, the devices it
moved (PCI address, host name > pod name), the outcome; and its metrics by command and
outcome, with latency."""

from __future__ import annotations

import logging

import pytest

from railyard.cni.metrics import CniMetrics
from support.cni import Node, add, delete

pytestmark = pytest.mark.root


def _lines(caplog: pytest.LogCaptureFixture, decision: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith(f"decision={decision} ")]


def test_add_and_del_each_say_the_pod_and_the_devices_moved_and_are_counted(
        node: Node, shim, conf, service, caplog):
    caplog.set_level(logging.INFO, logger="railyard.cni")
    metrics = service.server.plugin.metrics = CniMetrics("node-a")
    nics = node.vfs(2)
    host_names = [node.netdev_of(n) for n in nics]
    pod = node.pod(nics, name="trainer")
    assert add(shim, pod, conf()).code == 0
    assert delete(shim, pod, conf()).code == 0
    assert delete(shim, pod, conf()).code == 0  # nothing left: still one line, no devices
    [added] = _lines(caplog, "add")
    first, second = _lines(caplog, "del")
    moved = f"moved={nics[0].pci_address}:{host_names[0]}>net1," \
            f"{nics[1].pci_address}:{host_names[1]}>net1-1"
    assert added.startswith("decision=add outcome=ok pod=") and "/trainer " in added
    assert moved in added and " ifname=net1 network=rdma" in added
    assert first.startswith("decision=del outcome=ok") and moved in first
    assert "moved=" not in second
    def r(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"node": "node-a", **labels})

    assert r("railyard_cni_requests_total", command="ADD", outcome="ok") == 1
    assert r("railyard_cni_requests_total", command="DEL", outcome="ok") == 2
    assert r("railyard_cni_request_duration_seconds_count", command="ADD") == 1


def test_a_failed_add_says_why(node: Node, shim, conf, service, caplog):
    caplog.set_level(logging.INFO, logger="railyard.cni")
    metrics = service.server.plugin.metrics = CniMetrics("node-a")
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    bad = conf(ifname=7)  # not an interface name
    assert add(shim, pod, bad).code != 0
    [line] = _lines(caplog, "add")
    assert line.startswith("decision=add outcome=error") and 'why="code ' in line
    assert metrics.registry.get_sample_value("railyard_cni_requests_total", {
        "node": "node-a", "command": "ADD", "outcome": "error"}) == 1
