"""KEP-4817's network data on the box's real kube-apiserver, kubelet and containerd v1.36.3
(`hack/box up --with-railyard --dra`, railyard-cni chained with host-local addresses): after the
ADD of a pod whose claim comes from `railyard dra claim-template --pairs 2`, the stored claim's
status.devices names each of its VFs with the interface name, MAC and address the pod has
inside (`ip -o link` / `ip -o addr` in the pod), written by the agent's own identity through
the RBAC the chart grants (decision 0113). Another manager's entry in the same list stays when
the agent applies its entries again. Without the per-driver grant the pod runs all the same and
the refusal is a Warning Event on it. The chart's own rules let a ServiceAccount token bound to
a pod of the claim's node write, and the same account's unbound token not.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from railyard.cni.context import PodInterface
from railyard.kube.client import Client
from railyard.kube.config import TokenSource, load_kubeconfig
from railyard.kubelet.dra_status import FAILED, WRITTEN, ClaimStatusWriter
from railyard.records.dra_claims import PairRequest, claim_template
from railyard.records.dra_names import DRIVER
from support.box import get, kubebox, namespace, running_box, wait_for
from support.dra_box import claim_pod

pytestmark = [pytest.mark.root, pytest.mark.box]

AGENT = "railyard-agent"
SUBNET = "10.77.0.0/24"
SHOW = "ip -o link; ip -o addr; echo '<shown>'; sleep 600"


@pytest.fixture(scope="module")
def dra_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    folder = tmp_path_factory.mktemp("dra-network-data")
    kubebox.run([*kubebox.railyard_command(), "fixture", "--profile", "dgx-h100",
                 "--vfs-per-pf", "2", str(folder / "node")])
    ipam = {"type": "host-local", "ranges": [[{"subnet": SUBNET}]],
            "dataDir": "{run_dir}/railyard-ipam"}
    with running_box(folder / "box", node_sysfs=folder / "node" / "sys", with_railyard=True,
                     dra=True, railyard_ipam=ipam) as box:
        log = Path(next(s.log for s in box.state.started if s.name == AGENT))
        wait_for("kubelet to register the DRA driver", lambda: f"{DRIVER}: registered through "
                 "the plugin watcher" in log.read_text(), timeout=60)
        yield box


def start(box, ns: str, name: str, *, service_account: str | None = None) -> None:
    claim_pod(box, ns, name, claim_template(PairRequest(name=f"{name}-pairs", pairs=2)),
              command=SHOW,
              **({"serviceAccountName": service_account} if service_account else {}))


def inside(box, ns: str, name: str) -> dict[str, tuple[str, list[str]]]:
    """Each interface in the pod but lo and eth0: (MAC, its IPv4 addresses in CIDR form)."""
    log = wait_for("the pod to show its interfaces",
                   lambda: (t := box.kubectl("logs", "-n", ns, name, check=False))
                   and "<shown>" in t and t, timeout=120)
    macs = {m[1].split("@")[0]: m[2] for m in
            re.finditer(r"^\d+: ([^:]+):.*link/ether ([0-9a-f:]{17})", log, re.M)}
    ips: dict[str, list[str]] = {}
    for m in re.finditer(r"^\d+: (\S+)\s+inet (\S+)", log, re.M):
        ips.setdefault(m[1], []).append(m[2])
    return {n: (mac, ips.get(n, [])) for n, mac in macs.items() if n not in ("lo", "eth0")}


def claim_of(box, ns: str) -> dict:
    [claim] = get(box, "resourceclaims", "-n", ns, "--show-managed-fields")["items"]
    return claim


def ours(claim: dict) -> list[dict]:
    return [d for d in claim.get("status", {}).get("devices", []) if d["driver"] == DRIVER]


def test_the_claims_status_names_each_vf_as_the_pod_has_it(dra_box):
    box = dra_box
    ns = namespace(box)
    start(box, ns, "net")
    try:
        seen = inside(box, ns, "net")
        assert set(seen) == {"net1", "net1-1"}, seen
        claim = wait_for("the agent to write the claim's network data",
                         lambda: (c := claim_of(box, ns)) and len(ours(c)) == 2 and c,
                         timeout=60)
        results = claim["status"]["allocation"]["devices"]["results"]
        nics = [r for r in results if r["request"].startswith("nic")]
        # One entry per VF, in pair order, named by pool and device as the allocation is.
        assert [(d["pool"], d["device"]) for d in ours(claim)] == [
            (r["pool"], r["device"]) for r in nics]
        for entry, ifname in zip(ours(claim), ("net1", "net1-1"), strict=True):
            mac, ips = seen[ifname]
            assert entry["networkData"] == {"interfaceName": ifname, "hardwareAddress": mac,
                                            "ips": ips}, entry
            assert len(ips) == 1 and ips[0].startswith("10.77.0.")
        # Our manager owns exactly those entries, by server-side apply.
        managers = {m["manager"]: m for m in claim["metadata"]["managedFields"]
                    if m.get("subresource") == "status"}
        assert managers[AGENT]["operation"] == "Apply"
        events = get(box, "events", "-n", ns)["items"]
        assert not [e for e in events if e["reason"] == "RailyardClaimStatusNotWritten"]

        # Another manager's entry (one of the claim's GPUs) beside ours: the agent's apply
        # again, with its own credentials, leaves it and keeps ours as they were.
        gpu = next(r for r in results if r["request"].startswith("gpu"))
        other = {"driver": gpu["driver"], "pool": gpu["pool"], "device": gpu["device"],
                 "data": {"note": "another manager's"}}
        box.kubectl("patch", "resourceclaim", claim["metadata"]["name"], "-n", ns,
                    "--subresource=status", "--type=json", "--field-manager=box-other",
                    "-p", json.dumps([{"op": "add", "path": "/status/devices/-",
                                       "value": other}]))
        before = ours(claim_of(box, ns))
        pod_uid = get(box, "pod", "net", "-n", ns)["metadata"]["uid"]
        assert again(box, pod_uid, claim, seen) == [WRITTEN]
        after = claim_of(box, ns)
        assert ours(after) == before
        kept = [d for d in after["status"]["devices"] if d["device"] == gpu["device"]]
        # (The API server stores `conditions: null` on every entry: the Go field has no
        # omitempty.)
        assert [{k: v for k, v in d.items() if v is not None} for d in kept] == [other]
    finally:
        box.kubectl("delete", "pod", "net", "-n", ns, "--wait=false", check=False)


def again(box, pod_uid: str, claim: dict, seen: dict[str, tuple[str, list[str]]], *,
          token: str | None = None) -> list[str]:
    """The agent's write of the pod's interfaces, once more, from its state folder, as the
    agent (its kubeconfig) or as whoever `token` is: what an ADD of a sandbox made again
    would apply."""
    nics = [r for r in claim["status"]["allocation"]["devices"]["results"]
            if r["request"].startswith("nic")]
    interfaces = [PodInterface(_pci(r["device"]), name, seen[name][0], tuple(seen[name][1]))
                  for r, name in zip(nics, ("net1", "net1-1"), strict=True)]

    async def write() -> list[str]:
        config = load_kubeconfig(box.layout.dir / "config/railyard-agent.kubeconfig")
        if token is not None:
            config = replace(config, client_cert=None, client_key=None,
                             token=TokenSource(token))
        async with Client(config) as client:
            writer = ClaimStatusWriter(client, str(box.layout.dir / "railyard-state"),
                                       asyncio.get_running_loop(), node=kubebox.NODE_NAME)
            return await writer.write(pod_uid, interfaces)

    return asyncio.run(write())


def _pci(device: str) -> str:
    """`pci-0000-18-00-2` → `0000:18:00.2` (records.dra_names.device_name, backwards)."""
    d, b, s, f = device.removeprefix("pci-").split("-")
    return f"{d}:{b}:{s}.{f}"


def can_write_claim_status(box) -> bool:
    """Whether the API server's RBAC lets the box's agent write our entries now."""
    answer = box.kubectl("auth", "can-i", "arbitrary-node:patch",
                         f"resourceclaims/{DRIVER}", "--subresource=driver",
                         f"--as={kubebox.AGENT_USER}", check=False)
    return answer.strip() == "yes"


def test_without_the_driver_grant_the_pod_runs_and_the_refusal_is_an_event(dra_box):
    """The per-driver check of v1.36 refuses the write (422 naming resourceclaims/driver): the
    sandbox is made all the same, the pod has its VFs, and the pod gets a Warning Event."""
    box = dra_box
    ns = namespace(box)
    role = get(box, "clusterrole", "railyard-agent")
    granted = role["rules"]
    role["rules"] = [r for r in granted if "resourceclaims/driver" not in r["resources"]]
    box.kubectl("replace", "-f", "-", input=json.dumps(role))
    try:
        wait_for("RBAC to take the grant away", lambda: not can_write_claim_status(box),
                 timeout=30)
        start(box, ns, "denied")
        assert set(inside(box, ns, "denied")) == {"net1", "net1-1"}
        event = wait_for("the agent's Warning Event", lambda: [
            e for e in get(box, "events", "-n", ns)["items"]
            if e["reason"] == "RailyardClaimStatusNotWritten"], timeout=60)[0]
        assert event["type"] == "Warning"
        assert event["involvedObject"]["name"] == "denied"
        assert "resourceclaims/driver" in event["message"], event["message"]
        assert ours(claim_of(box, ns)) == []
    finally:
        role = get(box, "clusterrole", "railyard-agent")
        role["rules"] = granted
        box.kubectl("replace", "-f", "-", input=json.dumps(role))
        box.kubectl("delete", "pod", "denied", "-n", ns, "--wait=false", check=False)
    wait_for("RBAC to give the grant back", lambda: can_write_claim_status(box), timeout=30)


def test_the_charts_grant_lets_a_serviceaccount_of_the_claims_node_write_and_no_other(
        dra_box):
    """The chart's DRA-mode agent rules, bound to a ServiceAccount: with a token bound to a
    pod on the claim's node (as the agent's DaemonSet pod has) the write passes by
    `associated-node:patch`; with a token of the same account bound to no pod it is refused,
    for the chart grants no `arbitrary-node` verb."""
    box = dra_box
    ns = namespace(box)
    [rules] = [o["rules"] for o in kubebox.chart_objects(dra=True)
               if o["kind"] == "ClusterRole" and o["metadata"]["name"] == AGENT]
    name = f"chart-agent-{ns}"
    box.kubectl("create", "serviceaccount", AGENT, "-n", ns)
    box.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                      "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": AGENT, "namespace": ns}]}]}))
    start(box, ns, "sa", service_account=AGENT)
    try:
        seen = inside(box, ns, "sa")
        claim = wait_for("the agent to write the claim's network data",
                         lambda: (c := claim_of(box, ns)) and len(ours(c)) == 2 and c,
                         timeout=60)
        pod_uid = get(box, "pod", "sa", "-n", ns)["metadata"]["uid"]
        # A change to say (an address more on net1), so the API server checks the driver
        # grant: an apply that changes nothing needs none.
        more = {**seen, "net1": (seen["net1"][0], [*seen["net1"][1], "10.78.0.9/24"])}
        unbound = box.kubectl("create", "token", AGENT, "-n", ns).strip()
        wait_for("the account's RBAC to be served", lambda: box.kubectl(
            "auth", "can-i", "patch", "resourceclaims", "--subresource=status", "-n", ns,
            f"--as=system:serviceaccount:{ns}:{AGENT}", check=False).strip() == "yes",
            timeout=30)
        assert again(box, pod_uid, claim, more, token=unbound) == [FAILED]
        assert ours(claim_of(box, ns)) == ours(claim)
        bound = box.kubectl("create", "token", AGENT, "-n", ns, "--bound-object-kind=Pod",
                            "--bound-object-name=sa").strip()
        assert again(box, pod_uid, claim, more, token=bound) == [WRITTEN]
        [net1, _] = ours(claim_of(box, ns))
        assert net1["networkData"]["ips"] == more["net1"][1]
    finally:
        box.kubectl("delete", "pod", "sa", "-n", ns, "--wait=false", check=False)
        box.kubectl("delete", "clusterrolebinding,clusterrole", name, check=False)
