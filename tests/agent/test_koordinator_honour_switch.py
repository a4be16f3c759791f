"""The agent honours Koordinator's device-allocated (decision 0095) only when its config asks
and while it trusts every record: with the extender's public key configured, Koordinator's
unsigned record is never believed. The adopter itself: tests/kubelet/test_koordinator_records.py."""

from __future__ import annotations

import asyncio

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from railyard.agent.agent import Agent, AgentOptions
from railyard.agent.config import AgentConfig, KoordinatorOptions
from support.agent import NODE, topology

TOPO = topology()


def agent(tmp_path, honour: bool, extender_keys=()) -> Agent:
    options = AgentOptions(NODE, state_dir=str(tmp_path),
                           signing_key=Ed25519PrivateKey.generate() if extender_keys else None,
                           extender_keys=tuple(extender_keys))
    config = AgentConfig(koordinator=KoordinatorOptions(honour_device_allocated=honour))
    a = Agent(options, None, config, TOPO, kube=object())  # type: ignore[arg-type]
    a._topology = TOPO
    return a


@pytest.mark.parametrize(("honour", "signed", "adopted"), [
    (True, False, True), (False, False, False), (True, True, False)])
def test_the_agent_honours_koordinator_only_when_configured_and_trusting_every_record(
        tmp_path, honour, signed, adopted):
    keys = (Ed25519PrivateKey.generate().public_key(),) if signed else ()
    a = agent(tmp_path, honour, keys)
    a._honour_koordinator()
    assert a._api_pods is not None
    assert (a._api_pods.adopt is not None) == adopted
    asyncio.run(asyncio.to_thread(a.store.close))
