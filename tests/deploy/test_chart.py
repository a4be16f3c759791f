"""The Helm chart (deploy/chart/railyard) renders what docs/install.md promises: lint-clean,
valid objects of the expected kinds, least-privilege RBAC equal to the box's, an agent with
only the host folders and capabilities it needs, and deploy/manifests/ in sync. Needs the
box's pinned helm (built from its Go module), not root; docs/decisions/0081."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.main import get_command

from railyard.agent.config import ConfigError, config_from_dict
from railyard.cli.main import app
from railyard.cli.scheduler import BIND_CONNECTIONS
from railyard.kubelet.pairmap import DEFAULT_PAIR_MAP
from railyard.topology.rails import PCI_ORDER
from support.box import kubebox
from support.chart import CHART, MANIFESTS, NAMESPACE, REPO, documents, helm, helm_binary, helm_env
from support.chart_box import railyard_image


def rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


EVENTS = rule(["", "events.k8s.io"], ["events"], ["create", "patch"])
EXTENDER_CLUSTER_RULES = [
    rule([""], ["pods"], ["get", "list", "watch"]),
    rule([""], ["pods/binding"], ["create"]),
    rule(["railyard.dev"], ["nodetopologies"], ["get", "list", "watch"]),
    EVENTS,
]
EXTENDER_NAMESPACE_RULES = [rule(["coordination.k8s.io"], ["leases"], ["get", "create", "update"])]
AGENT_CLUSTER_RULES = [
    rule([""], ["pods"], ["get", "list", "watch", "patch"]),
    rule([""], ["nodes"], ["get"]),
    rule(["railyard.dev"], ["nodetopologies"],
         ["get", "list", "watch", "create", "update", "patch"]),
    rule(["railyard.dev"], ["nodetopologies/status"], ["get", "update", "patch"]),
    EVENTS,
    rule(["resource.k8s.io"], ["resourceslices"], ["list"]),  # DRA GPU drivers (0090)
]


@pytest.fixture(scope="module")
def render(tmp_path_factory):
    home = tmp_path_factory.mktemp("helm")

    def render(*options: str) -> list[dict[str, Any]]:
        return documents(helm(home, "template", "railyard", str(CHART), "--namespace",
                              NAMESPACE, *options))
    return render


@pytest.fixture(scope="module")
def objects(render) -> list[dict[str, Any]]:
    return render()


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def test_chart_is_helm_v2_format_and_lints_clean(tmp_path):
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "railyard"
    out = helm(tmp_path, "lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_template_renders_each_expected_kind_once_in_the_release_namespace(objects):
    kinds = Counter(o["kind"] for o in objects)
    assert kinds == Counter({"ServiceAccount": 2, "ClusterRole": 2, "ClusterRoleBinding": 2,
                             "Role": 1, "RoleBinding": 1, "ConfigMap": 2, "Service": 1,
                             "Deployment": 1, "DaemonSet": 1, "ValidatingAdmissionPolicy": 2,
                             "ValidatingAdmissionPolicyBinding": 2, "FlowSchema": 1})
    for o in objects:
        assert o["apiVersion"] and o["metadata"]["name"]
        if not o["kind"].startswith(("Cluster", "ValidatingAdmissionPolicy", "FlowSchema")):
            assert o["metadata"]["namespace"] == NAMESPACE, o["kind"]


def test_crd_is_a_copy_of_deploy_crds_in_the_charts_crds_folder():
    source = REPO / "deploy/crds/nodetopologies.railyard.dev.yaml"
    assert (CHART / "crds" / source.name).read_bytes() == source.read_bytes()
    assert not list((CHART / "templates").glob("*crd*"))


def _rules(objects, kind: str, name: str) -> list[dict[str, Any]]:
    return one(objects, kind, name)["rules"]


def test_rbac_is_the_least_privilege_of_each_component(objects):
    assert _rules(objects, "ClusterRole", "railyard-extender") == EXTENDER_CLUSTER_RULES
    assert _rules(objects, "Role", "railyard-extender") == EXTENDER_NAMESPACE_RULES
    assert _rules(objects, "ClusterRole", "railyard-agent") == AGENT_CLUSTER_RULES
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for o in (o for o in objects if o["kind"] == kind):
            name = o["metadata"]["name"]
            assert o["roleRef"]["name"] == name
            assert o["subjects"] == [{"kind": "ServiceAccount", "name": name,
                                      "namespace": NAMESPACE}]


def test_no_role_has_a_wildcard_or_touches_secrets(objects):
    for o in objects:
        for r in o.get("rules", []) if o["kind"] in ("ClusterRole", "Role") else []:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in r[key], (o["metadata"]["name"], r)
            assert not {"secrets", "configmaps", "serviceaccounts/token"} & set(r["resources"])
            assert not {"delete", "deletecollection", "escalate", "bind", "impersonate"} \
                & set(r["verbs"])


def test_the_box_grants_its_railyard_users_the_charts_roles():
    """hack/kubebox.py reads deploy/manifests/ and binds the same rules to its users; the
    extender's Lease Role goes to kube-system, where the box's extender keeps its Lease."""
    items = kubebox.railyard_rbac()["items"]
    roles = {(i["kind"], i["metadata"]["name"], i["metadata"].get("namespace")): i["rules"]
             for i in items if i["kind"] in ("ClusterRole", "Role")}
    assert roles == {
        ("ClusterRole", "railyard-extender", None): EXTENDER_CLUSTER_RULES,
        ("Role", "railyard-extender", "kube-system"): EXTENDER_NAMESPACE_RULES,
        ("ClusterRole", "railyard-agent", None): AGENT_CLUSTER_RULES,
    }
    subjects = {i["subjects"][0]["name"] for i in items if i["kind"].endswith("Binding")}
    assert subjects == {kubebox.EXTENDER_USER, kubebox.AGENT_USER}


def test_the_extenders_requests_go_to_kube_schedulers_priority_level(objects, render):
    """Decision 0114: its Bindings are kube-scheduler's, so they belong in workload-high
    with kube-scheduler's own, ahead of the service-accounts FlowSchema (9000) that would
    put them in workload-low; only the extender's ServiceAccount matches."""
    schema = one(objects, "FlowSchema", "railyard-extender")["spec"]
    assert schema["priorityLevelConfiguration"] == {"name": "workload-high"}
    assert schema["matchingPrecedence"] < 900
    [rule] = schema["rules"]
    assert rule["subjects"] == [{"kind": "ServiceAccount", "serviceAccount": {
        "name": "railyard-extender", "namespace": NAMESPACE}}]
    assert not any(o["kind"] == "FlowSchema"
                   for o in render("--set", "extender.priorityLevel="))
    items = kubebox.railyard_rbac()["items"]
    [boxed] = [i for i in items if i["kind"] == "FlowSchema"]
    assert [r["subjects"] for r in boxed["spec"]["rules"]] == [
        [{"kind": "User", "user": {"name": kubebox.EXTENDER_USER}}]]


def test_extender_runs_two_replicas_electing_a_leader_in_the_release_namespace(objects):
    deployment = one(objects, "Deployment", "railyard-extender")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "railyard-extender"
    [container] = pod["containers"]
    args = container["args"]
    assert args[0] == "scheduler" and "--listen=0.0.0.0:8888" in args
    assert "--leader-elect" in args and f"--leader-elect-namespace={NAMESPACE}" in args
    assert not any(a.startswith(("--kubeconfig", "--cluster-file")) for a in args)
    # The binds' connections the benchmarks measured (decision 0115), not a stale copy.
    assert f"--kube-connections={BIND_CONNECTIONS}" in args
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    service = one(objects, "Service", "railyard-scheduler")
    assert service["spec"]["ports"][0]["port"] == 8888
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize(("kind", "name"), [("Deployment", "railyard-extender"),
                                           ("DaemonSet", "railyard-agent")])
def test_each_components_args_are_flags_its_command_knows(objects, kind, name):
    args = one(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]["args"]
    command = get_command(app)  # the real command line, parsed but not run
    context = command.make_context("railyard", list(args), resilient_parsing=True)
    sub = command.get_command(context, args[0])
    sub.make_context(args[0], list(args[1:]))  # raises on an unknown flag or a bad value


def test_scheduler_config_is_the_deploy_extender_entry_at_the_releases_service(objects):
    config_map = one(objects, "ConfigMap", "railyard-scheduler-config")
    config = yaml.safe_load(config_map["data"]["kube-scheduler-config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["profiles"] == [{"schedulerName": "railyard-scheduler"}]
    [extender] = config["extenders"]
    assert extender["urlPrefix"] == f"http://railyard-scheduler.{NAMESPACE}.svc:8888/"
    [reference] = yaml.safe_load((REPO / "deploy/kube-scheduler-config.yaml").read_text())[
        "extenders"]
    assert {k: v for k, v in extender.items() if k != "urlPrefix"} == \
        {k: v for k, v in reference.items() if k != "urlPrefix"}
    assert config["leaderElection"]["resourceName"] != "railyard-scheduler"  # not the extender's


def test_the_real_kube_scheduler_accepts_the_configuration(objects, tmp_path):
    """The box's pinned kube-scheduler validates and defaults it (`--write-config-to`); the
    configuration's in-cluster client is swapped for a kubeconfig nobody answers."""
    written = _kube_scheduler_defaults(objects, tmp_path)
    assert [p["schedulerName"] for p in written["profiles"]] == ["railyard-scheduler"]


def _client_files(d: Path) -> dict[str, Path]:
    """A CA and a client certificate it signed, as kube-scheduler's tlsConfig names them
    (kube-scheduler loads them when it builds the extender's client)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make test certificates")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for argv in (("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                  "-subj", "/CN=ca"),
                 ("req", *ec, "-keyout", "client.key", "-out", "client.csr", "-subj",
                  "/CN=kube-scheduler"),
                 ("x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                  "-CAcreateserial", "-out", "client.crt", "-days", "2")):
        subprocess.run(["openssl", *argv], cwd=d, check=True, capture_output=True, timeout=30)
    return {"caFile": d / "ca.crt", "certFile": d / "client.crt", "keyFile": d / "client.key"}


def test_with_a_tls_secret_the_extender_serves_https_and_kube_scheduler_is_told(render,
                                                                                tmp_path):
    # docs/decisions/0083: opt-in; the default rendering above stays plain HTTP.
    files = _client_files(tmp_path)
    objs = render("--set", "extender.tls.secretName=railyard-tls",
                  "--set", "extender.tls.clientCertificates=true",
                  *(a for key, path in files.items()
                    for a in ("--set", f"scheduler.tlsConfig.{key}={path}")))
    pod = one(objs, "Deployment", "railyard-extender")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert {"--tls-cert-file=/etc/railyard/tls/tls.crt", "--tls-key-file=/etc/railyard/tls/tls.key",
            "--client-ca-file=/etc/railyard/tls/ca.crt"} <= set(container["args"])
    for probe in ("readinessProbe", "livenessProbe"):  # /healthz needs no client certificate
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    assert container["volumeMounts"] == [
        {"name": "tls", "mountPath": "/etc/railyard/tls", "readOnly": True}]
    assert pod["volumes"] == [{"name": "tls", "secret": {"secretName": "railyard-tls"}}]
    command = get_command(app)
    args = container["args"]
    context = command.make_context("railyard", list(args), resilient_parsing=True)
    command.get_command(context, args[0]).make_context(args[0], list(args[1:]))
    config = yaml.safe_load(one(objs, "ConfigMap", "railyard-scheduler-config")["data"][
        "kube-scheduler-config.yaml"])
    [extender] = config["extenders"]
    assert extender["urlPrefix"] == f"https://railyard-scheduler.{NAMESPACE}.svc:8888/"
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {key: str(path) for key, path in files.items()}
    written = _kube_scheduler_defaults(objs, tmp_path)
    assert written["extenders"][0]["enableHTTPS"] is True
    assert written["extenders"][0]["tlsConfig"]["caFile"] == extender["tlsConfig"]["caFile"]


def _kube_scheduler_defaults(objects, tmp_path) -> dict[str, Any]:
    """The chart's kube-scheduler configuration as the box's pinned kube-scheduler validates
    and defaults it; asserts its urlPrefix is kept."""
    family = kubebox.FAMILIES["kube"]
    if not (family.out_dir() / "complete").exists():
        pytest.skip("kube is not built (hack/box build kube)")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    config = yaml.safe_load(one(objects, "ConfigMap", "railyard-scheduler-config")["data"][
        "kube-scheduler-config.yaml"])
    config["clientConnection"]["kubeconfig"] = str(kubeconfig)
    (tmp_path / "in.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run([str(family.out_dir() / "bin/kube-scheduler"),
                           f"--config={tmp_path / 'in.yaml'}",
                           f"--write-config-to={tmp_path / 'out.yaml'}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    written = yaml.safe_load((tmp_path / "out.yaml").read_text())
    assert written["extenders"][0]["urlPrefix"] == config["extenders"][0]["urlPrefix"]
    return written


def _agent_pod(objects) -> dict[str, Any]:
    return one(objects, "DaemonSet", "railyard-agent")["spec"]["template"]["spec"]


def test_agent_mounts_only_the_host_folders_it_needs(objects):
    pod = _agent_pod(objects)
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert sorted(host.values()) == sorted([
        "/sys", "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/pod-resources", "/opt/cni/bin", "/var/lib/cni", "/var/run/netns",
        "/var/run/k8s.cni.cncf.io/devinfo", "/var/lib/railyard", "/run/railyard"])
    [agent] = pod["containers"]
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    for name, path in host.items():  # same path inside: sockets and netns paths are shared
        assert mounts[name]["mountPath"] == path
    assert mounts["sys"]["readOnly"] is True and mounts["cni-bin"]["readOnly"] is True
    assert mounts["netns"]["mountPropagation"] == "HostToContainer"


def test_agent_has_net_admin_and_sys_admin_only_and_is_not_privileged(objects):
    pod = _agent_pod(objects)
    [agent] = pod["containers"]
    security = agent["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN"]}
    assert not security.get("privileged") and security["allowPrivilegeEscalation"] is False
    assert pod["hostNetwork"] is True and not pod.get("hostPID") and not pod.get("hostIPC")


def test_agent_uses_in_cluster_config_and_its_node_name_from_the_downward_api(objects):
    pod = _agent_pod(objects)
    [agent] = pod["containers"]
    args = agent["args"]
    assert args[0] == "agent" and "--node-name=$(NODE_NAME)" in args
    assert not any(a.startswith(("--kubeconfig", "--pods-file")) for a in args)
    assert "--cni-socket=/run/railyard/cni.sock" in args
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert pod["serviceAccountName"] == "railyard-agent"


def test_an_init_container_installs_railyard_cni_into_the_cni_bin_folder(objects):
    [init] = _agent_pod(objects)["initContainers"]
    assert init["args"][:3] == ["cni", "install", "--bin-dir=/opt/cni/bin"]
    assert {"name": "cni-bin", "mountPath": "/opt/cni/bin"} in init["volumeMounts"]


def test_the_init_containers_install_gives_a_shim_the_hosts_python_runs(objects, tmp_path):
    """Its arguments, bin folder swapped for a temporary one; then a runtime's VERSION call."""
    [init] = _agent_pod(objects)["initContainers"]
    interpreter = next(a.split("=", 1)[1] for a in init["args"]
                       if a.startswith("--interpreter="))
    if not Path(interpreter).exists():
        pytest.skip(f"no {interpreter} here")
    args = [a if not a.startswith("--bin-dir=") else f"--bin-dir={tmp_path}"
            for a in init["args"]]
    subprocess.run([sys.executable, "-m", "railyard.cli.main", *args], check=True,
                   capture_output=True)
    done = subprocess.run([str(tmp_path / "railyard-cni")], input="{}", capture_output=True,
                          text=True, env={"CNI_COMMAND": "VERSION"}, check=True)
    assert "1.0.0" in json.loads(done.stdout)["supportedVersions"]
    assert (tmp_path / "railyard-cni").read_text().startswith(f"#!{interpreter} ")


def _agent_config(objects) -> Any:
    return config_from_dict(yaml.safe_load(
        one(objects, "ConfigMap", "railyard-agent-config")["data"]["agent.yaml"]))


def test_gpus_stay_with_nvidias_plugin_unless_given_to_railyard(objects, render):
    default = yaml.safe_load(one(objects, "ConfigMap", "railyard-agent-config")["data"][
        "agent.yaml"])
    assert default["gpuPlugin"] is False and default["pfPlugin"] is False
    _agent_config(objects)  # the agent's own parser takes it
    given = render("--set", "agent.gpus.enabled=true", "--set-json",
                   'agent.pools={"vf":[{"vendors":["15b3"],"pfNames":["ibp24s0#0-7"]}]}')
    config = yaml.safe_load(one(given, "ConfigMap", "railyard-agent-config")["data"]["agent.yaml"])
    assert config["gpuPlugin"] is True and config["pools"]["vf"][0]["pfNames"] == ["ibp24s0#0-7"]
    _agent_config(given)
    annotation = "railyard.dev/config-hash"

    def hash_of(objs):
        return one(objs, "DaemonSet", "railyard-agent")["spec"]["template"]["metadata"][
            "annotations"][annotation]
    assert hash_of(given) != hash_of(objects)  # a changed config rolls the agents


def test_values_set_image_resources_and_placement(render):
    objs = render("--set", "image.repository=registry.example/railyard", "--set",
                  "image.tag=9.9", "--set", "agent.nodeSelector.gpu=yes",
                  "--set", "extender.resources.limits.memory=3Gi")
    for kind, name in (("Deployment", "railyard-extender"), ("DaemonSet", "railyard-agent")):
        pod = one(objs, kind, name)["spec"]["template"]["spec"]
        assert {c["image"] for c in pod["containers"] + pod.get("initContainers", [])} == \
            {"registry.example/railyard:9.9"}
    assert _agent_pod(objs)["nodeSelector"] == {"gpu": "yes"}
    extender = one(objs, "Deployment", "railyard-extender")["spec"]["template"]["spec"]
    assert extender["containers"][0]["resources"]["limits"]["memory"] == "3Gi"


def test_samples_live_outside_templates_and_parse():
    examples = REPO / "deploy/examples"
    kinds = {d["kind"] for p in examples.glob("*.yaml") for d in documents(p.read_text())}
    assert kinds == {"NetworkAttachmentDefinition", "Pod", "ServiceAccount", "ClusterRoleBinding",
                     "Role", "RoleBinding", "Deployment"}
    [pod] = documents((examples / "training-pod.yaml").read_text())
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == limits["railyard.dev/vf"] == 2
    assert pod["spec"]["schedulerName"] == "railyard-scheduler"  # the chart's profile
    scheduler = next(d for d in documents((examples / "second-scheduler.yaml").read_text())
                 if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert scheduler["volumes"][0]["configMap"]["name"] == "railyard-scheduler-config"


def test_dockerfile_installs_the_wheel_without_the_simulator_extra():
    text = (REPO / "Dockerfile").read_text()
    assert "[sim]" not in text and "[test]" not in text
    # The image hack/build-image makes for the box (decision 0092): same Debian, same venv.
    assert f"FROM debian:{railyard_image.SUITE}-slim" in text
    assert f"python3 -m venv {railyard_image.VENV}" in text
    assert f'ENTRYPOINT ["{railyard_image.VENV}/bin/railyard"]' in text


def test_deploy_manifests_are_the_charts_rendering(tmp_path: Path):
    out = tmp_path / "railyard.yaml"
    env = {**helm_env(tmp_path), "HELM": helm_binary()}
    subprocess.run([str(REPO / "hack/render-manifests"), str(out)], env=env, check=True,
                   cwd=REPO, capture_output=True)
    assert out.read_text() == MANIFESTS.read_text(), \
        "deploy/manifests/railyard.yaml is stale: run hack/render-manifests (HELM=<helm v4>)"
    kinds = [d["kind"] for d in documents(MANIFESTS.read_text())]
    assert kinds[:2] == ["CustomResourceDefinition", "Namespace"]
    assert os.access(REPO / "hack/render-manifests", os.X_OK)


def test_vf_pools_reach_the_agent_the_extender_and_kube_scheduler(render):
    """agent.vfPools in sriov-network-device-plugin's resourceList form (decision 0085): the
    agent's config reads them, every pool but the default one is an extender --vf-pool and a
    managedResource kube-scheduler leaves to the extender."""
    objs = render("--set-json", 'agent.vfPools=[{"resourceName":"vf","selectors":'
                  '{"pfNames":["ibp24s0"],"isRdma":true}},{"resourceName":"vf_storage",'
                  '"resourcePrefix":"example.com","selectors":{"pfNames":["ens1f0"]}}]')
    config = _agent_config(objs)
    assert [p.resource for p in config.pools] == ["railyard.dev/vf", "example.com/vf_storage"]
    extender = one(objs, "Deployment", "railyard-extender")["spec"]["template"]["spec"][
        "containers"][0]
    assert [a for a in extender["args"] if a.startswith("--vf-pool")] == [
        "--vf-pool=example.com/vf_storage"]
    scheduler = yaml.safe_load(one(objs, "ConfigMap", "railyard-scheduler-config")["data"][
        "kube-scheduler-config.yaml"])
    managed = {m["name"]: m["ignoredByScheduler"]
               for m in scheduler["extenders"][0]["managedResources"]}
    assert managed == {"railyard.dev/vf": True, "example.com/vf_storage": True,
                       "railyard.dev/pf": True, "nvidia.com/gpu": False}


def test_pair_map_and_rails_values_reach_the_agents_config(objects, render):
    """agent.pairMap and agent.rails (docs/pair-map.md, docs/rails.md): the defaults are the
    agent's own, and a gpu-index scheme, the NCCL affinity form, a rail scheme or a rail map
    set in values is what the agent's parser reads."""
    default = _agent_config(objects)
    assert default.pair_map == DEFAULT_PAIR_MAP and default.rails is None
    indexed = _agent_config(render(
        "--set", "agent.pairMap.podIfnameScheme=gpu-index",
        "--set", "agent.pairMap.ncclGpuNicAffinity=true", "--set", "agent.rails=pci-order"))
    assert indexed.pair_map.pod_ifname_scheme == "gpu-index"
    assert indexed.pair_map.nccl_gpu_nic_affinity is True
    assert indexed.rails == PCI_ORDER
    mapped = _agent_config(render(
        "--set", "agent.pairMap.podIfname=rdmanet",
        "--set-json", 'agent.rails={"0000:18:00.0":0,"ibp64s0":1}'))
    assert mapped.pair_map.pod_ifname == "rdmanet"
    assert mapped.rails == {"0000:18:00.0": 0, "ibp64s0": 1}
    with pytest.raises(ConfigError, match="podIfnameScheme"):  # a scheme the CNI does not know
        _agent_config(render("--set", "agent.pairMap.podIfnameScheme=by-gpu"))
