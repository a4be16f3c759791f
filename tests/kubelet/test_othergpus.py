"""The pure parts of decision 0090: which ResourceSlices name a GPU DRA driver on this node,
and what the Events say."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from railyard.kubelet.othergpus import Correction, dra_message, gpu_drivers
from railyard.kubelet.response import PairFile
from support.agent import allocation, topology

TOPO = topology("dgx-h100", vfs_per_pf=2)
G = [g.device_id for g in TOPO.gpus]


def slice_(driver: object, node: object = "node-a") -> dict:
    return {"spec": {"driver": driver, "nodeName": node, "devices": [{"name": "d0"}]}}


def test_gpu_drivers_are_this_nodes_slices_of_drivers_that_serve_gpus():
    slices = [slice_("gpu.nvidia.com"), slice_("gpu.nvidia.com"), slice_("gpu.amd.com", "b"),
              slice_("dra.net"), slice_("gpu.example.com"), slice_("nic.example.com"),
              {"spec": {"driver": "gpu.intel.com", "allNodes": True}}]
    assert gpu_drivers(slices, "node-a") == ["gpu.example.com", "gpu.nvidia.com"]
    assert gpu_drivers(slices, "node-c") == []


@given(st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=5),
                          st.dictionaries(st.text(max_size=8), st.one_of(
                              st.none(), st.text(max_size=8),
                              st.dictionaries(st.text(max_size=8), st.text(max_size=8)))))))
def test_gpu_drivers_never_fails_on_any_shape_of_list(items):
    assert isinstance(gpu_drivers(items, "node-a"), list)


def test_the_correction_event_names_what_kubelet_gave_and_what_was_recorded():
    before = allocation(TOPO, [(0, "0000:18:00.1"), (1, "0000:40:00.1")])
    after = replace(allocation(TOPO, [(5, "0000:18:00.1"), (1, "0000:40:00.1")]),
                    decided_by="node")
    c = Correction("team", "a", "uid-a", before, after, {"main": (G[5], G[1])},
                   (PairFile("uid-a", "main", "{}"),), "nvidia.com/gpu")
    assert c.gpus_changed
    text = c.message()
    assert f"nvidia.com/gpu {sorted([G[1], G[5]])}, not the recorded {sorted(G[:2])}" in text
    assert f"{G[5]}=0000:18:00.1" in text and "pair file written again for main" in text
    swapped = Correction("team", "a", "uid-a", before, before, {}, (), "nvidia.com/gpu")
    assert not swapped.gpus_changed
    assert "paired again with the NICs of their own container" in swapped.message()


def test_the_dra_warning_names_the_drivers_and_who_serves_the_resource():
    text = dra_message(["gpu.nvidia.com"], "nvidia.com/gpu", gpu_plugin=False)
    assert "(gpu.nvidia.com)" in text and "another device plugin serves nvidia.com/gpu" in text
    assert "Railyard's GPU plugin" in dra_message(["x"], "nvidia.com/gpu", gpu_plugin=True)
