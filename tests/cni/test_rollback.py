"""Failures mid-ADD roll back completely; a crash mid-ADD is undone by the DEL that follows;
RDMA devices follow their netdevs in exclusive mode (recording double: no RDMA here)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from railyard.cni.netns import Netns
from support.cni import Node, links, run_shim, sh, standalone_env

pytestmark = pytest.mark.root

VERSION_REPLY = '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}'


def fake_ipam(folder: Path, name: str, on_add: str) -> str:
    """A shell IPAM plugin: answers VERSION, runs `on_add` for ADD, succeeds otherwise."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n"
                    f"if [ \"$CNI_COMMAND\" = VERSION ]; then echo '{VERSION_REPLY}'; exit 0; fi\n"
                    f"if [ \"$CNI_COMMAND\" = ADD ]; then {on_add}; fi\n"
                    "exit 0\n")
    path.chmod(0o755)
    return f"{folder}:/usr/lib/cni"


def host_local(tmp: Path) -> dict:
    return {"type": "host-local", "ranges": [[{"subnet": "10.66.0.0/24"}]],
            "dataDir": str(tmp / "ipam")}


def leases(tmp: Path) -> set[str]:
    folder = tmp / "ipam" / "rdma"
    return set(os.listdir(folder)) - {"lock", "last_reserved_ip.0"} if folder.exists() else set()


def records(node: Node) -> list[Path]:
    return list((node.state_dir / "cni" / "attachments").rglob("*.json"))


def test_ipam_failure_on_one_interface_rolls_back_every_device_and_lease(node: Node, shim, conf,
                                                                        tmp_path):
    nics = node.vfs(3)
    before = node.snapshot()
    pod = node.pod(nics)
    path = fake_ipam(tmp_path / "bin", "broken-ipam",
                     "echo '{\"cniVersion\":\"1.0.0\",\"code\":107,\"msg\":\"pool exhausted\"}'; "
                     "exit 1")
    c = conf(interfaces=[{"ipam": host_local(tmp_path)}, {"ipam": {"type": "broken-ipam"}},
                         {"ipam": host_local(tmp_path)}])
    r = run_shim(shim, "ADD", c, container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args(), path=path)
    assert r.error == 107 and "pool exhausted" in r.out["msg"]
    assert "rolled back" in r.out["details"]
    assert node.snapshot() == before
    assert links(pod.netns) == {}
    assert leases(tmp_path) == set()
    assert records(node) == []
    assert os.listdir(node.state_dir / "cni" / "in-use") == []


def test_name_clash_inside_the_pod_leaves_nothing_half_moved(node: Node, shim, conf):
    nics = node.vfs(2)
    before = node.snapshot()
    pod = node.pod(nics)
    sh("ip", "-n", pod.netns, "link", "add", "net1-1", "type", "veth", "peer", "name", "ryclash")
    r = run_shim(shim, "ADD", conf(), container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args())
    assert r.error == 104 and "net1-1" in r.out["msg"]
    assert node.snapshot() == before
    assert set(links(pod.netns)) == {"net1-1", "ryclash"}
    assert records(node) == []


def test_a_crash_between_move_and_ipam_is_undone_by_the_following_del(node: Node, shim,
                                                                      tmp_path):
    """Standalone mode: the plugin process itself is killed while IPAM runs."""
    nics = node.vfs(2)
    before = node.snapshot()
    pod = node.pod(nics)
    path = fake_ipam(tmp_path / "bin", "killer-ipam", "kill -9 $PPID; sleep 5")
    c = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni", "standalone": True,
         "stateDir": str(node.state_dir), "ipam": {"type": "killer-ipam"}}
    env = standalone_env(node)
    r = run_shim(shim, "ADD", c, container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args(), path=path, extra_env=env)
    assert r.code == -9
    assert set(links(pod.netns)) == {"net1", "net1-1"}  # moved, never configured
    (rec,) = records(node)
    assert json.loads(rec.read_text())["state"] == "adding"
    d = run_shim(shim, "DEL", c, container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args(), path=path, extra_env=env)
    assert d.code == 0, d.out
    assert node.snapshot() == before
    assert links(pod.netns) == {}
    assert records(node) == []


def test_standalone_mode_adds_and_deletes_without_an_agent(node: Node, shim):
    nics = node.vfs(1)
    before = node.snapshot()
    pod = node.pod(nics)
    c = {"cniVersion": "1.1.0", "name": "rdma", "type": "railyard-cni", "standalone": True,
         "stateDir": str(node.state_dir),
         "ipam": {"type": "static", "addresses": [{"address": "10.5.0.2/24"}]}}
    env = standalone_env(node)
    r = run_shim(shim, "ADD", c, container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args(), extra_env=env)
    assert r.code == 0, r.out
    assert r.out["interfaces"][0]["pciID"] == nics[0].pci_address
    assert run_shim(shim, "DEL", c, container_id=pod.container_id, netns=pod.netns_path,
                    args=pod.args(), extra_env=env).code == 0
    assert node.snapshot() == before



def test_exclusive_mode_moves_rdma_devices_before_netdevs_and_back_on_del(node: Node, shim,
                                                                         exclusive):
    rdma, sock = exclusive
    nics = node.vfs(2)
    with Netns.open(node.host_path) as host:
        for n in nics:
            rdma.place(n.rdma_device, host)
        host_id = host.identity()
    pod = node.pod(nics)
    c = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni", "agentSocket": sock}
    r = run_shim(shim, "ADD", c, container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args())
    assert r.code == 0, r.out
    with Netns.open(pod.netns_path) as p:
        assert all(rdma.where[n.rdma_device] == p.identity() for n in nics)
    for n, (dev, _src, dst, host_links) in zip(nics, rdma.moves, strict=True):
        assert dev == n.rdma_device and dst == pod.netns_path
        assert node.netdev_of(n) in host_links  # the netdev had not moved yet
    assert run_shim(shim, "DEL", c, container_id=pod.container_id, netns=pod.netns_path,
                    args=pod.args()).code == 0
    assert all(rdma.where[n.rdma_device] == host_id for n in nics)


def test_exclusive_mode_failure_to_move_an_rdma_device_moves_nothing(node: Node, shim,
                                                                    exclusive):
    rdma, sock = exclusive
    nics = node.vfs(2)
    with Netns.open(node.host_path) as host:
        rdma.place(nics[0].rdma_device, host)  # the second is "elsewhere"
        host_id = host.identity()
    before = node.snapshot()
    pod = node.pod(nics)
    c = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni", "agentSocket": sock}
    r = run_shim(shim, "ADD", c, container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args())
    assert r.error == 104 and nics[1].rdma_device in r.out["msg"]
    assert node.snapshot() == before
    assert rdma.where[nics[0].rdma_device] == host_id
    assert links(pod.netns) == {}


def test_exclusive_mode_never_moves_an_rdma_device_named_only_by_the_record(
        node: Node, shim, exclusive):
    """A record (seeded from a pod's own annotation) naming another function's RDMA device
    must not bring that device into the pod: sysfs, not the record, names it."""
    rdma, sock = exclusive
    mine, victim = node.vfs(2)
    with Netns.open(node.host_path) as host:
        rdma.place(mine.rdma_device, host)
        rdma.place(victim.rdma_device, host)
        host_id = host.identity()
    # Say `mine` has no RDMA device of its own (an Ethernet-only VF, or its driver unbound).
    os.rmdir(node.sysfs / "sys/bus/pci/devices" / mine.pci_address / "infiniband" /
             mine.rdma_device)
    forged = dataclasses.replace(mine, rdma_device=victim.rdma_device)
    pod = node.pod([forged])
    c = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni", "agentSocket": sock}
    r = run_shim(shim, "ADD", c, container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args())
    assert r.code == 0, r.out
    assert rdma.where[victim.rdma_device] == host_id
    assert rdma.moves == []
