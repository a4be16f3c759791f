"""The one rule for a sysfs tree option: its root (holding sys/) or its sys/ folder, the same
tree either way; anything else a clear error that says what was expected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from railyard.discovery.discover import discover
from railyard.discovery.fixture import write_fixture
from railyard.discovery.profiles import profile
from railyard.discovery.sysfs import SysfsError, tree_root

RAILYARD = [sys.executable, "-m", "railyard"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    write_fixture(profile("hgx-h100-4nic"), root, 1)
    return root


def test_the_root_and_its_sys_folder_name_the_same_tree(tree: Path):
    assert tree_root(tree) == str(tree)
    assert tree_root(tree / "sys") == str(tree)
    assert tree_root(str(tree / "sys") + "/") == str(tree)
    assert discover(tree / "sys").topology == discover(tree).topology


@pytest.mark.parametrize("where", ["empty", "sys-without-devices", "devices-not-in-sys",
                                   "missing", "a-file"])
def test_neither_is_an_error_naming_what_was_expected(tmp_path: Path, where: str):
    given = tmp_path / where
    if where == "sys-without-devices":
        given = tmp_path / "sys"
        (given / "class").mkdir(parents=True)
    elif where == "devices-not-in-sys":
        (given / "devices").mkdir(parents=True)  # a devices/ folder, but not under a sys/
    elif where == "a-file":
        given.write_text("")
    elif where == "empty":
        given.mkdir()
    with pytest.raises(SysfsError) as raised:
        tree_root(given)
    assert raised.value.path == str(given)
    if where in ("missing", "a-file"):
        assert raised.value.reason == "no such folder"
    else:
        assert "sys/devices" in raised.value.reason and "sys folder itself" in raised.value.reason


@pytest.mark.parametrize("command", [["discover"], ["allocate", "--request", "gpus=1,vfs=1"]])
def test_every_sysfs_root_option_takes_either_form(tree: Path, tmp_path: Path, command):
    outputs = []
    for given in (tree, tree / "sys"):
        done = subprocess.run([*RAILYARD, *command, "--sysfs-root", str(given)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    bad = subprocess.run([*RAILYARD, *command, "--sysfs-root", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [
        f"railyard: error: --sysfs-root {tmp_path}: not a sysfs tree: expected a folder holding "
        "sys/devices (such as / or a fixture's root) or the sys folder itself (holding devices/)"]
