"""Only PCI addresses granted to this pod on this node are ever moved: nothing in the network
config or CNI_ARGS can bring a host interface (here `ryeth0`, standing for eth0) or another
pod's VF into a pod."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from railyard.allocation.types import Allocation
from railyard.cni.service import build_plugin, start
from railyard.node.state import PodKey, StateStore
from support.cni import NODE, TOPOLOGY, Node, Pod, links, run_shim, standalone_env, vf_ref

pytestmark = pytest.mark.root

# The PF carrying the node's "default route": its netdev stands for eth0.
ETH0_PCI = TOPOLOGY.nics[1].pci_address


@pytest.fixture
def eth0(node: Node) -> str:
    name, _ = node.veth("ryeth0", "ryeth0peer")
    (node.sysfs / "sys/bus/pci/devices" / ETH0_PCI / "net" / name).mkdir(parents=True)
    return name


def add(shim, pod, conf, ifname="net1", args=None, **kw):
    return run_shim(shim, "ADD", conf, container_id=pod.container_id, netns=pod.netns_path,
                    ifname=ifname, args=pod.args() if args is None else args, **kw)


def test_device_keys_in_the_config_cannot_bring_a_host_interface_in(node: Node, shim, conf,
                                                                     eth0):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    c = conf(deviceID=ETH0_PCI, pciBusID=ETH0_PCI, device=eth0, master=eth0, hostInterface=eth0,
             runtimeConfig={"deviceID": ETH0_PCI}, capabilities={"deviceID": True},
             args={"cni": {"deviceID": ETH0_PCI, "K8S_POD_UID": "someone-else"}})
    r = add(shim, pod, c)
    assert r.code == 0, r.out
    assert [i["name"] for i in r.out["interfaces"]] == ["net1"]
    assert set(links(pod.netns)) == {"net1"}
    assert eth0 in node.snapshot()


def test_a_pod_with_no_grants_gets_nothing_whatever_its_config_names(node: Node, shim, conf,
                                                                     eth0):
    victim_nic = node.vfs(1)[0]
    node.pod([victim_nic])
    thief = node.pod([])
    c = conf(deviceID=victim_nic.pci_address, device=eth0,
             runtimeConfig={"deviceID": victim_nic.pci_address})
    r = add(shim, thief, c)
    assert r.code == 0 and r.out["interfaces"] == []
    assert links(thief.netns) == {}
    assert {eth0, node.netdev_of(victim_nic)} <= set(node.snapshot())


def test_another_pods_uid_in_cni_args_is_refused(node: Node, shim, conf):
    a_nic, b_nic = node.vfs(2)
    a, b = node.pod([a_nic]), node.pod([b_nic])
    before = node.snapshot()
    forged = (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={b.namespace};K8S_POD_NAME={b.name};"
              f"K8S_POD_UID={a.uid}")
    r = add(shim, b, conf(), args=forged)
    assert r.error == 4 and a.uid in r.out["msg"]
    assert node.snapshot() == before and links(b.netns) == {}


def test_a_uid_repeated_with_another_value_is_refused(node: Node, shim, conf):
    a_nic, b_nic = node.vfs(2)
    a, b = node.pod([a_nic]), node.pod([b_nic])
    r = add(shim, b, conf(), args=f"{b.args()};K8S_POD_UID={a.uid}")
    assert r.error == 4 and "K8S_POD_UID" in r.out["msg"]
    assert links(b.netns) == {}


def test_a_vf_in_use_by_a_live_pod_is_never_handed_to_another(node: Node, shim, conf):
    (nic,) = node.vfs(1)
    first = node.pod([nic])
    assert add(shim, first, conf()).code == 0
    # A wrong record grants the same VF to a second pod, and a new link takes the VF's old
    # name in the host: the in-use note still protects the first pod.
    second = node.pod([nic])
    node.veth(node.netdev_of(nic), None)
    r = add(shim, second, conf())
    assert r.error == 100 and first.container_id in r.out["msg"]
    assert set(links(first.netns)) == {"net1"}
    assert links(second.netns) == {}


def test_ifname_naming_a_host_interface_only_names_the_pods_own(node: Node, shim, conf, eth0):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    assert add(shim, pod, conf(), ifname=eth0).code == 0
    assert set(links(pod.netns)) == {eth0}
    assert links(pod.netns)[eth0]["mac"] != node.snapshot()[eth0]["mac"]
    assert eth0 in node.snapshot()


def forged_node(tmp: Path, pod, target_pci_for_pod: str) -> tuple[Path, Path]:
    """A state store granting the pod eth0's PF, and a sysfs pointing its VF at ryeth0."""
    from railyard.allocation.types import Allocation, NicRef

    store = StateStore(tmp / "forged-state")
    pf = NicRef.of_pf(TOPOLOGY.nics[1])
    store.put(PodKey(pod.uid, pod.namespace, pod.name),
              Allocation(node="node-a", numa_nodes=(0,), cpus=None, memory_bytes=(),
                         nics=(pf,)))
    sysfs = tmp / "forged-sysfs"
    (sysfs / "sys/bus/pci/devices" / target_pci_for_pod / "net" / "ryeth0").mkdir(parents=True)
    (sysfs / "sys/bus/pci/devices" / ETH0_PCI / "net" / "ryeth0").mkdir(parents=True)
    return store.root, sysfs


def test_agent_mode_ignores_state_and_sysfs_paths_in_the_config(node: Node, shim, conf, eth0,
                                                                tmp_path):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    state, sysfs = forged_node(tmp_path, pod, nic.pci_address)
    r = add(shim, pod, conf(stateDir=str(state), sysfsRoot=str(sysfs),
                            RAILYARD_CNI_SYSFS_ROOT=str(sysfs)))
    assert r.code == 0, r.out
    assert links(pod.netns)["net1"]["mac"] != node.snapshot()[eth0]["mac"]
    assert eth0 in node.snapshot()


def test_standalone_mode_takes_node_settings_only_from_the_runtime_environment(
        node: Node, shim, eth0, tmp_path):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    _, sysfs = forged_node(tmp_path, pod, nic.pci_address)
    c = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni", "standalone": True,
         "stateDir": str(node.state_dir), "sysfsRoot": str(sysfs), "hostNetns": "/proc/1/ns/net",
         "RAILYARD_CNI_SYSFS_ROOT": str(sysfs)}
    r = add(shim, pod, c, extra_env=standalone_env(node))
    assert r.code == 0, r.out
    assert eth0 in node.snapshot() and set(links(pod.netns)) == {"net1"}


def test_a_netns_path_that_is_not_a_network_namespace_is_refused(node: Node, shim, conf,
                                                                 tmp_path):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    before = node.snapshot()
    for bogus in (str(tmp_path / "plain-file"), "/proc/self/ns/mnt", "/run/netns/ry-nope"):
        Path(tmp_path / "plain-file").write_text("x")
        r = run_shim(shim, "ADD", conf(), container_id=pod.container_id, netns=bogus,
                     args=pod.args())
        assert r.error == 3, (bogus, r.out)
    assert node.snapshot() == before


class _Kubelet:
    def __init__(self, ids: frozenset[str] | None) -> None:
        self.ids = ids
        self.asked: list[tuple[str, str]] = []

    def device_ids(self, namespace: str, name: str) -> frozenset[str] | None:
        self.asked.append((namespace, name))
        return self.ids


@pytest.mark.parametrize("answer, ok", [(None, True), ("granted", True), ("other", False)])
def test_pod_resources_must_confirm_the_grant_when_kubelet_answers(node: Node, shim, tmp_path,
                                                                   answer, ok):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    ids = {None: None, "granted": frozenset({nic.pci_address, "GPU-1"}),
           "other": frozenset({vf_ref(5, 5).pci_address})}[answer]
    kubelet = _Kubelet(ids)
    plugin = build_plugin(str(node.state_dir), sysfs_root=str(node.sysfs),
                          host_netns=node.host_path, device_info_dir=str(node.devinfo),
                          pod_resources_socket=None, store=node.store)
    plugin.pod_devices = kubelet
    running = start(plugin, str(tmp_path / "k.sock"))
    try:
        c = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni",
             "agentSocket": running.socket_path}
        r = add(shim, pod, c)
    finally:
        running.stop()
    assert kubelet.asked == [(pod.namespace, pod.name)]
    if ok:
        assert r.code == 0 and set(links(pod.netns)) == {"net1"}
    else:
        assert r.error == 101 and nic.pci_address in r.out["msg"]
        assert links(pod.netns) == {}


def test_records_name_only_granted_devices(node: Node, shim, conf, eth0):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    assert add(shim, pod, conf(deviceID=ETH0_PCI)).code == 0
    (rec,) = (node.state_dir / "cni" / "attachments").rglob("*.json")
    assert [d["pci"] for d in json.loads(rec.read_text())["devices"]] == [nic.pci_address]


# ---------------------------------------------------------------- pod identity and node


@contextlib.contextmanager
def served(node: Node, tmp_path: Path, **build) -> Iterator[dict]:
    """A service of this test's own (build_plugin keywords in `build`); yields its config."""
    extra = {"pod_devices": build.pop("pod_devices")} if "pod_devices" in build else {}
    plugin = build_plugin(str(node.state_dir), sysfs_root=str(node.sysfs),
                          host_netns=node.host_path, device_info_dir=str(node.devinfo),
                          pod_resources_socket=None, store=node.store, **build)
    for k, v in extra.items():
        setattr(plugin, k, v)
    running = start(plugin, str(tmp_path / "own.sock"))
    try:
        yield {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni",
               "agentSocket": running.socket_path}
    finally:
        running.stop()


def uid_only(pod: Pod) -> str:
    return f"IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID={pod.container_id};K8S_POD_UID={pod.uid}"


def name_only(pod: Pod) -> str:
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod.namespace};K8S_POD_NAME={pod.name}"


@pytest.mark.parametrize("answer, ok", [("granted", True), ("other", False)])
def test_a_call_naming_the_pod_only_by_uid_is_confirmed_with_kubelet_all_the_same(
        node: Node, shim, tmp_path, answer, ok):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    ids = {"granted": frozenset({nic.pci_address}),
           "other": frozenset({vf_ref(5, 5).pci_address})}[answer]
    kubelet = _Kubelet(ids)
    with served(node, tmp_path, pod_devices=kubelet) as c:
        r = add(shim, pod, c, args=uid_only(pod))
    # kubelet is asked about the pod the record names for that UID
    assert kubelet.asked == [(pod.namespace, pod.name)]
    if ok:
        assert r.code == 0 and set(links(pod.netns)) == {"net1"}
    else:
        assert r.error == 101 and nic.pci_address in r.out["msg"]
        assert links(pod.netns) == {}


def test_uid_and_a_name_that_disagree_with_the_record_move_nothing(node: Node, shim, conf):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    before = node.snapshot()
    r = add(shim, pod, conf(), args=f"K8S_POD_UID={pod.uid};K8S_POD_NAME=someone-else;"
                                    f"K8S_POD_NAMESPACE={pod.namespace}")
    assert r.error == 4 and "someone-else" in r.out["msg"]
    assert node.snapshot() == before and links(pod.netns) == {}


def test_a_name_only_call_never_guesses_between_a_deleted_pods_record_and_the_new_one(
        node: Node, shim, conf):
    stale_nic, new_nic = node.vfs(2)
    old = node.pod([stale_nic], name="trainer-0")
    new = node.pod([new_nic], name="trainer-0")
    assert (old.namespace, old.name) == (new.namespace, new.name)
    before = node.snapshot()
    r = add(shim, new, conf(), args=name_only(new))
    assert r.error == 11 and old.uid in r.out["msg"] and "K8S_POD_UID" in r.out["msg"]
    assert node.snapshot() == before and links(new.netns) == {}
    # With its UID the same pod gets its own VF.
    assert add(shim, new, conf(), args=new.args()).code == 0
    assert node.netdev_of(stale_nic) in node.snapshot()


class _Pods:
    """The agent's pod list, as `PodSource` offers it."""

    def __init__(self, *uids: str, loaded: bool = True) -> None:
        self.uids = uids
        self.loaded = loaded

    def pods(self):
        return [type("PodView", (), {"uid": u})() for u in self.uids]


def test_a_name_only_call_never_takes_the_record_of_a_pod_the_agent_knows_is_gone(
        node: Node, shim, tmp_path):
    (stale_nic,) = node.vfs(1)
    old = node.pod([stale_nic], name="trainer-0")
    new = node.pod([], name="trainer-0")  # same name, no Railyard NICs of its own
    before = node.snapshot()
    with served(node, tmp_path, pods=_Pods(new.uid)) as c:
        r = add(shim, new, c, args=name_only(new))
    assert r.code == 0 and r.out["interfaces"] == []
    assert node.snapshot() == before and links(new.netns) == {}
    assert old.uid  # its record stays for the agent to forget


def test_a_name_only_call_takes_the_one_live_record_among_stale_ones(node: Node, shim,
                                                                     tmp_path):
    stale_nic, new_nic = node.vfs(2)
    node.pod([stale_nic], name="trainer-0")
    new = node.pod([new_nic], name="trainer-0")
    with served(node, tmp_path, pods=_Pods(new.uid)) as c:
        r = add(shim, new, c, args=name_only(new))
    assert r.code == 0, r.out
    assert r.out["interfaces"][0]["mac"] == links(new.netns)["net1"]["mac"]
    assert node.netdev_of(stale_nic) in node.snapshot()
    assert node.netdev_of(new_nic) not in node.snapshot()


def copied_record(node: Node, pod: Pod, nic, other_node: str = "node-b") -> None:
    """A record as another node's agent wrote it, copied into this node's state folder."""
    StateStore(node.state_dir).put(
        PodKey(pod.uid, pod.namespace, pod.name),
        Allocation(node=other_node, numa_nodes=(0,), cpus=None, memory_bytes=(), nics=(nic,)))


@pytest.mark.parametrize("by", ["uid", "name"])
def test_records_for_another_node_grant_nothing_here(node: Node, shim, conf, by):
    (nic,) = node.vfs(1)
    pod = node.pod([])
    copied_record(node, pod, nic)
    before = node.snapshot()
    r = add(shim, pod, conf(), args=pod.args() if by == "uid" else name_only(pod))
    assert r.error == 101 and "node-b" in r.out["msg"] and NODE in r.out["msg"]
    assert node.snapshot() == before and links(pod.netns) == {}


def test_standalone_trusts_only_records_for_its_own_node_name(node: Node, shim):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])  # granted on node-a
    c = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni", "standalone": True,
         "stateDir": str(node.state_dir)}
    before = node.snapshot()
    r = add(shim, pod, c, extra_env={**standalone_env(node), "RAILYARD_CNI_NODE_NAME": "node-b"})
    assert r.error == 101 and NODE in r.out["msg"]
    assert node.snapshot() == before and links(pod.netns) == {}
    r = add(shim, pod, c, extra_env=standalone_env(node))
    assert r.code == 0 and set(links(pod.netns)) == {"net1"}


def test_standalone_refuses_a_state_folder_the_config_names_instead_of_the_nodes(
        node: Node, shim, eth0, tmp_path):
    """A config author who can leave files on the node (an emptyDir is a host folder) must not
    be able to point standalone mode at records of their own making."""
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    forged, _ = forged_node(tmp_path, pod, nic.pci_address)  # grants the eth0 PF to the pod
    before = node.snapshot()
    c = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni", "standalone": True,
         "stateDir": str(forged)}
    r = add(shim, pod, c, extra_env=standalone_env(node))
    assert r.error == 7 and "RAILYARD_CNI_STATE_DIR" in r.out["msg"], r.out
    assert node.snapshot() == before and links(pod.netns) == {}
    # Without stateDir, standalone uses the node's own folder: the pod's real grant.
    del c["stateDir"]
    r = add(shim, pod, c, extra_env=standalone_env(node))
    assert r.code == 0, r.out
    assert eth0 in node.snapshot() and set(links(pod.netns)) == {"net1"}
