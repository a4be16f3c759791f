"""`railyard explain POD` against a stand-in API server answering recorded objects in the real
wire format (v1 Pod, v1 EventList filtered by fieldSelector, NodeTopology CRs), run as a
process with --kubeconfig, as an operator runs it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from railyard.kube.nodetopology import COLLECTION, path_of
from railyard.kubelet.report import node_status
from railyard.records.nodetopology_cr import node_topology_resource, status_to_json
from support.allocations import allocation, h100, nearest_vf, vf
from support.http import serve_app
from support.pods import pod

CMD = [sys.executable, "-m", "railyard.cli.main", "explain"]
TOPO = h100(node="gpu-1")
NOW = "2026-03-01T10:00:00Z"


def event(uid: str, name: str, reason: str, message: str, *, type_: str = "Normal",
          component: str = "default-scheduler", count: int = 1, at: str = NOW) -> dict:
    """A core v1 Event about pod `name` (uid), as kube-scheduler or Railyard writes one."""
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name}.{reason.lower()}", "namespace": "ml"},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "ml",
                               "name": name, "uid": uid},
            "reason": reason, "message": message, "type": type_, "count": count,
            "source": {"component": component}, "firstTimestamp": at, "lastTimestamp": at,
            "reportingComponent": component if component.startswith("railyard") else ""}


def node_topology(unhealthy: dict[str, str] | None = None) -> dict:
    obj = node_topology_resource(TOPO, "node-uid")
    obj["metadata"]["resourceVersion"] = "7"
    obj["status"] = status_to_json(node_status(TOPO, [], unhealthy or {}, NOW))
    return obj


class ApiServer:
    """Answers GETs from `objects` by path; lists are v1 List objects of matching items."""

    def __init__(self, pods: list[dict], events: list[dict], topologies: list[dict]) -> None:
        self.pods = {f"/api/v1/namespaces/{p['metadata']['namespace']}/pods/"
                     f"{p['metadata']['name']}": p for p in pods}
        self.events = events
        self.topologies = {path_of(t["metadata"]["name"]): t for t in topologies}
        self.selectors: list[str] = []

    async def get(self, request: web.Request) -> web.Response:
        path = request.path
        if path in self.pods:
            return web.json_response(self.pods[path])
        if path in self.topologies:
            return web.json_response(self.topologies[path])
        if path == COLLECTION:
            return _list("NodeTopologyList", list(self.topologies.values()))
        if path.endswith("/events"):
            selector = request.query.get("fieldSelector", "")
            self.selectors.append(selector)
            want = dict(term.split("=", 1) for term in selector.split(",") if term)
            items = [e for e in self.events
                     if all(_field(e, k) == v for k, v in want.items())]
            return _list("EventList", items)
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
             "reason": "NotFound", "message": f"{path} not found"}, status=404)


def _field(obj: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj.get(part, {})
    return obj


def _list(kind: str, items: list[dict]) -> web.Response:
    return web.json_response({"kind": kind, "apiVersion": "v1",
                              "metadata": {"resourceVersion": "42"}, "items": items})


def explain(tmp_path: Path, server: ApiServer, *args: str) -> tuple[int, str, str]:
    async def main() -> tuple[int, str, str]:
        app = web.Application()
        app.router.add_get("/{tail:.*}", server.get)
        runner, url = await serve_app(app)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: box
  cluster: {{server: "{url}"}}
users:
- name: operator
  user: {{token: operator-token}}
contexts:
- name: box
  context: {{cluster: box, user: operator, namespace: ml}}
current-context: box
""")
        try:
            proc = await asyncio.create_subprocess_exec(
                *CMD, *args, "--kubeconfig", str(kubeconfig),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode is not None
            return proc.returncode, out.decode(), err.decode()
        finally:
            await runner.cleanup()
    return asyncio.run(main())


def test_a_running_pod_shows_its_record_pairs_distances_and_its_nodes_health(tmp_path):
    alloc = allocation(TOPO, [(0, nearest_vf(TOPO, 0)), (1, nearest_vf(TOPO, 1))])
    p = pod("uid-1", {"main": {"nvidia.com/gpu": 2, "railyard.dev/vf": 2}}, name="trainer",
            namespace="ml", node="gpu-1", phase="Running", alloc=alloc)
    server = ApiServer([p], [
        event("uid-1", "trainer", "Scheduled", "Successfully assigned ml/trainer to gpu-1"),
        event("other", "someone-else", "FailedScheduling", "not about this pod")],
        [node_topology()])
    code, out, err = explain(tmp_path, server, "ml/trainer")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == ("pod ml/trainer (uid uid-1): Running, on node gpu-1, scheduler "
                        "default-scheduler")
    assert lines[1] == "asks for nvidia.com/gpu=2, railyard.dev/vf=2"
    assert lines[2].startswith("record: decided by the extender (decidedBy: scheduler) at "
                               "2026-01-01T00:00:00Z, node gpu-1")
    g0, g1 = TOPO.gpus[0], TOPO.gpus[1]
    assert lines[3].startswith(f"  pair 0: GPU 0 ({g0.pci_address}) <-> VF "
                               f"{nearest_vf(TOPO, 0)}")
    assert lines[3].endswith(alloc.pairs[0].distance.name)
    assert lines[4].startswith(f"  pair 1: GPU 1 ({g1.pci_address}) <-> VF")
    assert lines[5].startswith("  worst pair distance ")
    assert lines[6].startswith("node gpu-1: GPUs 8/8 free") and lines[6].endswith("Healthy")
    assert "kube-scheduler: Successfully assigned ml/trainer to gpu-1" in lines
    assert "not about this pod" not in out  # the Events asked for are this pod's, by uid
    assert server.selectors == ["involvedObject.uid=uid-1"]


def test_the_nodes_truth_and_railyards_events_are_shown(tmp_path):
    alloc = allocation(TOPO, [(0, vf(TOPO, 0, 1))], decided_by="node")
    gpu0 = TOPO.gpus[0].pci_address
    p = pod("uid-2", {"main": {"nvidia.com/gpu": 1, "railyard.dev/vf": 1}}, name="p",
            namespace="ml", node="gpu-1", phase="Running", alloc=alloc)
    rewritten = event("uid-2", "p", "RailyardNodeDecided",
                      "kubelet gave other devices than the record; node's truth recorded",
                      type_="Warning", component="railyard-agent")
    server = ApiServer([p], [rewritten], [node_topology({gpu0: "GPU lost"})])
    code, out, err = explain(tmp_path, server, "p")  # the context's namespace: ml
    assert code == 0, err
    assert "record: decided by the node's agent (decidedBy: node)" in out
    assert f"Degraded: {gpu0} (GPU lost)" in out
    assert f"  the record names unhealthy devices: ['{gpu0}']" in out
    assert ("Warning RailyardNodeDecided (railyard-agent): kubelet gave other devices than "
            "the record") in out


def test_a_pending_pod_shows_the_extenders_reasons_and_every_nodes_state(tmp_path):
    p = pod("uid-3", {"main": {"nvidia.com/gpu": 8, "railyard.dev/vf": 8}}, name="big",
            namespace="ml", phase="Pending", scheduler_name="railyard")
    p["status"]["conditions"] = [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 Railyard: 8 GPUs and 8 VFs not free on gpu-1."}]
    failed = event("uid-3", "big", "FailedScheduling",
                   "0/1 nodes are available: 1 Railyard: 8 GPUs and 8 VFs not free on gpu-1.",
                   type_="Warning", count=4)
    code, out, err = explain(tmp_path, ApiServer([p], [failed], [node_topology()]), "ml/big")
    assert code == 0, err
    assert "Pending, on no node yet, scheduler railyard" in out
    assert "record: none (railyard.dev/allocation is not set)\n" in out
    assert ("not scheduled: Unschedulable: 0/1 nodes are available: 1 Railyard: 8 GPUs and "
            "8 VFs not free on gpu-1.") in out
    assert "1 node(s) publish a NodeTopology:\n  gpu-1: GPUs 8/8 free" in out
    assert (f"  {NOW} FailedScheduling (x4): 0/1 nodes are available: 1 Railyard: 8 GPUs "
            "and 8 VFs not free on gpu-1.") in out


@pytest.mark.parametrize(("args", "code", "message"), [
    (["ml/ghost"], 1, "railyard: error: pod ml/ghost not found"),
    (["a/b/c"], 2, "railyard: error: POD 'a/b/c': expected NAMESPACE/NAME or NAME"),
])
def test_a_missing_pod_or_a_bad_name_is_one_line(tmp_path, args, code, message):
    rc, out, err = explain(tmp_path, ApiServer([], [], []), *args)
    assert (rc, out, err.strip()) == (code, "", message)
