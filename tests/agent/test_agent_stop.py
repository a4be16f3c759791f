"""Agent.stop: every part is stopped even when one of them fails to close; the first error is
raised afterwards (and each one logged)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from railyard.agent.agent import Agent, AgentOptions
from railyard.agent.config import AgentConfig
from railyard.kubelet.pods import PodsFile
from support.agent import NODE, async_test, make_tree, write_pods


@async_test
async def test_a_store_that_fails_to_close_still_lets_the_cni_service_stop(tmp_path):
    """Interleaving: the state store's last flush raises (an fsync EIO) in the middle of stop;
    the parts after it (the CNI service's socket and thread) must still be closed."""
    tree = make_tree(tmp_path / "root")
    kdir = Path(tempfile.mkdtemp(prefix="ry-"))
    write_pods(tmp_path / "pods.json", [])
    cfg = AgentConfig(devinfo_dir=str(tmp_path / "devinfo"))
    sock = tmp_path / "run" / "cni.sock"
    agent = Agent(AgentOptions(node_name=NODE, sysfs_root=str(tree), kubelet_dir=str(kdir),
                               state_dir=str(tmp_path / "state"), cni_socket=str(sock)),
                  PodsFile(tmp_path / "pods.json", cfg.resources), cfg)
    await agent.start()
    try:
        cni = agent._cni
        assert cni is not None and sock.exists()

        def broken_close():
            raise OSError(5, "Input/output error")

        agent.store.close = broken_close
        with pytest.raises(OSError, match="Input/output error"):
            await agent.stop()
        assert not sock.exists()
        assert not cni.thread.is_alive()
        assert not any(os.path.exists(ep.socket_path) for ep in agent.endpoints.values())
    finally:
        shutil.rmtree(kdir, ignore_errors=True)
