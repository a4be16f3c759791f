"""`railyard scheduler` as an operator runs it: a cluster file, a state file, a restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from scheduler_helpers import args, pod

from railyard.cli.scheduler import parse_listen

SRC = str(Path(__file__).resolve().parents[2] / "src")


def railyard(*argv: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "railyard.cli.main", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as r:
        return json.loads(r.read())


def wait_up(url: str, proc: subprocess.Popen) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise AssertionError(proc.communicate()[1])
        try:
            urllib.request.urlopen(f"{url}/healthz", timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("extender did not start")


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return err


def test_bound_pods_survive_a_restart_through_the_state_file(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"nodes": [
        {"name": "gpu-a", "profile": "dgx-h100"}, {"name": "gpu-b", "profile": "dgx-a100"}]}))
    state = tmp_path / "state.jsonl"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ("scheduler", "--listen", f"127.0.0.1:{port}", "--cluster-file", str(cluster),
            "--state-file", str(state))
    proc = railyard(*argv)
    try:
        wait_up(url, proc)
        fits = call(f"{url}/filter", args(pod("u1", gpus=4, vfs=4), ["gpu-a", "gpu-b"]))
        assert fits["NodeNames"] == ["gpu-a"]  # the dgx-h100 ranks first: PIX pairs
        assert call(f"{url}/bind", {"PodName": "pod-u1", "PodNamespace": "default",
                                    "PodUID": "u1", "Node": "gpu-a"}) == {"Error": ""}
        before = call(f"{url}/allocations")
    finally:
        err = stop(proc)
    assert "extender listening" in err
    proc = railyard(*argv)
    try:
        wait_up(url, proc)
        assert call(f"{url}/allocations") == before
        assert before["pods"][0]["uid"] == "u1"
    finally:
        stop(proc)


@pytest.mark.parametrize("content, message", [
    ("nodes: [{name: a, profile: nonesuch}]", "nodes[0].profile: unknown profile"),
    ("nodes: [\n", "neither JSON nor YAML"),
])
def test_bad_cluster_file_is_one_line_on_stderr_and_exit_2(tmp_path, content, message):
    f = tmp_path / "c.yaml"
    f.write_text(content)
    proc = railyard("scheduler", "--listen", "127.0.0.1:0", "--cluster-file", str(f))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert err.startswith("railyard: error: ") and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["--state-file", "s.json"], "--state-file needs --cluster-file"),
    (["--cluster-file", "c.yaml", "--kubeconfig", "k"], "not both"),
    (["--kubeconfig", "/nonexistent/kubeconfig"], "/nonexistent/kubeconfig"),
    ([], "not in a cluster"),
    (["--leader-elect-renew-deadline", "20"], "--leader-elect-renew-deadline < "
                                              "--leader-elect-lease-duration"),
    (["--admin-token-file", "t"], "--admin-token-file needs --cluster-file"),
    (["--client-ca-file", "ca.pem"], "--client-ca-file needs --tls-cert-file"),
    (["--tls-cert-file", "c.pem"], "--tls-cert-file and --tls-key-file together"),
    (["--tls-cert-file", "c.pem", "--tls-key-file", "k.pem"], "--tls-cert-file c.pem"),
    (["--kube-connections", "0"], "--kube-connections"),
])
def test_cluster_mode_mistakes_are_one_line_on_stderr_and_exit_2(tmp_path, argv, message):
    env_out = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")}
    env = {**env_out, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "railyard.cli.main", "scheduler", "--listen",
                           "127.0.0.1:0", *argv], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("railyard: error: ") and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_listen_addresses():
    assert parse_listen("127.0.0.1:8888") == ("127.0.0.1", 8888)
    assert parse_listen(":9000") == ("0.0.0.0", 9000)
    assert parse_listen("[::1]:80") == ("::1", 80)
    for bad in ("8888", "host:", "host:99999", "host:x"):
        with pytest.raises(ValueError, match="expected HOST:PORT"):
            parse_listen(bad)


def test_example_scheduler_config_consults_railyard_for_its_three_resources():
    doc = yaml.safe_load((Path(SRC).parent / "deploy" / "kube-scheduler-config.yaml").read_text())
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    (ext,) = doc["extenders"]
    assert ext["nodeCacheCapable"] is True and ext["bindVerb"] == "bind"
    assert {(r["name"], r["ignoredByScheduler"]) for r in ext["managedResources"]} == {
        ("railyard.dev/vf", True), ("railyard.dev/pf", True), ("nvidia.com/gpu", False)}
