"""The pair file's `podNetdev` follows the node's interface name scheme, the CNI's own rule
(`pairMap.podIfnameScheme` beside the CNI config's `ifnameScheme`, decision 0086)."""

from __future__ import annotations

import json

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.cni.spec import pair_ifnames
from railyard.discovery.profiles import DGX_H100, build_topology
from railyard.kubelet.pairmap import PairMapOptions, container_pairs, pair_file_json
from railyard.node.ifnames import nic_pair_indexes
from railyard.topology.model import Distance

TOPO = build_topology(DGX_H100, 2)
PFS = [n for n in TOPO.nics if n.vfs]
GPU_INDEX = PairMapOptions(pod_ifname_scheme="gpu-index")


def _alloc() -> Allocation:
    nics = [NicRef.of_vf(pf, pf.vfs[0]) for pf in PFS[:4]]
    # GPUs 1 and 2 share one NIC; the fourth NIC is paired with no GPU.
    pairs = tuple(Pair(GpuRef.of(TOPO.gpus[g]), nics[n], Distance.PIX)
                  for g, n in enumerate([0, 1, 1, 2]))
    return Allocation(TOPO.node, (0,), None, (), pairs=pairs, nics=(nics[3],))


def _netdevs(alloc: Allocation, options: PairMapOptions, gpus: int = 4, nics: int = 4) -> tuple:
    held = container_pairs(alloc, [g.device_id for g in alloc.all_gpus[:gpus]],
                           [n.pci_address for n in alloc.all_nics[:nics]])
    doc = json.loads(pair_file_json(held, namespace="ns", pod="p", uid="u", container="c",
                                    options=options))
    return ([p["nic"]["podNetdev"] for p in doc["pairs"]],
            [n["podNetdev"] for n in doc["nics"]])


def test_the_default_pair_file_keeps_todays_names() -> None:
    assert _netdevs(_alloc(), PairMapOptions()) == (
        ["net1", "net1-1", "net1-1", "net1-2"], ["net1-3"])


def test_under_gpu_index_each_pair_names_its_nic_rdma_of_its_first_pair() -> None:
    assert _netdevs(_alloc(), GPU_INDEX) == (["rdma0", "rdma1", "rdma1", "rdma3"], ["rdmau0"])


def test_a_container_holding_part_of_the_pod_sees_the_pods_names() -> None:
    # Names are the pod's (the CNI names the pod's interfaces once), not the container's.
    pairs, _ = _netdevs(_alloc(), GPU_INDEX, gpus=4, nics=4)
    alloc = _alloc()
    held = container_pairs(alloc, [alloc.all_gpus[3].device_id], [alloc.all_nics[2].pci_address])
    doc = json.loads(pair_file_json(held, namespace="ns", pod="p", uid="u", container="c",
                                    options=GPU_INDEX))
    assert [p["nic"]["podNetdev"] for p in doc["pairs"]] == [pairs[3]] == ["rdma3"]


def test_the_pair_file_and_the_cni_name_the_same_nic_alike_under_either_scheme() -> None:
    alloc = _alloc()
    for scheme in ("sequential", "gpu-index"):
        cni = pair_ifnames("net1", len(alloc.all_nics), scheme=scheme,
                           pair_indexes=nic_pair_indexes(alloc))
        pairs, unpaired = _netdevs(alloc, PairMapOptions(pod_ifname_scheme=scheme))
        by_nic = dict(zip((n.pci_address for n in alloc.all_nics), cni, strict=True))
        assert pairs == [by_nic[p.nic.pci_address] for p in alloc.pairs]
        assert unpaired == [by_nic[n.pci_address] for n in alloc.nics]
