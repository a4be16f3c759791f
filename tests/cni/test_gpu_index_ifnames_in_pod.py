"""Opt-in `ifnameScheme: gpu-index` in a real pod network namespace: the NIC of pair i is
`rdma<i>`, a shared NIC takes its first pair's name, unpaired NICs are `rdmau<j>`; the pair
file names them alike. veth ends stand in for VFs inside throwaway namespaces (support.cni)."""

from __future__ import annotations

import json

import pytest

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.kubelet.pairmap import PairMapOptions, container_pairs, pair_file_json
from railyard.node.state import PodKey
from railyard.topology.model import Distance
from support.cni import NODE, TOPOLOGY, Node, add, delete, links

pytestmark = pytest.mark.root


def _grant(node: Node, pod, nics: list[NicRef], pair_nics: list[int],
           unpaired: list[int]) -> Allocation:
    pairs = tuple(Pair(GpuRef.of(TOPOLOGY.gpus[g]), nics[n], Distance.PIX)
                  for g, n in enumerate(pair_nics))
    alloc = Allocation(node=NODE, numa_nodes=(0,), cpus=None, memory_bytes=(), pairs=pairs,
                       nics=tuple(nics[n] for n in unpaired),
                       decided_at="2026-01-01T00:00:00Z")
    node.store.put(PodKey(pod.uid, pod.namespace, pod.name), alloc)
    return alloc


def test_gpu_index_names_inside_the_pod_follow_the_pairs_and_del_restores_the_host(
        node: Node, shim, conf) -> None:
    nics = node.vfs(4)
    before = node.snapshot()
    macs = {n.pci_address: before[node.netdev_of(n)]["mac"] for n in nics}
    pod = node.pod([])
    # GPU0→NIC0, GPU1 and GPU2 share NIC1, GPU3→NIC2; NIC3 is paired with no GPU.
    alloc = _grant(node, pod, nics, [0, 1, 1, 2], [3])
    c = conf(cniVersion="1.1.0", ifnameScheme="gpu-index")
    r = add(shim, pod, c)
    assert r.code == 0, r.out
    want = {"rdma0": nics[0], "rdma1": nics[1], "rdma3": nics[2], "rdmau0": nics[3]}
    inside = links(pod.netns)
    assert set(inside) == set(want)
    assert {name: inside[name]["mac"] for name in want} == {
        name: macs[n.pci_address] for name, n in want.items()}
    assert all(inside[name]["up"] for name in want)
    assert [(i["name"], i["pciID"]) for i in r.out["interfaces"]] == [
        (name, n.pci_address) for name, n in want.items()]
    # The agent configured alike writes the same names into the pair file.
    held = container_pairs(alloc, [g.device_id for g in alloc.all_gpus],
                           [n.pci_address for n in alloc.all_nics])
    doc = json.loads(pair_file_json(held, namespace=pod.namespace, pod=pod.name, uid=pod.uid,
                                    container="main",
                                    options=PairMapOptions(pod_ifname_scheme="gpu-index")))
    assert [p["nic"]["podNetdev"] for p in doc["pairs"]] == ["rdma0", "rdma1", "rdma1", "rdma3"]
    assert [n["podNetdev"] for n in doc["nics"]] == ["rdmau0"]
    assert delete(shim, pod, c).code == 0
    assert links(pod.netns) == {}
    assert node.snapshot() == before


def test_the_same_pod_shape_gets_the_same_names_from_other_devices(node: Node, shim,
                                                                   conf) -> None:
    nics = node.vfs(6)
    names = []
    for chosen in ([0, 1, 2], [5, 3, 4]):
        pod = node.pod([])
        _grant(node, pod, [nics[i] for i in chosen], [0, 1], [2])
        r = add(shim, pod, conf(ifnameScheme="gpu-index"))
        assert r.code == 0, r.out
        names.append(sorted(links(pod.netns)))
    assert names[0] == names[1] == ["rdma0", "rdma1", "rdmau0"]


def test_a_bad_scheme_moves_nothing_and_names_the_field(node: Node, shim, conf) -> None:
    nics = node.vfs(1)
    before = node.snapshot()
    pod = node.pod(nics)
    r = add(shim, pod, conf(ifnameScheme="by-rail"))
    assert r.code != 0 and r.error == 7
    assert r.out is not None and r.out["msg"].startswith("ifnameScheme")
    assert links(pod.netns) == {} and node.snapshot() == before
