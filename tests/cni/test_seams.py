"""The seams at the edge: kubelet's PodResources (a fake kubelet on a unix socket), device
locks that time out, and GC of in-use notes nobody holds."""

from __future__ import annotations

import fcntl
import os
from concurrent import futures
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

import railyard.cni.gc as gc_mod
from railyard.allocation.types import NicRef
from railyard.cni.grants import KubeletPodResources, confirm
from railyard.cni.spec import CniError, PodArgs
from railyard.kubelet.api import podresources_pb2 as pb
from railyard.kubelet.api import podresources_pb2_grpc as pb_grpc
from railyard.node.attachments import InUse
from railyard.records.dra_names import DRIVER, device_name
from support.cni import Node, add, links, run_shim


def vf_ref(pci: str) -> NicRef:
    return NicRef("vf", pci, "0000:18:00.0", 0, None, None)


class _FakeKubelet(pb_grpc.PodResourcesListerServicer):
    def List(self, request, context):
        pod = pb.PodResources(name="trainer-0", namespace="team-a", containers=[
            pb.ContainerResources(name="main", devices=[
                pb.ContainerDevices(resource_name="railyard.dev/vf",
                                    device_ids=["0000:18:00.1", "0000:18:00.2"]),
                pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-1"])])])
        other = pb.PodResources(name="other", namespace="team-a", containers=[
            pb.ContainerResources(name="main", devices=[
                pb.ContainerDevices(resource_name="railyard.dev/vf",
                                    device_ids=["0000:40:00.1"])])])
        dra = pb.PodResources(name="dra-0", namespace="team-a", containers=[
            pb.ContainerResources(name="main", dynamic_resources=[pb.DynamicResource(
                claim_name="pairs", claim_namespace="team-a", claim_resources=[
                    pb.ClaimResource(driver_name=DRIVER, pool_name="node-a",
                                     device_name=device_name("0000:18:00.3")),
                    pb.ClaimResource(driver_name="gpu.nvidia.com", pool_name="node-a",
                                     device_name=device_name("0000:40:00.4"))])])])
        return pb.ListPodResourcesResponse(pod_resources=[pod, other, dra])


def test_pod_resources_client_lists_one_pods_device_ids(tmp_path: Path):
    sock = tmp_path / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(_FakeKubelet(), server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        client = KubeletPodResources(str(sock))
        assert client.device_ids("team-a", "trainer-0") == {
            "0000:18:00.1", "0000:18:00.2", "GPU-1"}
        assert client.device_ids("team-a", "nobody") == frozenset()
        # A DRA pod: the devices of Railyard's driver in its claims, not another driver's.
        dra = client.device_ids("team-a", "dra-0")
        assert dra == {device_name("0000:18:00.3")}
        pod = PodArgs(uid="u", namespace="team-a", name="dra-0")
        confirm((vf_ref("0000:18:00.3"),), pod, client)
        with pytest.raises(CniError, match=r"0000:40:00\.4"):  # another driver's device
            confirm((vf_ref("0000:40:00.4"),), pod, client)
    finally:
        server.stop(None)
    assert KubeletPodResources(str(tmp_path / "absent.sock")).device_ids("a", "b") is None


@pytest.mark.root
def test_a_device_whose_lock_is_held_answers_try_again(node: Node, shim, conf, service):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    service.server.plugin.settings = replace(service.server.plugin.settings, lock_timeout_s=0.3)
    lock = node.state_dir / "cni" / "locks" / f"{nic.pci_address}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = run_shim(shim, "ADD", conf(), container_id=pod.container_id, netns=pod.netns_path,
                     args=pod.args())
        assert r.error == 11 and nic.pci_address in r.out["msg"]
        assert links(pod.netns) == {}
    finally:
        os.close(fd)
    r = run_shim(shim, "ADD", conf(), container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args())
    assert r.code == 0, r.out


@pytest.mark.root
def test_gc_drops_in_use_notes_that_protect_nothing(node: Node, shim, conf, service):
    store = service.server.plugin.store
    stale = InUse(network="rdma", container_id="gone", ifname="net1",
                  netns="/run/netns/ry-gone", netns_id=(1, 2))
    other_net = InUse(network="another", container_id="gone", ifname="net1",
                      netns="/run/netns/ry-gone", netns_id=(1, 2))
    store.mark_in_use("0000:aa:00.1", stale)
    store.mark_in_use("0000:aa:00.2", other_net)
    r = run_shim(shim, "GC", conf(cniVersion="1.1.0", **{"cni.dev/valid-attachments": []}))
    assert r.code == 0, r.out
    assert store.in_use("0000:aa:00.1") is None
    assert store.in_use("0000:aa:00.2") is not None  # another network's GC decides on it


@pytest.mark.root
def test_gc_keeps_the_in_use_note_an_add_wrote_after_gc_judged_the_old_one_stale(
        node: Node, shim, conf, service, monkeypatch):
    """Interleaving: GC reads the device's note and finds it stale (its attachment and its
    namespace are gone); before GC drops it, an ADD of a new pod takes the device's lock and
    notes the device for itself. GC must leave the new note: it is not the one GC judged."""
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    store = service.server.plugin.store
    stale = InUse(network="rdma", container_id="gone", ifname="net1",
                  netns="/run/netns/ry-gone", netns_id=(1, 2))
    store.mark_in_use(nic.pci_address, stale)
    real, added = gc_mod.netns_identity, []

    def identity_while_an_add_runs(path):
        if path == stale.netns and not added:
            added.append(add(shim, pod, conf()))  # served on another thread of the service
        return real(path)

    monkeypatch.setattr(gc_mod, "netns_identity", identity_while_an_add_runs)
    r = run_shim(shim, "GC", conf(cniVersion="1.1.0", **{"cni.dev/valid-attachments": [
        {"containerID": pod.container_id, "ifname": "net1"}]}))
    assert r.code == 0, r.out
    assert added and added[0].code == 0, added[0].out
    note = store.in_use(nic.pci_address)
    assert note is not None and note.container_id == pod.container_id
    assert set(links(pod.netns)) == {"net1"}
