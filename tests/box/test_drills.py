"""Each restart primitive leaves the box working; a watch resumes after kube-apiserver restarts."""

from __future__ import annotations

import json
import ssl
import urllib.request

import pytest

from support.box import get, kubebox, leftovers, namespace, pod, run_to_success

pytestmark = [pytest.mark.root, pytest.mark.box]


def run_a_pod(box, name: str) -> None:
    assert run_to_success(box, namespace(box), pod(name, ["echo", name])).strip() == name


@pytest.mark.parametrize("component", ["kubelet", "containerd", "kube-scheduler"])
def test_a_restarted_component_leaves_the_box_working(drill_box, component):
    drill_box.restart(component)
    run_a_pod(drill_box, f"after-{component}")


def _api(box, path: str, timeout: float = 30.0):
    pki = box.layout.dir / "pki"
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    return urllib.request.urlopen(f"{box.layout.server}{path}", context=context, timeout=timeout)


def test_a_watch_resumes_after_the_apiserver_restarts(drill_box):
    ns = namespace(drill_box)
    listed = get(drill_box, "configmaps", "-n", ns)
    version = listed["metadata"]["resourceVersion"]
    drill_box.kubectl("create", "configmap", "before", "-n", ns)
    drill_box.restart("kube-apiserver")
    drill_box.kubectl("create", "configmap", "after", "-n", ns)
    # Resume from the list's resourceVersion: both changes arrive, none is lost to the restart.
    # (A freshly started watch cache may replay them as its initial state, sorted by name.)
    path = (f"/api/v1/namespaces/{ns}/configmaps?watch=1&resourceVersion={version}"
            "&allowWatchBookmarks=true&timeoutSeconds=5")
    seen = []
    with _api(drill_box, path) as stream:
        for line in stream:
            event = json.loads(line)
            assert event["type"] != "ERROR", event
            if event["type"] == "ADDED":
                seen.append(event["object"]["metadata"]["name"])
            if len(seen) == 2:
                break
    assert sorted(seen) == ["after", "before"]
    run_a_pod(drill_box, "after-apiserver")


def test_a_failed_up_removes_what_it_started(tmp_path):
    """kube-scheduler refuses a configuration with an unknown plugin: `up` fails naming it, with
    its log, and leaves nothing of the half-started box behind."""
    config = tmp_path / "scheduler.yaml"
    config.write_text("apiVersion: kubescheduler.config.k8s.io/v1\n"
                      "kind: KubeSchedulerConfiguration\n"
                      "profiles:\n- schedulerName: default-scheduler\n"
                      "  plugins: {filter: {enabled: [{name: NoSuchPlugin}]}}\n")
    broken = kubebox.Box(tmp_path / "box", scheduler_config=config)
    with pytest.raises(kubebox.BoxError, match="kube-scheduler") as failure:
        broken.up()
    assert "NoSuchPlugin" in str(failure.value)
    assert leftovers(broken) == {}


def test_down_leaves_nothing_and_can_run_twice(drill_box):
    """Last in this module: the drill box goes down here (the fixture's down runs again)."""
    run_a_pod(drill_box, "before-down")  # a pod's sandbox, netns and mounts exist to be removed
    drill_box.down()
    assert leftovers(drill_box) == {}
    drill_box.down()
    assert leftovers(drill_box) == {}
