"""The state file: durable before acknowledged, replayed exactly, snapshots atomic."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

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


def test_a_deeply_nested_journal_line_is_a_state_file_error(tmp_path):
    path = tmp_path / "state"
    path.write_bytes(b'{"railyardSchedulerState":1}\n' + b"[" * 5000 + b"]" * 5000 + b"\n")
    with pytest.raises(StateFileError, match=":2: not valid JSON: nested too deeply"):
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


def test_a_write_the_kernel_takes_in_parts_is_finished(tmp_path, monkeypatch):
    path = tmp_path / "state"
    sf, _ = StateFile.open(path)
    real = os.write
    # A regular file may take fewer bytes than asked (a signal, a filling disk).
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data)[:100]))
    sf.compact()
    sf.bind_sync(bound("a", 0))
    sf.bind_sync(bound("b", 1))
    sf.close()
    assert read_state(path) == [bound("a", 0), bound("b", 1)]


def test_a_release_asked_while_the_binds_line_is_being_written_is_recorded_after_it(
        tmp_path, monkeypatch):
    # DELETE /pods/<uid> can reach the state file after a bind of the same pod has left the
    # queue for the write in progress: the release must follow it, not be skipped as "not
    # held", or the journal keeps a pod that memory has freed.
    path = tmp_path / "state"
    sf, _ = StateFile.open(path)
    sf.compact()
    writing, finish = threading.Event(), threading.Event()
    real = sf._append

    def slow_append(ops):
        writing.set()
        finish.wait(5)
        real(ops)

    monkeypatch.setattr(sf, "_append", slow_append)

    async def go() -> None:
        bind = asyncio.ensure_future(sf.bind(bound("a", 0)))
        await asyncio.to_thread(writing.wait, 5)  # the bind's batch is being written
        release = asyncio.ensure_future(sf.release("a"))
        await asyncio.sleep(0.05)
        finish.set()
        await asyncio.wait_for(asyncio.gather(bind, release), timeout=5)

    asyncio.run(go())
    sf.close()
    _header, bind_line, release_line = path.read_bytes().splitlines()
    assert bind_line.startswith(b'{"bind":') and release_line == b'{"release":"a"}'
    assert read_state(path) == []


# write(2) on a regular file may write fewer bytes than asked without failing: when the disk
# fills (ENOSPC) or the file-size limit is reached part-way, Linux returns the count written
# so far, and the next write fails with the reason. RLIMIT_FSIZE gives that short write
# deterministically, in a child process so that nothing else is limited.
_SHORT_WRITE = textwrap.dedent("""
    import asyncio, os, resource, signal, sys
    from support.allocations import allocation, vf
    from railyard.discovery.profiles import build_topology, profile
    from railyard.scheduler.cluster_file import BoundPod
    from railyard.scheduler.state_file import StateFile, StateFileError

    T = build_topology(profile("dgx-h100"), node="gpu-1")
    def bound(uid, gpu):
        return BoundPod("ml", "p-" + uid, uid, "gpu-1",
                        allocation(T, [(gpu, vf(T, 0, gpu))], decided_at=None))

    path, mode = sys.argv[1], sys.argv[2]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit: EFBIG, not death
    sf, _ = StateFile.open(path)
    sf.compact()
    sf.bind_sync(bound("a", 0))
    if mode == "append":
        limit = os.path.getsize(path) + 100  # room for part of the next line only
    else:  # snapshot: the journal holds a, b, c (~475 bytes a line); room for two and a half
        sf.bind_sync(bound("b", 1))
        sf.bind_sync(bound("c", 2))
        limit = 1200
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        if mode == "append":
            asyncio.run(sf.bind(bound("b", 1)))
        else:
            sf.compact()
        print("acknowledged")
    except StateFileError as e:
        print("refused", e)
    # the process ends here: what is on disk is what a restart sees
""")


def short_write(tmp_path: Path, mode: str) -> tuple[str, list[str]]:
    path = tmp_path / "state"
    tests = str(Path(__file__).resolve().parent.parent)  # the child imports `support` from it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (tests, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-c", _SHORT_WRITE, str(path), mode],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip(), [p.uid for p in read_state(path)]


def test_a_short_write_of_a_journal_line_is_refused_not_acknowledged(tmp_path):
    said, replayed = short_write(tmp_path, "append")
    assert said.startswith("refused") and "File too large" in said
    assert replayed == ["a"]  # the torn line of "b" is dropped; "a" is intact


def test_a_short_write_of_a_snapshot_never_replaces_the_journal(tmp_path):
    said, replayed = short_write(tmp_path, "snapshot")
    assert said.startswith("refused") and "cannot write a snapshot" in said
    assert replayed == ["a", "b", "c"]
    assert os.listdir(tmp_path) == ["state"]  # the partial snapshot is not left behind


def test_a_bind_without_devices_is_recorded_and_replayed(tmp_path):
    # A pod asking for no Railyard devices is still bound to one node: a restart must not
    # forget where, or a second bind to another node would be taken (issue 19, class 7).
    path = tmp_path / "state"
    sf, _ = StateFile.open(path)
    sf.compact()
    plain = BoundPod("ml", "p-plain", "plain", "gpu-1", None)
    asyncio.run(sf.bind(plain))
    sf.close()
    assert read_state(path) == [plain]
