"""A real runtime makes the calls: a private containerd creates and removes pod sandboxes through
its CRI, with railyard-cni chained after ptp + host-local (containerd wants an eth0 with an IP;
its libcni 1.1 takes configs up to 1.0.0)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import grpc
import pytest
from containerd_helpers import Cri, containerd_missing, private_containerd

from support.cni import Node, Pod, addresses, links, sh, standalone_env

pytestmark = [pytest.mark.root, pytest.mark.slow]

_missing = containerd_missing()


@pytest.fixture(params=["agent", "standalone"])
def mode(request) -> str:
    if _missing:
        pytest.skip(_missing)
    return request.param


def conflist(node: Node, tmp: Path, mode: str, service) -> dict:
    def static(cidr: str) -> dict:
        return {"ipam": {"type": "static", "addresses": [{"address": cidr}]}}

    ours = {"type": "railyard-cni", "ifname": "net1",
            "interfaces": [static("10.77.0.2/24"), static("10.77.1.2/24")]}
    if mode == "agent":
        ours["agentSocket"] = service.socket_path
    else:
        ours.update(standalone=True, stateDir=str(node.state_dir))
    return {"cniVersion": "1.0.0", "name": "ryk8s", "plugins": [
        {"type": "ptp", "ipMasq": False,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.99.0.0/24"}]],
                  "dataDir": str(tmp / "host-local")}},
        ours]}


def records(node: Node) -> list[dict]:
    return [json.loads(p.read_text())
            for p in (node.state_dir / "cni" / "attachments").rglob("*.json")]


@pytest.fixture
def runtime(node: Node, shim: Path, service, tmp_path: Path, mode: str):
    env = standalone_env(node) if mode == "standalone" else {}
    with private_containerd(tmp_path / "containerd", node.host, shim,
                            conflist(node, tmp_path, mode, service), env) as cd:
        cri = Cri(cd.address)
        try:
            yield cd, cri
        finally:
            cri.close()


def test_a_pod_sandbox_gets_eth0_from_ptp_and_its_vfs_by_pair_order(node: Node, runtime):
    cd, cri = runtime
    nics = node.vfs(2)
    before = node.snapshot()
    macs = [before[node.netdev_of(n)]["mac"] for n in nics]
    pod = Pod(str(uuid.uuid4()), "team-a", "trainer-0", "", "")
    node.grant(pod, nics)
    try:
        sandbox = cri.run_pod_sandbox(pod.name, pod.uid, pod.namespace)
    except grpc.RpcError as e:
        pytest.fail(f"RunPodSandbox: {e.details()}\n{cd.log_tail()}")
    (rec,) = records(node)
    assert (rec["pod_uid"], rec["pod_namespace"], rec["pod_name"]) == (
        pod.uid, pod.namespace, pod.name)
    assert rec["ifname"] == "eth0" and rec["container_id"] == sandbox
    netns = Path(rec["netns"]).name
    inside = links_in(rec["netns"])
    assert {"eth0", "net1", "net1-1"} <= set(inside)
    assert [inside["net1"]["mac"], inside["net1-1"]["mac"]] == macs
    assert addresses_in(rec["netns"], "net1") == ["10.77.0.2/24"]
    assert addresses_in(rec["netns"], "net1-1") == ["10.77.1.2/24"]
    assert netns.startswith("cni-")
    cri.stop_pod_sandbox(sandbox)
    assert records(node) == []
    assert {k: v for k, v in node.snapshot().items() if k in before} == before
    cri.remove_pod_sandbox(sandbox)


def test_a_failed_add_fails_the_sandbox_and_leaves_nothing_behind(node: Node, runtime):
    _, cri = runtime
    nics = node.vfs(2)
    gone = node.netdev_of(nics[1])
    sh("ip", "-n", node.host, "link", "del", gone)  # the second VF has no netdev any more
    before = node.snapshot()
    pod = Pod(str(uuid.uuid4()), "team-a", "trainer-1", "", "")
    node.grant(pod, nics)
    with pytest.raises(grpc.RpcError) as e:
        cri.run_pod_sandbox(pod.name, pod.uid, pod.namespace)
    assert nics[1].pci_address in e.value.details()
    assert records(node) == []
    assert node.snapshot() == before  # ptp's host-side veth is gone too: DEL ran


def links_in(netns_path: str) -> dict[str, dict]:
    with _named(netns_path) as name:
        return links(name)


def addresses_in(netns_path: str, ifname: str) -> list[str]:
    with _named(netns_path) as name:
        return addresses(name, ifname)


class _named:
    """Give a netns file a name under /run/netns for `ip -n` (a bind mount, removed after)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = "ry" + uuid.uuid4().hex[:8]

    def __enter__(self) -> str:
        sh("touch", f"/run/netns/{self.name}")
        sh("mount", "--bind", self.path, f"/run/netns/{self.name}")
        return self.name

    def __exit__(self, *exc: object) -> None:
        sh("umount", f"/run/netns/{self.name}", check=False)
        sh("rm", "-f", f"/run/netns/{self.name}", check=False)
