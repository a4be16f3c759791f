"""`railyard --version`: the installed package's version, exit 0, before any command."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version


def test_version_prints_the_installed_package_version_and_exits_0():
    r = subprocess.run([sys.executable, "-m", "railyard.cli.main", "--version"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout == f"railyard {version('railyard')}\n"


def test_help_lists_version_and_commands_still_run():
    r = subprocess.run([sys.executable, "-m", "railyard.cli.main", "--help"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and "--version" in r.stdout and "simulate" in r.stdout
    r = subprocess.run([sys.executable, "-m", "railyard.cli.main", "discover", "--profile",
                        "generic"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and r.stdout.startswith("{")
