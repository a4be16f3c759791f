"""`railyard agent` as a process: registers with a (fake) kubelet, stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from support.agent import GPU, PF, VF, async_test, make_tree, write_pods
from support.fake_kubelet import FakeKubelet

CMD = [sys.executable, "-m", "railyard.cli.main", "agent"]


@async_test
async def test_agent_process_registers_and_stops_on_sigterm(tmp_path):
    tree = make_tree(tmp_path / "root")
    kdir = Path(tempfile.mkdtemp(prefix="ry-"))
    kubelet = FakeKubelet(str(kdir))
    await kubelet.start()
    write_pods(tmp_path / "pods.json", [])
    proc = await asyncio.create_subprocess_exec(
        *CMD, "--node-name", "node-a", "--pods-file", str(tmp_path / "pods.json"),
        "--sysfs-root", str(tree), "--kubelet-dir", str(kdir),
        "--state-dir", str(tmp_path / "state"), stderr=subprocess.PIPE)
    try:
        for res in (GPU, VF, PF):
            await kubelet.wait_registered(res, timeout_s=20)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 10)
        assert proc.returncode == 0, err.decode()
        assert not os.path.exists(kdir / "device-plugins" / "railyard.dev_vf.sock")
    finally:
        if proc.returncode is None:
            proc.kill()
        await kubelet.stop()
        shutil.rmtree(kdir, ignore_errors=True)


def test_bad_config_is_one_line_and_exit_code_2(tmp_path):
    (tmp_path / "c.json").write_text('{"pools": {"vf": [{"vendors": ["zz"]}]}}')
    r = subprocess.run([*CMD, "--node-name", "n", "--pods-file", str(tmp_path / "p.json"),
                        "--config", str(tmp_path / "c.json"), "--state-dir",
                        str(tmp_path / "s")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"railyard: error: {tmp_path / 'c.json'}: pools.vf[0].vendors[0]: expected a 4-digit "
        "hex PCI id, got 'zz'"]


def test_not_a_sysfs_root_is_a_clear_error(tmp_path):
    r = subprocess.run([*CMD, "--node-name", "n", "--pods-file", str(tmp_path / "p.json"),
                        "--sysfs-root", str(tmp_path), "--state-dir", str(tmp_path / "s"),
                        "--kubelet-dir", str(tmp_path / "k")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"railyard: error: --sysfs-root {tmp_path}: not a sysfs tree: expected a folder holding "
        "sys/devices (such as / or a fixture's root) or the sys folder itself (holding devices/)"]
