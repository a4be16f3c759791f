"""IPAM delegation: each interface's IPAM plugin is called at a version its VERSION lists, with
that interface's name; DEL and CHECK are forwarded, GC and STATUS only to 1.1 speakers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cni import Node, links, run_shim

pytestmark = pytest.mark.root


def recording_ipam(folder: Path, name: str, versions: list[str], log: Path) -> str:
    """An IPAM plugin that logs (command, cniVersion, CNI_IFNAME) and hands out 10.44.0.x."""
    folder.mkdir(parents=True, exist_ok=True)
    listed = json.dumps({"cniVersion": versions[-1], "supportedVersions": versions})
    (folder / name).write_text(f"""#!/bin/sh
conf=$(cat)
v=$(printf '%s' "$conf" | sed -n 's/.*"cniVersion": *"\\([^"]*\\)".*/\\1/p')
echo "$CNI_COMMAND $v $CNI_IFNAME" >> {log}
case "$CNI_COMMAND" in
  VERSION) echo '{listed}' ;;
  ADD) n=$(grep -c ADD {log})
       printf '{{"cniVersion": "%s", "ips": [{{"address": "10.44.0.%s/24"}}]}}' "$v" "$n" ;;
esac
exit 0
""")
    (folder / name).chmod(0o755)
    return f"{folder}:/usr/lib/cni"


def calls(log: Path) -> list[tuple[str, str, str]]:
    return [tuple(line.split(" ", 2)) for line in log.read_text().splitlines()
            if not line.startswith("VERSION")]


def test_ipam_is_called_per_interface_at_the_newest_version_it_lists(node: Node, shim, conf,
                                                                    tmp_path):
    log = tmp_path / "ipam.log"
    path = recording_ipam(tmp_path / "bin", "rec-ipam", ["0.3.1", "0.4.0"], log)
    pod = node.pod(node.vfs(3))
    c = conf(cniVersion="1.1.0", ipam={"type": "rec-ipam"})
    kw = {"container_id": pod.container_id, "netns": pod.netns_path, "args": pod.args(),
          "path": path}
    r = run_shim(shim, "ADD", c, **kw)
    assert r.code == 0, r.out
    assert sorted(calls(log)) == [("ADD", "0.4.0", n) for n in ("net1", "net1-1", "net1-2")]
    assert [ip["address"] for ip in r.out["ips"]] and r.out["cniVersion"] == "1.1.0"
    assert run_shim(shim, "CHECK", {**c, "prevResult": r.out}, **kw).code == 0
    assert run_shim(shim, "DEL", c, **kw).code == 0
    got = calls(log)
    assert sorted(x for x in got if x[0] == "CHECK") == [
        ("CHECK", "0.4.0", n) for n in ("net1", "net1-1", "net1-2")]
    assert sorted(x for x in got if x[0] == "DEL") == [
        ("DEL", "0.4.0", n) for n in ("net1", "net1-1", "net1-2")]


@pytest.mark.parametrize("versions, forwarded", [(["0.4.0", "1.0.0"], False),
                                                 (["1.0.0", "1.1.0"], True)])
def test_gc_and_status_reach_only_ipam_plugins_that_speak_1_1(node: Node, shim, conf, tmp_path,
                                                             versions, forwarded):
    log = tmp_path / "ipam.log"
    path = recording_ipam(tmp_path / "bin", "rec-ipam", versions, log)
    c = conf(cniVersion="1.1.0", ipam={"type": "rec-ipam"}, **{"cni.dev/valid-attachments": []})
    assert run_shim(shim, "STATUS", c, path=path).code == 0
    assert run_shim(shim, "GC", c, path=path).code == 0
    got = [x[0] for x in calls(log)] if log.exists() else []
    assert got == (["STATUS", "GC"] if forwarded else [])


def test_ipam_that_needs_the_interface_runs_after_it_is_in_the_pod(node: Node, shim, conf,
                                                                  tmp_path):
    """A plugin not known to stay out of the pod's netns (dhcp-like) sees its interface."""
    folder = tmp_path / "bin"
    folder.mkdir()
    seen = tmp_path / "seen"
    (folder / "netns-ipam").write_text(f"""#!/bin/sh
cat >/dev/null
case "$CNI_COMMAND" in
  VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}' ;;
  ADD) nsenter --net="$CNI_NETNS" ip -br link show "$CNI_IFNAME" > {seen} 2>&1
       echo '{{"cniVersion":"1.0.0","ips":[{{"address":"10.45.0.2/24"}}]}}' ;;
esac
""")
    (folder / "netns-ipam").chmod(0o755)
    pod = node.pod(node.vfs(1))
    r = run_shim(shim, "ADD", conf(ipam={"type": "netns-ipam"}), container_id=pod.container_id,
                 netns=pod.netns_path, args=pod.args(), path=f"{folder}:/usr/lib/cni")
    assert r.code == 0, r.out
    assert seen.read_text().startswith("net1")
    assert set(links(pod.netns)) == {"net1"}


def test_an_ipam_plugin_missing_from_cni_path_is_a_config_error(node: Node, shim, conf):
    pod = node.pod(node.vfs(1))
    before = node.snapshot()
    r = run_shim(shim, "ADD", conf(ipam={"type": "no-such-ipam"}),
                 container_id=pod.container_id, netns=pod.netns_path, args=pod.args())
    assert r.error == 7 and "no-such-ipam" in r.out["msg"]
    assert node.snapshot() == before and links(pod.netns) == {}
