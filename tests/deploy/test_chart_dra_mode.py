"""The chart's DRA mode (agent.mode: dra, decision 0111): the agent's flag and config, its
DRA plugin and CDI folders, RBAC to write ResourceSlices, read claims and write our entries of
their status (0113), and the three DeviceClasses, all only in DRA mode; an unknown mode refused
by name. Needs the box's pinned helm, not root."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from railyard.agent.config import MODE_DRA, DraOptions, config_from_dict
from railyard.records.dra_slices import device_classes
from support.box import kubebox
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
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        # Our claims' status.devices after a CNI ADD (decision 0113): least privilege, our
        # driver's entries only, from a ServiceAccount of the claim's node.
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
         "verbs": ["patch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
         "resourceNames": ["railyard.dev"], "verbs": ["associated-node:patch"]}]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["dra-plugin"] == "/var/lib/kubelet/plugins/railyard.dev"
    assert mounts["cdi"] == "/etc/cdi"


def test_an_unknown_mode_is_refused_by_name(render):
    with pytest.raises(AssertionError, match=r"agent\.mode: expected extender or dra, got "
                                             "kubelet"):
        render("--set", "agent.mode=kubelet")


def test_the_box_grants_its_dra_agent_the_charts_rules_and_the_arbitrary_node_verb(render):
    """The box's agent is a certificate user, not a ServiceAccount of its node: beside the
    chart's rules it gets `arbitrary-node:patch` for our driver's claim status (0113)."""
    [chart] = [o["rules"] for o in render("--set", "agent.mode=dra")
               if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("agent")]
    [box] = [i["rules"] for i in kubebox.railyard_rbac(dra=True)["items"]
             if i["kind"] == "ClusterRole" and i["metadata"]["name"] == "railyard-agent"]
    assert box == [*chart, {"apiGroups": ["resource.k8s.io"],
                            "resources": ["resourceclaims/driver"],
                            "resourceNames": ["railyard.dev"],
                            "verbs": ["arbitrary-node:patch"]}]
