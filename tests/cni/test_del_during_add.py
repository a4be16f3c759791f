"""A DEL (or the runtime's removal of the namespace) while an ADD of the same attachment is
still running: a runtime gives up on a slow ADD (the grant lookup may wait on kubelet, the
device locks on another call) and sends DEL. Calls of one attachment serialise on its lock;
an ADD whose namespace is gone by the time it would move anything moves nothing."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from support.cni import Node, add, delete, links, netns_del, record_path

pytestmark = pytest.mark.root


class HeldGrants:
    """The service's grants, with each lookup held until `go_on` is set (as a lookup waiting
    on kubelet's PodResources would be)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.in_grant, self.go_on = threading.Event(), threading.Event()

    def grant(self, args):
        self.in_grant.set()
        assert self.go_on.wait(20)
        return self.inner.grant(args)


def in_thread(fn, *args, **kw):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args, **kw)))
    t.start()
    return t, out


@pytest.fixture
def held(service) -> HeldGrants:
    plugin = service.server.plugin
    plugin.grants = HeldGrants(plugin.grants)
    return plugin.grants


def attachment_lock_files(node: Node) -> list:
    return sorted((node.state_dir / "cni" / "locks" / "attachments").rglob("*.lock"))


def test_a_del_sent_while_the_add_waits_for_its_grant_waits_and_then_undoes_the_add(
        node: Node, shim, conf, service, held):
    """Interleaving: ADD opens the netns and waits in its grant lookup; DEL of the same
    attachment arrives. DEL must not answer "never added" while ADD then moves the VF: it
    waits for the ADD to finish and puts the VF back."""
    (nic,) = node.vfs(1)
    before = node.snapshot()
    pod = node.pod([nic])
    adding, added = in_thread(add, shim, pod, conf())
    assert held.in_grant.wait(20)
    deleting, deleted = in_thread(delete, shim, pod, conf())
    time.sleep(0.5)
    assert deleting.is_alive(), f"DEL answered while the ADD was running: {deleted}"
    held.go_on.set()
    adding.join(30)
    deleting.join(30)
    assert added[0].code == 0, added[0].out
    assert deleted[0].code == 0, deleted[0].out
    assert links(pod.netns) == {}
    assert node.snapshot() == before
    assert not record_path(node, pod).exists()
    assert service.server.plugin.store.in_use_notes() == []
    assert attachment_lock_files(node) == []


def test_a_del_waits_for_a_running_add_only_so_long_then_says_try_again(
        node: Node, shim, conf, service, held):
    (nic,) = node.vfs(1)
    before = node.snapshot()
    pod = node.pod([nic])
    plugin = service.server.plugin
    plugin.settings = replace(plugin.settings, attachment_lock_timeout_s=0.3)
    adding, added = in_thread(add, shim, pod, conf())
    assert held.in_grant.wait(20)
    r = delete(shim, pod, conf())
    assert r.error == 11 and "busy" in r.out["msg"], r.out
    held.go_on.set()
    adding.join(30)
    assert added[0].code == 0, added[0].out
    r = delete(shim, pod, conf())  # the runtime's retry
    assert r.code == 0, r.out
    assert node.snapshot() == before


def test_an_add_whose_namespace_the_runtime_removed_meanwhile_moves_nothing(
        node: Node, shim, conf, service, held):
    """Interleaving: ADD opens the netns and waits in its grant lookup; the runtime gives up
    and removes the namespace (its path no longer names it; only ADD's handle keeps it
    alive). ADD must fail before its record, moving nothing: a VF moved there would come back
    to the host under the pod's name when the handle closes."""
    (nic,) = node.vfs(1)
    before = node.snapshot()
    pod = node.pod([nic])
    adding, added = in_thread(add, shim, pod, conf())
    assert held.in_grant.wait(20)
    netns_del(pod.netns)
    held.go_on.set()
    adding.join(30)
    r = added[0]
    assert r.error == 3 and "no longer names" in r.out["msg"], r.out
    assert node.snapshot() == before
    assert not record_path(node, pod).exists()
    assert service.server.plugin.store.in_use_notes() == []
