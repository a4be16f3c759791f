"""A box whose Railyard comes from the Helm chart's pods (tests/box/test_chart_pods_box.py): the
node is made ready for the chart as a real node would be for an operator — its /dev with the
verbs nodes its sysfs names, Multus for the VF attachments, and the Railyard image in its
containerd (hack/build-image) — and `chart_values()` are the host folders the chart mounts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from support.box import kubebox

HACK = Path(__file__).resolve().parents[2] / "hack"


def _load_image_builder() -> ModuleType:
    """hack/railyard_image.py, by path (it shares the already loaded kubebox module)."""
    if "railyard_image" in sys.modules:
        return sys.modules["railyard_image"]
    spec = importlib.util.spec_from_file_location("railyard_image", HACK / "railyard_image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["railyard_image"] = module
    spec.loader.exec_module(module)
    return module


railyard_image = _load_image_builder()


class ChartBox(kubebox.Box):
    """kubebox.Box with Multus, no Railyard process: the chart runs Railyard."""

    def __init__(self, folder: Path, **options: Any) -> None:
        super().__init__(folder, multus=True, **options)
        self.with_railyard = False  # no extender or agent process; Multus stays

    def _network(self) -> None:
        super()._network()
        # The agent is a host-network pod and reaches the API server at the `kubernetes`
        # Service's ClusterIP (in-cluster configuration). A real node routes that through its
        # default route; the box's namespace has none, so it gets a route for the Service range
        # alone (kube-proxy's DNAT then sends it to the API server, inside the box).
        kubebox.run(self.in_box(["ip", "route", "add", kubebox.SERVICE_CIDR,
                                 "dev", self.layout.box_veth]))

    def _node_mounts(self) -> None:
        # The box gives its node /dev/infiniband (the verbs nodes Railyard's device plugin
        # names) only when Railyard runs: it does here, from the chart.
        self.with_railyard = True
        try:
            super()._node_mounts()
        finally:
            self.with_railyard = False

    def _node_dev_script(self) -> str:
        # containerd mounts pods' network namespaces in the node's mount namespace; the agent's
        # HostToContainer (rslave) mount sees them only if that folder is a shared mount there,
        # as /run/netns is on a systemd node.
        netns = self.chart_values()["netnsDir"]
        return super()._node_dev_script() + (
            f"mkdir -p {netns}; mount --bind {netns} {netns}; mount --make-shared {netns}\n")

    @property
    def cni_socket(self) -> Path:
        """The chart's agent listens at <agent.hostPaths.socketDir>/cni.sock."""
        return self.layout.run_dir / "railyard" / "cni.sock"

    def chart_values(self) -> dict[str, Any]:
        """The chart's `agent.hostPaths` for this node: kubelet's folder (the node's mount
        namespace binds the box's own at /var/lib/kubelet), the CNI bin folder containerd and
        Multus search, containerd's pod netns folder, the fixture sysfs, and folders of the
        box's own for the rest, so nothing lands in the machine's /var/lib or /run."""
        assert self.node_sysfs is not None
        lay = self.layout
        return {
            "kubeletDir": str(kubebox.KUBELET_HOME),
            "cniBinDir": str(lay.dir / "cni/bin"),
            "cniStateDir": str(lay.dir / "cni-state"),
            # netns_mounts_under_state_dir: containerd's CRI state folder, /netns
            "netnsDir": str(lay.run_dir / "containerd/io.containerd.grpc.v1.cri/netns"),
            "devinfoDir": str(lay.dir / "devinfo"),
            "stateDir": str(lay.dir / "railyard-state"),
            "socketDir": str(self.cni_socket.parent),
            "sysfsRoot": str(self.node_sysfs.parent),
        }

    def import_railyard_image(self) -> str:
        """Build (or reuse) the Railyard image and load it into the node's containerd."""
        archive = railyard_image.build_image()
        kubebox.run(self._ctr("images", "import", "--no-unpack=false", str(archive)))
        return railyard_image.image_name()

    def ctr_images(self) -> str:
        return kubebox.run(self._ctr("images", "list", "-q")).stdout
