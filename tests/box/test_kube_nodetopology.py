"""The NodeTopology CRD (deploy/crds/) on the box's real kube-apiserver: it installs, the
server enforces its schema, a CR from a fixture tree round-trips through Railyard's codec and
client, is written only when it changed, is removed with its Node, and `kubectl get` shows the
columns."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
from pathlib import Path

import pytest

from railyard.discovery.discover import discover
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import DGX_H100, HGX_H100_4NIC
from railyard.kube.client import Client
from railyard.kube.config import load_kubeconfig
from railyard.kube.nodetopology import Published, path_of, publish
from railyard.kube.objects import NodeTopologyObject
from railyard.records.nodetopology_cr import (
    DeviceCounts,
    NodeTopologyStatus,
    UnhealthyDevice,
    node_topology_resource,
    spec_from_resource,
    status_from_resource,
    status_to_json,
)
from railyard.topology.model import NodeTopology
from support.box import install_topology_crd, wait_for

pytestmark = [pytest.mark.root, pytest.mark.box]



@pytest.fixture(scope="module")
def crd(box):
    install_topology_crd(box)
    return box


def make_node(box, name: str) -> str:
    """A Node object no kubelet serves (the NodeTopology's owner); its uid."""
    box.kubectl("create", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
    return box.kubectl("get", "node", name, "-o", "jsonpath={.metadata.uid}")


def fixture_topology(tmp_path: Path, profile, node: str) -> NodeTopology:
    return discover(write_fixture(profile, tmp_path / node, 2, node=node)).topology


def status_for(t: NodeTopology, unhealthy: tuple[UnhealthyDevice, ...] = ()) -> NodeTopologyStatus:
    vfs = sum(len(n.vfs) for n in t.nics)
    return NodeTopologyStatus(
        gpus=DeviceCounts(len(t.gpus), len(t.gpus) - 2, 2),
        nics=DeviceCounts(len(t.nics), len(t.nics), 0),
        vfs=DeviceCounts(vfs, vfs - 2 - len(unhealthy), 2), unhealthy=unhealthy)


def publish_now(box, topology: NodeTopology, status: NodeTopologyStatus | None = None) -> None:
    async def go() -> None:
        async with Client(load_kubeconfig(box.layout.admin_kubeconfig)) as client:
            await publish(client, topology, status)

    asyncio.run(go())


def apply(box, obj: dict) -> subprocess.CompletedProcess:
    return subprocess.run([box.bin("kubectl"), "--kubeconfig", str(box.layout.admin_kubeconfig),
                           "create", "-f", "-"], input=json.dumps(obj), capture_output=True,
                          text=True)


def test_the_api_server_refuses_a_node_topology_that_breaks_the_schema(crd, tmp_path):
    good = node_topology_resource(fixture_topology(tmp_path, DGX_H100, "schema-node"), None)
    broken = []
    for change, says in [
        (lambda o: o["spec"]["nics"][0].update(pciAddress="18:00.0"), "pciAddress"),
        (lambda o: o["spec"]["distance"][next(iter(o["spec"]["distance"]))].update(
            {"0000:18:00.0": "FAR"}), "Unsupported value: \"FAR\""),
        (lambda o: o["spec"].update(version=2), "spec.version"),
        (lambda o: o["spec"]["gpus"][0].pop("pcieRoot"), "pcieRoot: Required value"),
        (lambda o: o["metadata"].update(name="another-node"), "named after its node"),
    ]:
        obj = copy.deepcopy(good)
        change(obj)
        result = apply(crd, obj)
        broken.append((says, result.returncode, result.stderr))
    for says, code, stderr in broken:
        assert code != 0 and says in stderr, (says, stderr)
    assert apply(crd, good).returncode == 0
    # The status goes through its subresource, with its own rules.
    bad_status = subprocess.run(
        [crd.bin("kubectl"), "--kubeconfig", str(crd.layout.admin_kubeconfig), "patch",
         "nodetopology", "schema-node", "--subresource=status", "--type=merge", "-p",
         json.dumps({"status": {"gpus": {"total": 1, "free": 1, "held": 1}}})],
        capture_output=True, text=True)
    assert bad_status.returncode != 0
    assert "free + held must not exceed total" in bad_status.stderr
    crd.kubectl("delete", "nodetopology", "schema-node")


@pytest.mark.parametrize("profile", [DGX_H100, HGX_H100_4NIC], ids=lambda p: p.hostname)
def test_a_node_topology_from_a_fixture_tree_round_trips_and_is_written_only_when_changed(
        crd, tmp_path, profile):
    node = f"ntopo-{profile.hostname}"
    uid = make_node(crd, node)
    topology = fixture_topology(tmp_path, profile, node)
    status = status_for(topology)

    async def scenario() -> None:
        async with Client(load_kubeconfig(crd.layout.admin_kubeconfig)) as client:
            assert await publish(client, topology, status) is Published.CREATED
            raw = json.loads(await client.request("GET", path_of(node)))
            assert spec_from_resource(raw) == topology
            assert status_from_resource(raw) == status
            assert raw["metadata"]["ownerReferences"] == [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]
            version = raw["metadata"]["resourceVersion"]

            assert await publish(client, topology, status) is Published.UNCHANGED
            again = await client.get(path_of(node), NodeTopologyObject)
            assert again.metadata.resource_version == version  # nothing written

            link_down = status_for(topology, (UnhealthyDevice(
                topology.nics[0].vfs[0].pci_address, "link down"),))
            assert await publish(client, topology, link_down) is Published.UPDATED
            after = await client.get(path_of(node), NodeTopologyObject)
            assert after.status == status_to_json(link_down)
            assert after.metadata.generation == 1  # a status write leaves the spec's alone

    asyncio.run(scenario())


def test_kubectl_get_nodetopologies_shows_gpus_nics_vfs_free_of_total_and_health(crd, tmp_path):
    node = "ntopo-columns"
    make_node(crd, node)
    topology = fixture_topology(tmp_path, DGX_H100, node)
    publish_now(crd, topology, status_for(topology, (UnhealthyDevice(
        topology.nics[0].pci_address, "link down"),)))
    header, row = crd.kubectl("get", "nodetopologies", node).splitlines()
    assert header.split() == ["NAME", "GPUS", "NICS", "VFS", "HEALTH", "AGE"]
    vfs = sum(len(n.vfs) for n in topology.nics)
    assert row.split()[:5] == [node, f"{len(topology.gpus) - 2}/{len(topology.gpus)}",
                               f"{len(topology.nics)}/{len(topology.nics)}",
                               f"{vfs - 3}/{vfs}", "Degraded"]


def test_a_node_topology_goes_with_its_node(crd, tmp_path):
    node = "ntopo-gone"
    make_node(crd, node)
    topology = fixture_topology(tmp_path, HGX_H100_4NIC, node)
    publish_now(crd, topology)
    crd.kubectl("delete", "node", node)
    wait_for("the garbage collector to delete the NodeTopology", lambda: crd.kubectl(
        "get", "nodetopologies", "-o", "name", check=False).count(f"/{node}\n") == 0, 60)
