"""The chart against the box's real API server: a server-side dry run of `helm install` and of
the plain manifests, then its RBAC applied for real and asked, with `kubectl auth can-i` as
each component's ServiceAccount, for every call the component makes and a sample of calls it
must not make. No pod runs: no registry is reachable here for the image (docs/install.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from support.box import kubebox, running_box
from support.chart import CHART, MANIFESTS, NAMESPACE, documents, helm

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
