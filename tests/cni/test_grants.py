"""The grant lookup alone (no namespaces): which record, for which node, answers a CNI call."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.allocation.types import Allocation
from railyard.cni.grants import StoreGrants
from railyard.cni.spec import CniError, PodArgs
from railyard.node.state import PodKey, StateStore
from support.cni import NODE, vf_ref


def put(store: StateStore, uid: str, name: str = "trainer-0", node: str = NODE, vf: int = 0):
    store.put(PodKey(uid, "team", name),
              Allocation(node=node, numa_nodes=(0,), cpus=None, memory_bytes=(),
                         nics=(vf_ref(0, vf),)))


class Pods:
    def __init__(self, *uids: str, loaded: bool = True) -> None:
        self.uids, self.loaded = uids, loaded

    def pods(self):
        return [type("PodView", (), {"uid": u})() for u in self.uids]


def test_a_lookup_needs_the_node_it_serves(tmp_path):
    with pytest.raises(ValueError, match="node"):
        StoreGrants(StateStore(tmp_path))
    assert StoreGrants(StateStore(tmp_path, node="n1")).node == "n1"
    assert StoreGrants(StateStore(tmp_path, node="n1"), "n2").node == "n2"


@pytest.mark.parametrize("args", [PodArgs(uid="u1"), PodArgs(namespace="team", name="trainer-0")])
def test_a_record_for_another_node_is_refused_not_trusted(tmp_path, args):
    store = StateStore(tmp_path)
    put(store, "u1", node="elsewhere")
    with pytest.raises(CniError) as e:
        StoreGrants(store, NODE).grant(args)
    assert e.value.code == 101 and "'elsewhere'" in e.value.msg


def test_a_uid_only_call_learns_the_pods_name_from_the_record(tmp_path):
    store = StateStore(tmp_path)
    put(store, "u1")
    g = StoreGrants(store, NODE).grant(PodArgs(uid="u1"))
    assert g is not None and (g.pod.uid, g.pod.namespace, g.pod.name) == ("u1", "team",
                                                                          "trainer-0")
    assert g.nics == (vf_ref(0, 0),)


@pytest.mark.parametrize("args", [PodArgs(uid="u1", name="other"),
                                  PodArgs(uid="u1", namespace="other"),
                                  PodArgs(uid="u1", namespace="team", name="trainer-1")])
def test_uid_with_a_disagreeing_name_is_refused(tmp_path, args):
    store = StateStore(tmp_path)
    put(store, "u1")
    with pytest.raises(CniError) as e:
        StoreGrants(store, NODE).grant(args)
    assert e.value.code == 4


def test_several_records_for_one_name_are_refused_unless_the_agent_knows_which_live(tmp_path):
    store = StateStore(tmp_path)
    put(store, "old", vf=0)
    put(store, "new", vf=1)
    by_name = PodArgs(namespace="team", name="trainer-0")
    for pods in (None, Pods("old", "new"), Pods("new", loaded=False)):
        with pytest.raises(CniError) as e:
            StoreGrants(store, NODE, pods=pods).grant(by_name)
        assert e.value.code == 11 and "old" in e.value.msg and "new" in e.value.msg
    g = StoreGrants(store, NODE, pods=Pods("new")).grant(by_name)
    assert g is not None and g.pod.uid == "new" and g.nics == (vf_ref(0, 1),)
    assert StoreGrants(store, NODE, pods=Pods("someone")).grant(by_name) is None
    # A UID still names its own record, live or not.
    assert StoreGrants(store, NODE, pods=Pods("new")).grant(PodArgs(uid="old")).pod.uid == "old"


@settings(max_examples=40, deadline=None)
@given(records=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.booleans()), min_size=0,
                        max_size=4),
       loaded=st.booleans())
def test_a_name_only_lookup_returns_only_a_unique_live_record_of_this_node(
        tmp_path_factory, records, loaded):
    store = StateStore(tmp_path_factory.mktemp("s"))
    live = []
    for i, (name, alive) in enumerate(records):
        put(store, f"u{i}", name=name, vf=i)
        if alive:
            live.append(f"u{i}")
    pods = Pods(*live, loaded=loaded)
    candidates = [f"u{i}" for i, (name, alive) in enumerate(records)
                  if name == "a" and (alive or not loaded)]
    try:
        g = StoreGrants(store, NODE, pods=pods).grant(PodArgs(namespace="team", name="a"))
    except CniError as e:
        assert e.code == 11 and len(candidates) > 1
        return
    assert len(candidates) <= 1
    assert (g.pod.uid if g else None) == (candidates[0] if candidates else None)


def test_standalone_serves_the_node_named_in_its_environment_else_the_hostname(tmp_path):
    from railyard.cni.standalone import plugin_from_env

    base = {"RAILYARD_CNI_POD_RESOURCES": "", "RAILYARD_CNI_SYSFS_ROOT": str(tmp_path)}
    for env, want in ((base, socket.gethostname()),
                      ({**base, "RAILYARD_CNI_NODE_NAME": "node-z"}, "node-z")):
        plugin = plugin_from_env(str(tmp_path / "state"), env)
        try:
            assert plugin.grants.node == want
        finally:
            plugin.close()
