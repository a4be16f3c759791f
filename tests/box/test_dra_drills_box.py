"""Drills on Railyard as the DRA driver (issue 29), on the box's real kube-scheduler, kubelet
v1.36.3 and containerd with CDI, the agent in DRA mode (`support.dra_box`): the agent restarted
between kubelet's NodePrepareResources and the sandbox's CNI ADD (with its state folder, and
without it), and the pod's deletion after the agent lost its state (the prepared-claim
documents alone, or the whole folder but the CNI's attachment records). The pairs are freed
each time, and given to the next pod. A box of their own: they stop the agent and take its
folders away (the kubelet restart drill is in test_dra_kubelet_box.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from railyard.kubelet.dra_cdi import CdiSpecs
from railyard.kubelet.dra_prepared import PreparedClaim, PreparedClaims
from railyard.node.state import PodRecord, StateStore
from support.box import get, host_macs, kubebox, links_inside, namespace, phase, wait_for
from support.dra_box import (
    AGENT,
    Node,
    allocated_claim,
    claim_pod,
    claim_vfs,
    pinned_template,
    registrations,
    running_dra_box,
    start_pod,
)

pytestmark = [pytest.mark.root, pytest.mark.box]

LISTED = "-- listed --"
SLEEP = f"ip -o link; echo {LISTED}; sleep 3600"


@pytest.fixture(scope="module")
def dra_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Node]]:
    with running_dra_box(tmp_path_factory.mktemp("dra-drills")) as running:
        yield running


@pytest.fixture
def ns(dra_box) -> Iterator[str]:
    """A namespace whose pods are gone (their claims unprepared) before the next drill."""
    box, _ = dra_box
    name = namespace(box)
    yield name
    box.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s")


def events(box, ns: str, name: str, reason: str) -> str:
    listed = get(box, "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")
    return " ".join(e["message"] for e in listed["items"] if e["reason"] == reason)


def agent_said(box, claim_uid: str, what: str) -> int:
    """How many lines of the agent's log (every start of it) say `what` of the claim."""
    log = Path(next(s.log for s in box.state.started if s.name == AGENT))
    return sum(1 for line in log.read_text(errors="replace").splitlines()
               if f"({claim_uid})" in line and what in line)


def uid_of(box, ns: str, name: str) -> str:
    return get(box, "pod", name, "-n", ns)["metadata"]["uid"]


def restart_agent(box, while_stopped: Callable[[], None] = lambda: None) -> None:
    """Stop the agent, do `while_stopped`, start it again; back once kubelet has registered
    its DRA plugin again and its CNI socket is there."""
    registered = registrations(box)
    box.stop(AGENT)
    while_stopped()
    box.restart(AGENT)  # its pid is gone: this starts it with the same argv
    wait_for("kubelet to register the restarted agent's DRA plugin",
             lambda: registrations(box) > registered and box.cni_socket.exists(), timeout=90)


def running_log(box, ns: str, name: str) -> str:
    """The log of a running pod once its links are listed ("" before)."""
    if phase(box, ns, name) != "Running":
        return ""
    log = box.kubectl("logs", "-n", ns, name, check=False)
    return log if LISTED in log else ""


def finished(box, ns: str, name: str) -> str:
    p = phase(box, ns, name)
    return p if p in ("Succeeded", "Failed") else ""


def assert_inside(log: str, vfs: list, macs: dict[str, str]) -> None:
    """Exactly these VFs in the pod, net1, net1-1 in pair order (known by their MACs)."""
    inside = links_inside(log)
    for name, vf in zip(("net1", "net1-1"), vfs, strict=True):
        assert macs[vf.netdev] in inside.get(name, ""), (name, vf.netdev, inside)
    assert not {n for n in inside if n.startswith("net1")} - {"net1", "net1-1"}, inside


def the_next_pod_gets_them(box, ns: str, node: Node, claim: dict, vfs: list,
                           macs: dict[str, str]) -> None:
    """A pod asking for exactly `claim`'s devices is allocated them, prepared at once (kubelet
    says no prepare failure) and runs with the same VFs in the same pair order."""
    claim_pod(box, ns, "next", pinned_template(node, claim))
    again = allocated_claim(box, ns, "next")
    assert [r["device"] for r in again["status"]["allocation"]["devices"]["results"]] == \
        [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
    assert wait_for("pod next to finish", lambda: finished(box, ns, "next"),
                    timeout=120) == "Succeeded", events(box, ns, "next", "Failed")
    assert events(box, ns, "next", "FailedPrepareDynamicResources") == ""
    assert_inside(box.kubectl("logs", "-n", ns, "next"), vfs, macs)
    box.kubectl("delete", "pod", "next", "-n", ns, "--wait=true", "--timeout=120s")


def prepared_nothing_for(node: Node, claim_uid: str, pod_uid: str) -> bool:
    """Nothing of the claim's preparation left on the node (CDI spec, document, record,
    pair files)."""
    return (not CdiSpecs(node.cdi_dir).path(claim_uid).exists()
            and PreparedClaims(node.state_dir).get(claim_uid) is None
            and StateStore(node.state_dir, kubebox.NODE_NAME).get(pod_uid) is None
            and not (Path(node.state_dir) / "pairs" / pod_uid).exists())


@dataclass(frozen=True)
class Held:
    """A pod whose claim kubelet prepared and whose sandbox's ADD found no CNI service, and
    what the node had of it then."""

    claim: dict
    uid: str  # the claim's
    pod_uid: str
    record: PodRecord
    document: PreparedClaim
    spec: str  # the CDI spec's text


def held_at_the_add(box, node: Node, ns: str, name: str, rails: tuple[int, int],
                    while_stopped: Callable[[], None] = lambda: None) -> Held:
    """The CNI ADD held back, with kubelet's NodePrepareResources already answered: the
    agent's CNI socket is moved aside (the DRA plugin keeps its own sockets), so kubelet
    prepares the claim (its CDI spec is there) and the sandbox's ADD finds no service
    ("railyard CNI service unreachable", which kubelet reports as FailedCreatePodSandBox and
    retries). The agent is restarted there (`while_stopped` done while it is down); kubelet's
    next try reaches the new process."""
    aside = Path(f"{box.cni_socket}.aside")
    kubebox.run(box.on_node(["mv", str(box.cni_socket), str(aside)]))
    try:
        start_pod(box, ns, name, rails, command=SLEEP)
        claim = allocated_claim(box, ns)
        uid = claim["metadata"]["uid"]
        cdi = CdiSpecs(node.cdi_dir).path(uid)
        wait_for("kubelet to prepare the claim", cdi.exists, timeout=60)
        message = wait_for("the sandbox's ADD to find no CNI service",
                           lambda: events(box, ns, name, "FailedCreatePodSandBox"), timeout=90)
        assert "railyard CNI service unreachable" in message, message
        assert phase(box, ns, name) == "Pending"
        pod_uid = uid_of(box, ns, name)
        record = StateStore(node.state_dir, kubebox.NODE_NAME).get(pod_uid)
        document = PreparedClaims(node.state_dir).get(uid)
        assert record is not None and document is not None
        held = Held(claim, uid, pod_uid, record, document, cdi.read_text())
        restart_agent(box, while_stopped)
    finally:  # the socket back where the drill stopped short of the restart
        kubebox.run(box.on_node(["sh", "-c", 'test -e "$0" || mv "$1" "$0"; rm -f "$1"',
                                 str(box.cni_socket), str(aside)]))
    return held


def test_agent_restarted_between_prepare_and_the_cni_add_gives_the_pod_exactly_its_claims_vfs(
        dra_box, ns):
    """The agent restarts between kubelet's prepare and the sandbox's ADD (a new process,
    nothing in memory): the pod runs with exactly its claim's VFs in pair order, from the
    record prepare wrote: the same record, document and CDI spec, the claim allocated and
    prepared once."""
    box, node = dra_box
    macs = host_macs(box)
    held = held_at_the_add(box, node, ns, "held", (2, 5))
    uid, pod_uid = held.uid, held.pod_uid
    log = wait_for("pod held to run and list its links", lambda: running_log(box, ns, "held"),
                   timeout=180)

    vfs = [v for _, v in claim_vfs(node, held.claim)]
    assert [p.nic.pci_address for p in held.record.allocation.pairs] == \
        [v.pci_address for v in vfs]
    assert_inside(log, vfs, macs)
    # Prepared once: the record (its first stamp), the document and the spec as prepare wrote
    # them, the claim's allocation as kube-scheduler made it, and no other pod's record.
    store = StateStore(node.state_dir, kubebox.NODE_NAME)
    assert store.get(pod_uid) == held.record
    assert PreparedClaims(node.state_dir).get(uid) == held.document
    assert CdiSpecs(node.cdi_dir).path(uid).read_text() == held.spec
    assert get(box, "resourceclaim", held.claim["metadata"]["name"], "-n", ns)["status"][
        "allocation"] == held.claim["status"]["allocation"]
    assert [r.uid for r in store.all()] == [pod_uid]
    assert agent_said(box, uid, "prepared for pod") == 1  # kubelet did not prepare it again

    box.kubectl("delete", "pod", "held", "-n", ns, "--wait=true", "--timeout=120s")
    wait_for("the claim to be unprepared", lambda: prepared_nothing_for(node, uid, pod_uid),
             timeout=90)
    wait_for("the VFs back in the host", lambda: all(
        host_macs(box).get(v.netdev) == macs[v.netdev] for v in vfs), timeout=60)
    the_next_pod_gets_them(box, ns, node, held.claim, vfs, macs)


def test_the_state_lost_between_prepare_and_the_cni_add_is_prepared_again_and_the_pod_gets_its_vfs(
        dra_box, ns):
    """The agent's state folder lost while the sandbox's ADD is held back: kubelet will not
    prepare the claim again (its checkpoint says prepared), so the restarted agent prepares
    again what kubelet holds, and the ADD finds the pod's record: the pod runs with exactly its
    claim's VFs in pair order (without it the ADD moved nothing and the pod ran without them)."""
    box, node = dra_box
    macs = host_macs(box)
    held = held_at_the_add(box, node, ns, "reborn", (0, 7),
                           lambda: shutil.rmtree(node.state_dir))
    log = wait_for("pod reborn to run and list its links",
                   lambda: running_log(box, ns, "reborn"), timeout=180)
    vfs = [v for _, v in claim_vfs(node, held.claim)]
    assert_inside(log, vfs, macs)
    record = StateStore(node.state_dir, kubebox.NODE_NAME).get(held.pod_uid)
    assert record is not None and record.allocation.pairs == held.record.allocation.pairs
    assert agent_said(box, held.uid, "prepared again from the claim") == 1
    assert CdiSpecs(node.cdi_dir).path(held.uid).read_text() == held.spec

    box.kubectl("delete", "pod", "reborn", "-n", ns, "--wait=true", "--timeout=120s")
    wait_for("the claim to be unprepared",
             lambda: prepared_nothing_for(node, held.uid, held.pod_uid), timeout=90)
    wait_for("the VFs back in the host", lambda: all(
        host_macs(box).get(v.netdev) == macs[v.netdev] for v in vfs), timeout=60)


def lose_prepared_claims(node: Node) -> None:
    """The prepared-claim documents gone (`<state_dir>/dra/claims`); the rest stays."""
    shutil.rmtree(Path(node.state_dir) / "dra")


def lose_all_but_the_cni(node: Node) -> None:
    """The whole state folder gone, but the CNI's attachment records: in the box a VF is a
    veth, which dies with the pod's namespace unless a DEL brings it home (a real VF comes
    back by itself, under the pod's name; the extender-mode drill of a lost folder says so)."""
    state = Path(node.state_dir)
    lost = state.with_name("railyard-state.lost")
    state.rename(lost)
    shutil.copytree(lost / "cni", state / "cni")
    shutil.rmtree(lost)


@pytest.mark.parametrize("lose", [lose_prepared_claims, lose_all_but_the_cni],
                         ids=["prepared-claims", "state-folder"])
def test_unprepare_after_the_agent_lost_its_state_frees_the_claims_pairs(dra_box, ns, lose):
    """A claim prepared and its pod running; the agent stops, its state goes, it starts again,
    the pod is deleted: kubelet's NodeUnprepareResources succeeds (the claim's CDI spec is gone
    and nothing of the preparation is left), the VFs are back in the host under their names
    and MACs, and the next pod asking for the same devices runs with them, prepared at once.
    With the prepared-claim documents alone lost, unprepare finds the pod by the claim's pair
    file; with the folder lost, the restarted agent has prepared the claim kubelet holds
    again (the pod's record back as it was), and unprepare has its document."""
    box, node = dra_box
    macs = host_macs(box)
    start_pod(box, ns, "lost", (3, 4), command=SLEEP)
    claim = allocated_claim(box, ns)
    uid = claim["metadata"]["uid"]
    vfs = [v for _, v in claim_vfs(node, claim)]
    wait_for("pod lost to run", lambda: phase(box, ns, "lost") == "Running", timeout=120)
    pod_uid = uid_of(box, ns, "lost")
    assert not {v.netdev for v in vfs} & set(host_macs(box))  # moved into the pod
    cdi = CdiSpecs(node.cdi_dir).path(uid)
    assert cdi.exists()
    store = StateStore(node.state_dir, kubebox.NODE_NAME)
    record = store.get(pod_uid)
    assert record is not None

    restart_agent(box, lambda: lose(node))
    if lose is lose_all_but_the_cni:
        back = wait_for("the agent to prepare the claim kubelet holds again",
                        lambda: PreparedClaims(node.state_dir).get(uid), timeout=60)
        assert back.pod.uid == pod_uid
        assert wait_for("the pod's record back", lambda: store.get(pod_uid),
                        timeout=30).allocation.pairs == record.allocation.pairs
        assert agent_said(box, uid, "prepared again from the claim") == 1
    else:  # the record stands: nothing to prepare again, unprepare has no document
        assert store.get(pod_uid) == record
        assert agent_said(box, uid, "prepared again from the claim") == 0
        assert PreparedClaims(node.state_dir).get(uid) is None

    box.kubectl("delete", "pod", "lost", "-n", ns, "--wait=true", "--timeout=120s")
    wait_for("the claim to be unprepared", lambda: not cdi.exists(), timeout=90)
    # The record is freed by unprepare itself (found by the claim's pair file) or went with
    # the folder: nothing waits for the agent's clean-up.
    assert prepared_nothing_for(node, uid, pod_uid)
    # Kubelet unprepares before it reports the pod terminated, so the deletion's end above
    # says it succeeded; the agent answered no error.
    assert agent_said(box, uid, "not unprepared") == 0
    wait_for("the VFs back in the host", lambda: all(
        host_macs(box).get(v.netdev) == macs[v.netdev] for v in vfs), timeout=60)
    the_next_pod_gets_them(box, ns, node, claim, vfs, macs)
