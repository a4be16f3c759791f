"""What an admission says (docs/observability.md): one logfmt line per Allocate — the pod, its
devices, whether the record was followed or the node decided and why — and the agent's
metrics: admissions by outcome, kubelet's call latency, node-truth corrections, device gauges."""

from __future__ import annotations

import logging

import grpc
import pytest

from support.agent import GPU, VF, allocation, async_test, pod, rig, topology

TOPO = topology()
G0, G1 = (g.device_id for g in TOPO.gpus)
VFS0 = [v.pci_address for v in TOPO.nics[0].vfs]
VFS1 = [v.pci_address for v in TOPO.nics[1].vfs]
LOGGER = "railyard.kubelet.admission"


def _lines(caplog: pytest.LogCaptureFixture, decision: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith(f"decision={decision} ")]


def _value(r, name: str, **labels: str) -> float:
    return r.agent.metrics.registry.get_sample_value(name, {"node": "node-a", **labels}) or 0.0


@async_test
async def test_an_allocate_that_follows_the_record_says_so_once_and_counts(tmp_path,
                                                                           generic_tree,
                                                                           caplog):
    caplog.set_level(logging.INFO)
    alloc = allocation(TOPO, [(0, VFS0[1]), (1, VFS1[1])])
    async with rig(tmp_path, generic_tree, [pod("uid-a", {"main": {GPU: 2, VF: 2}},
                                                 alloc=alloc, name="trainer")]) as r:
        for res, avail in ((GPU, [G1, G0]), (VF, VFS1 + VFS0)):
            c = r.kubelet.client(res)
            await c.allocate(await c.preferred(avail, 2))
            await c.close()
        lines = _lines(caplog, "admit")
        assert len(lines) == 2
        vf_line = lines[1]
        assert vf_line.startswith(f"decision=admit outcome=record pod=team/trainer uid=uid-a "
                                  f"node=node-a container=main resource={VF} devices=")
        assert f"pairs={G0}>{VFS0[1]}:" in vf_line and "decidedBy=scheduler" in vf_line
        assert "why=" not in vf_line
        assert _value(r, "railyard_agent_admissions_total", resource=VF,
                      outcome="record") == 1
        assert _value(r, "railyard_agent_kubelet_request_duration_seconds_count",
                      method="Allocate", resource=VF) == 1
        assert _value(r, "railyard_agent_kubelet_request_duration_seconds_count",
                      method="GetPreferredAllocation", resource=GPU) == 1
        # The device gauges read the status the NodeTopology reports: 2 GPUs held.
        assert _value(r, "railyard_agent_devices", kind="gpu", state="held") == 2
        assert _value(r, "railyard_agent_devices", kind="gpu", state="free") == 0


@async_test
async def test_kubelet_giving_other_devices_is_a_node_decision_with_its_reason(tmp_path,
                                                                                generic_tree,
                                                                                caplog):
    caplog.set_level(logging.INFO)
    alloc = allocation(TOPO, [(0, VFS0[1]), (1, VFS1[1])])
    async with rig(tmp_path, generic_tree,
                   [pod("uid-a", {"main": {VF: 2}}, alloc=alloc)]) as r:
        vf = r.kubelet.client(VF)
        await vf.allocate([VFS0[2], VFS1[2]])  # not what the record says
        await vf.close()
        [line] = _lines(caplog, "admit")
        assert "outcome=node" in line and "decidedBy=node" in line
        assert 'why="' in line and "not the recorded" in line
        assert _value(r, "railyard_agent_admissions_total", resource=VF, outcome="node") == 1


@async_test
async def test_a_pod_without_a_record_is_decided_by_the_node(tmp_path, generic_tree, caplog):
    caplog.set_level(logging.INFO)
    async with rig(tmp_path, generic_tree, [pod("uid-a", {"main": {VF: 1}})]) as r:
        vf = r.kubelet.client(VF)
        await vf.allocate(await vf.preferred(VFS0, 1))
        await vf.close()
        [line] = _lines(caplog, "admit")
        assert "outcome=node" in line and 'why="no recorded allocation' in line


@async_test
async def test_unmatched_and_refused_allocates_are_counted_apart(tmp_path, generic_tree,
                                                                 caplog):
    caplog.set_level(logging.INFO)
    async with rig(tmp_path, generic_tree, []) as r:
        vf = r.kubelet.client(VF)
        await vf.allocate([VFS0[0]])  # no pod asks: answered for the devices alone
        with pytest.raises(grpc.aio.AioRpcError):
            await vf.allocate(["0000:ff:00.0"])  # never offered
        await vf.close()
        unmatched, refused = _lines(caplog, "admit")
        assert "outcome=unmatched" in unmatched and f"devices={VFS0[0]}" in unmatched
        assert "outcome=refused" in refused and "unknown device IDs" in refused
        for outcome in ("unmatched", "refused"):
            assert _value(r, "railyard_agent_admissions_total", resource=VF,
                          outcome=outcome) == 1


@async_test
async def test_the_podresources_check_rewriting_a_record_is_a_correction(tmp_path,
                                                                         generic_tree,
                                                                         caplog):
    caplog.set_level(logging.INFO)
    alloc = allocation(TOPO, [(0, VFS0[1])])
    p = pod("uid-a", {"main": {VF: 1}}, alloc=alloc, name="p")
    async with rig(tmp_path, generic_tree, [p],
                   assigned={("team", "p", "main", VF): [VFS0[3]]}) as r:
        await r.agent.verify()
        [line] = _lines(caplog, "correct")
        assert line.startswith("decision=correct pod=team/p uid=uid-a node=node-a "
                               "decidedBy=node")
        assert _value(r, "railyard_agent_node_truth_corrections_total") == 1
