"""ADD into the host's own network namespace is refused, however CNI_NETNS names it.

A runtime (or whoever can make the CNI call) could name the namespace the CNI service itself
runs in — by `/run/netns/…` (the node's own file or a second bind mount of it), by
`/proc/<pid>/ns/net` of any host process, or by `/proc/self/ns/net` — and ADD used to "move"
the pod's VFs into it: renamed in place in the host, as if the host were the pod (issue 19,
class 3). The namespace is compared by identity (the nsfs inode of the opened file), so no
spelling of the path gets past; the answer is code 4 naming CNI_NETNS, and nothing changes.

Every "host" here is a throwaway namespace standing in for the node's (tests/support/cni.py);
the one variant that names the service's process namespace runs the plugin itself inside such
a namespace (standalone mode under `ip netns exec`), so the machine's own interfaces are never
within reach, even if the refusal regressed.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cni import Node, record_path, run_shim, sh, standalone_env, unique

pytestmark = pytest.mark.root


@contextlib.contextmanager
def bind_mount_of(netns_path: str) -> Iterator[str]:
    """A second name under /run/netns for the namespace at `netns_path` (a bind mount)."""
    alias = f"/run/netns/{unique()}"
    Path(alias).touch()
    try:
        sh("mount", "--bind", netns_path, alias)
        try:
            yield alias
        finally:
            sh("umount", alias, check=False)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(alias)


@contextlib.contextmanager
def process_in(netns: str) -> Iterator[int]:
    """A process living in the named namespace, for its /proc/<pid>/ns/net."""
    p = subprocess.Popen(["ip", "netns", "exec", netns, "sleep", "60"])
    want = _identity(f"/run/netns/{netns}")
    try:
        deadline = time.monotonic() + 5
        while _identity(f"/proc/{p.pid}/ns/net") != want:  # until `ip` has entered it
            assert time.monotonic() < deadline, "ip netns exec did not enter the namespace"
            time.sleep(0.005)
        yield p.pid
    finally:
        p.kill()
        p.wait()


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _refused(r, netns: str) -> None:
    assert r.code == 1 and r.error == 4, r.out
    assert "CNI_NETNS" in r.out["msg"] and netns in r.out["msg"], r.out
    assert "own network namespace" in r.out["msg"], r.out


def test_add_into_the_host_namespace_by_its_own_path_is_refused_and_changes_nothing(
        node: Node, shim, conf):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    before = node.snapshot()
    r = run_shim(shim, "ADD", conf(), container_id=pod.container_id, netns=node.host_path,
                 args=pod.args())
    _refused(r, node.host_path)
    assert node.snapshot() == before
    assert not record_path(node, pod).exists()


def test_add_into_a_second_bind_mount_of_the_host_namespace_is_refused(node: Node, shim, conf):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    before = node.snapshot()
    with bind_mount_of(node.host_path) as alias:
        r = run_shim(shim, "ADD", conf(), container_id=pod.container_id, netns=alias,
                     args=pod.args())
    _refused(r, alias)
    assert node.snapshot() == before
    assert not record_path(node, pod).exists()


def test_add_into_the_namespace_of_a_host_process_is_refused(node: Node, shim, conf):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    before = node.snapshot()
    with process_in(node.host) as pid:
        path = f"/proc/{pid}/ns/net"
        r = run_shim(shim, "ADD", conf(), container_id=pod.container_id, netns=path,
                     args=pod.args())
    _refused(r, path)
    assert node.snapshot() == before


@pytest.mark.parametrize("own", ["/proc/self/ns/net", "/proc/thread-self/ns/net"])
def test_add_into_the_plugins_own_process_namespace_is_refused(node: Node, shim, own):
    # Standalone mode, run inside the node's (throwaway) namespace with no
    # RAILYARD_CNI_HOST_NETNS: the plugin's host is its own process namespace, as the agent's
    # service's is on a real node.
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    before = node.snapshot()
    env = {**standalone_env(node), "CNI_COMMAND": "ADD", "CNI_CONTAINERID": pod.container_id,
           "CNI_NETNS": own, "CNI_IFNAME": "net1", "CNI_ARGS": pod.args(),
           "CNI_PATH": "/usr/lib/cni", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    del env["RAILYARD_CNI_HOST_NETNS"]
    conf = {"cniVersion": "1.0.0", "name": "rdma", "type": "railyard-cni", "standalone": True}
    p = subprocess.run(["ip", "netns", "exec", node.host, str(shim)],
                       input=json.dumps(conf).encode(), env=env, capture_output=True,
                       timeout=60)
    out = json.loads(p.stdout)
    assert p.returncode == 1 and out["code"] == 4, out
    assert own in out["msg"] and "own network namespace" in out["msg"], out
    assert node.snapshot() == before
    assert not record_path(node, pod).exists()


def test_a_pods_own_namespace_still_gets_its_vf(node: Node, shim, conf):
    (nic,) = node.vfs(1)
    pod = node.pod([nic])
    netdev = node.netdev_of(nic)
    r = run_shim(shim, "ADD", conf(), container_id=pod.container_id, netns=pod.netns_path,
                 args=pod.args())
    assert r.code == 0, r.out
    assert netdev not in node.snapshot()
