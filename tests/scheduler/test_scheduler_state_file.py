"""The state file: durable before acknowledged, replayed exactly, snapshots atomic."""

from __future__ import annotations

import asyncio
import os

import pytest
from scheduler_helpers import hand_allocation

from railyard.discovery.profiles import build_topology, profile
from railyard.scheduler import state_file
from railyard.scheduler.cluster_file import BoundPod
from railyard.scheduler.state_file import StateFile, StateFileError, read_state

T = build_topology(profile("dgx-h100"), node="gpu-1")


def bound(uid: str, gpu: int = 0) -> BoundPod:
    return BoundPod("ml", f"p-{uid}", uid, "gpu-1", hand_allocation(T, [(gpu, 0, gpu)]))


def test_binds_and_releases_replay_to_the_live_pods(tmp_path):
    path = tmp_path / "state"
    sf, pods = StateFile.open(path)
    assert pods == [] and not path.exists()
    sf.compact()
    sf.bind_sync(bound("a", 0))
    sf.bind_sync(bound("b", 1))
    sf.release_sync("a")
    sf.bind_sync(bound("c", 2))
    sf.close()
    assert read_state(path) == [bound("b", 1), bound("c", 2)]


def test_a_new_state_file_starts_from_the_seed_and_an_existing_one_ignores_it(tmp_path):
    path = tmp_path / "state"
    sf, pods = StateFile.open(path, seed=[bound("a")])
    assert pods == [bound("a")]
    sf.compact()
    sf.close()
    _, pods = StateFile.open(path, seed=[bound("zzz")])
    assert pods == [bound("a")]


def test_a_torn_last_line_is_dropped_and_the_rest_kept(tmp_path):
    path = tmp_path / "state"
    sf, _ = StateFile.open(path)
    sf.bind_sync(bound("a", 0))
    sf.close()
    with open(path, "ab") as f:
        f.write(b'{"bind": {"namespace": "ml", "na')
    assert read_state(path) == [bound("a", 0)]


def test_a_corrupt_line_in_the_middle_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "state"
    sf, _ = StateFile.open(path)
    sf.bind_sync(bound("a", 0))
    sf.close()
    with open(path, "ab") as f:
        f.write(b'{"nonsense": 1}\n')
    with pytest.raises(StateFileError, match=r"state:3: expected"):
        read_state(path)
    path.write_bytes(b'{"something": "else"}\n')
    with pytest.raises(StateFileError, match=r"state:1: expected the header"):
        read_state(path)


def test_journal_is_compacted_to_a_snapshot_without_leftovers(tmp_path, monkeypatch):
    monkeypatch.setattr(state_file, "_SLACK_LINES", 50)
    path = tmp_path / "state"
    sf, _ = StateFile.open(path)
    sf.compact()
    for i in range(70):  # 140 lines > the slack: at least one snapshot
        sf.bind_sync(bound(f"u{i}", i % 8))
        sf.release_sync(f"u{i}")
    sf.bind_sync(bound("keep", 3))
    assert sf.compactions >= 2
    sf.close()
    assert read_state(path) == [bound("keep", 3)]
    assert len(path.read_bytes().splitlines()) < 70
    assert os.listdir(tmp_path) == ["state"]  # no temp file left behind


def test_concurrent_binds_share_fsyncs_and_all_are_durable(tmp_path, monkeypatch):
    path = tmp_path / "state"
    sf, _ = StateFile.open(path)
    sf.compact()
    fsyncs = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real(fd)))

    async def many() -> None:
        await asyncio.gather(*(sf.bind(bound(f"u{i}", i % 8)) for i in range(200)))

    asyncio.run(many())
    sf.close()
    assert len(read_state(path)) == 200
    assert len(fsyncs) < 200  # group commit: one fsync acknowledges a batch


def test_failed_append_raises_and_the_next_write_rewrites_from_what_was_acknowledged(
        tmp_path, monkeypatch):
    path = tmp_path / "state"
    sf, _ = StateFile.open(path)
    sf.compact()
    sf.bind_sync(bound("a", 0))
    real_fsync = os.fsync

    def failing(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(StateFileError, match="No space left"):
        asyncio.run(sf.bind(bound("b", 1)))
    monkeypatch.setattr(os, "fsync", real_fsync)
    sf.bind_sync(bound("c", 2))
    sf.close()
    # "b" may have reached the page cache before fsync failed; the rewrite drops it.
    assert read_state(path) == [bound("a", 0), bound("c", 2)]


def test_release_of_an_unknown_uid_writes_nothing(tmp_path):
    path = tmp_path / "state"
    sf, _ = StateFile.open(path)
    sf.compact()
    before = path.read_bytes()
    asyncio.run(sf.release("nobody"))
    sf.close()
    assert path.read_bytes() == before


def test_an_over_long_integer_in_the_journal_is_a_state_file_error(tmp_path):
    path = tmp_path / "state"
    path.write_bytes(b'{"railyardSchedulerState":1}\n{"release": ' + b"1" * 5000 + b"}\n")
    with pytest.raises(StateFileError, match=":2: not valid JSON"):
        read_state(path)


def test_an_unexpected_error_while_writing_fails_the_waiting_binds_instead_of_hanging(
        tmp_path, monkeypatch):
    sf, _ = StateFile.open(tmp_path / "state")
    sf.compact()

    def broken(ops):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(sf, "_append", broken)

    async def go() -> None:
        with pytest.raises(RuntimeError, match="disk on fire"):
            await asyncio.wait_for(sf.bind(bound("a")), timeout=5)
        monkeypatch.undo()
        await asyncio.wait_for(sf.bind(bound("b")), timeout=5)  # the writer still works

    asyncio.run(go())
    assert [p.uid for p in read_state(tmp_path / "state")] == ["b"]
    sf.close()
