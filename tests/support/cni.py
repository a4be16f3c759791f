"""A throwaway "node" for CNI tests: its host side is a network namespace of its own.

veth interfaces stand in for VF netdevs; a fixture sysfs points the VFs' PCI addresses (from
the dgx-h100 profile, built as users build it) at them; grants go through the real node state
store. Nothing here touches the machine's own interfaces: every link is created inside a
namespace named `ry` + 8 hex digits, and deleting the namespace deletes its links.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.cni.install import install_shim
from railyard.cni.netns import Netns
from railyard.cni.rdma import RdmaError
from railyard.discovery.profiles import build_topology, profile
from railyard.node.state import PodKey, StateStore
from railyard.topology.model import Distance

IS_ROOT = os.geteuid() == 0
NOT_ROOT_REASON = "needs root: creates network namespaces and moves links between them"

NODE = "node-a"  # the node every test's grants are for, and the one its plugin serves
TOPOLOGY = build_topology(profile("dgx-h100"), vfs_per_pf=8, node=NODE)
# Compute PFs with VFs, and each one's VFs: VF j of PF i is vf_refs()[i][j].
_PFS = [n for n in TOPOLOGY.nics if n.vfs]


def vf_ref(pf: int, vf: int) -> NicRef:
    nic = _PFS[pf]
    return NicRef.of_vf(nic, nic.vfs[vf])


def unique(prefix: str = "ry") -> str:
    return prefix + os.urandom(4).hex()


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=check)


def netns_add() -> str:
    name = unique()
    sh("ip", "netns", "add", name)
    return name


def netns_del(name: str) -> None:
    sh("ip", "netns", "del", name, check=False)


def links(ns: str) -> dict[str, dict]:
    """name → {mac, mtu, up} of every link in namespace `ns` but lo."""
    out = json.loads(sh("ip", "-j", "-n", ns, "link", "show").stdout or "[]")
    return {
        link["ifname"]: {"mac": link.get("address"), "mtu": link.get("mtu"),
                         "up": "UP" in link.get("flags", [])}
        for link in out if link["ifname"] != "lo"
    }


def addresses(ns: str, ifname: str) -> list[str]:
    out = json.loads(sh("ip", "-j", "-n", ns, "addr", "show", "dev", ifname).stdout or "[]")
    return [f"{a['local']}/{a['prefixlen']}" for link in out for a in link.get("addr_info", [])]


@dataclass
class Pod:
    uid: str
    namespace: str
    name: str
    netns: str  # the namespace's name under /run/netns
    container_id: str

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"

    def args(self) -> str:
        return (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={self.namespace};K8S_POD_NAME={self.name};"
                f"K8S_POD_INFRA_CONTAINER_ID={self.container_id};K8S_POD_UID={self.uid}")


@dataclass
class Node:
    """The host side of one test: a netns, a fixture sysfs, a state store, a devinfo folder."""

    root: Path
    host: str = field(default_factory=netns_add)
    namespaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sysfs = self.root / "sysfs"
        self.state_dir = self.root / "state"
        self.devinfo = self.root / "devinfo"
        self.store = StateStore(self.state_dir, node=NODE)

    @property
    def host_path(self) -> str:
        return f"/run/netns/{self.host}"

    def close(self) -> None:
        for ns in self.namespaces:
            netns_del(ns)
        netns_del(self.host)

    # ------------------------------------------------------------------ devices

    def veth(self, a: str | None = None, b: str | None = None) -> tuple[str, str]:
        a, b = a or unique("ryv"), b or unique("ryv")
        sh("ip", "-n", self.host, "link", "add", a, "type", "veth", "peer", "name", b)
        return a, b

    def point(self, nic: NicRef, netdev: str) -> None:
        """Make sysfs say `nic`'s netdev is `netdev`, and its RDMA device the recorded one
        (as the kernel does for a bound VF)."""
        function = self.sysfs / "sys/bus/pci/devices" / nic.pci_address
        (function / "net" / netdev).mkdir(parents=True, exist_ok=True)
        if nic.rdma_device:
            (function / "infiniband" / nic.rdma_device).mkdir(parents=True, exist_ok=True)

    def vfs(self, count: int, first_pf: int = 0) -> list[NicRef]:
        """`count` VFs, each backed by one end of a fresh veth pair in the host netns."""
        out = []
        for i in range(count):
            nic = vf_ref((first_pf + i) % len(_PFS), (first_pf + i) // len(_PFS))
            a, _ = self.veth()
            self.point(nic, a)
            out.append(nic)
        return out

    def pod(self, nics: list[NicRef], *, name: str | None = None) -> Pod:
        """A pod granted `nics` in this pair order, with a network namespace of its own."""
        ns = netns_add()
        self.namespaces.append(ns)
        pod = Pod(str(uuid.uuid4()), "default", name or unique("pod-"), ns, unique("c"))
        if nics:
            self.grant(pod, nics)
        return pod

    def grant(self, pod: Pod, nics: list[NicRef]) -> None:
        paired = min(len(nics), len(TOPOLOGY.gpus))
        pairs = tuple(Pair(GpuRef.of(g), n, Distance.PIX)
                      for g, n in zip(TOPOLOGY.gpus[:paired], nics[:paired], strict=True))
        alloc = Allocation(node=NODE, numa_nodes=(0,), cpus=None, memory_bytes=(),
                           pairs=pairs, nics=tuple(nics[paired:]),
                           decided_at="2026-01-01T00:00:00Z")
        self.store.put(PodKey(pod.uid, pod.namespace, pod.name), alloc)

    def netdev_of(self, nic: NicRef) -> str:
        return os.listdir(self.sysfs / "sys/bus/pci/devices" / nic.pci_address / "net")[0]

    def snapshot(self) -> dict[str, dict]:
        return links(self.host)


@dataclass
class Result:
    code: int
    out: dict | None
    stderr: str

    @property
    def error(self) -> int | None:
        return self.out.get("code") if self.out and self.code != 0 else None


def run_shim(shim: Path, command: str, conf: dict | bytes, *, container_id: str = "",
             netns: str = "", ifname: str = "net1", args: str = "",
             path: str = "/usr/lib/cni", extra_env: dict | None = None) -> Result:
    """Call the plugin exactly as a runtime does: an exec with CNI_* env and the config on stdin."""
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
           "CNI_IFNAME": ifname, "CNI_ARGS": args, "CNI_PATH": path,
           "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **(extra_env or {})}
    stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
    p = subprocess.run([str(shim)], input=stdin, env=env, capture_output=True, timeout=60)
    out = None
    if p.stdout.strip():
        out = json.loads(p.stdout)
    return Result(p.returncode, out, p.stderr.decode())


def installed_shim(folder: Path) -> Path:
    return install_shim(folder, sys.executable)


def standalone_env(node: Node) -> dict[str, str]:
    """The runtime-side settings standalone mode reads from its environment."""
    return {"RAILYARD_CNI_STATE_DIR": str(node.state_dir),
            "RAILYARD_CNI_SYSFS_ROOT": str(node.sysfs), "RAILYARD_CNI_HOST_NETNS": node.host_path,
            "RAILYARD_CNI_DEVINFO_DIR": str(node.devinfo), "RAILYARD_CNI_POD_RESOURCES": "",
            "RAILYARD_CNI_NODE_NAME": NODE}


class RecordingRdma:
    """RDMA netlink double: one namespace holds each RDMA device, as in exclusive mode.

    `moves` records (device, from, to, host links at that moment) so tests can check what
    moved, in which order relative to the netdevs, and that it came back.
    """

    def __init__(self, mode: str = "shared", host_ns: str | None = None) -> None:
        self._mode = mode
        self.host_ns = host_ns
        self.where: dict[str, tuple[int, int]] = {}
        self.moves: list[tuple[str, str, str, set[str]]] = []

    def mode(self) -> str:
        return self._mode

    def place(self, device: str, netns: Netns) -> None:
        self.where[device] = netns.identity()

    def holds(self, device: str, netns: Netns) -> bool:
        return self.where.get(device) == netns.identity()

    def move(self, device: str, source: Netns, target: Netns) -> None:
        if self.where.get(device) != source.identity():
            raise RdmaError(f"RDMA device {device} is not in {source.label}")
        self.where[device] = target.identity()
        host_links = set(links(self.host_ns)) if self.host_ns else set()
        self.moves.append((device, source.label, target.label, host_links))


def add(shim: Path, pod: Pod, conf: dict | bytes, **kw) -> Result:
    """ADD for `pod`, as a runtime makes it (its container, netns and CNI_ARGS)."""
    return run_shim(shim, "ADD", conf, container_id=pod.container_id, netns=pod.netns_path,
                    args=pod.args(), **kw)


def delete(shim: Path, pod: Pod, conf: dict | bytes, **kw) -> Result:
    return run_shim(shim, "DEL", conf, container_id=pod.container_id, netns=pod.netns_path,
                    args=pod.args(), **kw)


def record_path(node: Node, pod: Pod, network: str = "rdma", ifname: str = "net1") -> Path:
    """Where the CNI service keeps the pod's attachment record."""
    return node.state_dir / "cni" / "attachments" / network / f"{pod.container_id}:{ifname}.json"


def transit_names(node: Node, pod: Pod) -> list[str]:
    """The last transit name each device of the pod's attachment crossed (or will cross) under."""
    return [d["transit_names"][-1]
            for d in json.loads(record_path(node, pod).read_text())["devices"]]

