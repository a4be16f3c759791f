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
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.records.allocation import encode_allocation
from railyard.records.signature import NODE_KEY_ANNOTATION, public_key_text
from railyard.records.topology import topology_to_json
from support.allocations import allocation, h100, vf
from support.box import get, kubebox, namespace, pod, running_box, wait_for
from support.chart import MANIFESTS, NAMESPACE, documents
from support.local_railyard import free_port, get_json, post_json, start, stop

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


def _edits_refused_but_around(box: kubebox.Box, ns: str, name: str, annotation: str,
                              other_value: str, refused: str) -> None:
    """Alice may neither overwrite nor remove the pod's `annotation` (the policy says
    `refused`), but may label the pod."""
    for edit in (["annotate", "--overwrite", "pod", name, f"{annotation}={other_value}"],
                 ["annotate", "pod", name, f"{annotation}-"]):
        done = _as_alice(box, *edit, "-n", ns)
        assert done.returncode != 0 and refused in done.stderr, (edit, done.stderr)
    done = _as_alice(box, "label", "pod", name, "team=a", "-n", ns)
    assert done.returncode == 0, done.stderr


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
    _edits_refused_but_around(box, ns, "owner", ALLOCATION_ANNOTATION,
                              _record(decided_by="node"), REFUSED)
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


def _topology_object(node: str, key: str | None = None) -> dict:
    meta: dict = {"name": node}
    if key is not None:
        meta["annotations"] = {NODE_KEY_ANNOTATION: key}
    return {"apiVersion": "railyard.dev/v1alpha1", "kind": "NodeTopology", "metadata": meta,
            "spec": topology_to_json(h100(node=node))}


def test_an_agent_publishes_only_its_own_nodes_topology_and_record_key(box, world):
    agent_a = _as_token(box, world["folder"] / "agent-a-nt", "railyard-agent",
                        "--bound-object-kind=Node", "--bound-object-name=node-a")
    key = public_key_text(Ed25519PrivateKey.generate().public_key())
    done = _kubectl(box, agent_a, "create", "-f", "-",
                    input=json.dumps(_topology_object("node-b", key)))
    assert done.returncode != 0 and "writes only the NodeTopology of the node" in done.stderr
    done = _kubectl(box, agent_a, "create", "-f", "-",
                    input=json.dumps(_topology_object("node-a", key)))
    assert done.returncode == 0, done.stderr
    other = public_key_text(Ed25519PrivateKey.generate().public_key())
    done = kubebox.run([box.bin("kubectl"), "--kubeconfig", str(box.layout.admin_kubeconfig),
                        "annotate", "--overwrite", "nodetopology", "node-a",
                        f"{NODE_KEY_ANNOTATION}={other}"], check=False)
    assert done.returncode != 0 and "is set by the agent of node node-a only" in done.stderr
    box.kubectl("label", "nodetopology", "node-a", "team=a")  # the key left alone: passes


def test_without_the_policy_a_copied_signed_record_is_ignored_by_the_extender(
        box, world, tmp_path):
    """Layer 2 alone: the pods' admission policy unbound, the extender (the chart's arguments,
    its ServiceAccount's token, a signing key) binds `signed-owner`; a pod created with its
    record copied, signature and the extender's field-manager name included, is left out of
    the ledger: the VFs stay the owner's only."""
    ns = world["ns"]
    box.kubectl("delete", "validatingadmissionpolicybinding", "railyard-allocation-records")
    probe = json.dumps(_annotated(pod("probe", ["true"]), _record()))
    wait_for("the pods' admission policy to be gone", lambda: _as_alice(
        box, "create", "--dry-run=server", "-n", ns, "-f", "-", input=probe).returncode == 0,
        timeout=60)
    key_file = tmp_path / "signing.key"
    key_file.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    node = "node-c"
    box.kubectl("create", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    box.kubectl("create", "-f", "-", input=json.dumps(_topology_object(node)))
    [deployment] = [o for o in documents(MANIFESTS.read_text())
                    if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    port = free_port()
    log = tmp_path / "extender.log"
    extender_config = _as_token(box, tmp_path / "extender.kubeconfig", "railyard-extender")
    process = start([*(a for a in args if not a.startswith("--listen")), "--listen",
                     f"127.0.0.1:{port}", "--kubeconfig", str(extender_config),
                     "--signing-key-file", str(key_file)], log, POD_NAME="forged-test")
    try:
        wait_for("the extender to hold its Lease", lambda: box.kubectl(
            "get", "lease", "railyard-scheduler", "-n", NAMESPACE, "-o",
            "jsonpath={.spec.holderIdentity}", check=False).strip() == "forged-test",
            timeout=60)
        limits = {"nvidia.com/gpu": "2", "railyard.dev/vf": "2"}
        owner = pod("signed-owner", ["sleep", "3600"], schedulerName="nobody")
        owner["spec"]["containers"][0]["resources"] = {"limits": limits}
        box.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(owner))
        p = get(box, "pod", "signed-owner", "-n", ns)
        wait_for("the extender to see the pod fit", lambda: post_json(
            port, "/filter", {"Pod": p, "NodeNames": [node]}).get("NodeNames") == [node],
            timeout=60)
        answer = post_json(port, "/bind", {"PodName": "signed-owner", "PodNamespace": ns,
                                       "PodUID": p["metadata"]["uid"], "Node": node})
        assert not answer.get("Error"), answer
        record = get(box, "pod", "signed-owner", "-n", ns)["metadata"]["annotations"][
            ALLOCATION_ANNOTATION]
        assert json.loads(record)["signature"]
        thief = _annotated(pod("signed-thief", ["sleep", "3600"], nodeName=node), record)
        thief["spec"]["containers"][0]["resources"] = {"limits": limits}
        box.kubectl("create", "-n", ns, "--field-manager=railyard-scheduler", "-f", "-",
                    input=json.dumps(thief))
        wait_for("the extender to refuse the copied record", lambda: "did not make for this "
                 "pod" in log.read_text(errors="replace"), timeout=60)
        held = {q["name"]: q for q in get_json(port, "/allocations")["pods"]}
        assert "signed-owner" in held and "signed-thief" not in held
        owned = {n["pciAddress"] for pair in held["signed-owner"]["allocation"]["pairs"]
                 for n in [pair["nic"]]}
        assert owned == {pair["nic"]["pciAddress"] for pair in json.loads(record)["pairs"]}
    finally:
        print(stop(process, log)[-6000:])


KOORD_ANNOTATION = "scheduling.koordinator.sh/device-allocated"
KOORD_REFUSED = f"{KOORD_ANNOTATION} is written by Koordinator's scheduler only here"


@pytest.fixture(scope="module")
def koordinator_policy(box: kubebox.Box, world: dict,
                       tmp_path_factory: pytest.TempPathFactory) -> str:
    """The chart's koordinator-records policy (koordinator.honourDeviceAllocated, decision
    0095) with `koord` as Koordinator's scheduler, applied beside the main one; `koord` may
    edit pods in the test namespace. The namespace."""
    from support.chart import CHART, RELEASE, helm

    ns = world["ns"]
    rendered = helm(tmp_path_factory.mktemp("helm"), "template", RELEASE, str(CHART), "-n",
                    NAMESPACE, "--set", "koordinator.honourDeviceAllocated=true",
                    "--set", "koordinator.schedulerUsers={koord}")
    items = [o for o in documents(rendered) if o["kind"] in {
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
        and o["metadata"]["name"].endswith("-koordinator-records")]
    assert len(items) == 2, [o["metadata"]["name"] for o in items]
    box.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": items}))
    box.kubectl("create", "rolebinding", "koord-edit", "--clusterrole=edit", "--user=koord",
                "-n", ns)
    probe = json.dumps(_koord_annotated(pod("koord-probe", ["true"])))
    wait_for("the koordinator-records policy to refuse a user's annotation",
             lambda: KOORD_REFUSED in _as_alice(box, "create", "--dry-run=server", "-n", ns,
                                                "-f", "-", input=probe).stderr, timeout=60)
    return ns


def _koord_annotated(manifest: dict, gpu: str = "GPU-0") -> dict:
    value = json.dumps({"gpu": [{"minor": 0, "id": gpu, "resources": {}}]})
    manifest["metadata"]["annotations"] = {KOORD_ANNOTATION: value}
    return manifest


def test_only_koordinators_scheduler_writes_device_allocated(box, koordinator_policy):
    """A pod author's device-allocated is refused on create and edit (agents honouring it
    would grant any device); Koordinator's scheduler identity writes it; edits around it
    pass."""
    ns = koordinator_policy
    manifest = json.dumps(_koord_annotated(pod("koord-forged", ["sleep", "3600"],
                                               schedulerName="nobody")))
    done = _as_alice(box, "create", "-n", ns, "-f", "-", input=manifest)
    assert done.returncode != 0 and KOORD_REFUSED in done.stderr, done.stderr
    assert "alice may not" in done.stderr
    as_koord = kubebox.run([box.bin("kubectl"), "--kubeconfig",
                            str(box.layout.admin_kubeconfig), "--as=koord", "create", "-n", ns,
                            "-f", "-"], check=False, input=manifest.replace(
                                "koord-forged", "koord-decided"))
    assert as_koord.returncode == 0, as_koord.stderr
    _edits_refused_but_around(box, ns, "koord-decided", KOORD_ANNOTATION,
                              json.dumps({"gpu": []}), KOORD_REFUSED)
    kept = get(box, "pod", "koord-decided", "-n", ns)["metadata"]["annotations"]
    assert json.loads(kept[KOORD_ANNOTATION])["gpu"][0]["id"] == "GPU-0"
