"""Devices cross between namespaces under a transit name (decision 0047): each state a crash can
leave mid-crossing is found and undone by DEL, and a clash on any name moves nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from railyard.cni import moves
from railyard.cni.restore import fallback_name
from support.cni import Node, Pod, add, delete, links, record_path, sh, transit_names

pytestmark = pytest.mark.root


def added_pod(node: Node, shim: Path, conf: dict, count: int = 2) -> tuple[Pod, dict]:
    """A pod whose ADD succeeded; the host as it was before, with device 0 up there."""
    nics = node.vfs(count)
    sh("ip", "-n", node.host, "link", "set", node.netdev_of(nics[0]), "up")
    before = node.snapshot()
    pod = node.pod(nics)
    r = add(shim, pod, conf)
    assert r.code == 0, r.out
    return pod, before


def test_transit_names_are_recorded_distinct_and_gone_once_added(node: Node, shim, conf):
    pod, before = added_pod(node, shim, conf(), count=3)
    names = transit_names(node, pod)
    assert len(set(names)) == 3 and all(n.startswith("ry") and len(n) <= 15 for n in names)
    assert set(links(pod.netns)) == {"net1", "net1-1", "net1-2"}
    assert not set(names) & (set(node.snapshot()) | set(links(pod.netns)))
    assert delete(shim, pod, conf()).code == 0
    assert node.snapshot() == before


@pytest.mark.parametrize("where", ["host", "pod"])
def test_del_finds_a_device_a_crash_left_under_its_transit_name(node: Node, shim, conf, where):
    """A crash after the rename but before the move (host), or after the move but before the
    final rename (pod): DEL puts everything back as it was."""
    pod, before = added_pod(node, shim, conf())
    transit = transit_names(node, pod)[1]
    sh("ip", "-n", pod.netns, "link", "set", "net1-1", "down")
    sh("ip", "-n", pod.netns, "link", "set", "net1-1", "name", transit)
    if where == "host":
        sh("ip", "-n", pod.netns, "link", "set", transit, "netns", node.host)
    assert delete(shim, pod, conf()).code == 0
    assert node.snapshot() == before
    assert links(pod.netns) == {}


def test_del_of_a_record_without_transit_names_still_restores_the_host(node: Node, shim, conf):
    """Records written before transit names existed decode and are undone."""
    pod, before = added_pod(node, shim, conf())
    path = record_path(node, pod)
    rec = json.loads(path.read_text())
    for d in rec["devices"]:
        del d["transit_names"], d["pod_index"], d["original_parent"], d["original_altnames"]
    path.write_text(json.dumps(rec))
    assert delete(shim, pod, conf()).code == 0
    assert node.snapshot() == before


def test_a_transit_name_taken_in_the_host_falls_back_and_still_restores(node: Node, shim, conf):
    pod, before = added_pod(node, shim, conf(), count=1)
    (transit,) = transit_names(node, pod)
    node.veth(transit, "ryblocker")  # something in the host now holds the transit name
    squatters = {n: v for n, v in node.snapshot().items() if n not in before}
    assert delete(shim, pod, conf()).code == 0
    assert node.snapshot() == {**before, **squatters}
    assert links(pod.netns) == {}


def test_an_original_name_taken_in_the_host_returns_the_device_under_its_pci_name(
        node: Node, shim, conf):
    nics = node.vfs(1)
    original = node.netdev_of(nics[0])
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    node.veth(original, "ryblocker")
    assert delete(shim, pod, conf()).code == 0
    host = node.snapshot()
    assert fallback_name(nics[0].pci_address) in host and original in host
    assert links(pod.netns) == {}


def test_a_transit_name_taken_in_the_pod_moves_nothing(node: Node, shim, conf, monkeypatch):
    """The kernel refuses a move whose name is taken without moving anything; ADD rolls the
    host rename back."""
    nics = node.vfs(2)
    before = node.snapshot()
    pod = node.pod(nics)
    monkeypatch.setattr(moves, "transit_name", lambda: "rytaken")
    sh("ip", "-n", pod.netns, "link", "add", "rytaken", "type", "veth", "peer", "name",
       "rytakenpeer")
    r = add(shim, pod, conf())
    assert r.error == 104 and "rytaken" in r.out["msg"], r.out
    assert "rolled back" in r.out["details"]
    assert node.snapshot() == before
    assert set(links(pod.netns)) == {"rytaken", "rytakenpeer"}
    assert not list((node.state_dir / "cni" / "attachments").rglob("*.json"))


def test_a_pod_name_held_as_an_altname_in_the_pod_is_refused_before_anything_moves(
        node: Node, shim, conf):
    nics = node.vfs(2)
    before = node.snapshot()
    pod = node.pod(nics)
    sh("ip", "-n", pod.netns, "link", "add", "ryalt", "type", "veth", "peer", "name", "ryaltp")
    sh("ip", "-n", pod.netns, "link", "property", "add", "dev", "ryalt", "altname", "net1-1")
    r = add(shim, pod, conf())
    assert r.error == 104 and "'net1-1'" in r.out["msg"], r.out
    assert r.out["details"] == "nothing was moved"
    assert node.snapshot() == before
    assert set(links(pod.netns)) == {"ryalt", "ryaltp"}
