"""write_atomic: the one write-temp-then-rename of the node side."""

from __future__ import annotations

import os
import stat

import pytest

from railyard.node.files import fsync_dir, write_atomic


def test_write_atomic_replaces_the_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "rec.json"
    target.write_bytes(b"old")
    write_atomic(target, b"new", fsync=True)
    fsync_dir(tmp_path)
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["rec.json"]


def test_write_atomic_mode_is_exact_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "info.json", b"{}", mode=0o644)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "info.json").stat().st_mode) == 0o644


def test_write_atomic_failure_keeps_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "sub"
    target.mkdir()
    (target / "x").write_bytes(b"")  # a non-empty folder cannot be renamed over
    with pytest.raises(OSError):
        write_atomic(target, b"body")
    assert sorted(os.listdir(tmp_path)) == ["sub"]
    assert target.is_dir()
