"""The pair map's forms (railyard.kubelet.pairmap) against the record they come from, and
vLLM's rules for its two variables, with vLLM's per-worker step simulated."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from railyard.allocation.types import Allocation
from railyard.cni.spec import pair_ifnames
from railyard.kubelet.pairmap import (
    NCCL_AFFINITY,
    VLLM_MAPPING,
    VLLM_SELECTION,
    WORKER_HCA,
    ContainerPairs,
    PairMapOptions,
    container_pairs,
    pair_file_json,
    pair_map_envs,
)
from railyard.kubelet.response import gpu_grant, nic_grant
from support.allocations import allocation, h100, nearest_vf, nic_ref

TOPO = h100(vfs_per_pf=2)
OPT_IN = PairMapOptions(nccl_gpu_nic_affinity=True)
DEFAULT = PairMapOptions()


def _pod(n: int) -> Allocation:
    """n GPUs, each with a VF of its own nearest PF, in GPU order."""
    return allocation(TOPO, [(i, nearest_vf(TOPO, i)) for i in range(n)])


def _everything(alloc: Allocation) -> ContainerPairs:
    return container_pairs(alloc, [g.device_id for g in alloc.all_gpus],
                           [n.pci_address for n in alloc.all_nics])


def _container_env(held: ContainerPairs, options: PairMapOptions = DEFAULT
                   ) -> dict[str, str]:
    """What the container's environment holds: each plugin's answer, kubelet keeping the
    first value of a variable two set, as kubelet merges them."""
    env: dict[str, str] = {}
    for part in (gpu_grant(list(held.gpus)).envs,
                 nic_grant("railyard.dev/vf", list(held.nics), {}).envs,
                 pair_map_envs(held, options)):
        for k, v in part.items():
            env.setdefault(k, v)
    return env


def _file(held: ContainerPairs, container: str = "main") -> dict:
    return json.loads(pair_file_json(held, namespace="team", pod="p", uid="uid-p",
                                     container=container))


# ------------------------------------------------------------------ every form, every size


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_every_variable_names_the_records_pairs_in_pair_order(n):
    alloc = _pod(n)
    env = _container_env(_everything(alloc), OPT_IN)
    rdma = [p.nic.rdma_device for p in alloc.pairs]
    assert len(set(rdma)) == n and all(rdma)
    assert env["NCCL_IB_HCA"] == "=" + ",".join(f"{d}:1" for d in rdma)
    assert env["UCX_NET_DEVICES"] == ",".join(f"{d}:1" for d in rdma)
    assert env["NVSHMEM_HCA_LIST"] == ",".join(f"{d}:1" for d in rdma)
    assert env[VLLM_MAPPING] == ",".join(f"{p.gpu.pci_address}={p.nic.pci_address}"
                                         for p in alloc.pairs)
    assert env[VLLM_SELECTION] == f"{WORKER_HCA}:1"
    # CUDA numbers the container's GPUs by bus ID; the record's GPUs are in bus order here.
    by_bus = sorted(p.gpu.pci_address for p in alloc.pairs)
    assert env[NCCL_AFFINITY] == ",".join(
        f"cuda:{by_bus.index(p.gpu.pci_address)}={p.nic.rdma_device}" for p in alloc.pairs)
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(p.gpu.device_id for p in alloc.pairs)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_the_pair_file_holds_one_entry_per_pair_with_what_the_record_says(n):
    alloc = _pod(n)
    doc = _file(_everything(alloc))
    assert doc["version"] == 1
    assert doc["pod"] == {"namespace": "team", "name": "p", "uid": "uid-p"}
    assert (doc["container"], doc["node"], doc["decidedBy"]) == ("main", TOPO.node, "scheduler")
    names = pair_ifnames("net1", len(alloc.all_nics))  # the CNI's own naming
    assert doc["pairs"] == [
        {"index": i,
         "gpu": {"index": p.gpu.index, "pciAddress": p.gpu.pci_address, "uuid": p.gpu.uuid,
                 "cudaOrdinal": i},
         "nic": {"kind": "vf", "pciAddress": p.nic.pci_address,
                 "pfPciAddress": p.nic.pf_pci_address, "rdmaDevice": p.nic.rdma_device,
                 "podNetdev": names[i]},
         "distance": p.distance.name, "rail": None}
        for i, p in enumerate(alloc.pairs)]
    assert doc["nics"] == [] and doc["gpus"] == []


def test_the_affinity_form_is_opt_in():
    env = pair_map_envs(_everything(_pod(2)))
    assert NCCL_AFFINITY not in env and "CUDA_DEVICE_ORDER" not in env


def test_a_pod_interface_name_set_on_the_node_names_the_pods_netdevs():
    held = _everything(_pod(3))
    doc = json.loads(pair_file_json(held, namespace="t", pod="p", uid="u", container="c",
                                    options=PairMapOptions(pod_ifname="rdma")))
    assert [p["nic"]["podNetdev"] for p in doc["pairs"]] == ["rdma", "rdma-1", "rdma-2"]


# ------------------------------------------------------------------ part of the pod's pairs


def test_a_container_with_part_of_the_pods_pairs_gets_only_those_with_pod_level_indices():
    """Pod of 4 pairs; this container holds pairs 1 and 3, and pair 2's NIC without its GPU
    (which the record would pair with another container's GPU): its own pairs come first."""
    alloc = _pod(4)
    p = alloc.pairs
    held = container_pairs(alloc, [p[1].gpu.device_id, p[3].gpu.device_id],
                           [p[1].nic.pci_address, p[3].nic.pci_address, p[2].nic.pci_address])
    env = _container_env(held, OPT_IN)
    mine = [p[1], p[3]]
    assert env["UCX_NET_DEVICES"] == ",".join(
        f"{x.nic.rdma_device}:1" for x in (p[1], p[3], p[2]))
    assert env["NCCL_IB_HCA"] == "=" + env["UCX_NET_DEVICES"]
    assert env[VLLM_MAPPING] == ",".join(f"{x.gpu.pci_address}={x.nic.pci_address}"
                                         for x in mine)
    assert env[NCCL_AFFINITY] == f"cuda:0={p[1].nic.rdma_device},cuda:1={p[3].nic.rdma_device}"
    doc = _file(held)
    assert [x["index"] for x in doc["pairs"]] == [1, 3]
    assert [x["gpu"]["cudaOrdinal"] for x in doc["pairs"]] == [0, 1]
    # Netdev names count every NIC of the pod, as the CNI moves them all into its netns.
    assert [x["nic"]["podNetdev"] for x in doc["pairs"]] == ["net1-1", "net1-3"]
    assert [x["pciAddress"] for x in doc["nics"]] == [p[2].nic.pci_address]
    assert doc["nics"][0]["podNetdev"] == "net1-2"
    named = {x.gpu.pci_address for x in alloc.pairs} - {x.gpu.pci_address for x in mine}
    assert not any(g in json.dumps(doc) + json.dumps(env) for g in named)


def test_unpaired_devices_come_after_the_pairs():
    alloc = replace(allocation(TOPO, [(2, nearest_vf(TOPO, 2))], nics=(nearest_vf(TOPO, 5),)),
                    gpus=(_pod(8).pairs[6].gpu,))
    doc = _file(_everything(alloc))
    assert [x["gpu"]["index"] for x in doc["pairs"]] == [2]
    assert [x["podNetdev"] for x in doc["nics"]] == ["net1-1"]
    assert [(g["index"], g["cudaOrdinal"]) for g in doc["gpus"]] == [(6, 1)]


# ------------------------------------------------------------------ vLLM's rules


def _vllm_worker(env: dict[str, str], gpu_pci: str,
                 infiniband: dict[str, str]) -> dict[str, str]:
    """vLLM's per-worker step (vllm/v1/executor/vllm_net_devices.py, merged May 2026), as
    documented there: both variables or neither, else it refuses to start; the worker's GPU
    must be in the mapping; the NIC's BDF is resolved to a name through
    /sys/class/infiniband/*/device (`infiniband`: name → BDF); each selected variable gets
    `<name><suffix>` *prepended* to what it already holds."""
    mapping = env.get(VLLM_MAPPING, "").strip()
    selection = env.get(VLLM_SELECTION, "").strip()
    if bool(mapping) != bool(selection):
        raise RuntimeError("vLLM refuses to start: both must be set together")
    if not mapping:
        return dict(env)
    nic_of = dict(seg.split("=", 1) for seg in mapping.split(",") if seg)
    if gpu_pci not in nic_of:
        raise RuntimeError(f"vLLM refuses to start: no mapping entry for GPU {gpu_pci}")
    name = next(n for n, bdf in infiniband.items() if bdf == nic_of[gpu_pci])
    out = dict(env)
    for entry in filter(None, (e.strip() for e in selection.split(","))):
        var, colon, suffix = entry.partition(":")
        value = name + (":" + suffix if colon else "")
        if out.get(var, "").strip():
            value = f"{value},{out[var].strip()}"
        out[var] = value
    return out


def _infiniband(alloc: Allocation) -> dict[str, str]:
    return {n.rdma_device: n.pci_address for n in alloc.all_nics if n.rdma_device}


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_every_vllm_worker_gets_its_own_nic_and_the_exact_nccl_ib_hca_survives(n):
    alloc = _pod(n)
    env = _container_env(_everything(alloc))
    for p in alloc.pairs:
        worker = _vllm_worker(env, p.gpu.pci_address, _infiniband(alloc))
        assert worker[WORKER_HCA] == f"{p.nic.rdma_device}:1"
        assert {k: v for k, v in worker.items() if k != WORKER_HCA} == env
        assert worker["NCCL_IB_HCA"].startswith("=")


def test_selecting_nccl_ib_hca_for_vllm_would_make_it_inexact():
    """Why the selection names a variable of Railyard's own (decision 0084): vLLM's prepend
    puts the worker's device before the `=`, which NCCL then reads as a prefix list."""
    alloc = _pod(2)
    env = {**_container_env(_everything(alloc)), VLLM_SELECTION: "NCCL_IB_HCA:1"}
    worker = _vllm_worker(env, alloc.pairs[1].gpu.pci_address, _infiniband(alloc))
    assert not worker["NCCL_IB_HCA"].startswith("=")


def test_the_mapping_is_never_set_without_the_selection_nor_the_selection_without_it():
    alloc = _pod(4)
    p = alloc.pairs
    cases = {
        "everything": _everything(alloc),
        "no NIC": container_pairs(alloc, [p[0].gpu.device_id], []),
        "NICs only": container_pairs(alloc, [], [x.nic.pci_address for x in p]),
        "a GPU without its NIC": container_pairs(
            alloc, [p[0].gpu.device_id, p[1].gpu.device_id], [p[0].nic.pci_address]),
    }
    for what, held in cases.items():
        env = pair_map_envs(held, OPT_IN)
        assert (VLLM_MAPPING in env) == (VLLM_SELECTION in env), what
        for x in held.gpus:  # no worker on any GPU of the container is refused
            _vllm_worker(env, x.pci_address, _infiniband(alloc))
    assert VLLM_MAPPING in pair_map_envs(cases["everything"])
    assert VLLM_MAPPING not in pair_map_envs(cases["a GPU without its NIC"])


def test_a_paired_nic_without_an_rdma_device_sets_no_vllm_mapping():
    """vLLM could not resolve its BDF through /sys/class/infiniband and would refuse."""
    alloc = _pod(2)
    bare = nic_ref(TOPO, alloc.pairs[1].nic.pci_address)
    held = container_pairs(alloc, [p.gpu.device_id for p in alloc.pairs],
                           [p.nic.pci_address for p in alloc.pairs],
                           named={bare.pci_address: replace(bare, rdma_device=None)})
    env = pair_map_envs(held)
    assert VLLM_MAPPING not in env and VLLM_SELECTION not in env
    assert env["UCX_NET_DEVICES"] == f"{alloc.pairs[0].nic.rdma_device}:1"
