"""A private containerd (the test box's 2.x, built from its pinned Go module by hack/box) for
CNI tests, and the few CRI calls they make.

It gets its own root, state, socket and config, CNI config and bin folders of its own, a
busybox "pause" image built here as an OCI layout (there is no registry), and runs inside a
throwaway network namespace (entered with nsenter, so its mounts stay visible to the test
process): the primary plugin's host-side veth and routes never reach the machine's own
namespace. CRI messages are encoded by hand (runtime.v1 field numbers from cri-api).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from support.box import kubebox

PAUSE_IMAGE = "railyard.test/pause:1"
BUSYBOX = "/bin/busybox"
_CNI_PLUGINS = ("ptp", "host-local", "static", "loopback")


def containerd_missing() -> str | None:
    """Why a private containerd cannot run here, or None."""
    for tool in ("runc", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install runc util-linux)"
    if shutil.which("go") is None and not kubebox.FAMILIES["containerd"].out_dir().exists():
        return "containerd 2.x is not built and Go is missing to build it (hack/box build)"
    if not os.path.exists(BUSYBOX):
        return f"{BUSYBOX} is missing (apt-get install busybox-static)"
    for p in _CNI_PLUGINS:
        if not os.path.exists(f"/usr/lib/cni/{p}"):
            return f"/usr/lib/cni/{p} is missing (apt-get install containernetworking-plugins)"
    return None


# ----------------------------------------------------------------------- the pause image


def pause_image_archive(out: Path) -> Path:
    """An OCI image archive whose only process sleeps: busybox-static as the rootfs."""
    layer = kubebox.layer_tar([("bin/busybox", Path(BUSYBOX).read_bytes(), 0o755)]
                              + [(f"{d}/.keep", b"", 0o644) for d in ("proc", "sys", "dev", "tmp")])
    kubebox.write_image_archive(out, PAUSE_IMAGE, layer, ["/bin/busybox", "sleep", "2147483647"])
    return out


# ----------------------------------------------------------------------- CRI by hand


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _bytes_field(num: int, data: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def _str_field(num: int, text: str) -> bytes:
    return _bytes_field(num, text.encode()) if text else b""


def _first_string(data: bytes, want: int) -> str:
    """Field `want` (a string) of a protobuf message; enough for the replies read here."""
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        num, kind = key >> 3, key & 7
        if kind == 0:
            _, i = _read_varint(data, i)
        elif kind == 2:
            size, i = _read_varint(data, i)
            if num == want:
                return data[i:i + size].decode()
            i += size
        elif kind == 1:
            i += 8
        elif kind == 5:
            i += 4
        else:
            raise ValueError(f"unexpected wire type {kind}")
    return ""


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


class Cri:
    """runtime.v1.RuntimeService: RunPodSandbox, StopPodSandbox, RemovePodSandbox."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(f"unix://{address}")

    def _call(self, method: str, body: bytes, timeout_s: float = 60.0) -> bytes:
        rpc = self.channel.unary_unary(f"/runtime.v1.RuntimeService/{method}")
        return rpc(body, timeout=timeout_s)

    def run_pod_sandbox(self, name: str, uid: str, namespace: str) -> str:
        # PodSandboxMetadata{name=1, uid=2, namespace=3, attempt=4}
        metadata = _str_field(1, name) + _str_field(2, uid) + _str_field(3, namespace)
        # PodSandboxConfig{metadata=1, hostname=2}
        config = _bytes_field(1, metadata) + _str_field(2, name)
        reply = self._call("RunPodSandbox", _bytes_field(1, config))  # {config=1}
        return _first_string(reply, 1)  # {pod_sandbox_id=1}

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self._call("StopPodSandbox", _str_field(1, sandbox_id))

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        self._call("RemovePodSandbox", _str_field(1, sandbox_id))

    def close(self) -> None:
        self.channel.close()


# ----------------------------------------------------------------------- containerd


CONFIG = """\
version = 3
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{address}"
[ttrpc]
  address = "{address}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{root}/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{image}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = "{runc}"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    conf_dir = "{root}/net.d"
    bin_dirs = ["{root}/bin"]
    max_conf_num = 1
"""


@dataclass
class Containerd:
    root: Path
    address: str
    netns: str
    process: subprocess.Popen
    log: Path

    @property
    def conf_dir(self) -> Path:
        return self.root / "net.d"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


@contextlib.contextmanager
def private_containerd(root: Path, netns: str, shim: Path, conflist: dict,
                       env: dict[str, str] | None = None) -> Iterator[Containerd]:
    """Start containerd in network namespace `netns` (by name) with this CNI config (written
    first: containerd reloads a changed folder only eventually); stop it and unmount after."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "net.d").mkdir()
    (root / "net.d" / "10-railyard-test.conflist").write_text(json.dumps(conflist))
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for p in _CNI_PLUGINS:
        os.symlink(f"/usr/lib/cni/{p}", bin_dir / p)
    os.symlink(shim, bin_dir / "railyard-cni")
    address = str(root / "containerd.sock")
    config = root / "config.toml"
    config.write_text(CONFIG.format(root=root, address=address, image=PAUSE_IMAGE,
                                    runc=shutil.which("runc")))
    binaries = kubebox.build(("containerd",))["containerd"]  # reused from the cache when built
    log = root / "containerd.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{netns}", str(binaries / "containerd"),
             "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            # containerd finds its runc shim on PATH
            env={**os.environ, "PATH": f"{binaries}:{os.environ['PATH']}", **(env or {})})
    cd = Containerd(root, address, netns, process, log)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(address):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start:\n{cd.log_tail()}")
            time.sleep(0.1)
        archive = pause_image_archive(root / "pause.tar")
        subprocess.run([str(binaries / "ctr"), "--address", address, "-n", "k8s.io", "images",
                        "import", "--platform", "linux/amd64", str(archive)],
                       check=True, capture_output=True, timeout=60)
        yield cd
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        _kill_leftover_shims(root)
        _unmount_below(root)


def _kill_leftover_shims(root: Path) -> None:
    """containerd-shim processes outlive containerd by design; end the ones we started."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and \
                str(root).encode() in b" ".join(cmd):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _unmount_below(root: Path) -> None:
    prefix = str(root) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
