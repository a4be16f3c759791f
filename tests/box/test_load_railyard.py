"""Load on the real cluster (issue 19): 200 pods of mixed shapes created at once, for the box's
real node (its kubelet, containerd and Railyard's agent) and three kwok nodes, all through the
real kube-scheduler and Railyard's extender. Afterwards exactly what fits runs, the rest is
Pending with kube-scheduler's reason, and no device is held twice by any account: the pods'
records, the extender's ledger, the real node's NodeTopology counts, kubelet's PodResources and
the agent's node state all agree."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import urllib.request
from collections import Counter
from collections.abc import Iterator

import pytest

from railyard.allocation.allocator import allocate
from railyard.allocation.ledger import Ledger
from railyard.allocation.request import request_from_pod
from railyard.allocation.types import Allocation, Infeasible
from railyard.discovery.profiles import build_topology, profile
from railyard.kubelet.podresources import PodResourcesClient
from railyard.node.state import StateStore
from railyard.records.allocation import decode_allocation
from railyard.records.nodetopology_cr import spec_from_resource, status_from_resource
from support.box import get, kubebox, namespace, publish_topologies, running_box, wait_for

pytestmark = [pytest.mark.root, pytest.mark.box, pytest.mark.slow]

ALLOCATION = "railyard.dev/allocation"
PODS = 200
KWOK_NODES = 3
# (weight, GPUs, VFs): training pods of 1 to 8 pairs and VF-only pods, as the scheduling
# benchmark draws them. The real node (8 GPUs, 16 VFs) takes a handful, far under kubelet's
# 110 pods; each kwok node a dgx-h100 with 8 VFs per PF (8 GPUs, 64 VFs). Far more is asked
# than the four nodes have, so most pods must stay Pending.
MIX = [(40, 1, 1), (20, 2, 2), (12, 4, 4), (13, 8, 8), (10, 0, 1), (5, 0, 2)]
KWOK_VFS_PER_PF = 8


@pytest.fixture(scope="module")
def load_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubebox.Box]:
    with running_box(tmp_path_factory.mktemp("railyard-load"), with_railyard=True,
                     kwok_nodes=KWOK_NODES) as running:
        yield running


def kwok_names() -> list[str]:
    return [f"kwok-node-{i}" for i in range(KWOK_NODES)]


def publish_kwok_topologies(box) -> None:
    """kwok nodes have no agent: their NodeTopology CRs are written as an agent would."""
    base = build_topology(profile("dgx-h100"), vfs_per_pf=KWOK_VFS_PER_PF, node="x")
    publish_topologies(box, (dataclasses.replace(base, node=name) for name in kwok_names()))


def shaped(name: str, gpus: int, vfs: int) -> dict:
    limits = {"railyard.dev/vf": str(vfs)}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            # Any node: the real one, or a kwok one (which runs nothing, so the image is
            # only pulled where a kubelet starts it: the box's own busybox).
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": kubebox.BUSYBOX_IMAGE,
                            "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                            "resources": {"limits": limits}}],
        },
    }


def extender_holdings(box) -> dict[str, dict]:
    url = f"http://{box.layout.node_ip}:{kubebox.EXTENDER_PORT}/allocations"
    with urllib.request.urlopen(url, timeout=10) as response:
        return {p["uid"]: p for p in json.loads(response.read())["pods"]}


def scheduling_said(box, ns: str) -> dict[str, str]:
    """kube-scheduler's FailedScheduling messages, by pod name."""
    said: dict[str, str] = {}
    for e in get(box, "events", "-n", ns, "--field-selector", "reason=FailedScheduling")["items"]:
        said[e["involvedObject"]["name"]] = e["message"]
    return said


def settled(box, ns: str) -> tuple[list[dict], list[dict]] | None:
    """(bound, pending) once every pod is either Running on its node or Pending with
    kube-scheduler's reason; None before."""
    pods = get(box, "pods", "-n", ns)["items"]
    if len(pods) != PODS:
        return None
    said = scheduling_said(box, ns)
    bound = [p for p in pods if p["spec"].get("nodeName")]
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    if any(p["status"].get("phase") != "Running" for p in bound):
        return None
    if any(p["metadata"]["name"] not in said for p in pending):
        return None
    return bound, pending


def test_200_pods_at_once_run_what_fits_and_hold_no_device_twice(load_box):
    box = load_box
    publish_kwok_topologies(box)
    wait_for("the extender to know every node", lambda: len(get(
        box, "nodetopologies")["items"]) == KWOK_NODES + 1, timeout=60)
    ns = namespace(box)
    rng = random.Random(19)
    shapes = rng.choices([(g, v) for _, g, v in MIX], weights=[w for w, *_ in MIX], k=PODS)
    items = [shaped(f"p{i:03d}", g, v) for i, (g, v) in enumerate(shapes)]
    box.kubectl("apply", "-n", ns, "-f", "-",
                input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    # Settled twice in a row, 10 s apart: nothing bound, started or refused meanwhile.
    last: list[object] = [None]

    def steady() -> tuple[list[dict], list[dict]] | None:
        now = settled(box, ns)
        names = None if now is None else sorted(p["metadata"]["name"] for p in now[0])
        if now is not None and names == last[0]:
            return now
        last[0] = names
        return None

    bound, pending = wait_for("200 pods to run or be refused", steady, timeout=420, every=10)
    nodes = {kubebox.NODE_NAME, *kwok_names()}
    by_node: dict[str, list[tuple[dict, Allocation]]] = {n: [] for n in nodes}
    for p in bound:
        alloc = decode_allocation(p["metadata"]["annotations"][ALLOCATION])
        node = p["spec"]["nodeName"]
        assert alloc.node == node, (p["metadata"]["name"], alloc.node, node)
        request = request_from_pod(p)
        assert (len(alloc.all_gpus), len(alloc.vfs)) == (request.gpus, request.vfs)
        by_node[node].append((p, alloc))
    real = by_node[kubebox.NODE_NAME]
    assert real and all(by_node[n] for n in kwok_names()), {n: len(v) for n, v in by_node.items()}
    assert pending, "the pods ask for more than the nodes have: some must be Pending"

    # One ledger per node: adding a record whose device another pod holds raises.
    topologies = {t["metadata"]["name"]: spec_from_resource(t)
                  for t in get(box, "nodetopologies")["items"]}
    ledgers = {n: Ledger(topologies[n], [(p["metadata"]["uid"], a) for p, a in held])
               for n, held in by_node.items()}

    # Exactly what fits runs: no Pending pod fits on any node beside what is held.
    for p in pending:
        request = request_from_pod(p)
        for n, ledger in ledgers.items():
            got = allocate(topologies[n], ledger, request)
            assert isinstance(got, Infeasible), (
                f"{p['metadata']['name']} ({request.gpus} GPUs, {request.vfs} VFs) is Pending "
                f"but fits on {n}: {got}")

    # The extender's ledger holds exactly the pods' records.
    holdings = extender_holdings(box)
    mine = {p["metadata"]["uid"]: (node, a) for node, held in by_node.items() for p, a in held}
    ours = {uid: h for uid, h in holdings.items() if uid in mine or h["namespace"] == ns}
    assert set(ours) == set(mine)
    for uid, h in ours.items():
        node, alloc = mine[uid]
        assert h["node"] == node
        assert decode_allocation(json.dumps(h["allocation"])).pairs == alloc.pairs

    # The real node: its NodeTopology counts, kubelet's PodResources and the agent's state.
    gpus = sum(len(a.all_gpus) for _, a in real)
    vfs = sum(len(a.vfs) for _, a in real)
    status = wait_for("the agent's counts in the NodeTopology", lambda: (
        s := status_from_resource(get(box, "nodetopologies", kubebox.NODE_NAME))) and (
        s.gpus.held, s.vfs.held) == (gpus, vfs) and s, timeout=60)
    assert status.vfs.free == status.vfs.total - vfs

    socket = str(box.layout.kubelet_dir / "pod-resources/kubelet.sock")
    assigned = {(a.namespace, a.name): a
                for a in asyncio.run(PodResourcesClient(socket).list()) if a.namespace == ns}
    owners: Counter[str] = Counter()
    for p, alloc in real:
        a = assigned[(ns, p["metadata"]["name"])]
        assert set(a.ids("railyard.dev/vf")) == {v.pci_address for v in alloc.vfs}
        assert set(a.ids("nvidia.com/gpu")) == {g.device_id for g in alloc.all_gpus}
        owners.update([*a.ids("railyard.dev/vf"), *a.ids("nvidia.com/gpu")])
    assert not [i for i, n in owners.items() if n > 1]
    store = {r.uid: r for r in StateStore(box.layout.dir / "railyard-state").all()}
    for p, alloc in real:
        record = store[p["metadata"]["uid"]]
        assert record.allocation.pairs == alloc.pairs, p["metadata"]["name"]
