"""A real Kubernetes in a box for Railyard's tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kube-proxy, containerd 2.x and one kubelet, built from pinned Go modules
(hack/go/) and run inside a network namespace of the box's own.

`hack/box` is the command line; the tests drive the same `Box` class (tests/box/). What each
piece costs, which versions run and why, is in docs/testing.md.

Nothing here touches the machine's own interfaces: the box reaches the root namespace only
through a veth pair on a private /30, its namespace has no default route, and `down` removes
every process, mount, namespace, veth and cgroup that `up` made.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import gzip
import hashlib
import importlib.util
import io
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HACK = Path(__file__).resolve().parent
REPO = HACK.parent
# The chart rendered (hack/render-manifests): the box grants its Railyard users these roles.
CHART_MANIFESTS = REPO / "deploy/manifests/railyard.yaml"
GO_MODULES = HACK / "go"
KUBE_VERSION = "v1.36.3"
CONTAINERD_VERSION = "v2.2.9"
KWOK_VERSION = "v0.8.0"
MULTUS_VERSION = "v4.2.3"
HELM_VERSION = "v4.3.2"
KOORDINATOR_VERSION = "v1.8.0"  # its koord-scheduler, for benchmarks/scheduling.py
KUBE_COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
    "kubelet",
    "kubectl",
)
PAUSE_IMAGE = "railyard.test/pause:box"
BUSYBOX_IMAGE = "railyard.test/busybox:box"
NODE_NAME = "box-node"
KUBELET_HOME = Path("/var/lib/kubelet")
DEFAULT_PROFILE = "dgx-h100"
EXTENDER_USER = "railyard:extender"
AGENT_USER = "railyard:agent"
EXTENDER_PORT = 8888
MULTUS_USER = "railyard-box:multus"
SERVICE_CIDR = "10.96.0.0/24"
SERVICE_IP = "10.96.0.1"
POD_CIDR = "10.244.0.0/24"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# Extended resources every kwok node offers (docs/testing.md, "kwok nodes").
KWOK_NODE_CAPACITY = {
    "cpu": "224",
    "memory": "2Ti",
    "pods": "110",
    "nvidia.com/gpu": "8",
    "railyard.dev/vf": "64",
    "railyard.dev/pf": "8",
}
BUSYBOX_APPLETS = ("sh", "echo", "sleep", "cat", "ls", "true", "false", "env", "ip", "wget")


class BoxError(RuntimeError):
    """A box step failed; the message names the component and shows its last log lines."""


def say(message: str) -> None:
    """Progress for a person watching: one stamped line on stderr."""
    print(f"[box {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(argv: list[str], *, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise BoxError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


# --- the build -----------------------------------------------------------------------------


def cache_root() -> Path:
    """The machine-wide build cache, outside any checkout, so a clean clone reuses it."""
    return Path(os.environ.get("RAILYARD_BOX_CACHE", "/var/cache/railyard-box"))


@dataclass(frozen=True)
class Family:
    """One Go module of ours (one go.mod, so its dependencies don't fight the others')."""

    name: str
    version: str
    packages: tuple[str, ...]
    tags: str = ""

    @property
    def module_dir(self) -> Path:
        return GO_MODULES / self.name

    def key(self) -> str:
        """Keyed by what decides the binaries: go.mod, go.sum, our sources, Go's version."""
        digest = hashlib.sha256()
        for path in sorted(self.module_dir.rglob("*")):
            if path.is_file() and path.suffix in {".mod", ".sum", ".go"}:
                digest.update(path.relative_to(self.module_dir).as_posix().encode())
                digest.update(path.read_bytes())
        digest.update(run(["go", "env", "GOVERSION"]).stdout.encode())
        digest.update(self.ldflags().encode() + self.tags.encode())
        digest.update(EXTRAS.get(self.name, "").encode())  # files the build writes beside
        return digest.hexdigest()[:16]

    def out_dir(self) -> Path:
        return cache_root() / f"{self.name}-{self.key()}"

    def ldflags(self) -> str:
        if self.name == "kube":
            major, minor = self.version.lstrip("v").split(".")[:2]
            stamps = {
                "gitVersion": self.version,
                "gitMajor": major,
                "gitMinor": minor,
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
            }
            return " ".join(
                f"-X {package}.{name}={value}"
                for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
                for name, value in stamps.items()
            )
        if self.name == "containerd":
            return f"-X github.com/containerd/containerd/v2/version.Version={self.version}"
        if self.name == "kwok":
            return f"-X sigs.k8s.io/kwok/pkg/consts.Version={self.version}"
        if self.name == "multus":
            package = "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus"
            return f"-X {package}.version={self.version}"
        if self.name == "helm":
            return f"-X helm.sh/helm/v4/internal/version.version={self.version}"
        return ""


FAMILIES = {
    "kube": Family("kube", KUBE_VERSION, ("./cmd/kube", "./cmd/pause")),
    "containerd": Family(
        "containerd",
        CONTAINERD_VERSION,
        tuple(
            f"github.com/containerd/containerd/v2/cmd/{name}"
            for name in ("containerd", "containerd-shim-runc-v2", "ctr")
        ),
        tags="no_btrfs",
    ),
    "kwok": Family("kwok", KWOK_VERSION, ("sigs.k8s.io/kwok/cmd/kwok",)),
    "multus": Family("multus", MULTUS_VERSION,
                     ("gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus",)),
    "helm": Family("helm", HELM_VERSION, ("helm.sh/helm/v4/cmd/helm",)),
    "koordinator": Family("koordinator", KOORDINATOR_VERSION,
                          ("github.com/koordinator-sh/koordinator/cmd/koord-scheduler",)),
}
# Files a family's build keeps beside its binaries (part of its cache key).
EXTRAS = {"kwok": "kwok-stages.yaml", "multus": "nad-crd.yaml"}
# What `up` needs; kwok, Multus and helm are built when a box or a test asks for them.
BOX_FAMILIES = ("kube", "containerd")
# What `hack/box build` builds unnamed: what the tests use. Koordinator only for the
# scheduling benchmark, by name (`hack/box build koordinator`): no test needs its long build.
TESTED_FAMILIES = tuple(name for name in FAMILIES if name != "koordinator")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build(families: tuple[str, ...] = BOX_FAMILIES) -> dict[str, Path]:
    """Build what is missing into the cache (one builder at a time); return each family's bin."""
    built = {}
    with _locked(cache_root() / ".lock"):
        for name in families:
            family = FAMILIES[name]
            out = family.out_dir()
            if not (out / "complete").exists():
                _build_family(family, out)
            built[name] = out / "bin"
    return built


def built() -> dict[str, Path]:
    """Each family already in the cache, built for this checkout's pins, and its bin; builds
    nothing. The box's PATH offers all of them (helm, kwok, Multus once built)."""
    found = {}
    for name, family in FAMILIES.items():
        out = family.out_dir()
        if (out / "complete").exists():
            found[name] = out / "bin"
    return found


def _build_family(family: Family, out: Path) -> None:
    say(f"building {family.name} {family.version} into {out} (cold: tens of minutes)")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    started = time.monotonic()
    argv = ["go", "build", "-v", "-trimpath", "-ldflags", family.ldflags(),
            "-o", str(staging / "bin")]
    if family.tags:
        argv += ["-tags", family.tags]
    process = subprocess.Popen(
        [*argv, *family.packages],
        cwd=family.module_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    tail: list[str] = []
    downloaded = compiled = 0
    assert process.stdout is not None
    for line in process.stdout:  # `go build -v` names each package as it compiles it
        tail = [*tail[-40:], line.rstrip()]
        if line.startswith("go: downloading"):
            downloaded += 1
            if downloaded % 100 == 1:
                say(f"{family.name}: downloading modules ({downloaded} so far)")
        elif not line.startswith(("#", " ", "\t")):
            compiled += 1
            if compiled % 250 == 0:
                say(f"{family.name}: {compiled} packages compiled")
    if process.wait() != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise BoxError(f"go build of {family.name} failed:\n" + "\n".join(tail))
    if family.name == "kube":
        for component in KUBE_COMPONENTS:
            (staging / "bin" / component).symlink_to("kube")
    if family.name == "kwok":
        _write_kwok_stages(family, staging)
    if family.name == "multus":
        _write_nad_crd(family, staging)
    (staging / "complete").write_text(f"{time.monotonic() - started:.0f} s\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    say(f"built {family.name} in {time.monotonic() - started:.0f} s")


def _module_dir(family: Family, module: str) -> Path:
    return Path(run(["go", "list", "-m", "-f", "{{.Dir}}", module],
                    cwd=family.module_dir).stdout.strip())


def _write_nad_crd(family: Family, staging: Path) -> None:
    """The NetworkAttachmentDefinition CRD, as the pinned Multus release ships it."""
    source = _module_dir(family, "gopkg.in/k8snetworkplumbingwg/multus-cni.v4")
    documents = (source / "deployments/multus-daemonset.yml").read_text().split("\n---\n")
    crd = next(d for d in documents if "kind: CustomResourceDefinition" in d)
    (staging / "nad-crd.yaml").write_text(crd)


def _write_kwok_stages(family: Family, staging: Path) -> None:
    """kwok runs no lifecycle without stages: keep its own fast node and pod stages."""
    source = _module_dir(family, "sigs.k8s.io/kwok")
    parts = []
    for stage in ("node/fast", "node/heartbeat-with-lease", "pod/fast"):
        for path in sorted((Path(source) / "kustomize/stage" / stage).glob("*.yaml")):
            if path.name != "kustomization.yaml":
                parts.append(path.read_text())
    (staging / "kwok-stages.yaml").write_text("\n---\n".join(parts))


# --- images --------------------------------------------------------------------------------


def layer_tar(entries: list[tuple[str, bytes | str, int]]) -> bytes:
    """A layer: (path, file bytes or symlink target, mode) entries, deterministic."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directories = sorted({str(Path(p).parent) for p, _, _ in entries} - {"."})
        for directory in directories:
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, content, mode in entries:
            info = tarfile.TarInfo(path)
            info.mode = mode
            if isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def write_image_archive(path: Path, name: str, layer: bytes, entrypoint: list[str], *,
                        config: dict | None = None, compresslevel: int = 9) -> None:
    """An OCI image layout archive that `ctr images import` names `name`; `config` replaces
    the image config's own section (Entrypoint, Env, User...), default `entrypoint` alone."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    compressed = gzip.compress(layer, compresslevel=compresslevel, mtime=0)
    image = {
        "architecture": "amd64",
        "os": "linux",
        "config": config or {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(json.dumps(image).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [blob(compressed, "application/vnd.oci.image.layer.v1.tar+gzip")],
    }
    descriptor = blob(json.dumps(manifest).encode(), manifest["mediaType"])
    descriptor["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
    }
    index = {"schemaVersion": 2, "manifests": [descriptor]}
    entries: list[tuple[str, bytes | str, int]] = [
        ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644),
        ("index.json", json.dumps(index).encode(), 0o644),
    ]
    entries += [(f"blobs/sha256/{d.split(':')[1]}", data, 0o644) for d, data in blobs.items()]
    path.write_bytes(layer_tar(entries))


def build_images(kube_bin: Path, into: Path) -> dict[str, Path]:
    """The sandbox (our pause) and test (Debian's busybox-static) images, as archives."""
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        raise BoxError("busybox-static is not installed (apt-get install busybox-static)")
    into.mkdir(parents=True, exist_ok=True)
    pause = into / "pause.tar"
    write_image_archive(
        pause,
        PAUSE_IMAGE,
        layer_tar([("pause", (kube_bin / "pause").read_bytes(), 0o755)]),
        ["/pause"],
    )
    applets: list[tuple[str, bytes | str, int]] = [
        (f"bin/{applet}", "busybox", 0o777) for applet in BUSYBOX_APPLETS
    ]
    box = into / "busybox.tar"
    write_image_archive(
        box,
        BUSYBOX_IMAGE,
        layer_tar([("bin/busybox", busybox.read_bytes(), 0o755), *applets]),
        ["/bin/sh"],
    )
    return {PAUSE_IMAGE: pause, BUSYBOX_IMAGE: box}


# --- certificates --------------------------------------------------------------------------


class Pki:
    """A throwaway CA and the client and serving certificates the components present."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def path(self, name: str, kind: str) -> Path:
        return self.folder / f"{name}.{kind}"

    def _key(self, name: str) -> Path:
        key = self.path(name, "key")
        run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", str(key)])
        return key

    def ca(self) -> None:
        key = self._key("ca")
        run(["openssl", "req", "-x509", "-new", "-key", str(key), "-days", "30",
             "-subj", "/CN=railyard-box-ca", "-out", str(self.path("ca", "crt"))])

    def issue(self, name: str, subject: str, *, sans: list[str] | None = None) -> None:
        key = self._key(name)
        csr = self.path(name, "csr")
        run(["openssl", "req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr)])
        extensions = self.path(name, "ext")
        lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment"]
        lines.append("extendedKeyUsage=" + ("serverAuth,clientAuth" if sans else "clientAuth"))
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        extensions.write_text("\n".join(lines) + "\n")
        run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(self.path("ca", "crt")),
             "-CAkey", str(self.path("ca", "key")), "-CAcreateserial", "-days", "30",
             "-extfile", str(extensions), "-out", str(self.path(name, "crt"))])

    def service_account_keys(self) -> None:
        key = self._key("service-account")
        run(["openssl", "pkey", "-in", str(key), "-pubout",
             "-out", str(self.path("service-account", "pub"))])

    def kubeconfig(self, name: str, server: str, into: Path) -> Path:
        def data(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "box", "cluster": {
                "server": server,
                "certificate-authority-data": data(self.path("ca", "crt")),
            }}],
            "users": [{"name": name, "user": {
                "client-certificate-data": data(self.path(name, "crt")),
                "client-key-data": data(self.path(name, "key")),
            }}],
            "contexts": [{"name": "box", "context": {"cluster": "box", "user": name}}],
            "current-context": "box",
        }
        into.write_text(json.dumps(config, indent=1))
        into.chmod(0o600)
        return into


# --- the box -------------------------------------------------------------------------------


@dataclass
class Layout:
    """Every name and path one box uses, derived from its folder so `down` can find them."""

    dir: Path
    box_id: str
    netns: str
    host_veth: str
    box_veth: str
    host_ip: str
    node_ip: str
    run_dir: Path
    shm_dir: Path
    cgroup_name: str

    @classmethod
    def for_dir(cls, folder: Path) -> Layout:
        folder = folder.resolve()
        box_id = hashlib.sha256(str(folder).encode()).hexdigest()[:8]
        number = int(box_id, 16)
        # A private /30 per box, chosen by the folder's hash: 10.253.X.Y/30.
        base = (number % 16384) * 4
        prefix = f"10.253.{base // 256}"
        return cls(
            dir=folder,
            box_id=box_id,
            netns=f"rybox-{box_id}",
            host_veth=f"rybh{box_id}",
            box_veth=f"rybn{box_id}",
            host_ip=f"{prefix}.{base % 256 + 1}",
            node_ip=f"{prefix}.{base % 256 + 2}",
            run_dir=Path(f"/run/rybox-{box_id}"),
            shm_dir=Path(f"/dev/shm/rybox-{box_id}"),
            cgroup_name=f"rybox-{box_id}",
        )

    @property
    def server(self) -> str:
        return f"https://{self.node_ip}:6443"

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.run_dir / "kubelet"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    def cgroup_dirs(self) -> list[Path]:
        root = Path("/sys/fs/cgroup")
        found = [root / c / self.cgroup_name for c in _cgroup_controllers()]
        return [p for p in found if p.exists()]


def _cgroup_controllers() -> list[str]:
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():  # a pure cgroup v2 machine
        return [""]
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.is_symlink())


@dataclass
class Started:
    name: str
    pid: int
    log: str
    argv: list[str]
    on_node: bool = False


@dataclass
class BoxState:
    """What `up` started, in order; `down` reads it back."""

    started: list[Started] = field(default_factory=list)
    kwok_nodes: int = 0

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> BoxState:
        if not path.exists():
            return cls()
        raw = json.loads(path.read_text())
        return cls([Started(**s) for s in raw["started"]], raw.get("kwok_nodes", 0))


class Box:
    """One box: `up()` starts it and waits until it is ready, `down()` removes all of it."""

    def __init__(
        self,
        folder: Path,
        *,
        node_sysfs: Path | None = None,
        kwok_nodes: int = 0,
        scheduler_config: Path | None = None,
        with_railyard: bool = False,
        multus: bool = False,
        agent_config: dict | None = None,
        node_helpers: dict[str, list[str]] | None = None,
        dra: bool = False,
        railyard_ipam: dict | None = None,
    ) -> None:
        self.layout = Layout.for_dir(folder)
        # More agent config (merged into the box's), and processes started on the node just
        # before the agent, `{sysfs_root}` in their argv filled in (a stand-in for another
        # vendor's device plugin: tests/support/nvidia_standin.py).
        self.agent_config = agent_config or {}
        self.node_helpers = node_helpers or {}
        self.with_railyard = with_railyard or multus or dra
        self.multus = multus
        # The agent in DRA mode (issue 29): it publishes the node's ResourceSlices and serves
        # kubelet's DRA plugin; the chart's DRA RBAC and DeviceClasses are applied.
        self.dra = dra
        # IPAM for railyard-cni's interfaces (chained; none by default): `{run_dir}` in a
        # string value is the box's run folder (host-local's dataDir).
        self.railyard_ipam = railyard_ipam
        self.node_sysfs = node_tree(node_sysfs) / "sys" if node_sysfs is not None else None
        self.kwok_nodes = kwok_nodes
        self.scheduler_config = scheduler_config
        self.state_path = self.layout.dir / "box.json"
        self.state = BoxState.load(self.state_path)
        self.bins: dict[str, Path] = {}

    # -- helpers ------------------------------------------------------------------------------

    def bin(self, name: str) -> str:
        return str(self.layout.bin_dir / name)

    def on_node(self, argv: list[str]) -> list[str]:
        """Run as the node's own components do: in the box's network namespace and in the
        node's mount namespace, where /var/lib/kubelet is the box's own folder. kubelet keeps
        its device-plugin socket at that fixed path whatever its --root-dir says, so each box's
        kubelet, containerd (and, later, Railyard's agent) share a private view of it."""
        holder = next(s for s in self.state.started if s.name == "node-mounts")
        return ["nsenter", f"--net=/run/netns/{self.layout.netns}",
                f"--mount=/proc/{holder.pid}/ns/mnt", "--", *argv]

    def in_box(self, argv: list[str]) -> list[str]:
        """Run in the box's network namespace only. Not `ip netns exec`: that also unshares the
        mount namespace and mounts a fresh /sys over the cgroup mounts kubelet needs, and it
        would hide the runtime's mounts from the host (and from `down`)."""
        return ["nsenter", f"--net=/run/netns/{self.layout.netns}", "--", *argv]

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        argv = [self.bin("kubectl"), "--kubeconfig", str(self.layout.admin_kubeconfig), *args]
        return run(argv, check=check, input=input).stdout

    def log_tail(self, name: str, lines: int = 25) -> str:
        path = self.layout.dir / "logs" / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def start(self, name: str, argv: list[str], *, on_node: bool = False) -> int:
        """Start a component detached in the box namespace, its output in logs/NAME.log."""
        log = self.layout.dir / "logs" / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                self.on_node(argv) if on_node else self.in_box(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PATH": f"{self.layout.bin_dir}:{os.environ['PATH']}"},
            )
        entry = Started(name, process.pid, str(log), argv, on_node)
        names = [s.name for s in self.state.started]
        if name in names:  # a restart keeps its place in the start order
            self.state.started[names.index(name)] = entry
        else:
            self.state.started.append(entry)
        self.state.save(self.state_path)
        return process.pid

    def wait(self, name: str, ready: Callable[[], bool], timeout: float = 90.0) -> None:
        """Poll until ready; on timeout, or if the process died, fail naming it with its log."""
        deadline = time.monotonic() + timeout
        entry = next((s for s in self.state.started if s.name == name), None)
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if ready():
                    return
            if entry is not None and not _alive(entry.pid):
                raise BoxError(f"{name} exited during start-up; {self._log_says(name)}")
            time.sleep(0.25)
        raise BoxError(f"{name} not ready after {timeout:.0f} s; {self._log_says(name)}")

    def _log_says(self, name: str) -> str:
        return f"its log ({self.layout.dir / 'logs' / name}.log) ends:\n{self.log_tail(name)}"

    def _https_ok(self, url: str, *, client: str | None = "admin") -> bool:
        pki = Pki(self.layout.dir / "pki")
        context = ssl.create_default_context(cafile=str(pki.path("ca", "crt")))
        if client is None:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context.load_cert_chain(pki.path(client, "crt"), pki.path(client, "key"))
        try:
            with urllib.request.urlopen(url, context=context, timeout=3) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False

    # -- up -----------------------------------------------------------------------------------

    def up(self) -> None:
        started = time.monotonic()
        if any(_alive(s.pid) for s in self.state.started):
            raise BoxError(f"a box is already up in {self.layout.dir}; run `hack/box down` first")
        self.bins = build((*BOX_FAMILIES, *(["kwok"] if self.kwok_nodes else []),
                           *(["multus"] if self.multus else [])))
        self.state = BoxState(kwok_nodes=self.kwok_nodes)
        for sub in ("logs", "pki", "config", "cni/net.d", "cni/bin", "cdi", "pod-logs"):
            (self.layout.dir / sub).mkdir(parents=True, exist_ok=True)
        self.state.save(self.state_path)
        self._link_binaries()
        try:
            say(f"box {self.layout.box_id}: network namespace {self.layout.netns}")
            self._network()
            self._certificates()
            self._control_plane()
            self._node()
            if self.kwok_nodes:
                self._kwok()
        except BaseException:
            say("start-up failed; removing what was started")
            with contextlib.suppress(Exception):
                self.down(quiet=True)
            raise
        say(f"box ready in {time.monotonic() - started:.1f} s")

    def _link_binaries(self) -> None:
        bin_dir = self.layout.bin_dir
        shutil.rmtree(bin_dir, ignore_errors=True)
        bin_dir.mkdir()
        for family_bin in {**built(), **self.bins}.values():
            for binary in family_bin.iterdir():
                (bin_dir / binary.name).symlink_to(binary.resolve())

    def _network(self) -> None:
        lay = self.layout
        taken = run(["ip", "-o", "-4", "addr"]).stdout
        if f" {lay.host_ip}/" in taken or lay.netns in run(["ip", "netns", "list"]).stdout:
            raise BoxError(f"{lay.host_ip} or {lay.netns} is in use: is a box up in {lay.dir}?")
        run(["ip", "netns", "add", lay.netns])
        run(["ip", "link", "add", lay.host_veth, "type", "veth", "peer", "name", lay.box_veth,
             "netns", lay.netns])
        run(["ip", "addr", "add", f"{lay.host_ip}/30", "dev", lay.host_veth])
        run(["ip", "link", "set", lay.host_veth, "up"])
        for argv in (
            ["ip", "link", "set", "lo", "up"],
            ["ip", "addr", "add", f"{lay.node_ip}/30", "dev", lay.box_veth],
            ["ip", "link", "set", lay.box_veth, "up"],
            # Service traffic from pods is routed through the node; nothing leaves the box:
            # its namespace has no default route.
            ["sysctl", "-qw", "net.ipv4.ip_forward=1"],
        ):
            run(self.in_box(argv))
        self._stand_ins(self.node_sysfs or self._default_sysfs())

    def _default_sysfs(self) -> Path:
        """The built-in node: Railyard's dgx-h100 profile as a sysfs tree (2 VFs per PF)."""
        tree = self.layout.dir / "node-sysfs"
        if not (tree / "sys").exists():
            shutil.rmtree(tree, ignore_errors=True)
            run([*railyard_command(), "fixture", "--profile", DEFAULT_PROFILE, "--vfs-per-pf", "2",
                 str(tree)])
        self.node_sysfs = tree / "sys"
        return self.node_sysfs

    def _stand_ins(self, sysfs: Path) -> None:
        """A veth stand-in in the box for each PF and VF netdev discovery finds in the tree:
        one reader of sysfs, so the box offers exactly what the agent will serve."""
        found = run([*railyard_command(), "discover", "--sysfs-root", str(sysfs)])
        links = netdev_stand_ins(json.loads(found.stdout))
        existing = {
            line.split(":")[1].strip().split("@")[0]
            for line in run(self.in_box(["ip", "-o", "link"])).stdout.splitlines()
        }
        clash = sorted(set(links) & existing)
        if clash:
            raise BoxError(f"the node sysfs names netdevs the box already has: {clash}")
        batch = []
        for index, (name, mac) in enumerate(sorted(links.items())):
            peer = f"ryp{index:04d}"
            batch += [f"link add {name} address {mac} type veth peer name {peer}",
                      f"link set {name} up", f"link set {peer} up"]
        run(self.in_box(["ip", "-batch", "-"]), input="\n".join(batch) + "\n")
        say(f"{len(links)} netdev stand-ins from {sysfs}")

    def _certificates(self) -> None:
        lay = self.layout
        pki = Pki(lay.dir / "pki")
        pki.ca()
        pki.service_account_keys()
        pki.issue("kube-apiserver", "/CN=kube-apiserver", sans=[
            f"IP:{lay.node_ip}", f"IP:{SERVICE_IP}", "IP:127.0.0.1", "DNS:localhost",
            "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ])
        identities = {
            "admin": "/O=system:masters/CN=railyard-box-admin",
            "kube-apiserver-kubelet-client": "/O=system:masters/CN=kube-apiserver-kubelet-client",
            "kube-controller-manager": "/CN=system:kube-controller-manager",
            "kube-scheduler": "/CN=system:kube-scheduler",
            "kube-proxy": "/CN=system:kube-proxy",
            "kubelet": f"/O=system:nodes/CN=system:node:{NODE_NAME}",
            "kwok": "/CN=railyard-box:kwok",
            "railyard-extender": f"/CN={EXTENDER_USER}",
            "railyard-agent": f"/CN={AGENT_USER}",
            "multus": f"/CN={MULTUS_USER}",
        }
        for name, subject in identities.items():
            pki.issue(name, subject)
            pki.kubeconfig(name, lay.server, lay.dir / "config" / f"{name}.kubeconfig")
        shutil.copy(lay.dir / "config" / "admin.kubeconfig", lay.admin_kubeconfig)

    def _control_plane(self) -> None:
        lay, pki = self.layout, Pki(self.layout.dir / "pki")
        config = lay.dir / "config"
        lay.shm_dir.mkdir(parents=True, exist_ok=True)
        self.start("etcd", [self.bin("etcd"), "--name", "box",
                            "--data-dir", str(lay.shm_dir / "etcd"),
                            "--listen-client-urls", "http://127.0.0.1:2379",
                            "--advertise-client-urls", "http://127.0.0.1:2379",
                            "--listen-peer-urls", "http://127.0.0.1:2380",
                            "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                            "--initial-cluster", "box=http://127.0.0.1:2380",
                            "--unsafe-no-fsync", "--log-level", "warn"])
        self.start("kube-apiserver", [
            self.bin("kube-apiserver"),
            "--etcd-servers", "http://127.0.0.1:2379",
            "--bind-address", "0.0.0.0", "--secure-port", "6443",
            "--advertise-address", lay.node_ip,
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--client-ca-file", str(pki.path("ca", "crt")),
            "--tls-cert-file", str(pki.path("kube-apiserver", "crt")),
            "--tls-private-key-file", str(pki.path("kube-apiserver", "key")),
            "--kubelet-client-certificate", str(pki.path("kube-apiserver-kubelet-client", "crt")),
            "--kubelet-client-key", str(pki.path("kube-apiserver-kubelet-client", "key")),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(pki.path("service-account", "pub")),
            "--service-account-signing-key-file", str(pki.path("service-account", "key")),
            "--authorization-mode", "Node,RBAC",
            "--enable-admission-plugins", "NodeRestriction",
            "--allow-privileged=true",
            "--kubelet-preferred-address-types", "InternalIP",
            "--profiling=false",
        ])
        self.wait("kube-apiserver", lambda: self._https_ok(f"{lay.server}/readyz"), timeout=120)
        say("kube-apiserver ready")
        self.kubectl("create", "clusterrolebinding", "railyard-box:kwok",
                     "--clusterrole", "cluster-admin", "--user", "railyard-box:kwok")
        common = [
            "--authentication-kubeconfig", str(config / "{}.kubeconfig"),
            "--authorization-kubeconfig", str(config / "{}.kubeconfig"),
            "--kubeconfig", str(config / "{}.kubeconfig"),
        ]

        def own(name: str) -> list[str]:
            return [arg.format(name) for arg in common]

        self.start("kube-controller-manager", [
            self.bin("kube-controller-manager"), *own("kube-controller-manager"),
            "--bind-address", "127.0.0.1", "--leader-elect=false",
            "--use-service-account-credentials=true",
            "--service-account-private-key-file", str(pki.path("service-account", "key")),
            "--root-ca-file", str(pki.path("ca", "crt")),
            "--cluster-name", "railyard-box",
            # The default 20 QPS would make a 1,000-replica Deployment take 50 s to create.
            "--kube-api-qps", "200", "--kube-api-burst", "400",
        ])
        if self.with_railyard:
            # With the `Allocated` Events (off in the shipped default): the box's tests read
            # them from the real API server. benchmarks/scheduling.py names its own.
            self.start_railyard_extender("--allocated-events")
        scheduler_config = self._scheduler_config(config / "kube-scheduler.kubeconfig")
        self.start("kube-scheduler", [
            self.bin("kube-scheduler"), "--config", str(scheduler_config),
            *own("kube-scheduler")[:4], "--bind-address", "0.0.0.0",
        ])
        self.wait("kube-scheduler",
                  lambda: self._https_ok(f"https://{lay.node_ip}:10259/readyz", client=None))
        self.wait("kube-controller-manager", lambda: "default" in self.kubectl(
            "get", "serviceaccount", "default", "-n", "default", "-o", "name", check=False))
        say("kube-scheduler and kube-controller-manager ready")

    def _scheduler_config(self, kubeconfig: Path) -> Path:
        """The caller's KubeSchedulerConfiguration (or a plain one) with the box's client."""
        import yaml

        if self.scheduler_config is not None:
            document = yaml.safe_load(self.scheduler_config.read_text())
        else:
            document = {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
            }
        client = document.setdefault("clientConnection", {})
        client.setdefault("kubeconfig", str(kubeconfig))
        client.setdefault("qps", 200)
        client.setdefault("burst", 400)
        document.setdefault("leaderElection", {}).setdefault("leaderElect", False)
        if self.with_railyard and self.scheduler_config is None:
            shipped = yaml.safe_load((REPO / "deploy/kube-scheduler-config.yaml").read_text())
            document["extenders"] = shipped["extenders"]
            for extender in document["extenders"]:
                extender["urlPrefix"] = f"http://{self.layout.node_ip}:{EXTENDER_PORT}/"
        path = self.layout.dir / "config" / "kube-scheduler.yaml"
        path.write_text(yaml.safe_dump(document))
        return path

    def _node(self) -> None:
        lay = self.layout
        self._cgroup_root()
        self._node_mounts()
        containerd_config = self._containerd_config()
        self.start("containerd", [self.bin("containerd"), "--config", str(containerd_config)],
                   on_node=True)
        self.wait("containerd", lambda: run(self._ctr("version"), check=False).returncode == 0)
        images = build_images(self.bins["kube"], lay.dir / "images")
        for archive in images.values():
            run(self._ctr("images", "import", "--no-unpack=false", str(archive)))
        say("containerd ready, images imported")
        self._cni_config()
        self.start("kubelet", [
            self.bin("kubelet"), "--config", str(self._kubelet_config()),
            "--kubeconfig", str(lay.dir / "config" / "kubelet.kubeconfig"),
            "--hostname-override", NODE_NAME, "--node-ip", lay.node_ip,
        ], on_node=True)
        self.start("kube-proxy", [self.bin("kube-proxy"), "--config", str(self._proxy_config())])
        self.wait("kubelet", self.node_ready, timeout=120)
        self.wait("kube-proxy", lambda: "KUBE-SERVICES" in run(
            self.in_box(["iptables", "-t", "nat", "-S", "KUBE-SERVICES"]), check=False).stdout)
        if self.with_railyard:
            self._railyard_agent()
        say(f"node {NODE_NAME} Ready")

    def _node_mounts(self) -> None:
        """The node's mount namespace: the host's mounts flow in, none of the node's flow out
        (they go with the namespace at `down`); /var/lib/kubelet there is the box's folder."""
        self.layout.kubelet_dir.mkdir(parents=True, exist_ok=True)
        KUBELET_HOME.mkdir(parents=True, exist_ok=True)  # a mount point; stays empty outside
        script = f"set -e; mount --bind {self.layout.kubelet_dir} {KUBELET_HOME}\n"
        if self.with_railyard:
            script += self._node_dev_script()
        pid = self.start("node-mounts", ["unshare", "--mount", "--propagation", "slave", "--",
                                         "sh", "-c", script + "exec sleep infinity\n"])

        def mounted() -> bool:
            return f" {KUBELET_HOME} " in Path(f"/proc/{pid}/mountinfo").read_text()

        self.wait("node-mounts", mounted, timeout=10)

    def _node_dev_script(self) -> str:
        """A /dev of the node's own, in its mount namespace: the host's entries bound in, plus
        /dev/infiniband with the verbs nodes the node's sysfs names and rdma_cm, so containers
        that Railyard's device plugin gives NICs really start. They are character devices with
        /dev/null's numbers: there is no RDMA hardware here, and the host's /dev is not touched."""
        assert self.node_sysfs is not None
        verbs = sorted(p.name for p in (self.node_sysfs / "class/infiniband_verbs").glob("uverbs*"))
        host_dev = self.layout.run_dir / "host-dev"
        lines = [
            f"mkdir -p {host_dev}; mount --rbind /dev {host_dev}",
            "mount -t tmpfs -o mode=755,size=1m railyard-box-dev /dev",
            f"for entry in {host_dev}/* {host_dev}/.[!.]*; do",
            '  [ -e "$entry" ] || [ -L "$entry" ] || continue; name=${entry##*/}',
            '  if [ -L "$entry" ]; then cp -P "$entry" "/dev/$name"',
            '  elif [ -d "$entry" ]; then mkdir "/dev/$name"; mount --rbind "$entry" "/dev/$name"',
            '  else touch "/dev/$name"; mount --bind "$entry" "/dev/$name"; fi',
            "done",
            f"umount -l {host_dev}; rmdir {host_dev}",
            "mkdir /dev/infiniband",
            *(f"mknod -m 666 /dev/infiniband/{name} c 1 3" for name in [*verbs, "rdma_cm"]),
        ]
        return "\n".join(lines) + "\n"

    def node_ready(self, name: str = NODE_NAME) -> bool:
        status = self.kubectl("get", "node", name, "-o",
                              "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                              check=False)
        return status.strip() == "True"

    def _ctr(self, *args: str) -> list[str]:
        return [self.bin("ctr"), "--address", str(self.layout.containerd_socket),
                "--namespace", "k8s.io", *args]

    def _cgroup_root(self) -> None:
        """kubelet's cgroupRoot must exist; made per box so `down` can remove it whole."""
        for controller in _cgroup_controllers():
            path = Path("/sys/fs/cgroup") / controller / self.layout.cgroup_name
            path.mkdir(exist_ok=True)
            if controller == "cpuset":
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (path / name).write_text((path.parent / name).read_text())

    def _containerd_config(self) -> Path:
        lay = self.layout
        text = f"""version = 3
root = "{lay.dir / 'containerd/root'}"
state = "{lay.run_dir / 'containerd'}"

[grpc]
  address = "{lay.containerd_socket}"

[ttrpc]
  address = "{lay.containerd_socket}.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "{lay.dir / 'containerd/opt'}"

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ["{lay.dir / 'cdi'}"]
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{shutil.which('runc') or '/usr/sbin/runc'}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{lay.dir / 'cni/bin'}", "/usr/lib/cni"]
    conf_dir = "{lay.dir / 'cni/net.d'}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        path = lay.dir / "config" / "containerd.toml"
        path.write_text(text)
        return path

    def _cni_config(self) -> None:
        """The pod network: a bridge inside the box and host-local addresses (Debian's plugins),
        with Railyard's CNI chained after it when Railyard runs in the box."""
        conflist: dict[str, Any] = {
            "cniVersion": "1.0.0",
            "name": "box",
            "plugins": [{
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "isDefaultGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "dataDir": str(self.layout.run_dir / "ipam"),
                },
            }],
        }
        net_d = self.layout.dir / "cni/net.d"
        if self.with_railyard:
            run([*railyard_command(), "cni", "install",
                 "--bin-dir", str(self.layout.dir / "cni/bin")])
        if self.multus:
            self._multus_config(conflist)
            return
        if self.with_railyard:
            # Chained: eth0 is the bridge's, the pod's VFs become net1, net1-1, … in pair order.
            ours: dict[str, Any] = {"type": "railyard-cni", "ifname": "net1",
                                    "agentSocket": str(self.cni_socket)}
            if self.railyard_ipam is not None:
                ours["ipam"] = json.loads(json.dumps(self.railyard_ipam).replace(
                    "{run_dir}", str(self.layout.run_dir)))
            conflist["plugins"].append(ours)
        (net_d / "10-box.conflist").write_text(json.dumps(conflist, indent=1))

    def _multus_config(self, cluster_network: dict[str, Any]) -> None:
        """Multus's thin plugin as the node's network: the bridge for eth0, and whatever a pod's
        `k8s.v1.cni.cncf.io/networks` names, through NetworkAttachmentDefinitions."""
        lay = self.layout
        (lay.dir / "cni/bin/multus").symlink_to(self.bins["multus"] / "multus")
        self.kubectl("apply", "-f", str(self.bins["multus"].parent / "nad-crd.yaml"))
        self.kubectl("apply", "-f", "-", input=json.dumps(multus_rbac()))
        multus = {
            "cniVersion": "1.0.0",
            "name": "multus-cni-network",
            "type": "multus",
            "kubeconfig": str(lay.dir / "config/multus.kubeconfig"),
            "cniDir": str(lay.run_dir / "multus"),
            "binDir": f"{lay.dir / 'cni/bin'}:/usr/lib/cni",
            "logToStderr": True,
            "delegates": [cluster_network],
        }
        (lay.dir / "cni/net.d/00-multus.conf").write_text(json.dumps(multus, indent=1))

    def network_attachment(self, namespace: str, name: str = "railyard-vfs") -> str:
        """A NetworkAttachmentDefinition for Railyard's VFs in `namespace`; returns its name."""
        config = {"cniVersion": "1.0.0", "name": name, "type": "railyard-cni",
                  "agentSocket": str(self.cni_socket)}
        self.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name}, "spec": {"config": json.dumps(config)}}))
        return name

    def _kubelet_config(self) -> Path:
        lay = self.layout
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{lay.cgroup_name}",
            "containerRuntimeEndpoint": f"unix://{lay.containerd_socket}",
            "address": lay.node_ip,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "authentication": {
                "x509": {"clientCAFile": str(lay.dir / "pki/ca.crt")},
                "webhook": {"enabled": True},
                "anonymous": {"enabled": False},
            },
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(lay.dir / "pod-logs"),
            "resolvConf": "",
            "failSwapOn": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%"},
            "serializeImagePulls": False,
            "registerNode": True,
            "rotateCertificates": False,
        }
        path = lay.dir / "config" / "kubelet.yaml"
        path.write_text(json.dumps(config, indent=1))
        return path

    def _proxy_config(self) -> Path:
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {
                "kubeconfig": str(self.layout.dir / "config/kube-proxy.kubeconfig"),
            },
            "hostnameOverride": NODE_NAME,
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "nodePortAddresses": ["primary"],
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # Leave the kernel's conntrack settings alone: they are not the box's to change.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
        }
        path = self.layout.dir / "config" / "kube-proxy.yaml"
        path.write_text(json.dumps(config, indent=1))
        return path

    # -- Railyard ------------------------------------------------------------------------------

    @property
    def cni_socket(self) -> Path:
        return self.layout.run_dir / "railyard-cni.sock"

    def start_railyard_extender(self, *options: str) -> None:
        """The CRD, each Railyard service's own RBAC, and the extender kube-scheduler calls
        (`options`: more `railyard scheduler` options). `--with-railyard` starts it before
        kube-scheduler; benchmarks/scheduling.py starts it later."""
        self.kubectl("apply", "-f", str(REPO / "deploy/crds/nodetopologies.railyard.dev.yaml"))
        self.kubectl("wait", "--for", "condition=Established", "--timeout", "60s",
                     "crd/nodetopologies.railyard.dev")
        self.kubectl("apply", "-f", "-", input=json.dumps(railyard_rbac(dra=self.dra)))
        if self.dra:
            self.kubectl("apply", "-f", "-", input=json.dumps(
                {"apiVersion": "v1", "kind": "List",
                 "items": [d for d in chart_objects(dra=True) if d["kind"] == "DeviceClass"]}))
        listen = f"{self.layout.node_ip}:{EXTENDER_PORT}"
        self.start("railyard-scheduler", [
            *railyard_command(), "scheduler", "--listen", listen,
            "--kubeconfig", str(self.layout.dir / "config/railyard-extender.kubeconfig"),
            *options,
        ])

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://{listen}/healthz", timeout=3) as response:
                return response.status == 200

        self.wait("railyard-scheduler", healthy, timeout=60)
        say("railyard scheduler extender ready")

    def _railyard_agent(self) -> None:
        """The agent on the node: the real kubelet's device plugins and the CNI service."""
        assert self.node_sysfs is not None
        config = self.layout.dir / "config/railyard-agent.json"
        dra = {"mode": "dra", "dra": {"publishGpus": True,
                                      "cdiDir": str(self.layout.dir / "cdi")}} if self.dra else {}
        config.write_text(json.dumps({"cniDevinfoDir": str(self.layout.dir / "devinfo"),
                                      **dra, **self.agent_config}))
        for name, argv in self.node_helpers.items():
            self.start(name, [a.format(sysfs_root=self.node_sysfs.parent) for a in argv],
                       on_node=True)
        self.start("railyard-agent", [
            *railyard_command(), "agent", "--node-name", NODE_NAME,
            "--kubeconfig", str(self.layout.dir / "config/railyard-agent.kubeconfig"),
            "--sysfs-root", str(self.node_sysfs.parent),
            "--state-dir", str(self.layout.dir / "railyard-state"),
            "--cni-socket", str(self.cni_socket), "--config", str(config),
            *(["--mode", "dra"] if self.dra else []),
        ], on_node=True)

        def published() -> bool:
            listed = json.loads(self.kubectl(
                "get", "resourceslices", "-o", "json", "--field-selector",
                f"spec.nodeName={NODE_NAME},spec.driver=railyard.dev"))["items"]
            return bool(listed) and len(listed) == listed[0]["spec"]["pool"][
                "resourceSliceCount"]

        if self.dra:
            self.wait("railyard-agent", published, timeout=90)
            say("railyard agent in DRA mode: the node's ResourceSlices published")
            return

        def offered() -> bool:
            allocatable = json.loads(self.kubectl("get", "node", NODE_NAME, "-o", "json"))[
                "status"].get("allocatable", {})
            return int(allocatable.get("nvidia.com/gpu", "0")) > 0 and int(
                allocatable.get("railyard.dev/vf", "0")) > 0

        self.wait("railyard-agent", offered, timeout=90)
        say("railyard agent serving the node's GPUs and VFs")

    # -- kwok ---------------------------------------------------------------------------------

    def _kwok(self) -> None:
        stages = self.bins["kwok"].parent / "kwok-stages.yaml"
        self.start("kwok", [
            self.bin("kwok"), "--kubeconfig", str(self.layout.dir / "config/kwok.kubeconfig"),
            "--config", str(stages),
            "--manage-nodes-with-annotation-selector", f"{KWOK_ANNOTATION}=fake",
            "--node-ip", self.layout.node_ip, "--server-address", "127.0.0.1:10247",
            "--node-lease-duration-seconds", "40",
        ])
        self.add_kwok_nodes(self.kwok_nodes)

    def add_kwok_nodes(self, count: int, start: int = 0) -> list[str]:
        names = [f"kwok-node-{i}" for i in range(start, start + count)]
        items = [kwok_node(name) for name in names]
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                            "items": items}))
        self.wait("kwok", lambda: self._ready_count(names) == len(names),
                  timeout=max(120.0, count / 20))
        say(f"{count} kwok nodes Ready")
        return names

    def _ready_count(self, names: list[str]) -> int:
        out = self.kubectl("get", "nodes", "-l", "type=kwok", "-o", "json")
        ready = 0
        for node in json.loads(out)["items"]:
            conditions = node.get("status", {}).get("conditions", [])
            if node["metadata"]["name"] in names and any(
                c["type"] == "Ready" and c["status"] == "True" for c in conditions
            ):
                ready += 1
        return ready

    # -- restarts -----------------------------------------------------------------------------

    def stop(self, name: str) -> None:
        """Stop a component; `restart` starts it again (drills, benchmarks)."""
        _stop(next(s for s in self.state.started if s.name == name).pid)

    def restart(self, name: str) -> None:
        """Stop a component and start it again with the same command line (drills)."""
        entry = next(s for s in self.state.started if s.name == name)
        _stop(entry.pid)
        if name == "kubelet":
            plugins = self.layout.kubelet_dir / "device-plugins"
            for socket in plugins.glob("*.sock"):
                socket.unlink()
        self.start(name, entry.argv, on_node=entry.on_node)
        if name == "kube-apiserver":
            self.wait(name, lambda: self._https_ok(f"{self.layout.server}/readyz"), timeout=120)
        elif name == "kubelet":
            self.wait(name, lambda: (self.layout.kubelet_dir / "device-plugins/kubelet.sock")
                      .exists() and self.node_ready())
        elif name == "containerd":
            self.wait(name, lambda: run(self._ctr("version"), check=False).returncode == 0)
        elif name == "kube-scheduler":
            self.wait(name, lambda: self._https_ok(f"https://{self.layout.node_ip}:10259/readyz",
                                                   client=None))

    # -- down ---------------------------------------------------------------------------------

    def down(self, *, quiet: bool = False) -> None:
        lay = self.layout
        for entry in reversed(self.state.started):
            _stop(entry.pid)
        # What the runtime started outlives containerd: shims, pause and container processes.
        for pid in self._leftover_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(self._leftover_processes, 10)
        for mount in sorted(self._mounts(), key=len, reverse=True):
            run(["umount", "-l", mount], check=False)
        if lay.netns in run(["ip", "netns", "list"]).stdout:
            run(["ip", "netns", "del", lay.netns], check=False)
        run(["ip", "link", "del", lay.host_veth], check=False)
        for path in lay.cgroup_dirs():
            _remove_cgroup(path)
        for folder in (lay.run_dir, lay.shm_dir):
            shutil.rmtree(folder, ignore_errors=True)
        self.state = BoxState()
        self.state.save(self.state_path)
        if not quiet:
            say(f"box {lay.box_id} down")

    def _leftover_processes(self) -> list[int]:
        lay = self.layout
        pids = set()
        for path in lay.cgroup_dirs():
            for procs in path.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
        netns = Path("/run/netns") / lay.netns
        netns_inode = netns.stat().st_ino if netns.exists() else None
        markers = (str(lay.containerd_socket), str(lay.run_dir))
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                in_box = netns_inode is not None and os.stat(proc / "ns/net").st_ino == netns_inode
                if in_box or any(marker in cmdline for marker in markers):
                    pids.add(int(proc.name))
        return sorted(pids)

    def _mounts(self) -> list[str]:
        prefixes = tuple(str(p) + "/" for p in (self.layout.dir, self.layout.run_dir,
                                                self.layout.shm_dir))
        found = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if (point + "/").startswith(prefixes):
                found.append(point)
        return found


def chart_objects(*, dra: bool = False) -> list[dict]:
    """The chart's objects: deploy/manifests/railyard.yaml (its default values), or with
    `dra` rendered by the pinned helm with agent.mode=dra."""
    import tempfile

    import yaml

    if not dra:
        return [d for d in yaml.safe_load_all(CHART_MANIFESTS.read_text()) if d]
    helm = build(("helm",))["helm"] / "helm"
    with tempfile.TemporaryDirectory(prefix="box-helm-") as home:
        env = {**os.environ, "HELM_CACHE_HOME": home, "HELM_CONFIG_HOME": home,
               "HELM_DATA_HOME": home}
        text = run([str(helm), "template", "railyard", str(REPO / "deploy/chart/railyard"),
                    "--namespace", "railyard-system", "--set", "agent.mode=dra"],
                   env=env).stdout
    return [d for d in yaml.safe_load_all(text) if d]


def railyard_rbac(*, dra: bool = False) -> dict:
    """The chart's least-privilege roles (deploy/manifests/railyard.yaml, rendered from
    deploy/chart/railyard; decision 0081; with `dra`, agent.mode=dra's), bound to the box's
    users instead of the chart's ServiceAccounts: its ClusterRoles as they are, and the
    extender's Role (leader election, decision 0074) in kube-system, where the box's extender
    keeps its Lease; and its FlowSchema, for the box's extender user."""
    rendered = chart_objects(dra=dra)
    items: list[dict] = []

    def grant(kind: str, user: str, namespace: str | None = None) -> None:
        name = user.replace(":", "-")  # railyard-extender, railyard-agent: the chart's names
        [rules] = [d["rules"] for d in rendered
                   if d["kind"] == kind and d["metadata"]["name"] == name]
        metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
        items.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                      "metadata": metadata, "rules": rules})
        items.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": f"{kind}Binding",
                      "metadata": metadata,
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind,
                                  "name": name},
                      "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                    "name": user}]})

    grant("ClusterRole", EXTENDER_USER)
    grant("Role", EXTENDER_USER, "kube-system")
    grant("ClusterRole", AGENT_USER)
    if dra:
        # The chart's agent is a ServiceAccount of its node: `associated-node:patch` lets it
        # write our claims' status.devices (decision 0113). The box's agent is a certificate
        # user, never "of a node" to the API server, so it needs the arbitrary-node verb.
        [agent] = [i for i in items if i["kind"] == "ClusterRole"
                   and i["metadata"]["name"] == AGENT_USER.replace(":", "-")]
        agent["rules"] = [*agent["rules"], BOX_AGENT_CLAIM_STATUS_RULE]
    # The extender's FlowSchema (decision 0114), matching the box's extender user.
    for schema in (d for d in rendered if d["kind"] == "FlowSchema"):
        for rule in schema["spec"]["rules"]:
            rule["subjects"] = [{"kind": "User", "user": {"name": EXTENDER_USER}}]
        schema["metadata"] = {"name": schema["metadata"]["name"]}
        items.append(schema)
    return {"apiVersion": "v1", "kind": "List", "items": items}


BOX_AGENT_CLAIM_STATUS_RULE = {"apiGroups": ["resource.k8s.io"],
                               "resources": ["resourceclaims/driver"],
                               "resourceNames": ["railyard.dev"],
                               "verbs": ["arbitrary-node:patch"]}


def multus_rbac() -> dict:
    """What Multus's thin plugin reads and writes: attachments, the pod and its status."""
    rules = [
        {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["network-attachment-definitions"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["get", "update"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"],
         "verbs": ["create", "patch", "update"]},
    ]
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "box-multus"}
    return {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "box-multus"}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "box-multus"}, "roleRef": ref,
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": MULTUS_USER}]},
    ]}


def railyard_command() -> list[str]:
    """Railyard as the Python running the box runs it: a venv need not be on the PATH (nor
    activated) for the box, or a test that starts it, to find the Railyard it installed."""
    if importlib.util.find_spec("railyard") is None:
        raise BoxError(f"Railyard is not installed for {sys.executable} "
                       f"({sys.executable} -m pip install -e .)")
    return [sys.executable, "-m", "railyard"]


def kwok_node(name: str) -> dict:
    """A Node kwok manages, with the extended resources of docs/testing.md."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name},
        },
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake",
                             "effect": "NoSchedule"}]},
        "status": {"capacity": KWOK_NODE_CAPACITY, "allocatable": KWOK_NODE_CAPACITY},
    }


def node_tree(given: Path) -> Path:
    """The folder holding the node's sys/, given as it or as that sys/: the one rule every
    sysfs-tree option follows (railyard.discovery.sysfs.tree_root)."""
    railyard_command()
    from railyard.discovery.sysfs import SysfsError, tree_root

    try:
        return Path(tree_root(given))
    except SysfsError as error:
        raise BoxError(f"--node-sysfs {error}") from None


def netdev_stand_ins(topology: dict[str, Any]) -> dict[str, str]:
    """Each PF and VF netdev of a `railyard discover` document, with the MAC its veth carries.

    The MAC comes from the name, locally administered and unicast: a veth carries six bytes,
    which an InfiniBand port's 20-byte address is not, and a name is stable across boxes.
    """
    names = [n.get("netdev") for n in topology.get("nics", [])]
    names += [v.get("netdev") for n in topology.get("nics", []) for v in n.get("vfs", [])]
    links = {}
    for name in sorted(n for n in names if n):
        digest = hashlib.sha256(name.encode()).digest()
        links[name] = "02:" + ":".join(f"{b:02x}" for b in digest[:5])
    return links


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def _stop(pid: int, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after the grace period."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _wait_gone(pids: Callable[[], list[int]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids()):
        time.sleep(0.1)


def _remove_cgroup(path: Path) -> None:
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            child.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/box",
        description="A real Kubernetes in a box for Railyard's tests (docs/testing.md).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser(
        "build", help="build the pinned components into the machine-wide cache")
    build_command.add_argument(
        "families", nargs="*", metavar="FAMILY",
        help=f"what to build: {', '.join(FAMILIES)} (default: all the tests use, "
        f"{', '.join(TESTED_FAMILIES)})")
    up = commands.add_parser("up", help="build what is missing, start a box, wait until ready")
    up.add_argument("--dir", type=Path, required=True, help="the box's folder (made if missing)")
    up.add_argument("--node-sysfs", type=Path,
                    help=f"the node's sysfs tree: the folder holding sys/, or that sys/ "
                    f"(default: a {DEFAULT_PROFILE} fixture); a veth stand-in is made for each "
                    "PF and VF netdev `railyard discover` finds in it")
    up.add_argument("--kwok-nodes", type=int, default=0, help="kwok nodes to add (default 0)")
    up.add_argument("--scheduler-config", type=Path, help="a KubeSchedulerConfiguration file")
    up.add_argument("--with-railyard", action="store_true",
                    help="also run Railyard: its extender in kube-scheduler's configuration, its "
                    "agent serving the real kubelet on the node's sysfs, railyard-cni in the "
                    "node's CNI chain")
    up.add_argument("--multus", action="store_true",
                    help="with --with-railyard: Multus's thin plugin as the node's network, "
                    "Railyard's VFs through a NetworkAttachmentDefinition (Box.network_attachment)")
    up.add_argument("--dra", action="store_true",
                    help="with --with-railyard: the agent in DRA mode (it publishes the node's "
                    "ResourceSlices of driver railyard.dev, GPUs included, and serves kubelet's "
                    "DRA plugin; the DeviceClasses railyard-gpu/-vf/-pf applied; docs/dra.md)")
    down = commands.add_parser("down", help="stop a box and remove all it made")
    down.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if os.geteuid() != 0 and args.command != "build":
        parser.error("the box needs root (network namespaces, mounts, cgroups)")
    try:
        if args.command == "build":
            unknown = sorted(set(args.families) - set(FAMILIES))
            if unknown:
                parser.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
            for name, path in build(tuple(args.families or TESTED_FAMILIES)).items():
                print(f"{name}: {path}")
            return 0
        args.dir.mkdir(parents=True, exist_ok=True)
        if args.command == "down":
            Box(args.dir).down()
            return 0
        if args.kwok_nodes < 0:
            parser.error("--kwok-nodes must be 0 or more")
        if args.scheduler_config is not None and not args.scheduler_config.exists():
            parser.error(f"--scheduler-config {args.scheduler_config}: no such file")
        box = Box(args.dir, node_sysfs=args.node_sysfs, kwok_nodes=args.kwok_nodes,
                  scheduler_config=args.scheduler_config, with_railyard=args.with_railyard,
                  multus=args.multus, dra=args.dra)
        box.up()
        print(f"export PATH={box.layout.bin_dir}:$PATH")
        print(f"export KUBECONFIG={box.layout.admin_kubeconfig}")
        return 0
    except BoxError as error:
        print(f"hack/box: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hack/box: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
