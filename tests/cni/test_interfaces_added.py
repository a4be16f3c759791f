"""After an ADD that moved devices the CNI tells its `on_added` hook the pod and each
interface as the pod has it (device, name, MAC, addresses): what the agent writes into a DRA
claim's status (decision 0113). A hook that fails never fails the ADD; a pod with no NICs of
ours tells nothing."""

from __future__ import annotations

import pytest

from support.cni import Node, addresses, links, run_shim

pytestmark = pytest.mark.root

STATIC = "/usr/lib/cni"  # Debian's containernetworking-plugins: `static` is there


def static(address: str) -> dict:
    return {"ipam": {"type": "static", "addresses": [{"address": address}]}}


def test_the_hook_hears_each_interface_with_the_mac_and_addresses_the_pod_has(
        node: Node, shim, conf, service):
    told: list = []
    service.server.plugin.on_added = lambda pod, interfaces: told.append((pod, interfaces))
    nics = node.vfs(2)
    pod = node.pod(nics)
    c = conf(interfaces=[static("10.56.0.2/16"), static("10.56.0.3/16")])
    r = run_shim(shim, "ADD", c, container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args(), path=STATIC)
    assert r.code == 0, r.out
    [(who, interfaces)] = told
    assert (who.uid, who.namespace, who.name) == (pod.uid, pod.namespace, pod.name)
    inside = links(pod.netns)
    assert [(i.pci, i.name) for i in interfaces] == [(nics[0].pci_address, "net1"),
                                                     (nics[1].pci_address, "net1-1")]
    for i in interfaces:
        assert i.mac == inside[i.name]["mac"]
        assert list(i.ips) == addresses(pod.netns, i.name)
    assert [i.ips for i in interfaces] == [("10.56.0.2/16",), ("10.56.0.3/16",)]


def test_a_failing_hook_never_fails_the_add(node: Node, shim, conf, service):
    def broken(pod, interfaces):
        raise RuntimeError("the API server is down")

    service.server.plugin.on_added = broken
    pod = node.pod(node.vfs(1))
    r = run_shim(shim, "ADD", conf(), container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args())
    assert r.code == 0, r.out
    assert "net1" in links(pod.netns)


def test_a_pod_without_our_nics_tells_nothing(node: Node, shim, conf, service):
    told: list = []
    service.server.plugin.on_added = lambda pod, interfaces: told.append(pod)
    pod = node.pod([])
    r = run_shim(shim, "ADD", conf(), container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args())
    assert r.code == 0, r.out
    assert told == []
