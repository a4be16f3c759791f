"""The agent starts the CNI service in-process over its own state store when asked."""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace

from support.agent import async_test, rig


@async_test
async def test_cni_socket_is_served_while_the_agent_runs(tmp_path, generic_tree):
    # A short folder of its own (a socket path has at most 107 bytes), gone after the test.
    with tempfile.TemporaryDirectory(prefix="ry-cni-") as short:
        await _served(tmp_path, generic_tree, os.path.join(short, "cni.sock"))


async def _served(tmp_path, generic_tree, sock: str) -> None:
    async with rig(tmp_path, generic_tree) as r:
        assert r.agent._cni is None  # not asked: not started
        r.agent.options = replace(r.agent.options, cni_socket=sock)
        await r.agent._start_cni()
        assert os.path.exists(sock)
        plugin = getattr(getattr(r.agent._cni, "server", None), "plugin", None)
        assert plugin is not None  # the running service holds the plugin over our store
        # Name-only CNI calls must see which pods are gone: the agent hands over its pod list.
        assert plugin.grants.pods is r.agent.pods
    assert not os.path.exists(sock)
