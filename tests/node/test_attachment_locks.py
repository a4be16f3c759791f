"""The per-attachment lock of the CNI's node state: one holder at a time, a bounded wait, and
no lock file left behind an attachment that has no record, without ever letting two callers
hold it at once through the removed file and its successor."""

from __future__ import annotations

import threading
import time

import pytest

from railyard.node.attachments import AttachmentBusy, AttachmentRecord, AttachmentStore

KEY = ("rdma", "c1", "net1")


def record() -> AttachmentRecord:
    return AttachmentRecord(network="rdma", container_id="c1", ifname="net1",
                            netns="/run/netns/p", netns_id=(1, 2), pod_uid="u1",
                            pod_namespace="ns", pod_name="p")


def lock_file(store: AttachmentStore):
    return store.locks_dir / "attachments" / "rdma" / "c1:net1.lock"


def test_a_second_caller_waits_only_so_long_and_is_told_the_attachment_is_busy(tmp_path):
    store = AttachmentStore(tmp_path)
    with store.lock_attachment(*KEY, timeout_s=1):
        t0 = time.monotonic()
        with pytest.raises(AttachmentBusy, match=r"attachment \(c1, net1\) of network rdma is "
                                                 r"busy"), \
                store.lock_attachment(*KEY, timeout_s=0.2):
            pass
        assert 0.2 <= time.monotonic() - t0 < 2
    with store.lock_attachment("rdma", "c2", "net1", timeout_s=0):  # another attachment
        pass


def test_the_lock_file_goes_with_the_attachment_and_stays_while_it_has_a_record(tmp_path):
    store = AttachmentStore(tmp_path)
    with store.lock_attachment(*KEY, timeout_s=1):
        assert lock_file(store).exists()
    assert not lock_file(store).exists()  # never added: nothing left behind
    with store.lock_attachment(*KEY, timeout_s=1):
        store.save(record())
    assert lock_file(store).exists()
    with store.lock_attachment(*KEY, timeout_s=1):
        store.remove(record())
    assert not lock_file(store).exists()


def test_a_waiter_on_a_lock_file_its_holder_removed_locks_the_new_one(tmp_path):
    """Interleaving: A holds the lock; B opens the lock file and waits; A removes the file
    (no record) and lets go; B's flock succeeds on the removed file. B must lock the path
    again, so that C, who creates a new file of that name, cannot hold it beside B."""
    store = AttachmentStore(tmp_path)
    b_holds, b_done = threading.Event(), threading.Event()

    def b():
        with store.lock_attachment(*KEY, timeout_s=5):
            b_holds.set()
            assert b_done.wait(5)

    with store.lock_attachment(*KEY, timeout_s=1):
        waiter = threading.Thread(target=b)
        waiter.start()
        time.sleep(0.2)  # B has opened the file and polls its flock
    try:
        assert b_holds.wait(5)
        with pytest.raises(AttachmentBusy), store.lock_attachment(*KEY, timeout_s=0.2):
            pass  # C
    finally:
        b_done.set()
        waiter.join(5)
