"""The chart's own pods on the box (issue 16): the Railyard image built here (hack/build-image,
decision 0092) imported into the node's containerd, `helm install` with values that fit the
box's folders, the agent DaemonSet and the extender Deployment Ready, kube-scheduler calling the
extender through the release's Service, a 2 GPU + 2 VF pod running paired; `helm upgrade` while
it runs keeps its devices and record; `helm uninstall` leaves only what docs/install.md says.

The tests run in file order on one module box and one release: each phase starts from the last.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from railyard.allocation.names import ALLOCATION_ANNOTATION
from railyard.records.allocation import decode_allocation
from support.box import get, kubebox, namespace, pod, wait_for
from support.chart import CHART, helm
from support.chart_box import ChartBox, railyard_image

pytestmark = [pytest.mark.box, pytest.mark.root, pytest.mark.slow]

RELEASE, NS = "railyard", "railyard-system"  # docs/install.md's: the chart's short names
AGENT, EXTENDER = "railyard-agent", "railyard-extender"
SERVICE, SCHEDULER_CONFIG = "railyard-scheduler", "railyard-scheduler-config"
SCHEDULER_PORT = 10261  # the box's own kube-scheduler has 10259
READY_S = 240  # the image's first start on 2 busy CPUs; typically 20-40 s


@pytest.fixture(scope="module")
def chart_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartBox]:
    if os.geteuid() != 0:
        pytest.skip("the box needs root: network namespaces, mounts and cgroups")
    if not (kubebox.cache_root() / f"railyard-image-{railyard_image.image_key()}/complete"
            ).exists() and not Path("/usr/sbin/debootstrap").exists():
        pytest.skip("the Railyard image is not built and debootstrap is missing to build it "
                    "(apt-get install debootstrap; .ci/run installs it)")
    box = ChartBox(tmp_path_factory.mktemp("chart-pods-box"))
    box.up()
    try:
        box.import_railyard_image()
        yield box
    finally:
        box.down()


def _values(box: ChartBox, into: Path) -> Path:
    """The box's values: its folders, GPUs given to Railyard (no NVIDIA plugin here), the
    imported image never pulled."""
    values = {
        "image": {"pullPolicy": "Never"},
        "agent": {"gpus": {"enabled": True}, "hostPaths": box.chart_values()},
    }
    path = into / "box-values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _diagnose(box: ChartBox) -> str:
    """What to read when a wait fails: the release's pods, their events and logs."""
    parts = [box.kubectl("get", "pods", "-n", NS, "-o", "wide", check=False),
             box.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False)]
    for name in box.kubectl("get", "pods", "-n", NS, "-o", "name", check=False).split():
        parts.append(f"--- {name}\n" + box.kubectl("logs", "-n", NS, name, "--all-containers",
                                                  "--tail=40", check=False))
    return "\n".join(parts)[-12000:]


def _rollout(box: ChartBox, kind: str, name: str) -> None:
    done = kubebox.run([box.bin("kubectl"), "--kubeconfig", str(box.layout.admin_kubeconfig),
                        "rollout", "status", f"{kind}/{name}", "-n", NS,
                        f"--timeout={READY_S}s"], check=False)
    assert done.returncode == 0, f"{kind}/{name} not rolled out:\n{done.stderr}\n{_diagnose(box)}"


def _release_pods(box: ChartBox, component: str) -> list[dict]:
    return get(box, "pods", "-n", NS, "-l",
               f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
               )["items"]


def _offered(box: ChartBox) -> dict[str, int]:
    allocatable = get(box, "node", kubebox.NODE_NAME)["status"].get("allocatable", {})
    return {k: int(allocatable.get(k, "0")) for k in ("nvidia.com/gpu", "railyard.dev/vf")}


@pytest.fixture(scope="module")
def release(chart_box: ChartBox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`helm install` of the chart; returns helm's home (config and cache) for later calls."""
    home = tmp_path_factory.mktemp("helm-home")
    helm(home, "install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace",
         "--values", str(_values(chart_box, home)),
         kubeconfig=chart_box.layout.admin_kubeconfig)
    _rollout(chart_box, "daemonset", AGENT)
    _rollout(chart_box, "deployment", EXTENDER)
    return home


@pytest.fixture(scope="module")
def railyard_scheduler(chart_box: ChartBox, release: Path) -> str:
    """The chart's KubeSchedulerConfiguration (its ConfigMap) run as a second kube-scheduler,
    option 1 of docs/install.md, as a process of the box (no kube-scheduler image here). It
    runs on the node's network with no cluster DNS, so — as docs/install.md says for such a
    scheduler — its urlPrefix names the Service's ClusterIP instead of its DNS name."""
    box = chart_box
    config = yaml.safe_load(get(box, "configmap", SCHEDULER_CONFIG, "-n", NS)["data"][
        "kube-scheduler-config.yaml"])
    cluster_ip = get(box, "service", SERVICE, "-n", NS)["spec"]["clusterIP"]
    [extender] = config["extenders"]
    dns_name = f"{SERVICE}.{NS}.svc"
    assert dns_name in extender["urlPrefix"]
    extender["urlPrefix"] = extender["urlPrefix"].replace(dns_name, cluster_ip)
    identity = str(box.layout.dir / "config/kube-scheduler.kubeconfig")
    config["clientConnection"]["kubeconfig"] = identity
    # The box's scheduler identity may hold only the Lease named kube-scheduler (its default
    # ClusterRole); one replica here needs none.
    config["leaderElection"] = {"leaderElect": False}
    path = box.layout.dir / "config/railyard-kube-scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    box.start("railyard-kube-scheduler", [
        box.bin("kube-scheduler"), "--config", str(path),
        "--authentication-kubeconfig", identity, "--authorization-kubeconfig", identity,
        "--bind-address", "0.0.0.0", "--secure-port", str(SCHEDULER_PORT)])
    box.wait("railyard-kube-scheduler", lambda: box._https_ok(
        f"https://{box.layout.node_ip}:{SCHEDULER_PORT}/readyz", client=None))
    return config["profiles"][0]["schedulerName"]


@pytest.fixture(scope="module")
def paired(chart_box: ChartBox, railyard_scheduler: str) -> tuple[str, str]:
    """A sleeping pod asking 2 GPUs and 2 VFs of the chart's scheduler profile, its VFs
    through Multus and the agent's CNI socket (deploy/examples/training-pod.yaml's shape, with
    the box's busybox and without its 8 CPUs: the box node has 2). Returns (namespace, name)."""
    box = chart_box
    wait_for("the agent's device plugins on the node", lambda: all(_offered(box).values()),
             timeout=READY_S)
    ns = namespace(box)
    manifest = pod("train", ["sleep", "3600"], schedulerName=railyard_scheduler,
                   restartPolicy="Never")
    manifest["metadata"]["annotations"] = {
        "k8s.v1.cni.cncf.io/networks": box.network_attachment(ns)}
    manifest["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "2", "railyard.dev/vf": "2"}}
    box.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))

    def running() -> bool:
        return get(box, "pod", "train", "-n", ns).get("status", {}).get("phase") == "Running"

    try:
        wait_for("the paired pod to run", running, timeout=READY_S)
    except BaseException:
        print(box.kubectl("describe", "pod", "train", "-n", ns, check=False))
        print(_diagnose(box))
        raise
    return ns, "train"


def _links_in(box: ChartBox, ns: str, name: str) -> set[str]:
    out = box.kubectl("exec", "-n", ns, name, "--", "ip", "-o", "link")
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def test_chart_pods_run_and_a_pod_runs_paired_through_the_charts_extender(chart_box, paired):
    box, (ns, name) = chart_box, paired
    images = box.ctr_images()
    assert railyard_image.image_name() in images
    for component, count in ((AGENT.split("-")[1], 1), (EXTENDER.split("-")[1], 2)):
        pods = _release_pods(box, component)
        assert len(pods) == count, [p["metadata"]["name"] for p in pods]
        for p in pods:
            ready = {c["type"]: c["status"] for c in p["status"]["conditions"]}
            assert ready["Ready"] == "True", (p["metadata"]["name"], ready)
            [status] = p["status"]["containerStatuses"]
            assert status["imageID"] and status["image"].endswith("railyard:0.1.0"), status
    record = get(box, "pod", name, "-n", ns)
    allocation = decode_allocation(record["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    # Written by the extender pod (the scheduler's decision), bound to the box's node.
    assert allocation.decided_by == "scheduler"
    assert record["spec"]["nodeName"] == allocation.node == kubebox.NODE_NAME
    assert len(allocation.pairs) == 2
    holder = box.kubectl("get", "lease", SERVICE, "-n", NS, "-o",
                         "jsonpath={.spec.holderIdentity}").strip()
    assert holder in {p["metadata"]["name"] for p in _release_pods(box, "extender")}
    # The agent pod's CNI service moved exactly the pair's VFs in, named in pair order.
    assert {"net1", "net1-1"} <= _links_in(box, ns, name)
    topology = get(box, "nodetopology", kubebox.NODE_NAME)
    assert topology["status"]["health"], topology["status"]


def _pod_devices(box: ChartBox, ns: str, name: str) -> tuple[str, str, int, set[str]]:
    p = get(box, "pod", name, "-n", ns)
    [status] = p["status"]["containerStatuses"]
    return (status["containerID"], p["metadata"]["annotations"][ALLOCATION_ANNOTATION],
            status["restartCount"], _links_in(box, ns, name))


def test_helm_upgrade_while_the_pod_runs_keeps_its_devices_and_record(chart_box, release,
                                                                       paired):
    """A changed log level changes both pod templates: every agent and extender pod is
    replaced, the running pod keeps its container, VFs and record."""
    box, (ns, name) = chart_box, paired
    before = _pod_devices(box, ns, name)
    old = {p["metadata"]["uid"] for c in ("agent", "extender") for p in _release_pods(box, c)}
    helm(release, "upgrade", RELEASE, str(CHART), "--namespace", NS, "--reuse-values",
         "--set", "agent.logLevel=debug", "--set", "extender.logLevel=debug",
         kubeconfig=box.layout.admin_kubeconfig)
    _rollout(box, "daemonset", AGENT)
    _rollout(box, "deployment", EXTENDER)
    # rollout status returns once the new pods are Ready; the old extender pods may still be
    # terminating.
    wait_for("only the upgraded agent and extender pods", lambda: not old & {
        p["metadata"]["uid"] for c in ("agent", "extender") for p in _release_pods(box, c)},
        timeout=READY_S)
    agents = _release_pods(box, "agent")
    assert [a["spec"]["containers"][0]["args"].count("--log-level=debug") for a in agents] == [1]
    wait_for("the upgraded agent's device plugins", lambda: all(_offered(box).values()),
             timeout=READY_S)
    after = _pod_devices(box, ns, name)
    assert after == before, (before, after)
    assert get(box, "pod", name, "-n", ns)["status"]["phase"] == "Running"


def _railyard_files(values: dict[str, str], kubelet: Path) -> list[str]:
    """Every file on the node, in the chart's host folders, that is Railyard's: named so, or
    in its own state and socket folders. `kubelet`: kubelet's folder as this process sees it
    (the node's mount namespace binds it at /var/lib/kubelet)."""
    found = []
    for key in ("cniBinDir", "devinfoDir", "cniStateDir"):
        root = Path(values[key])
        found += [str(p) for p in root.rglob("*") if "railyard" in str(p.relative_to(root))]
    for key in ("stateDir", "socketDir"):
        found += [str(p) for p in Path(values[key]).rglob("*")]
    for sub in ("device-plugins", "plugins_registry", "pod-resources"):
        found += [str(p) for p in (kubelet / sub).glob("*railyard*")]
    return sorted(found)


def _documented(values: dict[str, str], kubelet: Path) -> list[str]:
    """docs/install.md's "Uninstall" list, in the box's folders."""
    return [f"{values['cniBinDir']}/railyard-cni", f"{values['cniBinDir']}/.railyard-cni",
            f"{values['cniBinDir']}/.railyard-cni/*",
            f"{values['stateDir']}/*", f"{values['socketDir']}/*",
            f"{values['devinfoDir']}/*/railyard.dev-*",
            f"{kubelet}/device-plugins/railyard.dev_*.sock",
            f"{kubelet}/plugins_registry/railyard.dev_*.sock"]


def test_helm_uninstall_leaves_only_what_the_docs_list(chart_box, release, paired):
    box, (ns, name) = chart_box, paired
    # docs/install.md: the pods holding Railyard's VFs go first (their CNI DEL returns the
    # VFs through the agent).
    box.kubectl("delete", "pod", name, "-n", ns, "--wait=true", "--timeout=120s")
    helm(release, "uninstall", RELEASE, "--namespace", NS, "--wait", "--timeout", "180s",
         kubeconfig=box.layout.admin_kubeconfig)
    wait_for("the release's pods to be gone",
             lambda: not get(box, "pods", "-n", NS)["items"], timeout=READY_S)

    # Objects: in the namespace, only the extender's Lease, Events and what Kubernetes puts
    # in every namespace; cluster-wide, only the CRD and the NodeTopology it holds.
    kinds = box.kubectl("api-resources", "--verbs=list", "--namespaced", "-o", "name").split()
    kept = sorted(["configmap/kube-root-ca.crt", "serviceaccount/default",
                   f"lease.coordination.k8s.io/{SERVICE}"])

    def in_namespace() -> list[str]:
        return sorted(box.kubectl("get", ",".join(k for k in kinds if not k.startswith("events")),
                                  "-n", NS, "-o", "name").split())

    # The garbage collector removes what the Deployment and DaemonSet owned (ReplicaSets,
    # ControllerRevisions) after helm returns.
    wait_for("only the documented objects in the namespace", lambda: in_namespace() == kept,
             timeout=120)
    selector = f"app.kubernetes.io/instance={RELEASE}"
    cluster = box.kubectl("get", "clusterroles,clusterrolebindings,validatingadmissionpolicies,"
                          "validatingadmissionpolicybindings", "-l", selector, "-o", "name")
    assert cluster.strip() == ""
    assert box.kubectl("get", "crd", "nodetopologies.railyard.dev", "-o", "name").strip()
    assert box.kubectl("get", "nodetopology", kubebox.NODE_NAME, "-o", "name").strip()
    # Kubelet forgets the resources once the plugins are gone (allocatable 0).
    wait_for("kubelet to stop offering Railyard's devices",
             lambda: not any(_offered(box).values()), timeout=120)

    # Files: on the node, only docs/install.md's list.
    values, kubelet = box.chart_values(), box.layout.kubelet_dir
    files = _railyard_files(values, kubelet)
    documented = _documented(values, kubelet)
    undocumented = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in documented)]
    assert undocumented == [], undocumented
    assert f"{values['cniBinDir']}/railyard-cni" in files  # what the docs name is what is left
    # The docs list plugin sockets and the CNI socket for an agent that died; a clean stop (the
    # DaemonSet's pod deleted) removes them.
    assert [f for f in files if f.endswith(".sock")] == []
    print("left on the node:", files)
