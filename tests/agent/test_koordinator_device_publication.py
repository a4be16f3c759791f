"""The agent's Koordinator `Device` CR (kube.koordinator_device, decision 0095): created owned
by its Node, the spec replaced under a resourceVersion test only when it changed, a Device
someone else wrote (koordlet) left alone; and the config switch that turns it on. A recording
API client stands in for the server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from railyard.agent.config import ConfigError, KoordinatorOptions, config_from_dict
from railyard.discovery.profiles import build_topology, profile
from railyard.kube.client import ApiError
from railyard.kube.koordinator_device import DeviceObject, DevicePublished, publish_device
from railyard.kube.objects import ObjectMeta
from railyard.records.koordinator_device import device_spec

TOPO = build_topology(profile("dgx-h100"), vfs_per_pf=2, node="node-a")
OURS = {"app.kubernetes.io/managed-by": "railyard"}


class Recorder:
    def __init__(self, current: DeviceObject | None, conflicts: int = 0) -> None:
        self.current, self.conflicts = current, conflicts
        self.created: list[tuple[str, Any]] = []
        self.patches: list[tuple[str, Any]] = []

    async def get(self, path: str, type_: Any) -> Any:
        if path.startswith("/api/v1/nodes/"):
            return type_(metadata=ObjectMeta(name="node-a", uid="node-uid"))
        if self.current is None:
            raise ApiError(404, "NotFound", "", path)
        return self.current

    async def create(self, path: str, body: Any, type_: Any) -> Any:
        self.created.append((path, body))
        return type_(metadata=ObjectMeta(name="node-a", resource_version="1"))

    async def patch(self, path: str, body: Any, type_: Any, patch_type: str = "") -> Any:
        if self.conflicts:
            self.conflicts -= 1
            raise ApiError(409, "Conflict", "the object has been modified", path)
        self.patches.append((path, body))
        return type_(metadata=ObjectMeta(resource_version="2"))


def run(client: Recorder, unhealthy: frozenset[str] = frozenset()) -> DevicePublished:
    return asyncio.run(publish_device(client, TOPO, unhealthy))  # type: ignore[arg-type]


def existing(labels: dict[str, str], unhealthy: frozenset[str] = frozenset()) -> DeviceObject:
    return DeviceObject(ObjectMeta(name="node-a", resource_version="7", labels=labels),
                        spec=device_spec(TOPO, unhealthy))


def test_a_missing_device_is_created_cluster_scoped_named_after_the_node_owned_by_it():
    client = Recorder(None)
    assert run(client) is DevicePublished.CREATED
    [(path, body)] = client.created
    assert path == "/apis/scheduling.koordinator.sh/v1alpha1/devices"
    assert body["kind"] == "Device" and body["metadata"]["name"] == "node-a"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-uid"}]
    assert body["spec"] == device_spec(TOPO)


def test_an_unchanged_device_costs_one_read_and_no_write():
    client = Recorder(existing(OURS))
    assert run(client) is DevicePublished.UNCHANGED
    assert client.created == [] and client.patches == []


def test_a_health_change_replaces_the_spec_under_a_resource_version_test():
    bad = frozenset({TOPO.nics[0].pci_address})
    client = Recorder(existing(OURS))
    assert run(client, bad) is DevicePublished.UPDATED
    [(path, ops)] = client.patches
    assert path == "/apis/scheduling.koordinator.sh/v1alpha1/devices/node-a"
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert ops[1] == {"op": "add", "path": "/spec", "value": device_spec(TOPO, bad)}
    assert ops[1]["value"]["devices"][8]["health"] is False


def test_a_conflict_reads_again_and_a_lasting_one_is_raised():
    bad = frozenset({TOPO.nics[0].pci_address})
    client = Recorder(existing(OURS), conflicts=1)
    assert run(client, bad) is DevicePublished.UPDATED
    with pytest.raises(ApiError):
        run(Recorder(existing(OURS), conflicts=5), bad)


def test_a_device_koordlet_wrote_is_never_overwritten():
    client = Recorder(existing({}, frozenset({"x"})))
    assert run(client) is DevicePublished.FOREIGN
    assert client.created == [] and client.patches == []


def test_koordinator_interop_is_off_by_default_and_switched_on_by_name():
    assert config_from_dict({}).koordinator == KoordinatorOptions(False, False)
    on = config_from_dict({"koordinator": {"publishDevices": True}}).koordinator
    assert on == KoordinatorOptions(publish_devices=True, honour_device_allocated=False)
    both = config_from_dict({"koordinator": {"publishDevices": True,
                                             "honourDeviceAllocated": True}}).koordinator
    assert both.honour_device_allocated and both.publish_devices


@pytest.mark.parametrize(("doc", "says"), [
    ({"koordinator": {"publishDevice": True}}, "koordinator.publishDevice: unknown key"),
    ({"koordinator": {"publishDevices": "yes"}}, "koordinator.publishDevices: expected true"),
    ({"koordinator": True}, "koordinator"),
])
def test_a_bad_koordinator_section_is_refused_naming_the_field(doc, says):
    with pytest.raises(ConfigError) as e:
        config_from_dict(doc)
    assert says in str(e.value)


def _agent(tmp_path, client: Recorder, on: bool):
    from railyard.agent.agent import Agent, AgentOptions
    from railyard.agent.config import AgentConfig

    config = AgentConfig(koordinator=KoordinatorOptions(publish_devices=on))
    agent = Agent(AgentOptions("node-a", state_dir=str(tmp_path)), None, config, TOPO,
                  kube=client)  # type: ignore[arg-type]
    agent._topology = TOPO
    return agent


def test_the_agent_publishes_its_device_only_when_asked_and_again_only_on_health_change(
        tmp_path):
    async def main() -> tuple[Recorder, Recorder]:
        off_client, on_client = Recorder(None), Recorder(None)
        off = _agent(tmp_path / "off", off_client, False)
        assert await off.publish_koordinator_device()
        on = _agent(tmp_path / "on", on_client, True)
        assert await on.publish_koordinator_device()
        on_client.current = existing(OURS)  # what the create left there
        assert await on.publish_koordinator_device()  # same health: not even read
        on.unhealthy = {TOPO.nics[0].pci_address: "link down"}
        assert await on.publish_koordinator_device()
        for a in (off, on):
            await asyncio.to_thread(a.store.close)
        return off_client, on_client

    off_client, on_client = asyncio.run(main())
    assert off_client.created == [] and off_client.patches == []
    assert len(on_client.created) == 1
    [(_, ops)] = on_client.patches
    assert ops[1]["value"] == device_spec(TOPO, {TOPO.nics[0].pci_address})


def test_an_api_server_that_refuses_the_device_is_retried_by_the_publish_loop(tmp_path):
    class Refusing(Recorder):
        async def get(self, path: str, type_: Any) -> Any:
            raise ApiError(403, "Forbidden", "devices is forbidden", path)

    async def main() -> tuple[bool, frozenset[str] | None]:
        agent = _agent(tmp_path, Refusing(None), True)
        ok = await agent.publish_koordinator_device()
        await asyncio.to_thread(agent.store.close)
        return ok, agent._device_published

    assert asyncio.run(main()) == (False, None)
