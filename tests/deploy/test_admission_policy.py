"""The chart's ValidatingAdmissionPolicies (templates/admission-policy.yaml, decision 0087) as
rendered: one guards the record on every pod write that can carry it, names the release's
identities unless the values name others, and the node's truth it lets an agent write is the
prefix the one codec really writes; the other holds an agent to its own node's NodeTopology
and its record key. Their CEL is run by kube-apiserver in tests/box/test_forged_records_box.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.records.allocation import RecordError, decode_allocation, encode_allocation
from railyard.records.signature import NODE_KEY_ANNOTATION
from support.allocations import allocation, h100, vf
from support.chart import CHART, MANIFESTS, NAMESPACE, documents, helm

POLICY = "ValidatingAdmissionPolicy"


@pytest.fixture(scope="module")
def render(tmp_path_factory):
    home = tmp_path_factory.mktemp("helm")

    def render(*options: str, policy: str = "railyard-allocation-records"
               ) -> list[dict[str, Any]]:
        """The policy named `policy` and its binding."""
        out = documents(helm(home, "template", "railyard", str(CHART), "--namespace",
                             NAMESPACE, "--show-only", "templates/admission-policy.yaml",
                             *options))
        assert len(out) == 4
        return [o for o in out if o["metadata"]["name"] == policy]
    return render


def _variables(policy: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def test_policy_guards_every_pod_write_and_refuses_when_it_cannot_decide(render):
    policy, binding = render()
    assert (policy["kind"], binding["kind"]) == (POLICY, f"{POLICY}Binding")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    # pods/* holds pods/binding (its annotations land on the pod) and pods/status (which may
    # change annotations: podStatusStrategy keeps the new metadata).
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
         "resources": ["pods", "pods/*"]}]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}
    assert all(ALLOCATION_ANNOTATION in e for name, e in _variables(policy).items()
               if name in ("hasNew", "hasOld", "newRecord", "oldRecord"))


def test_identities_are_the_release_service_accounts_unless_the_values_name_others(render):
    variables = _variables(render()[0])
    assert variables["isExtender"] == ("request.userInfo.username in "
                                       f'["system:serviceaccount:{NAMESPACE}:railyard-extender"]')
    assert variables["isAgent"] == ("request.userInfo.username in "
                                    f'["system:serviceaccount:{NAMESPACE}:railyard-agent"]')
    variables = _variables(render("--set", "admissionPolicy.extenderUsers={a,b:c}",
                                  "--set", "admissionPolicy.agentUsers={d}")[0])
    assert variables["isExtender"] == 'request.userInfo.username in ["a","b:c"]'
    assert variables["isAgent"] == 'request.userInfo.username in ["d"]'


def test_an_agent_writes_only_its_nodes_topology_and_only_it_sets_the_record_key(render):
    policy, binding = render(policy="railyard-node-topologies")
    assert binding["spec"] == {"policyName": "railyard-node-topologies",
                               "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": ["railyard.dev"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
         "resources": ["nodetopologies", "nodetopologies/*"]}]
    variables = _variables(policy)
    assert variables["isAgent"] == _variables(render()[0])["isAgent"]
    assert NODE_KEY_ANNOTATION in variables["newKey"] and NODE_KEY_ANNOTATION in variables["oldKey"]


def test_policy_can_be_left_out(tmp_path):
    out = helm(tmp_path, "template", "railyard", str(CHART), "--namespace", NAMESPACE,
               "--set", "admissionPolicy.enabled=false")
    assert not [o for o in documents(out) if o["kind"].startswith(POLICY)]


def test_the_rendered_manifests_carry_the_policy():
    kinds = [o["kind"] for o in documents(MANIFESTS.read_text())]
    assert kinds.count(POLICY) == 2 and kinds.count(f"{POLICY}Binding") == 2


def _node_truth_prefix(policy: dict[str, Any], node: str) -> str:
    """The record prefix the policy lets an agent of `node` write, from its own expression."""
    expression = _variables(policy)["nodeTruthOnOwnNode"]
    found = re.search(r"startsWith\('([^']*)' \+ variables\.tokenNode\s*\+ '([^']*)'\)",
                      expression)
    assert found, expression
    return found[1] + node + found[2]


def test_the_node_truth_the_policy_admits_is_what_the_codec_writes(render):
    topo = h100(node="node-a")
    policy = render()[0]
    truth = encode_allocation(allocation(topo, [(0, vf(topo, 0, 0))], decided_by="node"))
    assert truth.startswith(_node_truth_prefix(policy, "node-a"))
    assert not truth.startswith(_node_truth_prefix(policy, "node-b"))
    decision = encode_allocation(allocation(topo, [(0, vf(topo, 0, 0))]))
    assert not decision.startswith(_node_truth_prefix(policy, "node-a"))


def test_a_record_naming_a_key_twice_is_refused_so_the_first_decided_by_is_the_one_read():
    """The policy reads the first `decidedBy`; json keeps the last: the codec refuses both."""
    topo = h100(node="node-a")
    truth = encode_allocation(allocation(topo, [(0, vf(topo, 0, 0))], decided_by="node"))
    forged = truth[:-1] + ',"decidedBy":"scheduler"}'
    with pytest.raises(RecordError, match="'decidedBy' appears twice"):
        decode_allocation(forged)
    nested = truth.replace('"distance":', '"distance":"PIX","distance":', 1)
    with pytest.raises(RecordError, match="'distance' appears twice"):
        decode_allocation(nested)
