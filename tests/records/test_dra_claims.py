"""The pair claim template: its shape, the API server's limits, and the contract with the
kubelet plugin (the k-th GPU result pairs with the k-th NIC result, decision 0109)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.discovery.profiles import PROFILES, build_topology
from railyard.kubelet.dra_claim import ClaimRef, DeviceNames, claim_to_allocation, read_claim
from railyard.kubelet.pairing import DeviceIndex
from railyard.records.dra_claims import (
    GPU_SOURCES,
    LEVELS,
    MAX_CONSTRAINT_REQUESTS,
    MAX_CONSTRAINTS,
    MAX_REQUESTS,
    MAX_SUBREQUESTS,
    NVIDIA_GPU_CLASS,
    PF_SPREADS,
    PairRequest,
    TemplateError,
    claim_template,
)
from railyard.records.dra_names import DRIVER, device_name
from railyard.topology.model import Distance

TOPO = build_topology(PROFILES["dgx-h100"], 2)
COMPUTE = [n for n in TOPO.nics if n.total_vfs]


def devices(template: dict) -> dict:
    return template["spec"]["spec"]["devices"]


def valid_options() -> st.SearchStrategy[PairRequest]:
    return st.builds(
        lambda level, gpus, nics, spread, n: PairRequest("pairs", n, level, gpus, nics, spread),
        st.sampled_from(LEVELS), st.sampled_from(GPU_SOURCES), st.sampled_from(("vf", "pf")),
        st.sampled_from(PF_SPREADS), st.integers(1, 16),
    ).filter(lambda r: not (r.gpus == "nvidia" and r.level == "switch"))


def test_two_pairs_ask_nic_then_gpu_per_pair_with_every_level_as_a_fallback():
    t = claim_template(PairRequest("train", 2))
    assert (t["apiVersion"], t["kind"], t["metadata"]) == (
        "resource.k8s.io/v1", "ResourceClaimTemplate", {"name": "train"})
    requests = devices(t)["requests"]
    assert [r["name"] for r in requests] == ["nic-0", "gpu-0", "nic-1", "gpu-1"]
    assert requests[1] == {"name": "gpu-0", "exactly": {"deviceClassName": "railyard-gpu"}}
    assert [s["name"] for s in requests[0]["firstAvailable"]] == [
        "switch", "switch-shared-pf", "root", "root-shared-pf", "numa", "numa-shared-pf"]
    assert {s["deviceClassName"] for s in requests[0]["firstAvailable"]} == {"railyard-vf"}
    constraints = devices(t)["constraints"]
    assert constraints[:3] == [
        {"requests": ["gpu-0", "nic-0/switch", "nic-0/switch-shared-pf"],
         "matchAttribute": "railyard.dev/pcieSwitch"},
        {"requests": ["gpu-0", "nic-0/root", "nic-0/root-shared-pf"],
         "matchAttribute": "resource.kubernetes.io/pcieRoot"},
        {"requests": ["gpu-0", "nic-0/numa", "nic-0/numa-shared-pf"],
         "matchAttribute": "resource.kubernetes.io/numaNode"}]
    # Only the own-PF subrequests are held apart: a shared-PF one is the fallback.
    assert constraints[-1] == {"requests": ["nic-0/switch", "nic-0/root", "nic-0/numa",
                                            "nic-1/switch", "nic-1/root", "nic-1/numa"],
                               "distinctAttribute": "railyard.dev/pf"}
    assert len(constraints) == 7


def test_one_level_needs_no_subrequests_and_a_required_spread_names_the_requests():
    t = claim_template(PairRequest("t", 3, level="switch", pf_spread="required",
                                   namespace="ml"))
    assert t["metadata"] == {"name": "t", "namespace": "ml"}
    assert all("exactly" in r for r in devices(t)["requests"])
    assert devices(t)["constraints"] == [
        *({"requests": [f"gpu-{i}", f"nic-{i}"], "matchAttribute": "railyard.dev/pcieSwitch"}
          for i in range(3)),
        {"requests": ["nic-0", "nic-1", "nic-2"], "distinctAttribute": "railyard.dev/pf"}]


def test_nvidia_gpus_pair_by_pcie_root_in_their_own_device_class():
    t = claim_template(PairRequest("t", 2, level="root", gpus="nvidia", pf_spread="none"))
    gpu = devices(t)["requests"][1]
    assert gpu == {"name": "gpu-0", "exactly": {"deviceClassName": NVIDIA_GPU_CLASS}}
    assert [c["matchAttribute"] for c in devices(t)["constraints"]] == [
        "resource.kubernetes.io/pcieRoot"] * 2
    with pytest.raises(TemplateError, match="--level root"):
        claim_template(PairRequest("t", 2, level="switch", gpus="nvidia"))


def test_whole_pfs_are_their_own_pf_so_no_spread_rule_is_written():
    t = claim_template(PairRequest("t", 4, nics="pf"))
    assert {s["deviceClassName"] for s in devices(t)["requests"][0]["firstAvailable"]} == {
        "railyard-pf"}
    assert all("distinctAttribute" not in c for c in devices(t)["constraints"])
    assert [s["name"] for s in devices(t)["requests"][0]["firstAvailable"]] == list(LEVELS)


@given(valid_options())
def test_every_template_within_its_limit_keeps_the_api_servers_limits(req):
    try:
        t = claim_template(req)
    except TemplateError as e:
        assert "--pairs" in str(e)
        return
    d = devices(t)
    names = {r["name"]: {s["name"] for s in r.get("firstAvailable", ())} for r in d["requests"]}
    assert len(d["requests"]) == 2 * req.pairs <= MAX_REQUESTS
    assert len(d["constraints"]) <= MAX_CONSTRAINTS
    for r in d["requests"]:
        assert len(r.get("firstAvailable", ())) <= MAX_SUBREQUESTS
    for c in d["constraints"]:
        assert len(c["requests"]) <= MAX_CONSTRAINT_REQUESTS
        for ref in c["requests"]:  # as validation resolves `<request>[/<subrequest>]`
            base, _, sub = ref.partition("/")
            assert base in names and (not sub or sub in names[base]), ref
        gpus = [r for r in c["requests"] if r.startswith("gpu-")]
        if "matchAttribute" in c:  # one pair per closeness constraint, never two
            assert len(gpus) == 1 and {r.split("/")[0] for r in c["requests"]} == {
                gpus[0], "nic-" + gpus[0][4:]}


@pytest.mark.parametrize("level, spread, most", [
    ("switch", "preferred", 16), ("root", "preferred", 15), ("numa", "preferred", 10),
    ("numa", "none", 10), ("switch", "none", 16)])
def test_the_pair_limit_follows_from_the_claim_limits(level, spread, most):
    claim_template(PairRequest("t", most, level=level, pf_spread=spread))
    with pytest.raises(TemplateError, match=f"--pairs {most + 1}: between 1 and {most}"):
        claim_template(PairRequest("t", most + 1, level=level, pf_spread=spread))


@pytest.mark.parametrize("req, words", [
    (PairRequest("t", 0), "--pairs 0"),
    (PairRequest("Train", 1), "--name 'Train'"),
    (PairRequest("a" * 254, 1), "DNS subdomain"),
    (PairRequest("t", 1, namespace="a.b"), "--namespace"),
    (PairRequest("t", 1, level="pix"), "--level 'pix': expected one of switch, root, numa"),
    (PairRequest("t", 1, gpus="amd"), "--gpus"),
    (PairRequest("t", 1, nics="nic"), "--nics"),
])
def test_bad_options_are_refused_naming_the_option(req, words):
    with pytest.raises(TemplateError) as e:
        claim_template(req)
    assert words in str(e.value)


def scheduler_results(template: dict, choose) -> list[dict]:
    """Results in the order kube-scheduler writes them: request order, a chosen subrequest as
    `<request>/<subrequest>`; `choose(request, pair)` names the device and subrequest."""
    results = []
    for r in devices(template)["requests"]:
        pair = int(r["name"].split("-")[1])
        device, sub = choose(r["name"].split("-")[0], pair)
        name = f"{r['name']}/{sub}" if "firstAvailable" in r else r["name"]
        results.append({"request": name, "driver": DRIVER, "pool": TOPO.node,
                        "device": device_name(device)})
    return results


@pytest.mark.parametrize("pairs", [1, 2, 8])
def test_a_claim_allocated_from_the_template_pairs_each_gpu_with_its_own_nic(pairs):
    # GPU k with a VF of the compute NIC under its switch (dgx-h100: one per GPU), as the
    # switch subrequest would find it; pairs in reverse GPU order, so order is not luck.
    gpus = list(reversed(TOPO.gpus))[:pairs]
    near = {g.pci_address: next(n for n in COMPUTE
                                if TOPO.gpu_nic_distance(g.pci_address, n.pci_address)
                                == Distance.PIX) for g in gpus}

    def choose(kind: str, k: int) -> tuple[str, str]:
        g = gpus[k]
        return (g.pci_address, "") if kind == "gpu" else (near[g.pci_address].vfs[0].pci_address,
                                                        "switch")

    t = claim_template(PairRequest("t", pairs))
    doc = {"metadata": {"uid": "c-1", "name": "t-abc", "namespace": "ns"},
           "status": {"allocation": {"devices": {"results": scheduler_results(t, choose)}},
                      "reservedFor": [{"resource": "pods", "name": "p",
                                       "uid": "0f0e0d0c-0000-4000-8000-000000000001"}]}}
    claim = read_claim(doc, ClaimRef("ns", "c-1", "t-abc"), TOPO.node)
    alloc = claim_to_allocation(claim, DeviceNames(DeviceIndex(TOPO)), decided_at="t")
    assert [(p.gpu.pci_address, p.nic.pci_address) for p in alloc.pairs] == [
        (g.pci_address, near[g.pci_address].vfs[0].pci_address) for g in gpus]
    assert {p.distance for p in alloc.pairs} == {Distance.PIX}
    assert alloc.nics == () and alloc.gpus == ()
