"""The chart against the box's real API server: a server-side dry run of `helm install` and of
the plain manifests, then its RBAC applied for real and asked, with `kubectl auth can-i` as
each component's ServiceAccount, for every call the component makes and a sample of calls it
must not make; then the agent and the extender as processes with those ServiceAccounts' tokens
doing their work. The chart's pods themselves run in test_chart_pods_box.py (decision 0092)."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import DGX_H100
from railyard.records.allocation import decode_allocation
from support.box import get, kubebox, namespace, pod, running_box, wait_for
from support.chart import CHART, MANIFESTS, NAMESPACE, documents, helm
from support.local_railyard import free_port, post_json, start, stop

pytestmark = [pytest.mark.box, pytest.mark.root, pytest.mark.slow]

EXTENDER = f"system:serviceaccount:{NAMESPACE}:railyard-extender"
AGENT = f"system:serviceaccount:{NAMESPACE}:railyard-agent"
NT = "nodetopologies.railyard.dev"
LEASES = "leases.coordination.k8s.io"

# (verb, resource, namespace or None for all / cluster scope)
EXTENDER_MAY = [
    ("get", "pods", "team-a"), ("list", "pods", None), ("watch", "pods", None),
    ("create", "pods/binding", "team-a"),
    ("get", NT, None), ("list", NT, None), ("watch", NT, None),
    ("create", "events", "team-a"), ("patch", "events", "team-a"),
    ("create", "events.events.k8s.io", "team-a"),
    ("get", LEASES, NAMESPACE), ("create", LEASES, NAMESPACE), ("update", LEASES, NAMESPACE),
]
EXTENDER_MAY_NOT = [
    ("get", "secrets", NAMESPACE), ("list", "secrets", None),
    ("patch", "pods", "team-a"), ("update", "pods", "team-a"), ("delete", "pods", "team-a"),
    ("create", "pods", "team-a"),
    ("create", LEASES, "kube-system"), ("update", LEASES, "kube-system"),
    ("delete", LEASES, NAMESPACE),
    ("create", NT, None), ("patch", NT, None), ("delete", NT, None),
    ("get", "nodes", None), ("delete", "nodes", None),
    ("get", "configmaps", NAMESPACE), ("impersonate", "serviceaccounts", NAMESPACE),
]
AGENT_MAY = [
    ("get", "pods", "team-a"), ("list", "pods", None), ("watch", "pods", None),
    ("patch", "pods", "team-a"), ("get", "nodes", None),
    *[(verb, NT, None) for verb in ("get", "list", "watch", "create", "update", "patch")],
    *[(verb, f"{NT}/status", None) for verb in ("get", "update", "patch")],
    ("create", "events", "default"), ("patch", "events", "default"),
]
AGENT_MAY_NOT = [
    ("get", "secrets", NAMESPACE), ("list", "secrets", None),
    ("create", "pods/binding", "team-a"), ("create", "pods", "team-a"),
    ("update", "pods", "team-a"), ("delete", "pods", "team-a"),
    ("delete", "nodes", None), ("patch", "nodes", None), ("update", "nodes/status", None),
    ("delete", NT, None), ("get", LEASES, NAMESPACE), ("create", "pods/eviction", "team-a"),
    ("create", "serviceaccounts/token", NAMESPACE),
]


@pytest.fixture(scope="module")
def chart_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubebox.Box]:
    """A box of its own: the chart's cluster-scoped objects (CRD, ClusterRoles) stay out of the
    session box other tests share."""
    with running_box(tmp_path_factory.mktemp("chart-box")) as running:
        running.kubectl("create", "namespace", NAMESPACE)
        yield running


def test_helm_install_passes_a_server_dry_run(chart_box, tmp_path):
    out = helm(tmp_path, "install", "railyard", str(CHART), "--namespace", NAMESPACE,
               "--dry-run=server", kubeconfig=chart_box.layout.admin_kubeconfig)
    assert "STATUS: pending-install" in out and "kind: DaemonSet" in out


def test_every_plain_manifest_passes_a_server_dry_run(chart_box):
    out = chart_box.kubectl("apply", "--dry-run=server", "-f", str(MANIFESTS))
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert len(names) == len(documents(MANIFESTS.read_text())), out
    assert all("(server dry run)" in line for line in out.splitlines() if line.strip())


def test_the_examples_pass_a_server_dry_run(chart_box):
    """The second scheduler as it is; the samples a user creates in their own namespace (the
    attachment needs Multus's CRD, which this box has only with --multus: not asked here)."""
    examples = CHART.parents[1] / "examples"
    out = chart_box.kubectl("apply", "--dry-run=server", "-f",
                            str(examples / "second-scheduler.yaml"))
    assert out.count("(server dry run)") == 7, out
    out = chart_box.kubectl("apply", "--dry-run=server", "-n", "default", "-f",
                            str(examples / "training-pod.yaml"))
    assert "pod/railyard-2-pairs created (server dry run)" in out


def test_helm_install_then_uninstall_leaves_only_the_crd_and_the_namespace(chart_box, tmp_path):
    """A real release (no pod started: no replica, no node selected), then `helm uninstall`:
    what remains is what docs/install.md says, the CRD (helm never deletes crds/) and the
    namespace. test_chart_pods_box.py does it with the pods running."""
    release, ns = "ry-test", "ry-test"
    config = chart_box.layout.admin_kubeconfig
    helm(tmp_path, "install", release, str(CHART), "--namespace", ns, "--create-namespace",
         "--set", "extender.replicas=0", "--set", "agent.nodeSelector.railyard-test=none",
         kubeconfig=config)
    selector = f"app.kubernetes.io/instance={release}"
    namespaced = "deployments,daemonsets,services,configmaps,serviceaccounts,roles,rolebindings"
    cluster = "clusterroles,clusterrolebindings"

    def names(kinds: str, *where: str) -> set[str]:
        out = chart_box.kubectl("get", kinds, "-l", selector, *where, "-o", "name")
        return set(out.split())
    assert names(namespaced, "-n", ns) == {
        "deployment.apps/ry-test-railyard-extender", "daemonset.apps/ry-test-railyard-agent",
        "service/ry-test-railyard-scheduler", "configmap/ry-test-railyard-scheduler-config",
        "configmap/ry-test-railyard-agent-config",
        "serviceaccount/ry-test-railyard-extender", "serviceaccount/ry-test-railyard-agent",
        "role.rbac.authorization.k8s.io/ry-test-railyard-extender",
        "rolebinding.rbac.authorization.k8s.io/ry-test-railyard-extender"}
    assert len(names(cluster)) == 4
    helm(tmp_path, "uninstall", release, "--namespace", ns, "--wait", kubeconfig=config)
    assert names(namespaced, "-n", ns) == set() and names(cluster) == set()
    assert chart_box.kubectl("get", "crd", NT, "-o", "name").strip()
    assert chart_box.kubectl("get", "namespace", ns, "-o", "name").strip()


def _can(box: kubebox.Box, who: str, verb: str, resource: str, namespace: str | None) -> str:
    where = ["--namespace", namespace] if namespace else ["--all-namespaces"]
    resource, _, subresource = resource.partition("/")  # kubectl reads pods/x as a pod's name
    sub = [f"--subresource={subresource}"] if subresource else []
    return box.kubectl("auth", "can-i", verb, resource, *sub, f"--as={who}", *where,
                       check=False).strip()


@pytest.fixture(scope="module")
def applied(chart_box: kubebox.Box) -> kubebox.Box:
    """The manifests' identities and RBAC applied for real (nothing that would start a pod)."""
    kinds = {"CustomResourceDefinition", "Namespace", "ServiceAccount", "ClusterRole",
             "ClusterRoleBinding", "Role", "RoleBinding"}
    items = [o for o in documents(MANIFESTS.read_text()) if o["kind"] in kinds]
    chart_box.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": items}))
    chart_box.kubectl("wait", "--for", "condition=Established", "--timeout", "60s", f"crd/{NT}")
    return chart_box


@pytest.mark.parametrize(("who", "may", "may_not"), [
    pytest.param(EXTENDER, EXTENDER_MAY, EXTENDER_MAY_NOT, id="extender"),
    pytest.param(AGENT, AGENT_MAY, AGENT_MAY_NOT, id="agent"),
])
def test_each_service_account_may_make_its_calls_and_no_others(applied, who, may, may_not):
    refused = [c for c in may if _can(applied, who, *c) != "yes"]
    allowed = [c for c in may_not if _can(applied, who, *c) != "no"]
    assert refused == [] and allowed == [], f"refused: {refused}; allowed: {allowed}"


def _token_kubeconfig(box: kubebox.Box, account: str, into: Path) -> Path:
    """The admin kubeconfig's cluster with a token of the chart's ServiceAccount `account`."""
    token = box.kubectl("create", "token", account, "-n", NAMESPACE, "--duration", "1h").strip()
    config = yaml.safe_load(box.layout.admin_kubeconfig.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = account
    into.write_text(json.dumps(config))
    into.chmod(0o600)
    return into


def _rendered(kind: str, name: str) -> dict:
    [found] = [o for o in documents(MANIFESTS.read_text())
               if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_agent_and_extender_do_their_work_with_the_charts_service_account_tokens(
        applied, tmp_path):
    """The agent (the chart's config file) publishes its node's NodeTopology; the extender,
    elected on its Lease in the release namespace, filters and binds a 2 GPU + 2 VF pod there
    with its record: every call on the way is made with the chart's RBAC and nothing else."""
    box = applied
    node = "chart-node"  # a Node no kubelet serves: the bound pod stays where it was put
    box.kubectl("create", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    tree = write_fixture(DGX_H100, tmp_path / "root", 2, node=node)
    config = tmp_path / "agent.yaml"
    agent_config = yaml.safe_load(_rendered("ConfigMap", "railyard-agent-config")["data"][
        "agent.yaml"])
    assert agent_config["gpuPlugin"] is False  # the chart's default: GPUs are NVIDIA's
    agent_config.update(devinfoDir=str(tmp_path / "devinfo"),
                        cniDevinfoDir=str(tmp_path / "cni-devinfo"))
    config.write_text(yaml.safe_dump(agent_config))
    agent_log, extender_log = tmp_path / "agent.log", tmp_path / "extender.log"
    kubelet_dir = Path(tempfile.mkdtemp(prefix="ry-"))  # socket paths: 107 bytes at most
    agent = start(["agent", "--node-name", node, "--sysfs-root", str(tree),
                    "--kubeconfig", str(_token_kubeconfig(box, "railyard-agent",
                                                          tmp_path / "agent.kubeconfig")),
                    "--kubelet-dir", str(kubelet_dir),
                    "--state-dir", str(tmp_path / "state"), "--config", str(config)], agent_log)
    port = free_port()
    args = _rendered("Deployment", "railyard-extender")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    extender = start([*(a for a in args if not a.startswith("--listen")),
                       "--listen", f"127.0.0.1:{port}",
                       "--kubeconfig", str(_token_kubeconfig(box, "railyard-extender",
                                                             tmp_path / "extender.kubeconfig"))],
                      extender_log, POD_NAME="railyard-extender-test")
    try:
        wait_for("the agent's NodeTopology and its status", lambda: box.kubectl(
            "get", "nodetopology", node, "-o", "jsonpath={.status.health}", check=False).strip(),
            timeout=60)
        wait_for("the extender to hold its Lease in the release namespace", lambda: box.kubectl(
            "get", "lease", "railyard-scheduler", "-n", NAMESPACE, "-o",
            "jsonpath={.spec.holderIdentity}", check=False).strip() == "railyard-extender-test",
            timeout=60)
        ns = namespace(box)
        manifest = pod("paired", ["sleep", "3600"], schedulerName="nobody")
        manifest["spec"]["containers"][0]["resources"] = {
            "limits": {"nvidia.com/gpu": "2", "railyard.dev/vf": "2"}}
        box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))
        p = get(box, "pod", "paired", "-n", ns)

        def fits() -> bool:
            return post_json(port, "/filter", {"Pod": p, "NodeNames": [node]}).get(
                "NodeNames") == [node]
        wait_for("the extender to see the pod and the node fit", fits, timeout=60)
        m = p["metadata"]
        answer = post_json(port, "/bind", {"PodName": m["name"], "PodNamespace": ns,
                                       "PodUID": m["uid"], "Node": node})
        assert not answer.get("Error"), answer
        bound = get(box, "pod", "paired", "-n", ns)
        assert bound["spec"]["nodeName"] == node
        allocation = decode_allocation(bound["metadata"]["annotations"][ALLOCATION_ANNOTATION])
        assert len(allocation.pairs) == 2
    finally:
        logs = stop(extender, extender_log) + stop(agent, agent_log)
        print(logs[-6000:])  # shown when the test fails
        shutil.rmtree(kubelet_dir, ignore_errors=True)
    # A 403 on its own, not inside a number (the extender's random port was once 38403).
    assert not re.search(r"\b403\b", logs) and "forbidden" not in logs.lower(), logs[-4000:]
