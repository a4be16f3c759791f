"""ADD, DEL, CHECK, GC and STATUS in real network namespaces, called through the shim as a
runtime calls a plugin, with Debian's IPAM plugins (/usr/lib/cni)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from support.cni import Node, addresses, links, run_shim, sh

pytestmark = pytest.mark.root


def static(*cidrs: str, gateway: str | None = None) -> dict:
    addrs = [{"address": c, **({"gateway": gateway} if gateway else {})} for c in cidrs]
    return {"type": "static", "addresses": addrs}


def host_local(tmp: Path, subnet: str = "10.66.0.0/24") -> dict:
    return {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": str(tmp / "ipam")}


def add(shim, pod, conf, ifname="net1", **kw):
    return run_shim(shim, "ADD", conf, container_id=pod.container_id, netns=pod.netns_path,
                    ifname=ifname, args=pod.args(), **kw)


def delete(shim, pod, conf, ifname="net1", **kw):
    return run_shim(shim, "DEL", conf, container_id=pod.container_id, netns=pod.netns_path,
                    ifname=ifname, args=pod.args(), **kw)


def test_add_moves_each_granted_vf_into_the_pod_named_by_pair_order(node: Node, shim, conf,
                                                                    tmp_path):
    nics = node.vfs(3)
    before = node.snapshot()
    macs = [before[node.netdev_of(n)]["mac"] for n in nics]
    pod = node.pod(nics)
    r = add(shim, pod, conf(cniVersion="1.1.0", ipam=host_local(tmp_path)))
    assert r.code == 0, r.out
    inside = links(pod.netns)
    assert [inside[n]["mac"] for n in ("net1", "net1-1", "net1-2")] == macs
    assert all(inside[n]["up"] for n in ("net1", "net1-1", "net1-2"))
    assert not any(node.netdev_of(n) in node.snapshot() for n in nics)
    assert [i["name"] for i in r.out["interfaces"]] == ["net1", "net1-1", "net1-2"]
    assert [i["pciID"] for i in r.out["interfaces"]] == [n.pci_address for n in nics]
    assert all(i["sandbox"] == pod.netns_path for i in r.out["interfaces"])
    assert [ip["interface"] for ip in r.out["ips"]] == [0, 1, 2]
    for ip, name in zip(r.out["ips"], ("net1", "net1-1", "net1-2"), strict=True):
        assert addresses(pod.netns, name) == [ip["address"]]


def test_results_for_older_versions_leave_out_fields_added_in_1_1(node: Node, shim, conf):
    (nic,) = node.vfs(1)
    for version in ("0.4.0", "1.0.0"):
        pod = node.pod([nic])
        r = add(shim, pod, conf(cniVersion=version, ipam=static("10.9.0.2/24")))
        assert r.code == 0, r.out
        assert r.out["cniVersion"] == version
        assert "pciID" not in r.out["interfaces"][0] and "mtu" not in r.out["interfaces"][0]
        assert ("version" in r.out["ips"][0]) == (version == "0.4.0")
        assert delete(shim, pod, conf(cniVersion=version, ipam=static("10.9.0.2/24"))).code == 0


def test_add_del_add_leaves_the_host_exactly_as_it_was(node: Node, shim, conf, tmp_path):
    nics = node.vfs(2)
    node.veth("ryhosta", "ryhostb")  # bystanders that must not change
    before = node.snapshot()
    pod = node.pod(nics)
    c = conf(mtu=1400, mac="02:00:00:aa:bb:01", ipam=host_local(tmp_path))
    for _ in range(2):
        r = add(shim, pod, c)
        assert r.code == 0, r.out
        inside = links(pod.netns)
        assert inside["net1"]["mtu"] == 1400 and inside["net1-1"]["mtu"] == 1400
        assert inside["net1"]["mac"] == "02:00:00:aa:bb:01"
        assert delete(shim, pod, c).code == 0
        assert node.snapshot() == before
        assert links(pod.netns) == {}
    # host-local keeps one file per lease: none is left.
    assert set(os.listdir(tmp_path / "ipam" / "rdma")) <= {"lock", "last_reserved_ip.0"}


def test_two_pods_ping_each_other_over_the_two_ends_of_one_veth(node: Node, shim, conf):
    a, b = node.veth()
    from support.cni import vf_ref

    nic_a, nic_b = vf_ref(0, 0), vf_ref(1, 0)
    node.point(nic_a, a)
    node.point(nic_b, b)
    pod_a, pod_b = node.pod([nic_a]), node.pod([nic_b])
    assert add(shim, pod_a, conf(ipam=static("10.77.0.1/24"))).code == 0
    assert add(shim, pod_b, conf(ipam=static("10.77.0.2/24"))).code == 0
    ping = sh("ip", "netns", "exec", pod_a.netns, "busybox", "ping", "-c", "1", "-W", "2",
              "10.77.0.2", check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert "1 packets received" in ping.stdout


def test_del_is_idempotent_and_succeeds_without_a_record_or_a_netns(node: Node, shim, conf):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    c = conf(ipam=static("10.9.0.2/24"))
    assert add(shim, pod, c).code == 0
    assert delete(shim, pod, c).code == 0
    assert delete(shim, pod, c).code == 0
    stranger = run_shim(shim, "DEL", c, container_id="never-added", netns="", ifname="net1")
    assert stranger.code == 0 and stranger.out is None
    # The pod's namespace dies first (its veth with it): DEL still succeeds and forgets it.
    assert add(shim, pod, c).code == 0
    sh("ip", "netns", "del", pod.netns)
    assert delete(shim, pod, c).code == 0
    assert delete(shim, pod, c).code == 0
    assert not list((node.state_dir / "cni" / "attachments").rglob("*.json"))


def test_a_pod_without_grants_passes_the_chain_through_untouched(node: Node, shim, conf):
    node.vfs(1)
    pod = node.pod([])
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": pod.netns_path}],
            "ips": [{"address": "10.1.0.5/24", "interface": 0}], "dns": {}}
    r = add(shim, pod, conf(prevResult=prev), ifname="eth0")
    assert r.code == 0, r.out
    assert r.out["interfaces"] == prev["interfaces"] and r.out["ips"] == prev["ips"]


def test_chained_after_a_primary_plugin_appends_its_interfaces_and_ips(node: Node, shim, conf):
    nics = node.vfs(2)
    pod = node.pod(nics)
    prev = {"cniVersion": "1.0.0",
            "interfaces": [{"name": "veth1", "mac": "aa:bb:cc:dd:ee:ff"},
                           {"name": "eth0", "sandbox": pod.netns_path}],
            "ips": [{"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 1}],
            "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.0.0.10"]}}
    c = conf(prevResult=prev, ifname="rdma", interfaces=[
        {"ipam": static("10.88.0.2/24")}, {"ipam": static("10.88.1.2/24")}])
    r = add(shim, pod, c, ifname="eth0")
    assert r.code == 0, r.out
    assert [i["name"] for i in r.out["interfaces"]] == ["veth1", "eth0", "rdma", "rdma-1"]
    assert [(ip["address"], ip["interface"]) for ip in r.out["ips"]] == [
        ("10.1.0.5/24", 1), ("10.88.0.2/24", 2), ("10.88.1.2/24", 3)]
    assert r.out["dns"] == prev["dns"] and r.out["routes"] == prev["routes"]
    assert set(links(pod.netns)) == {"rdma", "rdma-1"}
    # Without "ifname", the chain's eth0 would clash: refused before anything moves.
    pod2 = node.pod(node.vfs(1, first_pf=2))
    r2 = add(shim, pod2, conf(prevResult=prev), ifname="eth0")
    assert r2.error == 7 and "eth0" in r2.out["msg"]


def test_check_passes_after_add_and_fails_once_an_interface_is_down(node: Node, shim, conf):
    nics = node.vfs(2)
    pod = node.pod(nics)
    c = conf(ipam=static("10.9.0.2/24"))
    r = add(shim, pod, c)
    assert r.code == 0
    ok = run_shim(shim, "CHECK", conf(ipam=static("10.9.0.2/24"), prevResult=r.out),
                  container_id=pod.container_id, netns=pod.netns_path, args=pod.args())
    assert ok.code == 0, ok.out
    sh("ip", "-n", pod.netns, "link", "set", "net1-1", "down")
    bad = run_shim(shim, "CHECK", conf(ipam=static("10.9.0.2/24"), prevResult=r.out),
                   container_id=pod.container_id, netns=pod.netns_path, args=pod.args())
    assert bad.error == 102 and "net1-1" in bad.out["msg"]


def test_gc_removes_attachments_missing_from_valid_attachments(node: Node, shim, conf):
    keep_nics, drop_nics = node.vfs(1), node.vfs(1, first_pf=1)
    before = node.snapshot()
    keep, drop = node.pod(keep_nics), node.pod(drop_nics)
    for p in (keep, drop):
        assert add(shim, p, conf(ipam=static("10.9.0.2/24"))).code == 0
    gc = run_shim(shim, "GC", conf(cniVersion="1.1.0", ipam=static("10.9.0.2/24"), **{
        "cni.dev/valid-attachments": [{"containerID": keep.container_id, "ifname": "net1"}]}))
    assert gc.code == 0, gc.out
    assert set(links(keep.netns)) == {"net1"}
    assert links(drop.netns) == {}
    assert node.snapshot() == {k: v for k, v in before.items()
                               if k != node.netdev_of(keep_nics[0])}


def test_status_answers_ready_for_1_1_and_refuses_older_configs(node: Node, shim, conf):
    assert run_shim(shim, "STATUS", conf(cniVersion="1.1.0", ipam=static("10.9.0.2/24"))).code == 0
    r = run_shim(shim, "STATUS", conf(cniVersion="1.0.0"))
    assert r.error == 1


def test_version_lists_the_three_spoken_versions(shim):
    r = run_shim(shim, "VERSION", {"cniVersion": "1.0.0"})
    assert r.code == 0
    assert r.out == {"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]}


def test_device_info_file_names_each_vf_and_goes_away_on_del(node: Node, shim, conf):
    nics = node.vfs(2)
    pod = node.pod(nics)
    multus_path = node.devinfo / "default-rdma_abc_net1"
    outside = node.root / "elsewhere.json"
    c = conf(runtimeConfig={"CNIDeviceInfoFile": str(multus_path)})
    assert add(shim, pod, c).code == 0
    first = json.loads(multus_path.read_text())
    assert first == {"type": "pci", "version": "1.1.0",
                     "pci": {"pci-address": nics[0].pci_address,
                             "rdma-device": nics[0].rdma_device}}
    second = node.devinfo / f"rdma-{pod.container_id}-net1-1-device-info.json"
    assert json.loads(second.read_text())["pci"]["pci-address"] == nics[1].pci_address
    assert delete(shim, pod, c).code == 0
    assert not multus_path.exists() and not second.exists()
    # A path outside the device-info folder is never written to.
    pod2 = node.pod(node.vfs(1, first_pf=3))
    assert add(shim, pod2, conf(runtimeConfig={"CNIDeviceInfoFile": str(outside)})).code == 0
    assert not outside.exists()


def test_concurrent_adds_for_different_pods_all_succeed(node: Node, shim, conf):
    pods = [node.pod(node.vfs(1, first_pf=i)) for i in range(4)]
    results = {}

    def go(i, p):
        results[i] = add(shim, p, conf(ipam=static(f"10.9.{i}.2/24")))

    threads = [threading.Thread(target=go, args=(i, p)) for i, p in enumerate(pods)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.code == 0 for r in results.values()), results
    assert all(set(links(p.netns)) == {"net1"} for p in pods)


def test_shim_reports_try_again_when_the_service_is_unreachable(shim, tmp_path):
    c = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni",
         "agentSocket": str(tmp_path / "nobody.sock")}
    r = run_shim(shim, "ADD", c, container_id="c1", netns="/run/netns/x", ifname="net1")
    assert r.code != 0 and r.error == 11 and r.out["cniVersion"] == "1.0.0"


def test_shim_is_stdlib_only(shim):
    p = subprocess.run([str(shim)], input=b"{}", env={"CNI_COMMAND": "VERSION"},
                       capture_output=True, check=True)
    assert json.loads(p.stdout)["supportedVersions"]
    src = (shim.parent / ".railyard-cni" / "railyard_cni_shim.py").read_text()
    imports = {line.split()[1].split(".")[0] for line in src.splitlines()
               if line.startswith(("import ", "from "))}
    assert imports <= {"os", "_socket", "sys", "time", "json", "site", "railyard"}


def test_a_second_add_of_the_same_attachment_is_refused_and_changes_nothing(node: Node, shim,
                                                                           conf):
    nics = node.vfs(1)
    pod = node.pod(nics)
    assert add(shim, pod, conf()).code == 0
    inside = links(pod.netns)
    again = add(shim, pod, conf())
    assert again.error == 103 and pod.container_id in again.out["msg"]
    assert links(pod.netns) == inside
