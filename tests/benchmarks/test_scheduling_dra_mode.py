"""The pure parts of benchmarks/scheduling.py's `dra` mode (benchmarks/dra_mode.py): the
slices and claim templates of the benchmark's shapes, its pods, and the switch-aligned count
read from an allocated claim. The rounds themselves need the box."""

from __future__ import annotations

import pytest

import dra_mode
from railyard.records.dra_names import DRIVER, device_name
from railyard.records.dra_slices import node_slices
from scheduling import MIX

TOPO = dra_mode.node_topology("kwok-node-0")
FACTS = dra_mode.device_facts(node_slices(TOPO, publish_gpus=True))
# Each GPU of the dgx-h100 with the first VF of the PF under its own switch, by GPU index.
GPUS = sorted(TOPO.gpus, key=lambda g: g.index)
VF_UNDER = {g.pci_address: next(v for n in TOPO.nics if n.switch == g.switch
                                for v in n.vfs) for g in GPUS}


def requests(template: dict) -> list[dict]:
    return template["spec"]["spec"]["devices"]["requests"]


def test_every_shape_of_the_mix_gets_one_template_in_the_rounds_namespace():
    templates = dra_mode.claim_templates(((g, v) for _, g, v in MIX), "bench-1")
    assert [t["metadata"] for t in templates] == [
        {"name": n, "namespace": "bench-1"}
        for n in ("pairs-1", "pairs-2", "pairs-4", "pairs-8", "vfs-1", "vfs-2")]
    assert {t["kind"] for t in templates} == {"ResourceClaimTemplate"}


@pytest.mark.parametrize("pairs", [1, 2, 4, 8])
def test_a_pair_template_asks_each_pair_under_one_switch_and_nothing_looser(pairs):
    t = next(t for t in dra_mode.claim_templates([(pairs, pairs)])
             if t["metadata"]["name"] == f"pairs-{pairs}")
    names = [r["name"] for r in requests(t)]
    assert names == [x for k in range(pairs) for x in (f"nic-{k}", f"gpu-{k}")]
    constraints = t["spec"]["spec"]["devices"]["constraints"]
    matched = [c for c in constraints if "matchAttribute" in c]
    assert {c["matchAttribute"] for c in matched} == {"railyard.dev/pcieSwitch"}
    assert len(matched) == pairs  # one level: the switch, no root or NUMA fallback
    assert [c["requests"][0] for c in matched] == [f"gpu-{k}" for k in range(pairs)]
    gpu_classes = {r["exactly"]["deviceClassName"] for r in requests(t)
                   if r["name"].startswith("gpu-")}
    assert gpu_classes == {"railyard-gpu"}


def test_a_vf_only_template_is_a_claim_of_that_many_vfs():
    (t,) = dra_mode.claim_templates([(0, 2)])
    assert requests(t) == [{"name": "vfs", "exactly": {"deviceClassName": "railyard-vf",
                                                        "count": 2}}]


def test_a_shape_with_gpus_but_another_number_of_vfs_is_refused():
    with pytest.raises(ValueError, match="as many VFs"):
        dra_mode.template_name(2, 4)


def test_the_pod_asks_its_shapes_claim_and_no_device_plugin_resources():
    body = dra_mode.pod_body("p-3", 4, 4)
    container = body["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert container["resources"]["claims"] == [{"name": "devices"}]
    assert body["spec"]["resourceClaims"] == [
        {"name": "devices", "resourceClaimTemplateName": "pairs-4"}]
    assert dra_mode.pod_body("p-4", 0, 1)["spec"]["resourceClaims"][0][
        "resourceClaimTemplateName"] == "vfs-1"


def test_the_nodes_slices_carry_every_gpu_and_vf_with_its_switch():
    kinds = [k for k, _ in FACTS.values()]
    assert kinds.count("gpu") == 8
    assert kinds.count("vf") == 8 * dra_mode.VFS_PER_PF
    for g in GPUS:
        assert FACTS[device_name(g.pci_address)] == ("gpu", g.switch)
        assert FACTS[device_name(VF_UNDER[g.pci_address].pci_address)][1] == g.switch


def allocated(pairs: list[tuple[str, str]], driver: str = DRIVER) -> dict:
    """A claim as kube-scheduler leaves it: per pair the NIC's result, then the GPU's."""
    results = []
    for k, (gpu, vf) in enumerate(pairs):
        results.append({"request": f"nic-{k}/switch", "driver": driver,
                        "pool": "kwok-node-0", "device": device_name(vf)})
        results.append({"request": f"gpu-{k}", "driver": driver, "pool": "kwok-node-0",
                        "device": device_name(gpu)})
    return {"status": {"allocation": {"devices": {"results": results}}}}


def pair(gpu_index: int, vf_of: int | None = None) -> tuple[str, str]:
    """GPU `gpu_index` with the VF under the switch of GPU `vf_of` (its own by default)."""
    gpu = GPUS[gpu_index].pci_address
    return gpu, VF_UNDER[GPUS[gpu_index if vf_of is None else vf_of].pci_address].pci_address


def test_a_claim_whose_every_pair_shares_a_switch_counts_as_aligned():
    claim = allocated([pair(0), pair(3), pair(5)])
    assert dra_mode.switch_aligned(FACTS, [claim]) == {"switchAlignedShare": 1.0,
                                                      "switchAlignedPods": 1}


def test_a_claim_with_one_pair_across_switches_does_not_count():
    crossed = allocated([pair(0), pair(1, vf_of=2)])
    aligned = allocated([pair(4), pair(6)])
    assert dra_mode.switch_aligned(FACTS, [crossed, aligned]) == {
        "switchAlignedShare": 0.5, "switchAlignedPods": 1}


def test_pairs_are_read_in_result_order_not_as_any_matching():
    # GPU 0 with GPU 1's VF and GPU 1 with GPU 0's: a one-to-one matching under switches
    # exists, but the kubelet plugin pairs the k-th GPU with the k-th NIC (decision 0109).
    swapped = allocated([pair(0, vf_of=1), pair(1, vf_of=0)])
    assert dra_mode.switch_aligned(FACTS, [swapped])["switchAlignedPods"] == 0


def test_single_gpu_unallocated_and_other_drivers_claims_are_not_counted():
    single = allocated([pair(2)])
    pending: dict = {"metadata": {"name": "p-9-devices"}, "status": {}}
    other = allocated([pair(0), pair(1)], driver="gpu.nvidia.com")
    result = dra_mode.switch_aligned(FACTS, [single, pending, other])
    assert result["switchAlignedPods"] == 0
    assert result["switchAlignedShare"] != result["switchAlignedShare"]  # NaN: none counted


def test_a_gpu_left_without_a_nic_is_not_aligned():
    claim = allocated([pair(0), pair(1)])
    results = claim["status"]["allocation"]["devices"]["results"]
    del results[2]  # pair 1's VF
    assert dra_mode.switch_aligned(FACTS, [claim])["switchAlignedPods"] == 0


def test_claims_left_unallocated_are_counted_by_the_gpus_they_ask():
    templates = {t["metadata"]["name"]: t["spec"]["spec"] for t in
                 dra_mode.claim_templates([(8, 8), (1, 1), (0, 2)])}
    pending = [{"spec": templates[n], "status": {}} for n in ("pairs-8", "pairs-8", "vfs-2")]
    done = {**allocated([pair(0)]), "spec": templates["pairs-1"]}
    assert dra_mode.unallocated([*pending, done]) == {"unallocatedGpu0": 1,
                                                      "unallocatedGpu8": 2}
