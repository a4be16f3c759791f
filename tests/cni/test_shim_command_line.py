"""`railyard-cni` run by a person: --help and --version answer and exit 0, never a CNI error;
the runtime's way of calling it (no arguments, CNI_COMMAND set) is unchanged."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from pathlib import Path

import pytest

from railyard.cni.shim import SUPPORTED_VERSIONS

ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def run(shim: Path, *args: str, env: dict[str, str] | None = None,
        stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(shim), *args], input=stdin.decode(), env=env or ENV,
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_says_what_the_shim_is_and_what_it_reads_and_exits_0(shim: Path, flag: str):
    r = run(shim, flag)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith("usage: railyard-cni")
    for word in ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS",
                 "CNI_PATH", "agentSocket", "/run/railyard/cni.sock", "docs/cni.md",
                 "railyard cni install"):
        assert word in r.stdout, word
    assert not r.stdout.lstrip().startswith("{")  # not a CNI error document


def test_help_wins_even_with_cni_command_set(shim: Path):
    r = run(shim, "--help", env={**ENV, "CNI_COMMAND": "ADD"})
    assert r.returncode == 0 and r.stdout.startswith("usage: railyard-cni")


def test_version_names_the_package_version_and_the_cni_versions(shim: Path):
    from importlib.metadata import version

    r = run(shim, "--version")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout == f"railyard-cni {version('railyard')} (CNI {', '.join(SUPPORTED_VERSIONS)})\n"


def test_version_under_a_python_without_railyard_still_answers(tmp_path: Path):
    from railyard.cni.install import install_shim

    bare = "/usr/bin/python3"
    if not os.path.exists(bare):
        pytest.skip(f"needs a python3 outside this environment at {bare}")
    shim = install_shim(tmp_path, bare)
    r = run(shim, "--version")
    assert r.returncode == 0
    assert r.stdout.startswith("railyard-cni ") and "CNI 0.4.0" in r.stdout


def test_other_arguments_are_a_one_line_usage_error(shim: Path):
    r = run(shim, "ADD")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "railyard-cni --help" in r.stderr


def test_the_cni_version_verb_is_still_the_cni_answer(shim: Path):
    r = run(shim, env={**ENV, "CNI_COMMAND": "VERSION"}, stdin=b'{"cniVersion": "1.0.0"}')
    assert r.returncode == 0
    assert json.loads(r.stdout) == {"cniVersion": "1.0.0",
                                    "supportedVersions": list(SUPPORTED_VERSIONS)}


def test_without_cni_command_on_a_terminal_it_points_to_help_instead_of_waiting(shim: Path):
    # A person typing `railyard-cni` would otherwise wait on stdin for a config.
    parent, child = pty.openpty()
    try:
        p = subprocess.run([str(shim)], stdin=child, env=ENV, capture_output=True, text=True,
                           timeout=30, check=False)
    finally:
        os.close(child)
        os.close(parent)
    assert p.returncode == 2 and p.stdout == ""
    assert "CNI_COMMAND" in p.stderr and "--help" in p.stderr


def test_without_cni_command_from_a_pipe_it_is_still_a_cni_error(shim: Path, tmp_path: Path):
    conf = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni",
            "agentSocket": str(tmp_path / "nobody.sock")}
    r = run(shim, stdin=json.dumps(conf).encode())
    assert r.returncode == 1 and json.loads(r.stdout)["code"] == 11
