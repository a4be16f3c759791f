"""Signed records on the extender's side (decision 0087): its binder signs each record for
its pod, and its ClusterSync, rebuilding the ledger from the pods' annotations, believes a
record only when it is signed for that pod — a decision with the extender's key, a node's
truth with the key its NodeTopology publishes. A forged record, even with the extender's own
field-manager name and a signature copied from the pod that holds the VF, is no record: that
VF stays with its owner. Without a key every record is trusted, as before."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from scheduler_helpers import hand_allocation
from test_cluster_api import cr, topology

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.allocation.types import Allocation
from railyard.kube.objects import Pod
from railyard.kube.reflector import Change
from railyard.records.allocation import encode_allocation
from railyard.records.signature import NODE_KEY_ANNOTATION, public_key_text, sign_record
from railyard.scheduler.cluster_api import ClusterSync, PodBinder, TopologyObject
from railyard.scheduler.cluster_file import BoundPod
from railyard.scheduler.state import ClusterState

EXTENDER_KEY = Ed25519PrivateKey.generate()
NODE_KEY = Ed25519PrivateKey.generate()
T = topology("a")
OWNED = hand_allocation(T, [(0, 0, 0)])  # GPU 0 with VF 0 of NIC 0


def pod(uid: str, record: str | None, manager: str = "railyard-scheduler") -> Pod:
    """A pod as the watch brings it, managedFields and all (the manager name is the
    client's to choose)."""
    meta: dict[str, Any] = {"name": f"p-{uid}", "namespace": "ml", "uid": uid,
                            "managedFields": [{"manager": manager, "operation": "Update",
                                               "fieldsType": "FieldsV1"}]}
    if record is not None:
        meta["annotations"] = {ALLOCATION_ANNOTATION: record}
    return msgspec.json.decode(json.dumps({"metadata": meta, "spec": {"nodeName": "a"},
                                           "status": {"phase": "Running"}}), type=Pod)


def signed(alloc: Allocation, uid: str, key: Ed25519PrivateKey = EXTENDER_KEY) -> str:
    return sign_record(encode_allocation(alloc), uid, key)


def keyed_cr(node: str, key: Ed25519PrivateKey | None) -> TopologyObject:
    obj = cr(node)
    if key is not None:
        obj.metadata.annotations = {NODE_KEY_ANNOTATION: public_key_text(key.public_key())}
    return obj


def strict(node_key: Ed25519PrivateKey | None = NODE_KEY) -> ClusterSync:
    sync = ClusterSync(ClusterState(()))
    sync.require_signatures([EXTENDER_KEY.public_key()])
    sync.on_topology(Change("ADDED", "a", keyed_cr("a", node_key)))
    return sync


def holders(sync: ClusterSync) -> list[str]:
    return [uid for uid, _ in sync.state.ledger("a").holders()]


def test_a_forged_record_with_the_extenders_manager_name_and_a_copied_signature_is_no_record(
        caplog):
    sync = strict()
    sync.on_pod(Change("ADDED", "ml/p-owner", pod("owner", signed(OWNED, "owner"))))
    # The thief copies the owner's whole annotation, signature included, and writes it as
    # the extender's field manager would: managedFields proves nothing.
    stolen = pod("thief", signed(OWNED, "owner"), manager="railyard-scheduler")
    with caplog.at_level(logging.WARNING, "railyard.scheduler"):
        sync.on_pod(Change("ADDED", "ml/p-thief", stolen))
    assert holders(sync) == ["owner"]
    assert sync.state.pod("thief") is None
    assert "did not make for this pod (uid thief)" in caplog.text
    # Re-signed with a key that is not the extender's: no better.
    sync.on_pod(Change("MODIFIED", "ml/p-thief",
                       pod("thief", signed(OWNED, "thief", Ed25519PrivateKey.generate()))))
    assert holders(sync) == ["owner"]


@pytest.mark.parametrize("edit", [
    lambda r: r.replace('"decidedBy":"scheduler"', '"decidedBy":"node"'),  # now node truth
    lambda r: r[:r.index(',"signature"')] + "}",  # the signature removed
    lambda r: r.replace('"cpus":null', '"cpus":"0-3"'),  # any other field changed
], ids=["author", "unsigned", "edited"])
def test_an_edited_or_unsigned_record_on_its_own_pod_is_no_record(edit):
    sync = strict()
    record = signed(OWNED, "owner")
    assert edit(record) != record
    sync.on_pod(Change("ADDED", "ml/p-owner", pod("owner", edit(record))))
    assert holders(sync) == []


def test_a_node_truth_signed_with_its_nodes_published_key_is_believed_even_if_the_key_comes_late():
    truth = dataclasses.replace(hand_allocation(T, [(1, 0, 1)]), decided_by="node")
    sync = strict(node_key=None)  # the node has published no key yet
    sync.on_pod(Change("ADDED", "ml/p-1", pod("1", signed(truth, "1", NODE_KEY))))
    assert holders(sync) == []
    sync.on_topology(Change("MODIFIED", "a", keyed_cr("a", NODE_KEY)))
    assert holders(sync) == ["1"]
    # The extender's key does not make a node's truth.
    sync.on_pod(Change("ADDED", "ml/p-2", pod("2", signed(truth, "2", EXTENDER_KEY))))
    assert holders(sync) == ["1"]


def test_without_keys_every_record_is_trusted_as_before():
    sync = ClusterSync(ClusterState(()))
    sync.on_topology(Change("ADDED", "a", cr("a")))
    sync.on_pod(Change("ADDED", "ml/p-1", pod("1", encode_allocation(OWNED))))
    assert holders(sync) == ["1"]


def test_the_binder_signs_each_record_for_its_pod_and_its_sync_believes_it():
    class Recorder:
        def __init__(self) -> None:
            self.bodies: list[Any] = []

        async def create(self, path: str, body: Any, type_: object, **_: Any) -> None:
            self.bodies.append(body)

    async def bind() -> dict[str, Any]:
        client, sync = Recorder(), strict()
        binder = PodBinder(client, sync, signing_key=EXTENDER_KEY)  # type: ignore[arg-type]
        await binder.bind(BoundPod("ml", "p-owner", "owner", "a", OWNED))
        await asyncio.sleep(0)
        return client.bodies[0]

    binding = asyncio.run(bind())
    record = binding["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    assert json.loads(record)["signature"]
    assert record.startswith(encode_allocation(OWNED)[:-1])  # fields in order, signature last
    sync = strict()
    sync.on_pod(Change("ADDED", "ml/p-owner", pod("owner", record)))
    assert holders(sync) == ["owner"]
