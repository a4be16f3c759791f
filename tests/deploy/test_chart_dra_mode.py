"""The chart's DRA mode (agent.mode: dra, decision 0111): the agent's flag and config, its
DRA plugin and CDI folders, RBAC to write ResourceSlices and read claims, and the three
DeviceClasses, all only in DRA mode; an unknown mode refused by name. Needs the box's pinned
helm, not root."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from railyard.agent.config import MODE_DRA, DraOptions, config_from_dict
from railyard.records.dra_slices import device_classes
from support.chart import CHART, NAMESPACE, documents, helm


@pytest.fixture(scope="module")
def render(tmp_path_factory):
    home = tmp_path_factory.mktemp("helm")

    def render(*options: str) -> list[dict[str, Any]]:
        return documents(helm(home, "template", "railyard", str(CHART), "--namespace",
                              NAMESPACE, *options))
    return render


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def agent_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [ds] = [o for o in of_kind(objects, "DaemonSet") if o["metadata"]["name"].endswith("agent")]
    [c] = ds["spec"]["template"]["spec"]["containers"]
    return c


def agent_config(objects: list[dict[str, Any]]):
    [cm] = [o for o in of_kind(objects, "ConfigMap") if "agent.yaml" in o.get("data", {})]
    return config_from_dict(yaml.safe_load(cm["data"]["agent.yaml"]))


def agent_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    [role] = [o for o in of_kind(objects, "ClusterRole") if o["metadata"]["name"].endswith(
        "agent")]
    return [r for r in role["rules"] if r["apiGroups"] == ["resource.k8s.io"]]


def test_extender_mode_is_the_default_and_ships_nothing_of_dra(render):
    objects = render()
    assert "--mode=extender" in agent_container(objects)["args"]
    assert agent_config(objects).mode == "extender"
    assert of_kind(objects, "DeviceClass") == []
    assert agent_rules(objects) == [{"apiGroups": ["resource.k8s.io"],
                                     "resources": ["resourceslices"], "verbs": ["list"]}]
    mounts = {m["name"] for m in agent_container(objects)["volumeMounts"]}
    assert not {"dra-plugin", "cdi"} & mounts


def test_dra_mode_passes_the_flag_and_settings_and_ships_classes_rbac_and_folders(render):
    objects = render("--set", "agent.mode=dra", "--set", "dra.publishGpus=true",
                     "--set", "dra.cdiDir=/etc/cdi")
    container = agent_container(objects)
    assert "--mode=dra" in container["args"]
    cfg = agent_config(objects)
    assert cfg.mode == MODE_DRA and cfg.dra == DraOptions(publish_gpus=True, cdi_dir="/etc/cdi")
    classes = [{"name": c["metadata"]["name"], "spec": c["spec"]}
               for c in of_kind(objects, "DeviceClass")]
    assert classes == [{"name": c["metadata"]["name"], "spec": c["spec"]}
                       for c in device_classes()]
    assert agent_rules(objects) == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch", "create", "update", "delete"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]}]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["dra-plugin"] == "/var/lib/kubelet/plugins/railyard.dev"
    assert mounts["cdi"] == "/etc/cdi"


def test_an_unknown_mode_is_refused_by_name(render):
    with pytest.raises(AssertionError, match=r"agent\.mode: expected extender or dra, got "
                                             "kubelet"):
        render("--set", "agent.mode=kubelet")
