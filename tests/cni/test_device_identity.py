"""Device identity where the kernel names no parent (veth stand-ins here; real VFs on kernels
without IFLA_PARENT_DEV_NAME): a pod that hides its VF and forges its ifindex, name and MAC on
a link of its own, or changes the VF's MAC, must not make DEL bring the wrong link home or
leave the VF stranded (issue 19, class 2; decision 0082).

Everything runs in throwaway namespaces from support.cni (names `ry` + random hex); the "pod"
acts with `ip -n <its namespace>`, and its nested namespace is one more throwaway.
"""

from __future__ import annotations

import json

import msgspec
import pytest

from railyard.cni.netns import Netns
from railyard.node.attachments import AttachmentRecord
from support.cni import (
    Node,
    Pod,
    add,
    delete,
    links,
    netns_add,
    record_path,
    run_shim,
    sh,
    unique,
)

pytestmark = pytest.mark.root


def detail(ns: str) -> dict[str, dict]:
    """name → `ip -j -d link` entry of every link in `ns`."""
    out = json.loads(sh("ip", "-j", "-d", "-n", ns, "link", "show").stdout or "[]")
    return {link["ifname"]: link for link in out}


def pods_link(ns: str) -> list[str]:
    """Links in `ns` whose other end lives in another namespace (a pod's veth pulled home
    shows one; the stand-in's own peer stays in the host, so a restored VF shows none)."""
    return [n for n, link in detail(ns).items() if "link_netnsid" in link]


def nested(node: Node) -> str:
    """A namespace the pod made for itself (unshare -n): throwaway, removed with the node."""
    ns = netns_add()
    node.namespaces.append(ns)
    return ns


def hide_vf_behind_an_impostor(node: Node, pod: Pod, peer_where: str) -> tuple[str, dict]:
    """The pod moves its VF into a namespace of its own, then makes a veth carrying the VF's
    ifindex, name and MAC — and, with its peer in that namespace, the VF's peer ifindex too
    (the pod reads it from `ip -d link`): everything about it a pod can see and choose."""
    vf = detail(pod.netns)["net1"]
    hideout = nested(node)
    sh("ip", "-n", pod.netns, "link", "set", "net1", "netns", hideout)
    peer = ["netns", hideout, "index", str(vf["link_index"])] if peer_where == "nested" else []
    sh("ip", "-n", pod.netns, "link", "add", "net1", "index", str(vf["ifindex"]), "address",
       vf["address"], "type", "veth", "peer", "name", unique("ryp"), *peer)
    sh("ip", "-n", pod.netns, "link", "set", "net1", "up")
    impostor = detail(pod.netns)["net1"]
    assert (impostor["ifindex"], impostor["address"]) == (vf["ifindex"], vf["address"])
    return hideout, vf


def record(node: Node, pod: Pod) -> dict:
    return json.loads(record_path(node, pod).read_text())


@pytest.mark.parametrize("peer_where", ["pod", "nested"])
def test_an_impostor_with_the_vfs_ifindex_name_and_mac_never_takes_its_name_in_the_host(
        node: Node, shim, conf, peer_where):
    """DEL refuses loudly and keeps the record; the impostor stays the pod's; once the pod
    puts the real VF back, a later DEL brings exactly it home."""
    nics = node.vfs(1)
    original = node.netdev_of(nics[0])
    sh("ip", "-n", node.host, "link", "set", original, "up")
    before = node.snapshot()
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    hideout, vf = hide_vf_behind_an_impostor(node, pod, peer_where)

    r = delete(shim, pod, conf())
    assert r.code != 0 and r.error == 104, r.out
    assert "not the device" in r.out["details"] or "found neither" in r.out["details"], r.out
    assert record_path(node, pod).exists(), "the record of a device still away must stay"
    assert original not in node.snapshot(), f"{original} in the host is the pod's impostor"
    assert set(node.snapshot()) == set(before) - {original}  # nothing of the pod's came in
    assert "net1" in links(pod.netns)  # the impostor is still the pod's

    # The pod gives up: the VF back in its namespace (the impostor gone, so the VF keeps its
    # ifindex), under a name of the pod's choosing.
    sh("ip", "-n", pod.netns, "link", "del", "net1")
    sh("ip", "-n", hideout, "link", "set", "net1", "name", "ryback", "netns", pod.netns)
    r = delete(shim, pod, conf())
    assert r.code == 0, r.out
    assert node.snapshot() == before
    assert detail(node.host)[original]["address"] == vf["address"]
    assert not pods_link(node.host)
    assert not record_path(node, pod).exists()
    assert links(pod.netns) == {}


def test_a_vf_back_in_the_pod_under_another_ifindex_is_found_and_the_impostor_left(
        node: Node, shim, conf):
    """The impostor keeps the VF's ifindex, so the VF comes back under a new one: DEL finds
    the VF by what the pod cannot forge and leaves the pod's own link where it is."""
    nics = node.vfs(1)
    before = node.snapshot()
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    hideout, vf = hide_vf_behind_an_impostor(node, pod, "nested")
    assert delete(shim, pod, conf()).error == 104
    sh("ip", "-n", hideout, "link", "set", "net1", "name", "ryback", "netns", pod.netns)
    assert detail(pod.netns)["ryback"]["ifindex"] != vf["ifindex"]
    r = delete(shim, pod, conf())
    assert r.code == 0, r.out
    assert node.snapshot() == before
    assert not pods_link(node.host)
    assert set(links(pod.netns)) == {"net1"}  # the impostor, still the pod's


def test_check_tells_the_impostor_from_the_vf(node: Node, shim, conf):
    """CHECK passes on the VF, and fails (code 102) on a link that took its ifindex, name and
    MAC; before, it went by the ifindex and passed."""
    nics = node.vfs(1)
    pod = node.pod(nics)
    r = add(shim, pod, conf())
    assert r.code == 0, r.out

    def check():
        return run_shim(shim, "CHECK", conf(prevResult=r.out), container_id=pod.container_id,
                        netns=pod.netns_path, args=pod.args())

    assert check().code == 0, check().out
    hide_vf_behind_an_impostor(node, pod, "nested")
    bad = check()
    assert bad.error == 102 and "is not" in bad.out["msg"], bad.out


def test_a_vf_whose_mac_the_pod_changed_comes_home_with_its_own(node: Node, shim, conf):
    """Before: the VF was pulled out of the pod, failed the MAC rule in the host, and stayed
    there under a transit name; every DEL failed while the pod lived, and once it was gone DEL
    answered success and forgot the record, the device still under the transit name."""
    nics = node.vfs(1)
    original = node.netdev_of(nics[0])
    before = node.snapshot()
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    sh("ip", "-n", pod.netns, "link", "set", "net1", "address", "02:00:00:00:be:ef")
    r = delete(shim, pod, conf())
    assert r.code == 0, r.out
    assert node.snapshot() == before
    assert detail(node.host)[original]["address"] == before[original]["mac"]
    assert not record_path(node, pod).exists()
    assert delete(shim, pod, conf()).code == 0


def test_a_device_under_a_transit_name_that_fails_its_identity_is_never_forgotten(
        node: Node, shim, conf):
    """An older record (no peer recorded: MAC only) whose VF the pod re-MACed, left in the
    host under its transit name by a DEL that stopped there: once the pod is gone, DEL must not
    answer success and forget the record while the device sits under that name."""
    nics = node.vfs(1)
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    rec = record(node, pod)
    for d in rec["devices"]:
        d.pop("peer_index", None)
        d.pop("bus_info", None)
    record_path(node, pod).write_text(json.dumps(rec))
    transit = rec["devices"][0]["transit_names"][-1]
    sh("ip", "-n", pod.netns, "link", "set", "net1", "down", "address", "02:00:00:00:be:ef",
       "name", transit)
    sh("ip", "-n", pod.netns, "link", "set", transit, "netns", node.host)
    sh("ip", "netns", "del", pod.netns)
    r = delete(shim, pod, conf())
    assert r.code != 0 and r.error == 104, r.out
    assert record_path(node, pod).exists()
    assert transit in node.snapshot()


def test_an_older_records_vf_with_a_new_mac_goes_back_to_the_pod_and_del_fails(
        node: Node, shim, conf):
    """A record from before the identity fields knows the VF by ifindex in the pod and MAC in
    the host. Its re-MACed VF, pulled out, fails the check there: it goes back to the pod (under
    a name the pod has not seen), DEL fails and keeps the record; once the pod puts the MAC
    back, a later DEL brings it home."""
    nics = node.vfs(1)
    before = node.snapshot()
    original = node.netdev_of(nics[0])
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    rec = record(node, pod)
    for d in rec["devices"]:
        d.pop("peer_index", None)
        d.pop("bus_info", None)
    record_path(node, pod).write_text(json.dumps(rec))
    vf_mac = links(pod.netns)["net1"]["mac"]
    sh("ip", "-n", pod.netns, "link", "set", "net1", "address", "02:00:00:00:be:ef")
    r = delete(shim, pod, conf())
    assert r.error == 104 and "not the device ADD moved" in r.out["details"], r.out
    assert "back in the pod" in r.out["details"], r.out
    assert set(node.snapshot()) == set(before) - {original}  # not under a transit name
    assert record_path(node, pod).exists()
    (name,) = links(pod.netns)
    sh("ip", "-n", pod.netns, "link", "set", name, "address", vf_mac)
    r = delete(shim, pod, conf())
    assert r.code == 0, r.out
    assert node.snapshot() == before
    assert not record_path(node, pod).exists()


def test_a_device_recorded_by_its_pci_bus_info_is_never_matched_by_a_link_without_it(
        node: Node, shim, conf):
    """A parentless real VF is known by the PCI address ethtool reports (bus_info); no link a
    pod can make reports one. The stand-in here is a veth (bus_info empty): recorded as if it
    were that VF, nothing in the pod matches it, so DEL refuses and moves nothing."""
    nics = node.vfs(1)
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    rec = record(node, pod)
    rec["devices"][0]["bus_info"] = nics[0].pci_address
    record_path(node, pod).write_text(json.dumps(rec))
    host = node.snapshot()
    r = delete(shim, pod, conf())
    assert r.code != 0 and r.error == 104, r.out
    assert node.snapshot() == host
    assert "net1" in links(pod.netns)
    assert record_path(node, pod).exists()


def test_add_records_the_stand_ins_peer_and_no_bus_info(node: Node, shim, conf):
    nics = node.vfs(1)
    original = node.netdev_of(nics[0])
    host = detail(node.host)
    peer = host[host[original]["link"]]["ifindex"]  # `link`: the peer's name, same namespace
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    (d,) = record(node, pod)["devices"]
    assert (d["peer_index"], d.get("bus_info")) == (peer, None)


def test_a_record_written_before_the_identity_fields_still_reads(tmp_path):
    old = {"network": "rdma", "container_id": "c1", "ifname": "net1", "netns": "/x",
           "netns_id": None, "pod_uid": None, "pod_namespace": None, "pod_name": None,
           "devices": [{"pci": "0000:3b:00.2", "kind": "vf", "ifname": "net1",
                        "original_name": "ens1f0v0", "original_mac": "02:00:00:00:00:01",
                        "original_mtu": 1500, "original_up": True}]}
    rec = msgspec.json.decode(json.dumps(old), type=AttachmentRecord)
    assert (rec.devices[0].bus_info, rec.devices[0].peer_index) == (None, None)


def test_bus_info_of_a_veth_is_empty_and_of_a_missing_link_none(node: Node):
    a, _ = node.veth()
    with Netns.open(node.host_path) as ns, ns.links() as host:
        link = host.get(a)
        assert link is not None
        assert host.bus_info(link) == ""
        sh("ip", "-n", node.host, "link", "del", a)
        assert host.bus_info(link) is None
