"""The one Railyard image, built on this machine with no registry and no container daemon:
a Debian root made by debootstrap, python3 from Debian, the project's wheel and its
dependencies in a venv at /opt/railyard, packed as one OCI layer (as hack/kubebox.py's
`write_image_archive` packs the box's own images) that `ctr images import` loads. The
Dockerfile at the repository root builds the same image with docker (decision 0092).

    hack/build-image            # prints the archive's path; cached, see below

Cached in the box's machine-wide cache (kubebox.cache_root()): the Debian base is keyed by
the suite and its package list, the image by the project's content (pyproject.toml, README.md,
src/) and the base. A warm machine reuses both; a source change rebuilds the venv only.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path
from types import ModuleType

HACK = Path(__file__).resolve().parent
REPO = HACK.parent
SUITE = "bookworm"
MIRROR = os.environ.get("RAILYARD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# python3-venv brings ensurepip's pip; nothing else: the agent talks netlink through pyroute2
# and the CNI shim runs on the host (docs/cni.md).
PACKAGES = ("python3", "python3-venv")
VENV = "/opt/railyard"
# What only the build needs, and what no container reads: left out of the layer.
PRUNED = ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
          "usr/share/locale", "usr/share/info", "tmp", "var/log")
# The layer's fixed mtime: a rebuild of the same files is the same layer (2026-01-01).
EPOCH = 1767225600


def _kubebox() -> ModuleType:
    """hack/kubebox.py (a script, not a package): the cache and the OCI archive writer."""
    if "kubebox" in sys.modules:
        return sys.modules["kubebox"]
    spec = importlib.util.spec_from_file_location("kubebox", HACK / "kubebox.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kubebox"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


kubebox = _kubebox()


def version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def image_name() -> str:
    """The name the chart's default values resolve to: `railyard:<appVersion>`, as containerd
    normalises it (kubelet asks the runtime for docker.io/library/railyard:0.1.0)."""
    return f"docker.io/library/railyard:{version()}"


def _project_files() -> list[Path]:
    files = [REPO / "pyproject.toml", REPO / "README.md"]
    files += sorted(p for p in (REPO / "src").rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts
                    and not p.name.endswith((".pyc", ".egg-info")) and ".egg-info" not in str(p))
    return files


def base_key() -> str:
    digest = hashlib.sha256(f"{SUITE} {' '.join(PACKAGES)} {' '.join(PRUNED)}".encode())
    return f"{SUITE}-{digest.hexdigest()[:12]}"


def image_key() -> str:
    """The project's content, the Debian base and this builder: what decides the image."""
    digest = hashlib.sha256(base_key().encode())
    digest.update(Path(__file__).read_bytes())
    for path in _project_files():
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _run(argv: list[str], **kwargs) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise kubebox.BoxError(f"{' '.join(argv)} failed ({done.returncode}):\n{tail}")


def _base(cache: Path) -> Path:
    """debootstrap's minimal Debian with python3 and venv, kept as a folder in the cache."""
    out = cache / f"railyard-image-base-{base_key()}"
    if (out / "complete").exists():
        return out / "rootfs"
    if shutil.which("debootstrap") is None:
        raise kubebox.BoxError("debootstrap is not installed (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise kubebox.BoxError("building the image needs root (debootstrap, chroot)")
    started = time.monotonic()
    kubebox.say(f"debootstrap {SUITE} from {MIRROR} (cold: about a minute)")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
          str(staging / "rootfs"), MIRROR])
    for pruned in PRUNED:
        folder = staging / "rootfs" / pruned
        if folder.is_dir():
            shutil.rmtree(folder)
            folder.mkdir(mode=0o1777 if pruned == "tmp" else 0o755)
    (staging / "complete").write_text(f"{time.monotonic() - started:.0f} s\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    kubebox.say(f"Debian base ready in {time.monotonic() - started:.0f} s")
    return out / "rootfs"


def _wheels(into: Path) -> None:
    """The project's wheel (from a copy of what the Dockerfile copies, so nothing is written
    into the checkout) and every dependency as a binary wheel for Debian's CPython 3.11."""
    with tempfile.TemporaryDirectory(prefix="railyard-src-") as source:
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(REPO / name, Path(source) / name)
        shutil.copytree(REPO / "src", Path(source) / "src",
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-q",
              "--wheel-dir", str(into), source])
    [wheel] = into.glob("railyard-*.whl")
    platforms = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64",
                 "manylinux_2_5_x86_64", "manylinux1_x86_64", "linux_x86_64", "any"]
    _run([sys.executable, "-m", "pip", "download", "-q", "--dest", str(into),
          "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
          "--abi", "cp311", *(f"--platform={p}" for p in platforms), str(wheel)])


def _layer(rootfs: Path, into: Path) -> bytes:
    """The root folder as one uncompressed layer; device nodes left out (the runtime makes
    /dev), times fixed."""
    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if info.ischr() or info.isblk() or info.isfifo():
            return None
        info.mtime = min(info.mtime, EPOCH)
        info.uname = info.gname = ""
        return info

    path = into / "layer.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for child in sorted(rootfs.iterdir()):
            tar.add(child, arcname=child.name, filter=normalise)
    return path.read_bytes()


def write_archive(path: Path, name: str, layer: bytes) -> None:
    """The OCI image layout archive `ctr images import` names `name`: kubebox's
    `write_image_archive` with the Dockerfile's environment, user and command."""
    entrypoint = [f"{VENV}/bin/railyard"]
    kubebox.write_image_archive(path, name, layer, entrypoint, compresslevel=6, config={
        # compresslevel 9: twice the time for 2% less
        "Entrypoint": entrypoint,
        "Cmd": ["--help"],
        "User": "65532:65532",  # the extender's; the chart runs the agent as root
        "Env": [f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "LANG=C.UTF-8"],
    })


def build_image() -> Path:
    """The image archive for `ctr images import`, built if the cache lacks it."""
    cache = kubebox.cache_root()
    out = cache / f"railyard-image-{image_key()}"
    archive = out / "railyard.tar"
    if (out / "complete").exists():
        return archive
    with kubebox._locked(cache / ".image-lock"):
        if (out / "complete").exists():
            return archive
        started = time.monotonic()
        base = _base(cache)
        staging = out.with_name(out.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            rootfs = staging / "rootfs"
            _run(["cp", "-a", str(base), str(rootfs)])
            wheels = rootfs / "tmp/wheels"
            wheels.mkdir(parents=True)
            _wheels(wheels)
            # Debian's own python3 and pip, in the root alone: none of this machine's pip
            # settings (find-links, certificates) reach it, and it installs from the wheels only.
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
            _run(["chroot", str(rootfs), "/usr/bin/python3", "-m", "venv", VENV], env=env)
            _run(["chroot", str(rootfs), f"{VENV}/bin/pip", "install", "--no-index",
                  "--no-cache-dir", "--disable-pip-version-check", "-q",
                  "--find-links", "/tmp/wheels", "railyard"], env=env)
            # pip and its caches are build tools: the image runs railyard, not pip.
            venv = rootfs / VENV.lstrip("/")
            for name in ("pip", "setuptools"):
                for found in venv.glob(f"lib/python3*/site-packages/{name}*"):
                    shutil.rmtree(found)
            for found in (venv / "bin").glob("pip*"):
                found.unlink()
            _run(["chroot", str(rootfs), f"{VENV}/bin/railyard", "--version"], env=env)
            _run(["chroot", str(rootfs), f"{VENV}/bin/railyard-cni", "--version"], env=env)
            shutil.rmtree(wheels)
            layer = _layer(rootfs, staging)
            shutil.rmtree(rootfs)
            write_archive(staging / "railyard.tar", image_name(), layer)
            (staging / "layer.tar").unlink()
            seconds = time.monotonic() - started
            (staging / "complete").write_text(f"{seconds:.0f} s\n")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
        _forget_older(cache, keep=out)
        size_mib = archive.stat().st_size / 2**20
        kubebox.say(f"image {image_name()} built in {seconds:.0f} s ({size_mib:.0f} MiB): "
                    f"{archive}")
    return archive


def _forget_older(cache: Path, keep: Path) -> None:
    """One image per source state piles up fast: keep the newest three."""
    images = sorted((p for p in cache.glob("railyard-image-*") if p.is_dir()
                     and not p.name.startswith("railyard-image-base-") and p != keep),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for old in images[2:]:
        with contextlib.suppress(OSError):
            shutil.rmtree(old)


def main() -> int:
    try:
        print(build_image())
    except kubebox.BoxError as error:
        print(f"hack/build-image: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
