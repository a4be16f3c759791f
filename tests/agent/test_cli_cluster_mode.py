"""`railyard agent` in cluster mode, where no API server is needed to tell: one pods source at
a time, and a pods source that cannot be read stops the start with one clear line (the box
tests run the rest against a real kube-apiserver: tests/box/test_agent_api.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from support.agent import make_tree

CMD = [sys.executable, "-m", "railyard.cli.main", "agent"]


def _kubeconfig(tmp_path, server: str):
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server,
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_pods_file_and_kubeconfig_together_are_refused(tmp_path):
    r = subprocess.run([*CMD, "--node-name", "n", "--pods-file", str(tmp_path / "p.json"),
                        "--kubeconfig", str(_kubeconfig(tmp_path, "https://127.0.0.1:1"))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--pods-file and --kubeconfig" in r.stderr


def test_no_pods_source_outside_a_cluster_says_what_to_give(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    r = subprocess.run([*CMD, "--node-name", "n"], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 2, r.stderr
    assert "not in a cluster" in r.stderr and "--kubeconfig" in r.stderr
    assert "Traceback" not in r.stderr


def test_an_unreachable_api_server_stops_the_start_with_one_line(tmp_path):
    tree = make_tree(tmp_path / "root")
    r = subprocess.run([*CMD, "--node-name", "n",
                        "--kubeconfig", str(_kubeconfig(tmp_path, "https://127.0.0.1:1")),
                        "--sysfs-root", str(tree), "--kubelet-dir", str(tmp_path / "k"),
                        "--state-dir", str(tmp_path / "state")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("railyard: error: cannot read this node's pods: pods of node "
                                "n from https://127.0.0.1:1"), r.stderr
    assert "Traceback" not in r.stderr and "Unclosed" not in r.stderr
    assert not (tmp_path / "k" / "device-plugins").exists()


def test_a_client_rate_limit_below_one_request_is_refused(tmp_path):
    r = subprocess.run([*CMD, "--node-name", "n", "--kube-qps", "0",
                        "--kubeconfig", str(_kubeconfig(tmp_path, "https://127.0.0.1:1"))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--kube-qps must be above 0" in r.stderr
