"""Forged records are refused at admission (issue 16; decision 0087): the chart's
ValidatingAdmissionPolicy on the box's real kube-apiserver. The extender's ServiceAccount binds
a pod with its record through pods/binding; a user who creates a pod carrying a record that
names that pod's VF is refused, and so is every edit of the record but the node's truth written
by the agent of the node the pod is bound to (its token's node claim). Writes that leave the
record alone pass. Run by the lead with the other box tests (needs root)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.records.allocation import encode_allocation
from support.allocations import allocation, h100, vf
from support.box import get, kubebox, namespace, pod, running_box, wait_for
from support.chart import MANIFESTS, NAMESPACE, documents

pytestmark = [pytest.mark.box, pytest.mark.root, pytest.mark.slow]

REFUSED = "railyard.dev/allocation is written by Railyard's extender only"
AGENT_REFUSED = "a Railyard agent writes only its node's truth"
KINDS = {"CustomResourceDefinition", "Namespace", "ServiceAccount", "ClusterRole",
         "ClusterRoleBinding", "Role", "RoleBinding", "ValidatingAdmissionPolicy",
         "ValidatingAdmissionPolicyBinding"}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubebox.Box]:
    """A box of its own (the policy is cluster-wide: it would refuse the session box's own
    extender user), with the chart's identities, RBAC and admission policy applied."""
    with running_box(tmp_path_factory.mktemp("forged-box")) as running:
        items = [o for o in documents(MANIFESTS.read_text()) if o["kind"] in KINDS]
        running.kubectl("apply", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": items}))
        for node in ("node-a", "node-b"):  # Nodes no kubelet serves: pods stay where put
            running.kubectl("create", "-f", "-", input=json.dumps(
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
        yield running


def _as_token(box: kubebox.Box, into: Path, account: str, *bound: str) -> Path:
    """A kubeconfig of the admin's cluster with a token of the chart's ServiceAccount."""
    token = box.kubectl("create", "token", account, "-n", NAMESPACE, "--duration", "1h",
                        *bound).strip()
    config = yaml.safe_load(box.layout.admin_kubeconfig.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = account
    into.write_text(json.dumps(config))
    into.chmod(0o600)
    return into


def _kubectl(box: kubebox.Box, kubeconfig: Path, *args: str, input: str | None = None):
    """kubectl with another identity; the finished process (a refusal is not raised)."""
    return kubebox.run([box.bin("kubectl"), "--kubeconfig", str(kubeconfig), *args],
                       check=False, input=input)


TOPO = h100(node="node-a")
OWNED_VF = vf(TOPO, 0, 0)


def _record(node: str = "node-a", decided_by: str = "scheduler", gpu: int = 0) -> str:
    return encode_allocation(allocation(TOPO, [(gpu, OWNED_VF)], node=node,
                                        decided_by=decided_by))  # type: ignore[arg-type]


def _bind(box: kubebox.Box, extender: Path, ns: str, name: str, node: str, record: str):
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": name, "annotations": {ALLOCATION_ANNOTATION: record}},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    return _kubectl(box, extender, "create", "--raw",
                    f"/api/v1/namespaces/{ns}/pods/{name}/binding", "-f", "-",
                    input=json.dumps(binding))


@pytest.fixture(scope="module")
def world(box: kubebox.Box, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A user `alice` who may edit pods in her namespace, and `owner`, a pod the extender's
    ServiceAccount bound to node-a with a record naming OWNED_VF."""
    folder = tmp_path_factory.mktemp("tokens")
    ns = namespace(box)
    box.kubectl("create", "rolebinding", "alice-edit", "--clusterrole=edit", "--user=alice",
                "-n", ns)
    extender = _as_token(box, folder / "extender", "railyard-extender")
    box.kubectl("create", "-n", ns, "-f", "-",
                input=json.dumps(pod("owner", ["sleep", "3600"], schedulerName="nobody")))
    # The policy acts once kube-apiserver's informer has it: wait for it to refuse a record.
    probe = json.dumps(_annotated(pod("probe", ["true"]), _record()))
    wait_for("the admission policy to refuse a user's record", lambda: REFUSED in _as_alice(
        box, "create", "--dry-run=server", "-n", ns, "-f", "-", input=probe).stderr,
        timeout=60)
    done = _bind(box, extender, ns, "owner", "node-a", _record())
    assert done.returncode == 0, done.stderr
    return {"ns": ns, "extender": extender, "folder": folder}


def _annotated(manifest: dict, record: str) -> dict:
    manifest["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: record}
    return manifest


def _as_alice(box: kubebox.Box, *args: str, input: str | None = None):
    return kubebox.run([box.bin("kubectl"), "--kubeconfig", str(box.layout.admin_kubeconfig),
                        "--as=alice", *args], check=False, input=input)


def test_the_extenders_bind_writes_the_record(box, world):
    owner = get(box, "pod", "owner", "-n", world["ns"])
    assert owner["spec"]["nodeName"] == "node-a"
    assert owner["metadata"]["annotations"][ALLOCATION_ANNOTATION] == _record()


def test_a_user_creating_a_pod_whose_record_names_another_pods_vf_is_refused(box, world):
    ns = world["ns"]
    for spec in ({"schedulerName": "nobody"}, {"nodeName": "node-a"}):
        thief = _annotated(pod("thief", ["sleep", "3600"], **spec), _record())
        done = _as_alice(box, "create", "-n", ns, "-f", "-", input=json.dumps(thief))
        assert done.returncode != 0 and REFUSED in done.stderr, done.stderr
        assert "alice may not" in done.stderr
    assert box.kubectl("get", "pod", "thief", "-n", ns, "-o", "name", check=False).strip() == ""
    # The same pod without the record is hers to create.
    done = _as_alice(box, "create", "-n", ns, "-f", "-",
                     input=json.dumps(pod("thief", ["sleep", "3600"], schedulerName="nobody")))
    assert done.returncode == 0, done.stderr


def test_a_user_may_not_bind_with_a_record_or_edit_one_but_may_edit_around_it(box, world):
    ns = world["ns"]
    box.kubectl("create", "rolebinding", "alice-bind", "--clusterrole=system:kube-scheduler",
                "--user=alice", "-n", ns)
    box.kubectl("create", "-n", ns, "-f", "-",
                input=json.dumps(pod("unbound", ["sleep", "3600"], schedulerName="nobody")))
    done = _as_alice(box, "create", "--raw", f"/api/v1/namespaces/{ns}/pods/unbound/binding",
                     "-f", "-", input=json.dumps(
                         {"apiVersion": "v1", "kind": "Binding",
                          "metadata": {"name": "unbound",
                                       "annotations": {ALLOCATION_ANNOTATION: _record()}},
                          "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}))
    assert done.returncode != 0 and REFUSED in done.stderr, done.stderr
    for edit in (["annotate", "--overwrite", "pod", "owner",
                  f"{ALLOCATION_ANNOTATION}={_record(decided_by='node')}"],
                 ["annotate", "pod", "owner", f"{ALLOCATION_ANNOTATION}-"]):
        done = _as_alice(box, *edit, "-n", ns)
        assert done.returncode != 0 and REFUSED in done.stderr, (edit, done.stderr)
    done = _as_alice(box, "label", "pod", "owner", "team=a", "-n", ns)
    assert done.returncode == 0, done.stderr
    owner = get(box, "pod", "owner", "-n", ns)
    assert owner["metadata"]["annotations"][ALLOCATION_ANNOTATION] == _record()


def _truth_patch(record: str) -> str:
    return json.dumps({"metadata": {"annotations": {ALLOCATION_ANNOTATION: record}}})


def test_an_agent_writes_only_its_nodes_truth_on_pods_bound_to_its_node(box, world):
    ns, folder = world["ns"], world["folder"]
    box.kubectl("create", "-n", ns, "-f", "-",
                input=json.dumps(pod("elsewhere", ["sleep", "3600"], schedulerName="nobody")))
    done = _bind(box, world["extender"], ns, "elsewhere", "node-b", _record(node="node-b"))
    assert done.returncode == 0, done.stderr
    agent_a = _as_token(box, folder / "agent-a", "railyard-agent",
                        "--bound-object-kind=Node", "--bound-object-name=node-a")
    unbound_agent = _as_token(box, folder / "agent", "railyard-agent")

    def patch(kubeconfig: Path, name: str, record: str):
        return _kubectl(box, kubeconfig, "patch", "pod", name, "-n", ns, "--type=merge",
                        "-p", _truth_patch(record))
    refused = [
        (agent_a, "elsewhere", _record(node="node-b", decided_by="node")),  # not its node
        (agent_a, "owner", _record(node="node-b", decided_by="node")),  # names another node
        (agent_a, "owner", _record(gpu=1)),  # a decision, not the node's truth
        (unbound_agent, "owner", _record(decided_by="node")),  # a token naming no node
    ]
    for kubeconfig, name, record in refused:
        done = patch(kubeconfig, name, record)
        assert done.returncode != 0 and AGENT_REFUSED in done.stderr, (name, done.stderr)
    done = patch(agent_a, "owner", _record(decided_by="node"))
    assert done.returncode == 0, done.stderr
    owner = get(box, "pod", "owner", "-n", ns)
    assert owner["metadata"]["annotations"][ALLOCATION_ANNOTATION] == _record(decided_by="node")
