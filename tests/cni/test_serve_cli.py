"""`railyard cni serve` refuses paths that do not exist before it starts, and makes at most
the socket's own folder."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import railyard.cli.main  # noqa: F401  (registers every command)
from railyard.cli.app import app
from railyard.cni.service import CniServer, build_plugin
from support.cni import RecordingRdma


def serve(*args: str):
    return CliRunner().invoke(app, ["cni", "serve", *args])


def test_a_sysfs_root_that_does_not_exist_is_one_line_and_exit_2(tmp_path: Path):
    r = serve("--state-dir", str(tmp_path / "state"), "--sysfs-root", str(tmp_path / "nope"),
              "--socket", str(tmp_path / "cni.sock"))
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "--sysfs-root" in lines[0] and "nope" in lines[0]
    assert not (tmp_path / "cni.sock").exists()


def test_a_socket_whose_folder_has_no_parent_is_refused_and_nothing_is_made(tmp_path: Path):
    sock = tmp_path / "typo" / "deeper" / "cni.sock"
    (tmp_path / "sys" / "devices").mkdir(parents=True)
    r = serve("--state-dir", str(tmp_path / "state"), "--sysfs-root", str(tmp_path),
              "--socket", str(sock))
    assert r.exit_code == 2 and "--socket" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "typo").exists()


@pytest.fixture
def plugin(tmp_path: Path):
    p = build_plugin(str(tmp_path / "state"), sysfs_root=str(tmp_path),
                     device_info_dir=str(tmp_path / "devinfo"), rdma=RecordingRdma("shared"),
                     pod_resources_socket=None, node="n1")
    yield p
    p.close()


def test_the_server_makes_the_sockets_own_folder_only(tmp_path: Path, plugin):
    with pytest.raises(FileNotFoundError) as e:
        CniServer(str(tmp_path / "a" / "b" / "cni.sock"), plugin)
    assert e.value.errno == errno.ENOENT and not (tmp_path / "a").exists()
    server = CniServer(str(tmp_path / "run" / "cni.sock"), plugin)
    try:
        assert os.path.exists(tmp_path / "run" / "cni.sock")
        assert (os.stat(tmp_path / "run" / "cni.sock").st_mode & 0o777) == 0o600
    finally:
        server.server_close()
