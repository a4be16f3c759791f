"""What a pod (or bad luck) can do to its devices and namespace before DEL — squat names,
rename its VF away and put an impostor in its place, add altnames — and what DEL must still
do: bring exactly the granted device home, never a link of the pod's own.

Everything runs in throwaway namespaces from support.cni (names `ry` + random hex).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from railyard.cni import moves
from railyard.cni.restore import fallback_name
from support.cni import (
    Node,
    add,
    delete,
    links,
    record_path,
    sh,
    transit_names,
    unique,
)

pytestmark = pytest.mark.root


def link_json(ns: str) -> dict[str, dict]:
    out = json.loads(sh("ip", "-j", "-d", "-n", ns, "link", "show").stdout or "[]")
    return {link["ifname"]: link for link in out}


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("with_vf_mac", [False, True])
def test_a_pod_that_squats_its_transit_name_cannot_push_its_own_link_into_the_host(
        node: Node, shim, conf, with_vf_mac):
    """A process in the pod's namespace sees the device arrive under its transit name (an ADD
    into a running pod, e.g. Multus dynamic networks; or the kernel's "renamed from" log line).
    Before DEL it creates a link under that name. DEL's rename in the pod then fails with
    EEXIST, and _leave_pod's fallback `need(pod, d.transit_name)` takes the *pod's* link (no
    owns() check), renames it and moves it into the host namespace. Given the VF's MAC as well,
    owns() then accepts it in the host: it is renamed to the VF's original name and brought up,
    DEL answers success and forgets the record, and the real VF stays in the pod."""
    nics = node.vfs(1)
    sh("ip", "-n", node.host, "link", "set", node.netdev_of(nics[0]), "up")
    before = node.snapshot()
    pod = node.pod(nics)
    # The pod watches its own namespace while the device arrives.
    mon = subprocess.Popen(["ip", "-n", pod.netns, "monitor", "link"], stdout=subprocess.PIPE,
                           text=True)
    try:
        time.sleep(0.3)
        assert add(shim, pod, conf()).code == 0
        time.sleep(0.3)
    finally:
        mon.terminate()
    seen = mon.communicate(timeout=5)[0]
    (transit,) = transit_names(node, pod)
    assert transit in seen  # the pod learns the transit name from netlink alone
    # The pod's own veth pair, one end under the transit name.
    mac = ["address", links(pod.netns)["net1"]["mac"]] if with_vf_mac else []
    sh("ip", "-n", pod.netns, "link", "add", transit, *mac, "type", "veth", "peer", "name",
       "rypodpeer")
    r = delete(shim, pod, conf())
    intruders = set(node.snapshot()) - set(before)
    assert not intruders, (f"pod-created link(s) {intruders} now live in the host namespace "
                           f"(DEL answered {r.code}: {r.out})")
    crossed = [n for n, link in link_json(node.host).items() if "link_netnsid" in link]
    assert not crossed, (f"host links {crossed} are veths whose peer is in another namespace: "
                         f"the pod's link took the VF's name (DEL answered {r.code}), "
                         f"pod now holds {sorted(links(pod.netns))}")


def test_an_altname_the_pod_gave_its_vf_cannot_block_its_return(node: Node, shim, conf):
    """Altnames must be free in the target of a move too. A pod that names its VF after a
    host link (by altname) would make every move home fail with EEXIST: DEL drops the names
    the device did not have before it leaves."""
    nics = node.vfs(1)
    before = node.snapshot()
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    blocker = unique("ryh")
    node.veth(blocker, unique("ryh"))
    blockers = {n: v for n, v in node.snapshot().items() if n not in before}
    sh("ip", "-n", pod.netns, "link", "property", "add", "dev", "net1", "altname", blocker)
    r = delete(shim, pod, conf())
    assert r.code == 0, r.out
    assert node.snapshot() == {**before, **blockers}
    assert links(pod.netns) == {}


def test_a_del_retry_finds_a_device_left_in_the_pod_when_both_names_were_taken(
        node: Node, shim, conf, monkeypatch):
    """The host holds both this attempt's transit name and the PCI-derived fallback for a
    moment: DEL fails with the device still in the pod (under the fallback name); once the
    squatters go, a retry finds it there by identity and brings it home."""
    from railyard.cni import restore

    nics = node.vfs(1)
    before = node.snapshot()
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    squat = unique("ryq")
    node.veth(squat, fallback_name(nics[0].pci_address))
    monkeypatch.setattr(restore, "transit_name", lambda: squat)
    first = delete(shim, pod, conf())
    assert first.code != 0 and "File exists" in first.out["details"], first.out
    assert fallback_name(nics[0].pci_address) in links(pod.netns)
    sh("ip", "-n", node.host, "link", "del", squat)
    monkeypatch.undo()
    retry = delete(shim, pod, conf())
    assert retry.code == 0, retry.out
    assert node.snapshot() == before
    assert links(pod.netns) == {}


# --------------------------------------------------------------------------- identity, concurrency


def test_an_impostor_with_the_recorded_mac_is_not_moved_into_the_host(node: Node, shim, conf):
    """owns() takes any parentless link carrying the recorded MAC. A pod renames its VF away
    and creates a veth under the pod name with the VF's MAC: DEL moves the pod's veth into the
    host, renames it to the VF's original name and brings it up; the VF stays in the pod and
    DEL reports success. (A real VF has a parent; the pod's veth/macvlan never does, so the
    record should require a parent whenever the original had one.)"""
    nics = node.vfs(1)
    original = node.netdev_of(nics[0])
    sh("ip", "-n", node.host, "link", "set", original, "up")
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    vf_mac = links(pod.netns)["net1"]["mac"]
    sh("ip", "-n", pod.netns, "link", "set", "net1", "down")
    sh("ip", "-n", pod.netns, "link", "set", "net1", "name", "ryhidden")
    sh("ip", "-n", pod.netns, "link", "add", "net1", "address", vf_mac, "type", "veth",
       "peer", "name", "rypodpeer")
    r = delete(shim, pod, conf())
    host = link_json(node.host)
    assert "ryhidden" not in links(pod.netns), f"the VF is still in the pod (DEL: {r.code})"
    assert "link_netnsid" not in host.get(original, {}), \
        f"the host's {original} is the pod's veth (its peer is in the pod)"


def test_a_pods_altname_on_its_vf_does_not_follow_it_into_the_host(node: Node, shim, conf):
    """Altnames travel with a device between namespaces and RTM_GETLINK by IFLA_IFNAME
    resolves them. A pod may add any free name as an altname of its VF; after DEL the host's
    VF answers to that name (e.g. the original name of another pod's VF, whose own DEL then
    finds its name taken)."""
    nics = node.vfs(1)
    original = node.netdev_of(nics[0])
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    chosen = unique("rypa")
    sh("ip", "-n", pod.netns, "link", "property", "add", "dev", "net1", "altname", chosen)
    assert delete(shim, pod, conf()).code == 0
    host = link_json(node.host)
    assert chosen not in (host[original].get("altnames") or []), \
        f"the host's {original} now also answers to the pod-chosen name {chosen}"


def _lease_ipam(folder: Path, leases: Path) -> str:
    """An IPAM plugin outside NETNS_FREE_IPAM (so it starts after the moves) that keeps one
    file per lease: ADD creates it, DEL removes it."""
    folder.mkdir(parents=True, exist_ok=True)
    leases.mkdir(parents=True, exist_ok=True)
    exe = folder / "lease-ipam"
    exe.write_text(
        "#!/bin/sh\n"
        "cat >/dev/null\n"
        "case \"$CNI_COMMAND\" in\n"
        "VERSION) echo '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"1.0.0\"]}';;\n"
        f"ADD) touch {leases}/$CNI_CONTAINERID-$CNI_IFNAME;"
        " echo '{\"cniVersion\":\"1.0.0\",\"ips\":[]}';;\n"
        f"DEL) rm -f {leases}/$CNI_CONTAINERID-$CNI_IFNAME;;\n"
        "esac\n")
    exe.chmod(0o755)
    return f"{folder}:/usr/lib/cni"


def test_a_del_that_waited_for_a_running_add_releases_what_the_add_took(
        node: Node, shim, conf, tmp_path, monkeypatch):
    """_del loads the record before taking the device locks. A DEL sent while ADD runs (a
    runtime whose ADD timed out: the service carries on) waits on the locks holding the record
    as it was mid-ADD (ipam_started False, no device-info paths), then undoes from that stale
    copy and removes the record: the IPAM lease and the device-info file are never released."""
    nics = node.vfs(1)
    pod = node.pod(nics)
    leases = tmp_path / "leases"
    path = _lease_ipam(tmp_path / "bin", leases)
    c = conf(ipam={"type": "lease-ipam"})
    real = moves.move_in

    def slow_move_in(*a, **kw):
        time.sleep(1.5)  # a slow kernel move: widens the window the race needs
        return real(*a, **kw)

    monkeypatch.setattr(moves, "move_in", slow_move_in)
    results = {}
    t = threading.Thread(target=lambda: results.setdefault("add", add(shim, pod, c, path=path)))
    t.start()
    deadline = time.monotonic() + 10
    while not record_path(node, pod).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert record_path(node, pod).exists()
    d = delete(shim, pod, c, path=path)  # loads the mid-ADD record, then waits for the lock
    t.join()
    assert results["add"].code == 0, results["add"].out
    assert d.code == 0, d.out
    assert not record_path(node, pod).exists()
    assert links(pod.netns) == {}  # the devices did come back
    left = {"leases": sorted(p.name for p in leases.iterdir()),
            "device-info": sorted(p.name for p in node.devinfo.glob("*.json"))}
    assert left == {"leases": [], "device-info": []}, f"never released: {left}"
