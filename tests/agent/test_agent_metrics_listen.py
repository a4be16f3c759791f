"""`--metrics-listen`: the agent serves its registry (and its CNI service's) at /metrics;
without it, nothing listens. A bad HOST:PORT is one line and exit code 2."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

from railyard.agent.agent import Agent, AgentOptions
from railyard.agent.config import AgentConfig
from railyard.kubelet.pods import PodsFile
from support.agent import NODE, async_test, make_tree, write_pods

CMD = [sys.executable, "-m", "railyard.cli.main", "agent"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@async_test
async def test_metrics_are_served_with_the_device_gauges_and_the_cni_service(tmp_path):
    tree = make_tree(tmp_path / "root")
    kdir = Path(tempfile.mkdtemp(prefix="ry-"))
    write_pods(tmp_path / "pods.json", [])
    cfg = AgentConfig(devinfo_dir=str(tmp_path / "devinfo"))
    port = _free_port()
    agent = Agent(AgentOptions(node_name=NODE, sysfs_root=str(tree), kubelet_dir=str(kdir),
                               state_dir=str(tmp_path / "state"),
                               cni_socket=str(tmp_path / "run" / "cni.sock"),
                               metrics_listen=("127.0.0.1", port)),
                  PodsFile(tmp_path / "pods.json", cfg.resources), cfg)
    await agent.start()
    try:
        async with aiohttp.ClientSession() as s, \
                s.get(f"http://127.0.0.1:{port}/metrics") as r:
            assert r.status == 200 and r.content_type == "text/plain"
            text = await r.text()
    finally:
        await agent.stop()
        shutil.rmtree(kdir, ignore_errors=True)
    assert f'railyard_agent_devices{{kind="vf",node="{NODE}",state="free"}} 8.0' in text
    assert f'railyard_agent_devices{{kind="gpu",node="{NODE}",state="held"}} 0.0' in text
    for name in ("railyard_agent_admissions_total", "railyard_agent_kubelet_request_duration",
                 "railyard_agent_node_truth_corrections_total", "railyard_cni_requests_total",
                 "railyard_cni_request_duration_seconds"):
        assert f"# HELP {name.removesuffix('_total')}" in text, name
    with socket.socket() as probe:  # stopped: the port is free again
        probe.bind(("127.0.0.1", port))


def test_a_bad_metrics_listen_is_one_line_and_exit_code_2(tmp_path):
    r = subprocess.run([*CMD, "--node-name", "n", "--pods-file", str(tmp_path / "p.json"),
                        "--metrics-listen", "localhost"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "railyard: error: --metrics-listen 'localhost': expected HOST:PORT with a port "
        "0..65535"]
