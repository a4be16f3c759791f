"""The flags of signed records (decision 0087) refuse what cannot work, in one line and exit 2:
a key with a file mode (where every record is trusted), an unreadable key, and an agent that
would check the extender's signatures without a key of its own for its node's truth."""

from __future__ import annotations

import subprocess
import sys

import pytest


def railyard(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "railyard.cli.main", *argv],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("argv", "says"), [
    (["scheduler", "--cluster-file", "c.yaml", "--signing-key-file", "k"],
     "--signing-key-file needs the API"),
    (["scheduler", "--kubeconfig", "kc", "--signing-key-file", "{tmp}/missing"],
     "--signing-key-file {tmp}/missing: No such file"),
    (["agent", "--node-name", "a", "--pods-file", "p.json", "--signing-key-file", "k"],
     "need cluster mode"),
    (["agent", "--node-name", "a", "--kubeconfig", "kc", "--extender-public-key-file", "k"],
     "--extender-public-key-file needs --signing-key-file"),
])
def test_impossible_signing_flags_are_refused_naming_them(tmp_path, argv, says):
    done = railyard(*(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert done.returncode == 2, done.stderr
    assert says.replace("{tmp}", str(tmp_path)) in done.stderr
