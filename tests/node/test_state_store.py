"""The node-local state store: atomic, restart-proof, shared safely by two processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import railyard.node.state as state
from railyard.node.state import (
    PodKey,
    StateError,
    StateStore,
    record_from_json,
    record_to_json,
)
from support.allocations import allocation, h100, nearest_vf

POD = PodKey("0b6f3c1e-uid-1", "team", "trainer-0")


def paired_allocation(topo, gpus, decided_by="scheduler"):
    """GPU i paired with the first VF of its nearest PF."""
    return allocation(topo, [(i, nearest_vf(topo, i)) for i in gpus], decided_by=decided_by)


@pytest.fixture(scope="module")
def topo():
    return h100()


def test_put_then_get_returns_the_same_allocation_after_a_restart(tmp_path, topo):
    alloc = paired_allocation(topo, [0, 1])
    StateStore(tmp_path).put(POD, alloc)
    again = StateStore(tmp_path).get(POD.uid)  # a fresh object: as after an agent restart
    assert again is not None
    assert again.pod == POD
    assert again.allocation == alloc


def test_find_by_namespace_and_name(tmp_path, topo):
    s = StateStore(tmp_path)
    s.put(POD, paired_allocation(topo, [0]))
    assert s.find("team", "trainer-0").uid == POD.uid
    assert s.find("team", "other") is None


def test_granted_nics_are_in_pair_order_and_only_for_known_pods(tmp_path, topo):
    s = StateStore(tmp_path, node=topo.node)
    alloc = paired_allocation(topo, [3, 0, 5])
    s.put(POD, alloc)
    assert s.granted_nics(POD.uid) == tuple(p.nic for p in alloc.pairs)
    assert s.granted_nics("someone-else") == ()


def test_put_for_another_node_is_refused_and_writes_nothing(tmp_path, topo):
    s = StateStore(tmp_path, node="other-node")
    with pytest.raises(StateError, match="other-node"):
        s.put(POD, paired_allocation(topo, [0]))
    assert s.all() == []


def test_mark_consumed_records_per_container_and_resource(tmp_path, topo):
    s = StateStore(tmp_path)
    s.put(POD, paired_allocation(topo, [0, 1]))
    s.mark_consumed(POD.uid, "main", "railyard.dev/vf", ["a", "b"])
    s.mark_consumed(POD.uid, "main", "nvidia.com/gpu", ["g1"])
    s.mark_consumed(POD.uid, "main", "railyard.dev/vf", ["c"])  # replaces, not appends
    r = StateStore(tmp_path).get(POD.uid)
    assert r.consumed_ids("railyard.dev/vf") == ("c",)
    assert r.consumed_ids("nvidia.com/gpu") == ("g1",)
    assert r.is_consumed("main", "nvidia.com/gpu")
    assert not r.is_consumed("sidecar", "nvidia.com/gpu")


def test_replacing_the_allocation_keeps_consumed(tmp_path, topo):
    s = StateStore(tmp_path)
    s.put(POD, paired_allocation(topo, [0]))
    s.mark_consumed(POD.uid, "main", "railyard.dev/vf", ["x"])
    node_alloc = paired_allocation(topo, [1], decided_by="node")
    r = s.put(POD, node_alloc)
    assert r.allocation.decided_by == "node"
    assert r.consumed_ids("railyard.dev/vf") == ("x",)


def test_a_record_with_the_sections_older_versions_wrote_still_reads(tmp_path, topo):
    """Decision 0061: `sections` is gone; a file that still has it is read past it."""
    s = StateStore(tmp_path)
    s.put(POD, paired_allocation(topo, [0]))
    path = tmp_path / "pods" / f"{POD.uid}.json"
    doc = json.loads(path.read_text())
    doc["sections"] = {"cni": {"moved": [{"pci": "0000:18:00.2", "hostName": "ib0v0"}]}}
    path.write_text(json.dumps(doc))
    r = StateStore(tmp_path).get(POD.uid)
    assert r is not None and r.allocation == paired_allocation(topo, [0])
    s.mark_consumed(POD.uid, "main", "railyard.dev/vf", ["x"])
    assert "sections" not in json.loads(path.read_text())


def test_mark_consumed_of_unknown_pod_names_the_file(tmp_path):
    with pytest.raises(StateError, match="no record"):
        StateStore(tmp_path).mark_consumed("nope", "c", "r", [])


def test_remove_is_idempotent(tmp_path, topo):
    s = StateStore(tmp_path)
    s.put(POD, paired_allocation(topo, [0]))
    assert s.remove(POD.uid) is True
    assert s.remove(POD.uid) is False
    assert s.get(POD.uid) is None


@pytest.mark.parametrize("uid", ["", "../etc/passwd", ".hidden", "a/b", "x" * 300])
def test_unsafe_uids_are_refused(tmp_path, topo, uid):
    with pytest.raises(StateError, match="uid"):
        StateStore(tmp_path).put(PodKey(uid, "ns", "n"), paired_allocation(topo, [0]))


def test_a_corrupt_file_is_named_by_get_and_skipped_by_all(tmp_path, topo):
    s = StateStore(tmp_path)
    s.put(POD, paired_allocation(topo, [0]))
    (s.pods_dir / "broken.json").write_text("{not json")
    (s.pods_dir / "wrong.json").write_text(json.dumps({"version": 1, "pod": {}}))
    with pytest.raises(StateError, match=r"broken\.json"):
        s.get("broken")
    with pytest.raises(StateError, match=r"pod\.uid"):
        s.get("wrong")
    assert [r.uid for r in s.all()] == [POD.uid]


def test_a_leftover_temp_file_from_a_crash_is_ignored(tmp_path, topo):
    s = StateStore(tmp_path)
    s.put(POD, paired_allocation(topo, [0]))
    (s.pods_dir / f".{POD.uid}.json.999.tmp").write_text('{"half": ')
    assert [r.uid for r in s.all()] == [POD.uid]


def test_write_failure_leaves_the_old_record(tmp_path, topo, monkeypatch):
    s = StateStore(tmp_path)
    s.put(POD, paired_allocation(topo, [0]))

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(StateError, match="No space"):
        s.put(POD, paired_allocation(topo, [1]))
    monkeypatch.undo()
    assert s.get(POD.uid).allocation.pairs[0].gpu.index == 0
    assert not list(s.pods_dir.glob(".*.tmp"))


def _hammer(state_dir: str, container: str, n: int) -> None:
    s = StateStore(state_dir)
    for i in range(n):
        s.mark_consumed(POD.uid, container, f"res-{i}", [str(i)])


def test_two_processes_updating_one_pod_lose_no_update(tmp_path, topo):
    StateStore(tmp_path).put(POD, paired_allocation(topo, [0]))
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), c, 15)) for c in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(20)
        assert p.exitcode == 0
    r = StateStore(tmp_path).get(POD.uid)
    assert len(r.consumed) == 30


names = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=12)


@settings(max_examples=40, deadline=None)
@given(gpus=st.lists(st.integers(0, 7), unique=True, max_size=8),
       consumed=st.lists(st.tuples(names, names, st.lists(names, max_size=3)), max_size=4))
def test_record_codec_round_trips(gpus, consumed):
    from railyard.node.state import Consumed, PodRecord
    topo = h100()
    r = PodRecord(POD, paired_allocation(topo, gpus),
                  tuple(Consumed(c, res, tuple(ids)) for c, res, ids in consumed))
    assert record_from_json(json.loads(json.dumps(record_to_json(r)))) == r


def test_deferred_durability_is_visible_at_once_and_flushed_soon(tmp_path, topo, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    s = StateStore(tmp_path, durability="deferred")
    s.put(POD, paired_allocation(topo, [0]))
    assert StateStore(tmp_path).get(POD.uid) is not None  # another reader sees it now
    s.flush()
    assert len(synced) == 2  # the file and its folder
    s.close()


def test_a_write_by_another_store_is_seen_despite_the_cache(tmp_path, topo):
    a, b = StateStore(tmp_path), StateStore(tmp_path)
    a.put(POD, paired_allocation(topo, [0]))
    assert b.get(POD.uid).consumed == ()
    a.mark_consumed(POD.uid, "main", "railyard.dev/vf", ["x"])
    assert b.get(POD.uid).consumed_ids("railyard.dev/vf") == ("x",)
    a.remove(POD.uid)
    assert b.get(POD.uid) is None


def test_a_failed_fsync_is_retried_and_the_flusher_lives_on(tmp_path, topo, monkeypatch):
    """Interleaving: the first background pass meets EIO on the folder's fsync; the thread must
    keep the paths pending, try again after a pause, and go on syncing later writes."""
    calls = []
    real = state.fsync_dir

    def eio_once(folder):
        calls.append(folder)
        if len(calls) == 1:
            raise OSError(5, "Input/output error")
        real(folder)

    monkeypatch.setattr(state, "fsync_dir", eio_once)
    s = StateStore(tmp_path, durability="deferred")
    s.put(POD, paired_allocation(topo, [0]))
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    s.put(PodKey("uid-2", "team", "trainer-1"), paired_allocation(topo, [1]))
    while (s._flusher._pending or len(calls) < 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s._flusher._thread.is_alive()
    assert s._flusher._pending == set()  # both records synced, the first one on the retry
    s.close()  # no error left for the last pass to raise


def test_a_flush_that_fails_keeps_the_writes_pending_and_says_so(tmp_path, topo, monkeypatch):
    def enospc(folder):
        raise OSError(28, "No space left on device")

    s = StateStore(tmp_path, durability="deferred")
    monkeypatch.setattr(state, "fsync_dir", enospc)
    s.put(POD, paired_allocation(topo, [0]))
    assert s.flush() is False
    assert s._flusher._pending == {s.pods_dir / f"{POD.uid}.json"}
    monkeypatch.undo()
    assert s.flush() is True
    s.close()
