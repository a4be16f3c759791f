"""The chart's Koordinator interop (koordinator values, decision 0095): off by default it
renders nothing new; each switch reaches its component (the extender's flag, the agent's
config, the agent's RBAC for Device CRs); honouring device-allocated brings the policy that
lets only Koordinator's scheduler and the extender write it, and is refused where it would
not be safe (signed records, no admission policy, no scheduler identity)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from railyard.agent.config import KoordinatorOptions, config_from_dict
from railyard.allocation.names import KOORDINATOR_DEVICE_ALLOCATED
from support.chart import CHART, NAMESPACE, documents, helm

KOORD = "system:serviceaccount:koordinator-system:koord-scheduler"
EXTENDER = f"system:serviceaccount:{NAMESPACE}:railyard-extender"
ALL_ON = ("--set", "koordinator.annotateBinds=true", "--set", "koordinator.publishDevices=true",
          "--set", "koordinator.honourDeviceAllocated=true",
          "--set", f"koordinator.schedulerUsers={{{KOORD}}}")


def _render(home, *options: str) -> list[dict[str, Any]]:
    return documents(helm(home, "template", "railyard", str(CHART), "--namespace", NAMESPACE,
                          *options))


def _one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [obj] = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def _agent_config(objs: list[dict[str, Any]]) -> Any:
    return yaml.safe_load(_one(objs, "ConfigMap", "railyard-agent-config")["data"]["agent.yaml"])


def _extender_args(objs: list[dict[str, Any]]) -> list[str]:
    deployment = _one(objs, "Deployment", "railyard-extender")
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def _device_rules(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    role = _one(objs, "ClusterRole", "railyard-agent")
    return [r for r in role["rules"] if "scheduling.koordinator.sh" in r["apiGroups"]]


def test_off_by_default_nothing_koordinator_is_rendered(tmp_path):
    objs = _render(tmp_path)
    assert "koordinator" not in _agent_config(objs)
    assert "--koordinator-annotation" not in _extender_args(objs)
    assert _device_rules(objs) == []
    assert not [o for o in objs if "koordinator" in o["metadata"]["name"]]


def test_each_switch_reaches_its_component(tmp_path):
    objs = _render(tmp_path, *ALL_ON)
    config = config_from_dict(_agent_config(objs))  # the agent's own parser reads it
    assert config.koordinator == KoordinatorOptions(publish_devices=True,
                                                    honour_device_allocated=True)
    assert "--koordinator-annotation" in _extender_args(objs)
    assert _device_rules(objs) == [{"apiGroups": ["scheduling.koordinator.sh"],
                                    "resources": ["devices"],
                                    "verbs": ["get", "create", "patch"]}]


def test_publishing_devices_alone_adds_the_rbac_but_no_policy(tmp_path):
    objs = _render(tmp_path, "--set", "koordinator.publishDevices=true")
    assert len(_device_rules(objs)) == 1
    assert _agent_config(objs)["koordinator"] == {"publishDevices": True,
                                                  "honourDeviceAllocated": False}
    assert not [o for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")
                and "koordinator" in o["metadata"]["name"]]


def test_honouring_brings_a_policy_letting_only_koordinator_and_the_extender_write_it(tmp_path):
    objs = _render(tmp_path, *ALL_ON)
    policy = _one(objs, "ValidatingAdmissionPolicy", "railyard-koordinator-records")
    binding = _one(objs, "ValidatingAdmissionPolicyBinding", "railyard-koordinator-records")
    assert binding["spec"] == {"policyName": "railyard-koordinator-records",
                               "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
         "resources": ["pods", "pods/*"]}]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert KOORDINATOR_DEVICE_ALLOCATED in variables["hasNew"]
    assert KOORDINATOR_DEVICE_ALLOCATED in variables["hasOld"]
    writers = yaml.safe_load(variables["mayWrite"].split(" in ", 1)[1])
    assert writers == [KOORD, EXTENDER]
    assert [v["expression"] for v in spec["validations"]] == [
        "!variables.changed || variables.mayWrite"]


@pytest.mark.parametrize(("options", "says"), [
    (("--set", "koordinator.honourDeviceAllocated=true"), "koordinator.schedulerUsers"),
    ((*ALL_ON, "--set", "recordSigning.secretName=s",
      "--set", "recordSigning.publicKeySecretName=p"), "never believe an unsigned"),
    ((*ALL_ON, "--set", "admissionPolicy.enabled=false"), "needs admissionPolicy.enabled"),
])
def test_honouring_where_it_would_not_be_safe_is_refused(tmp_path, options, says):
    with pytest.raises(AssertionError, match=says):
        _render(tmp_path, *options)
