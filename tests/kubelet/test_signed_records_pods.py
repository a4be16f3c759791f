"""Signed records on the node's side (decision 0087): with the extender's public key, the
agent believes a pod's record only when it is signed for that pod (a decision by the
extender, its node's truth by its own key). A forged record — the extender's field-manager
name, a signature copied from the pod that holds the VF — is no record: the pod resolves
without one (the node decides for it, saying why) and the VF's Allocate goes to its owner.
The node's truth it writes back is signed with its own key. Without keys, as before."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from railyard.agent.agent import AgentOptions
from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.allocation.names import DEFAULT_RESOURCES as NAMES
from railyard.kubelet.pods import pod_view
from railyard.kubelet.resolver import candidates, match_allocate
from railyard.kubelet.writeback import AllocationWriteBack
from railyard.records.allocation import encode_allocation
from railyard.records.signature import RecordTrust, sign_record
from support.agent import NODE, VF, allocation, pod, topology

EXTENDER_KEY = Ed25519PrivateKey.generate()
NODE_KEY = Ed25519PrivateKey.generate()
TOPO = topology("dgx-h100", vfs_per_pf=2)
OWNED_VF = next(n for n in TOPO.nics if n.vfs).vfs[0].pci_address
OWNED = allocation(TOPO, [(0, OWNED_VF)])
TRUST = AgentOptions(NODE, signing_key=NODE_KEY,
                     extender_keys=(EXTENDER_KEY.public_key(),)).record_trust()


def signed(text: str, uid: str, key: Ed25519PrivateKey = EXTENDER_KEY) -> str:
    return sign_record(text, uid, key)


def with_manager(p: dict[str, Any], manager: str) -> dict[str, Any]:
    p["metadata"]["managedFields"] = [{"manager": manager, "operation": "Update",
                                       "fieldsType": "FieldsV1"}]
    return p


def test_a_forged_record_is_no_record_and_the_vf_goes_to_its_owner():
    owner = pod("owner", {"c": {VF: 1}}, annotation=signed(encode_allocation(OWNED), "owner"),
                created="2026-01-02T00:00:00Z")
    thief = with_manager(pod("thief", {"c": {VF: 1}},  # older: first in line if believed
                             annotation=signed(encode_allocation(OWNED), "owner"),
                             created="2026-01-01T00:00:00Z"), "railyard-scheduler")
    views = [pod_view(owner, NAMES, TRUST), pod_view(thief, NAMES, TRUST)]
    assert views[0].allocation == OWNED
    assert views[1].allocation is None
    assert "did not make for this pod (uid thief)" in (views[1].allocation_error or "")
    cands = candidates(views, {}, NODE, NAMES, VF, 1)
    assert {c.pod.uid: c.allocation for c in cands} == {"owner": OWNED, "thief": None}
    found = match_allocate(cands, [OWNED_VF])
    assert found is not None and found.pod.uid == "owner"
    # Believed without keys (as before): the thief's copy would single out no one.
    plain = [pod_view(owner), pod_view(thief)]
    assert plain[1].allocation == OWNED


def test_an_unsigned_or_foreign_nodes_truth_is_no_record_but_its_own_is():
    truth = encode_allocation(dataclasses.replace(OWNED, decided_by="node"))
    for text in (truth, signed(truth, "u", Ed25519PrivateKey.generate()),
                 signed(truth, "u", EXTENDER_KEY)):
        view = pod_view(pod("u", {"c": {VF: 1}}, annotation=text), NAMES, TRUST)
        assert view.allocation is None and view.allocation_error
    view = pod_view(pod("u", {"c": {VF: 1}}, annotation=signed(truth, "u", NODE_KEY)),
                    NAMES, TRUST)
    assert view.allocation is not None and view.allocation.decided_by == "node"


def test_without_the_extenders_key_every_record_is_trusted():
    trust = AgentOptions(NODE, signing_key=NODE_KEY).record_trust()
    assert trust == RecordTrust()
    view = pod_view(pod("u", {"c": {VF: 1}}, alloc=OWNED), NAMES, trust)
    assert view.allocation == OWNED


def test_the_node_truth_written_back_is_signed_with_the_nodes_key():
    truth = dataclasses.replace(OWNED, decided_by="node")

    class Record:
        uid, allocation = "u", truth

    class Store:
        def all(self) -> list[Any]:
            return [Record()]

    class Pods:
        def pods(self) -> list[Any]:
            return [pod_view(pod("u", {"c": {VF: 1}}, alloc=OWNED))]

    class Client:
        def __init__(self) -> None:
            self.bodies: list[Any] = []

        async def patch(self, path: str, body: Any, type_: object) -> None:
            self.bodies.append(body)

    client = Client()
    back = AllocationWriteBack(client, Store(), Pods(), NODE_KEY)  # type: ignore[arg-type]
    assert asyncio.run(back.write()) == 1
    text = client.bodies[0]["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    assert json.loads(text)["signature"]
    view = pod_view(pod("u", {"c": {VF: 1}}, annotation=text), NAMES, TRUST)
    assert view.allocation == truth
