"""What a runtime, a chain or a delegated IPAM plugin may send: malformed prevResults and IPAM
results, IPAM plugins too old to answer with an `ips` list, GC lists (their two key names, and
the per-interface names IPAM must hear), and bursts of calls at once.

Each test states the behaviour the CNI spec (or the project's rules) asks for; see the
docstrings for why it matters.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from railyard.cni.grants import StoreGrants
from railyard.cni.plugin import Plugin, Settings
from railyard.cni.service import RunningService, build_plugin, start
from railyard.cni.shim import call_service
from railyard.cni.spec import CniError, parse_ipam_result
from railyard.node.state import StateStore
from support.cni import Node, RecordingRdma, addresses, links, run_shim

# ----------------------------------------------------------------------- helpers


def lease_ipam(folder: Path, name: str, leases: Path) -> str:
    """A CNI 1.1 IPAM plugin keeping one lease file per (CNI_CONTAINERID, CNI_IFNAME), with
    host-local's GC semantics (containernetworking/plugins host-local backend/disk GC: a lease
    whose (containerID, ifname) is not in `cni.dev/valid-attachments` is released)."""
    folder.mkdir(parents=True, exist_ok=True)
    leases.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(f"""#!{sys.executable} -IS
import json, os, sys
cmd = os.environ.get("CNI_COMMAND")
raw = sys.stdin.read()
conf = json.loads(raw) if raw.strip() else {{}}
leases = {str(leases)!r}
if cmd == "VERSION":
    print(json.dumps({{"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]}}))
    sys.exit(0)
ifname = os.environ.get("CNI_IFNAME", "")
key = os.environ.get("CNI_CONTAINERID", "") + ":" + ifname
if cmd == "ADD":
    n = 2 + (int(ifname.rsplit("-", 1)[1]) if "-" in ifname else 0)
    with open(os.path.join(leases, key), "w") as f:
        f.write(str(n))
    ips = [{{"address": "10.47.0.%d/24" % n}}]
    print(json.dumps({{"cniVersion": conf["cniVersion"], "ips": ips}}))
elif cmd == "DEL":
    try:
        os.unlink(os.path.join(leases, key))
    except FileNotFoundError:
        pass
elif cmd == "GC":
    valid = {{a["containerID"] + ":" + a["ifname"]
             for a in conf.get("cni.dev/valid-attachments") or []}}
    for lease in os.listdir(leases):
        if lease not in valid:
            os.unlink(os.path.join(leases, lease))
sys.exit(0)
""")
    (folder / name).chmod(0o755)
    return f"{folder}:/usr/lib/cni"


def attachment_records(node: Node) -> list[Path]:
    return list((node.state_dir / "cni" / "attachments").rglob("*.json"))


@pytest.fixture
def empty_plugin(tmp_path: Path) -> Iterator[Plugin]:
    """The plugin over an empty node state store: it grants nothing, so never moves a link."""
    p = Plugin(str(tmp_path / "state"), StoreGrants(StateStore(tmp_path / "state"), "node-a"),
               RecordingRdma("shared"), settings=Settings(sysfs_root=str(tmp_path / "sysfs")))
    yield p
    p.close()


@pytest.fixture
def bare_service(tmp_path: Path) -> Iterator[RunningService]:
    plugin = build_plugin(str(tmp_path / "state"), sysfs_root=str(tmp_path / "sysfs"),
                          device_info_dir=str(tmp_path / "devinfo"),
                          rdma=RecordingRdma("shared"), pod_resources_socket=None)
    running = start(plugin, str(tmp_path / "cni.sock"))
    yield running
    running.stop()


POD_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;K8S_POD_UID=u1"

# Malformed prevResult shapes (a chain's earlier plugin, or whoever wrote the config). Each is
# (config version, prevResult).
BAD_PREV = [
    ("1.0.0", {"interfaces": ["eth0"]}),
    ("1.0.0", {"ips": [7]}),
    ("1.0.0", {"routes": ["0.0.0.0/0"]}),
    ("0.4.0", {"ips": [{"interface": 0}]}),
    ("0.4.0", {"ips": [{"address": "not-an-ip", "interface": 0}]}),
]


# ----------------------------------------------------------------------- prevResult


@pytest.mark.parametrize("version, prev", BAD_PREV)
def test_a_malformed_prev_result_is_a_config_error_not_an_internal_one(empty_plugin: Plugin,
                                                                       version, prev):
    """parse_netconf checks only that prevResult.interfaces/ips/routes are lists; build_result
    then calls dict() on each item and ipaddress on 0.4.0 addresses, so a malformed entry is an
    'internal error' (code 5) with a Python traceback on stderr instead of error 7."""
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/self/ns/net",
           "CNI_IFNAME": "net1", "CNI_ARGS": POD_ARGS, "CNI_PATH": "/usr/lib/cni"}
    conf = {"cniVersion": version, "name": "rdma", "type": "railyard-cni", "prevResult": prev}
    reply = empty_plugin.handle(env, json.dumps(conf).encode())
    err = json.loads(reply.stdout)
    assert reply.code == 1 and err["code"] == 7, err
    assert "prevResult" in err["msg"]
    assert reply.stderr == b""


@pytest.mark.root
@pytest.mark.parametrize("version, prev", BAD_PREV[:3])
def test_a_malformed_prev_result_moves_nothing(node: Node, shim, conf, version, prev):
    """With grants the malformed prevResult is only touched by build_result, which runs after
    the devices moved and the record was marked "added", outside the rollback: the ADD fails
    with code 5 and a traceback, yet the VF stays in the pod and the record stays behind."""
    nics = node.vfs(1)
    before = node.snapshot()
    pod = node.pod(nics)
    r = run_shim(shim, "ADD", conf(cniVersion=version, prevResult=prev),
                 container_id=pod.container_id, netns=pod.netns_path, args=pod.args())
    assert r.code == 1
    assert links(pod.netns) == {} and node.snapshot() == before, "a failed ADD moved a VF"
    assert attachment_records(node) == []
    assert r.error == 7 and "Traceback" not in r.stderr, r.out


# ----------------------------------------------------------------------- IPAM results


@pytest.mark.parametrize("bad", [
    {"ips": 5},
    {"routes": 5},
    {"ips": [{"address": "10.0.0.2/24", "gateway": 167772161}]},
    {"routes": [{"dst": "0.0.0.0/0", "gw": 167772161}]},
])
def test_an_ipam_result_of_the_wrong_shape_is_a_decode_error(bad):
    """A non-list `ips`/`routes` raises TypeError (an internal error with a traceback after the
    rollback); a non-string gateway passes as an int (ipaddress accepts ints) and ends up in
    our result, which libcni then cannot parse."""
    with pytest.raises(CniError) as e:
        parse_ipam_result(bad, "weird-ipam")
    assert e.value.code == 6


@pytest.mark.root
def test_an_ipam_plugin_speaking_only_0_2_0_never_gives_a_silent_addressless_add(
        node: Node, shim, conf, tmp_path):
    """Negotiation goes down to 0.1.0 (and assumes 0.1.0/0.2.0 for a plugin whose VERSION fails),
    but parse_ipam_result reads only the 0.3+ `ips` list: a 0.2.0 answer (`ip4`) is dropped and
    ADD succeeds with no address on the interface. It must either apply the address or refuse
    the plugin (code 1) and move nothing."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "old-ipam").write_text("""#!/bin/sh
cat >/dev/null
case "$CNI_COMMAND" in
  VERSION) echo '{"cniVersion":"0.2.0","supportedVersions":["0.1.0","0.2.0"]}' ;;
  ADD) echo '{"cniVersion":"0.2.0","ip4":{"ip":"10.48.0.2/24","gateway":"10.48.0.1"}}' ;;
esac
exit 0
""")
    (folder / "old-ipam").chmod(0o755)
    nics = node.vfs(1)
    before = node.snapshot()
    pod = node.pod(nics)
    r = run_shim(shim, "ADD", conf(ipam={"type": "old-ipam"}), container_id=pod.container_id,
                 netns=pod.netns_path, args=pod.args(), path=f"{folder}:/usr/lib/cni")
    if r.code == 0:
        assert addresses(pod.netns, "net1") == ["10.48.0.2/24"], \
            f"ADD succeeded without the IPAM address: {r.out}"
        assert [ip["address"] for ip in r.out["ips"]] == ["10.48.0.2/24"]
    else:
        assert r.error == 1, r.out
        assert links(pod.netns) == {} and node.snapshot() == before


# ----------------------------------------------------------------------- GC


@pytest.mark.root
@pytest.mark.parametrize("count, cni_ifname, own_ifname", [
    (2, "net1", None),  # a second interface's lease is keyed by net1-1
    (1, "eth0", "net1"),  # chained: the attachment is eth0, the lease is keyed by net1
])
def test_gc_keeps_the_ipam_leases_of_a_valid_attachment(node: Node, shim, conf, tmp_path,
                                                        count, cni_ifname, own_ifname):
    """IPAM ADD runs per interface with that interface's own name as CNI_IFNAME (net1, net1-1,
    or the config's `ifname`), but GC forwards the runtime's valid-attachments as they are,
    keyed by CNI_IFNAME. An IPAM plugin with GC (host-local's semantics) then releases the
    leases of interfaces of a live attachment, and hands those addresses to the next pod."""
    leases = tmp_path / "leases"
    path = lease_ipam(tmp_path / "bin", "lease-ipam", leases)
    pod = node.pod(node.vfs(count))
    extra = {"ifname": own_ifname} if own_ifname else {}
    c = conf(cniVersion="1.1.0", ipam={"type": "lease-ipam"}, **extra)
    r = run_shim(shim, "ADD", c, container_id=pod.container_id, netns=pod.netns_path,
                 ifname=cni_ifname, args=pod.args(), path=path)
    assert r.code == 0, r.out
    held = set(os.listdir(leases))
    assert len(held) == count
    valid = [{"containerID": pod.container_id, "ifname": cni_ifname}]
    gc = run_shim(shim, "GC", {**c, "cni.dev/valid-attachments": valid}, path=path)
    assert gc.code == 0, gc.out
    assert len(links(pod.netns)) == count  # Railyard kept the attachment...
    assert set(os.listdir(leases)) == held, "...but GC released its IPAM leases"


@pytest.mark.root
@pytest.mark.parametrize("gc_keys", [
    {},  # no list at all: not a GC request a runtime makes
    {"cni.dev/attachments": "VALID"},  # the key's name in the CNI 1.1.0 SPEC text (cni#1101)
])
def test_gc_without_a_valid_attachments_list_tears_nothing_down(node: Node, shim, conf, gc_keys):
    """A GC config without `cni.dev/valid-attachments` is read as an empty list, so every
    attachment of the network is deleted: live pods lose their VFs. The CNI 1.1.0 SPEC text
    named the key `cni.dev/attachments` until libcni 1.2.3 (cni#1101/#1103), so a runtime
    written to that text lists the pod and still has it torn down."""
    pod = node.pod(node.vfs(1))
    c = conf(cniVersion="1.1.0")
    r = run_shim(shim, "ADD", c, container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args())
    assert r.code == 0, r.out
    valid = [{"containerID": pod.container_id, "ifname": "net1"}]
    keys = {k: (valid if v == "VALID" else v) for k, v in gc_keys.items()}
    run_shim(shim, "GC", {**c, **keys})
    assert set(links(pod.netns)) == {"net1"}, "GC took a live pod's VF away"
    assert len(attachment_records(node)) == 1


# ----------------------------------------------------------------------- the service socket


def test_a_burst_of_calls_is_queued_not_answered_service_unreachable(bare_service):
    """The service listens with socketserver's default backlog (5) and the shim connects with a
    timeout, i.e. non-blocking: a unix-socket connect to a full backlog fails at once with
    EAGAIN, which the shim reports as error 11 "service unreachable". A node starting a few
    dozen pods at once gets spurious failures from a healthy service."""
    conf = json.dumps({"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni",
                       "agentSocket": bare_service.socket_path}).encode()
    n = 48
    barrier = threading.Barrier(n)
    outcomes: list[object] = []

    def one(i: int) -> None:
        env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": f"c{i}", "CNI_IFNAME": "net1",
               "CNI_NETNS": "", "CNI_ARGS": "", "CNI_PATH": "/usr/lib/cni"}
        barrier.wait()
        try:
            outcomes.append(call_service(bare_service.socket_path, env, conf)[0])
        except OSError as e:  # what the shim turns into error 11
            outcomes.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [o for o in outcomes if o != 0]
    assert refused == [], f"{len(refused)} of {n} calls refused: {refused[0]}"


def test_del_with_cni_args_it_cannot_read_still_brings_the_devices_home(node: Node, shim,
                                                                        conf):
    """DEL reads everything from the attachment record; unreadable CNI_ARGS (a runtime's
    oddity) must not keep a VF in a pod."""
    nics = node.vfs(1)
    before = node.snapshot()
    pod = node.pod(nics)
    assert run_shim(shim, "ADD", conf(), container_id=pod.container_id, netns=pod.netns_path,
                    args=pod.args()).code == 0
    r = run_shim(shim, "DEL", conf(), container_id=pod.container_id, netns=pod.netns_path,
                 args="K8S_POD_UID")  # no '=': an ADD with these would be error 4
    assert r.code == 0, r.out
    assert node.snapshot() == before and links(pod.netns) == {}


def test_stopping_the_service_lets_a_call_in_flight_finish_its_rollback(
        node: Node, shim, service, conf, tmp_path):
    """stop() used to close the plugin (its host namespace) under a running ADD, whose
    rollback then could not bring the devices home; it now waits for calls in flight."""
    nics = node.vfs(1)
    before = node.snapshot()
    pod = node.pod(nics)
    folder = tmp_path / "bin"
    folder.mkdir()
    slow = folder / "slow-ipam"
    version = json.dumps({"cniVersion": "1.0.0", "supportedVersions": ["1.0.0"]})
    failure = json.dumps({"cniVersion": "1.0.0", "code": 107, "msg": "pool exhausted"})
    slow.write_text("#!/bin/sh\ncat >/dev/null\n"
                    f"if [ \"$CNI_COMMAND\" = VERSION ]; then echo '{version}'; exit 0; fi\n"
                    f"if [ \"$CNI_COMMAND\" = ADD ]; then sleep 1; echo '{failure}'; exit 1; fi\n")
    slow.chmod(0o755)
    c = conf(ipam={"type": "slow-ipam"})
    results = {}
    t = threading.Thread(target=lambda: results.setdefault("add", run_shim(
        shim, "ADD", c, container_id=pod.container_id, netns=pod.netns_path, args=pod.args(),
        path=f"{folder}:/usr/lib/cni")))
    t.start()
    deadline = time.monotonic() + 10
    while not attachment_records(node) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert attachment_records(node), "the ADD never started"
    service.stop()
    t.join(timeout=10)
    r = results["add"]
    assert r.error == 107 and "rolled back" in r.out["details"], r.out
    assert node.snapshot() == before and links(pod.netns) == {}
