"""Benchmark: CNI ADD and DEL wall time, railyard-cni against Debian's Go `host-device`.

In one run, interleaved round by round so the machine's load hits every case alike:
- `host-device` (/usr/lib/cni) moving one veth into a pod netns with `static` IPAM;
- railyard-cni (installed shim `python3 -IS` → warm `railyard cni serve` process) doing the
  same for a pod granted 1 VF, and for a pod granted 8 VFs (static IPAM per interface).
Every call is a fresh process started as a runtime starts it, from inside a throwaway "host"
netns (veths stand in for VFs; a fixture sysfs points the VFs' PCI addresses at them). Needs
root. Nothing touches the machine's own interfaces.

    sudo python benchmarks/cni.py                 # markdown section on stdout
    sudo python benchmarks/cni.py --write-docs    # and replace `## CNI` in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from railyard.allocation.types import Allocation, GpuRef, NicRef, Pair
from railyard.cni.install import install_shim
from railyard.cni.netns import Netns
from railyard.discovery.profiles import build_topology, profile
from railyard.node.state import PodKey, StateStore
from railyard.topology.model import Distance

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SECTION = "## CNI"
HOST_DEVICE = "/usr/lib/cni/host-device"
TARGET_RATIO_1VF, TARGET_8VF_MS = 2.0, 250.0
PYTHON_START = "reference: `python3 -IS -c pass`"
KERNEL_MOVE = "reference: one netdev move, in-process netlink"
_libc = ctypes.CDLL(None, use_errno=True)


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.host = "ry" + os.urandom(4).hex()
        self.pods: list[str] = []
        sh("ip", "netns", "add", self.host)
        self.host_fd = os.open(f"/run/netns/{self.host}", os.O_RDONLY)
        self.sysfs = root / "sysfs"
        self.sysfs.mkdir()  # the service refuses a --sysfs-root that does not exist
        self.state = root / "state"
        self.store = StateStore(self.state)
        topo = build_topology(profile("dgx-h100"), vfs_per_pf=8, node="bench")
        self.gpus = topo.gpus
        self.vfs = [NicRef.of_vf(pf, vf) for vf_i in range(8) for pf in topo.nics
                    if len(pf.vfs) > vf_i for vf in [pf.vfs[vf_i]]]

    def close(self) -> None:
        os.close(self.host_fd)
        for ns in [*self.pods, self.host]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def veth(self) -> str:
        name = "ryv" + os.urandom(4).hex()
        sh("ip", "-n", self.host, "link", "add", name, "type", "veth", "peer", "name",
           "ryp" + os.urandom(4).hex())
        return name

    def pod_netns(self) -> str:
        ns = "ry" + os.urandom(4).hex()
        sh("ip", "netns", "add", ns)
        self.pods.append(ns)
        return f"/run/netns/{ns}"

    def grant(self, count: int) -> tuple[str, str]:
        """A pod granted `count` VFs, each backed by a fresh veth; returns (uid, CNI_ARGS)."""
        nics = self.vfs[:count]
        self.vfs = self.vfs[count:]
        for nic in nics:
            (self.sysfs / "sys/bus/pci/devices" / nic.pci_address / "net" / self.veth()).mkdir(
                parents=True)
        uid = str(uuid.uuid4())
        name = f"bench-{count}"
        pairs = tuple(Pair(GpuRef.of(g), n, Distance.PIX)
                      for g, n in zip(self.gpus, nics, strict=False))
        self.store.put(PodKey(uid, "default", name),
                       Allocation(node="bench", numa_nodes=(0,), cpus=None, memory_bytes=(),
                                  pairs=pairs))
        return uid, f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};" \
                    f"K8S_POD_UID={uid}"

    def move_once(self, name: str, pod_netns: str) -> float:
        """The kernel's cost of one netns move (host → pod), timed; moved back untimed."""
        with Netns.open(f"/run/netns/{self.host}") as host, Netns.open(pod_netns) as pod, \
                host.links() as h, pod.links() as p:
            link = h.get(name)
            assert link is not None
            start = time.perf_counter()
            h.move(link, pod)
            ms = (time.perf_counter() - start) * 1000
            back = p.get(name)
            assert back is not None
            p.move(back, host)
        return ms

    def call(self, exe: str, command: str, conf: dict, netns: str, cid: str,
             args: str = "") -> float:
        """One plugin process, started in the host netns as a runtime would; wall ms."""
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns,
               "CNI_IFNAME": "net1", "CNI_ARGS": args, "CNI_PATH": "/usr/lib/cni",
               "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        stdin = json.dumps(conf).encode()
        fd = self.host_fd

        def enter() -> None:
            _libc.setns(fd, 0x40000000)

        start = time.perf_counter()
        p = subprocess.run([exe], input=stdin, env=env, capture_output=True,
                           preexec_fn=enter, pass_fds=(fd,))
        ms = (time.perf_counter() - start) * 1000
        if p.returncode != 0:
            raise RuntimeError(f"{exe} {command}: {p.stdout.decode()} {p.stderr.decode()}")
        return ms


def static(i: int) -> dict:
    return {"type": "static", "addresses": [{"address": f"10.{50 + i}.0.2/24"}]}


def run(rounds: int, root: Path) -> dict[str, list[float]]:
    b = Bench(root)
    service = None
    try:
        shim = str(install_shim(root / "bin", sys.executable))
        sock = str(root / "cni.sock")
        service = subprocess.Popen(
            [sys.executable, "-m", "railyard.cli.main", "cni", "serve",
             "--state-dir", str(b.state), "--socket", sock, "--sysfs-root", str(b.sysfs),
             "--host-netns", f"/run/netns/{b.host}", "--devinfo-dir", str(root / "devinfo"),
             "--pod-resources", "", "--node-name", "bench"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if service.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("railyard cni serve did not start")
            time.sleep(0.05)
        hd_dev, spare = b.veth(), b.veth()
        hd_conf = {"cniVersion": "1.0.0", "name": "hd", "type": "host-device",
                   "device": hd_dev, "ipam": static(0)}
        one_args, eight_args = b.grant(1)[1], b.grant(8)[1]
        one_conf = {"cniVersion": "1.0.0", "name": "ry", "type": "railyard-cni",
                    "agentSocket": sock, "ipam": static(0)}
        eight_conf = {**one_conf, "interfaces": [{"ipam": static(i)} for i in range(8)]}
        cases = [("host-device", HOST_DEVICE, hd_conf, ""),
                 ("railyard 1 VF", shim, one_conf, one_args),
                 ("railyard 8 VFs", shim, eight_conf, eight_args)]
        netns = {name: b.pod_netns() for name, *_ in cases}
        out: dict[str, list[float]] = {f"{n} {v}": [] for n, *_ in cases for v in ("ADD", "DEL")}
        out[PYTHON_START] = []
        out[KERNEL_MOVE] = []
        for r in range(rounds + 2):  # two warm-up rounds, not counted
            for name, exe, conf, args in cases:
                cid = f"bench{r}"
                add = b.call(exe, "ADD", conf, netns[name], cid, args)
                delete = b.call(exe, "DEL", conf, netns[name], cid, args)
                if r >= 2:
                    out[f"{name} ADD"].append(add)
                    out[f"{name} DEL"].append(delete)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-IS", "-c", "pass"], check=True)
            if r >= 2:
                out[PYTHON_START].append((time.perf_counter() - start) * 1000)
            move = b.move_once(spare, netns["host-device"])
            if r >= 2:
                out[KERNEL_MOVE].append(move)
        return out
    finally:
        if service is not None:
            service.terminate()
            service.wait()
        b.close()


def section(results: dict[str, list[float]], rounds: int, load: float) -> str:
    med = {k: statistics.median(v) for k, v in results.items()}
    ratio = med["railyard 1 VF ADD"] / med["host-device ADD"]
    del_ratio = med["railyard 1 VF DEL"] / med["host-device DEL"]
    # Cases interleave, so each round's ratio compares calls made under the same load.
    paired = statistics.median(r / h for r, h in zip(results["railyard 1 VF ADD"],
                                                      results["host-device ADD"], strict=True))
    rows = []
    targets = {"railyard 1 VF ADD": f"≤ {TARGET_RATIO_1VF:g}× host-device",
               "railyard 8 VFs ADD": f"≤ {TARGET_8VF_MS:g} ms"}
    for k, v in results.items():
        rows.append(f"| {k} | {med[k]:.1f} ms | {min(v):.1f} ms | {max(v):.1f} ms | "
                    f"{targets.get(k, '')} |")
    return "\n".join([
        SECTION, "",
        "ADD and DEL wall time per call, each a fresh process started from inside a",
        "throwaway host netns as a runtime starts a plugin: Debian's Go `host-device` moving",
        "one veth with `static` IPAM (the baseline, same run), and `railyard-cni` (installed",
        "shim, `python3 -IS`, forwarding to a warm `railyard cni serve` process) moving 1 and 8",
        "granted VFs (veths behind a fixture sysfs), `static` IPAM per interface. Cases",
        "interleave round by round.",
        "",
        f"- Machine: `{platform.platform()}`, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; machines here may be shared with other sessions (load "
        f"average {load:.1f} when the run began): medians are the figures to read, min…max "
        "shows the noise.",
        f"- Command: `sudo python benchmarks/cni.py --rounds {rounds}` (`--write-docs` writes "
        "this section)",
        "",
        "| call | median | min | max | target |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"- 1 VF ADD: **{ratio:.2f}×** host-device (target ≤ {TARGET_RATIO_1VF:g}×; median "
        f"of the per-round ratios {paired:.2f}×); DEL {del_ratio:.2f}×.",
        f"- 8 VFs ADD: **{med['railyard 8 VFs ADD']:.0f} ms** (target ≤ {TARGET_8VF_MS:g} ms). "
        "Each device moves once, host → pod under a transit name (decision 0047), as "
        f"host-device's one device does: 8 kernel moves at {med[KERNEL_MOVE]:.1f} ms each "
        f"(median, this run) are {8 * med[KERNEL_MOVE]:.0f} ms of it.",
        "",
    ])


def write_docs(text: str) -> None:
    """Replace only the `## CNI` section; other sections belong to other benchmarks."""
    doc = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    start = doc.find(SECTION + "\n")
    if start < 0:
        doc = doc.rstrip("\n") + "\n\n" + text
    else:
        end = doc.find("\n## ", start + len(SECTION))
        rest = doc[end + 1:] if end >= 0 else ""
        doc = doc[:start] + text.rstrip("\n") + "\n" + ("\n" + rest if rest else "")
    DOCS.write_text(doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--write-docs", action="store_true")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("benchmarks/cni.py: needs root (network namespaces)")
    if not os.path.exists(HOST_DEVICE):
        sys.exit(f"benchmarks/cni.py: {HOST_DEVICE} missing (containernetworking-plugins)")
    load = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="railyard-cni-bench-"))
    try:
        results = run(opts.rounds, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = section(results, opts.rounds, load)
    print(text)
    if opts.write_docs:
        write_docs(text)


if __name__ == "__main__":
    main()
