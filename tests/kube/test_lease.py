"""Leader election's state machine (railyard.kube.lease, decision 0074) on a fake clock and an
in-memory Lease that enforces resourceVersions as the API server does."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from railyard.kube.client import ApiUnavailable
from railyard.kube.lease import Elector, LeaseConflict, LeaseRecord


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=self.t)


class MemoryLease:
    """One Lease with optimistic concurrency: a write must carry the version it read."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.down = False

    async def get(self) -> LeaseRecord | None:
        if self.down:
            raise ApiUnavailable("GET lease: connection refused")
        return self.record

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        if self.down:
            raise ApiUnavailable("POST lease: connection refused")
        if self.record is not None:
            raise LeaseConflict("already exists")
        return self._store(record)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        if self.down:
            raise ApiUnavailable("PUT lease: connection refused")
        if self.record is None or record.resource_version != self.record.resource_version:
            raise LeaseConflict("the object has been modified")
        return self._store(record)

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = replace(record, resource_version=str(self.version))
        return self.record


def elector(store: MemoryLease, clock: Clock, identity: str) -> Elector:
    return Elector(store, identity, lease_duration_s=15, renew_deadline_s=10,
                   retry_period_s=2, clock=clock, wall=clock.wall)


def step(e: Elector) -> bool:
    return asyncio.run(e.step())


def test_the_first_replica_creates_the_lease_and_the_second_follows():
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert step(a) and a.is_leader()
    assert not step(b) and not b.is_leader() and b.holder == "a"
    assert store.record is not None
    assert (store.record.holder, store.record.lease_duration_s, store.record.transitions) == (
        "a", 15, 0)
    assert store.record.acquire_time == store.record.renew_time == "2026-01-01T00:16:40.000000Z"


def test_renewing_keeps_the_acquire_time_and_moves_the_renew_time():
    store, clock = MemoryLease(), Clock()
    a = elector(store, clock, "a")
    step(a)
    acquired = store.record.acquire_time  # type: ignore[union-attr]
    clock.t += 2
    assert step(a)
    assert store.record.acquire_time == acquired  # type: ignore[union-attr]
    assert store.record.renew_time > acquired  # type: ignore[union-attr]
    assert store.record.transitions == 0  # type: ignore[union-attr]


def test_a_follower_takes_over_only_after_the_lease_duration_without_a_renewal():
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    step(a)
    step(b)  # b sees a's record now
    clock.t += 14.9
    assert not step(b)
    clock.t += 0.2  # 15.1 s since b last saw the record change: a is gone
    assert step(b) and b.is_leader()
    assert store.record.holder == "b" and store.record.transitions == 1  # type: ignore[union-attr]
    assert store.record.acquire_time == "2026-01-01T00:16:55.100000Z"  # type: ignore[union-attr]
    assert not a.is_leader()  # a has not renewed for over its renew deadline


def test_a_renewal_seen_by_the_follower_restarts_its_wait():
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    step(a)
    step(b)
    for _ in range(10):  # 20 s of a renewing every 2 s, b watching
        clock.t += 2
        assert step(a)
        assert not step(b)
    assert a.is_leader() and store.record.holder == "a"  # type: ignore[union-attr]


def test_the_leader_stops_leading_when_it_cannot_renew_within_the_deadline():
    store, clock = MemoryLease(), Clock()
    a = elector(store, clock, "a")
    changes: list[bool] = []
    a.on_change = changes.append
    step(a)
    store.down = True
    clock.t += 9.9
    assert step(a)  # still inside the renew deadline: the fence holds
    clock.t += 0.2
    assert not a.is_leader()  # the fence drops by the clock alone, before any step
    assert not step(a)
    assert changes == [True, False]


def test_the_fence_drops_before_a_follower_can_take_over():
    # renew deadline < lease duration: for every instant, at most one replica calls itself
    # leader, even when the leader's renewals silently stop.
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    step(a)
    step(b)
    while not b.is_leader():  # a's renewals stop (partitioned): only b steps
        clock.t += 0.5
        step(b)
        assert not (a.is_leader() and b.is_leader()), clock.t
    assert clock.t - 1000.0 <= 15.5


def test_two_replicas_racing_for_an_expired_lease_one_wins_by_resource_version():
    store, clock = MemoryLease(), Clock()
    a, b, c = (elector(store, clock, n) for n in "abc")
    step(a)
    step(b)
    step(c)
    clock.t += 16

    async def race() -> list[bool]:
        return list(await asyncio.gather(b.step(), c.step()))

    won = asyncio.run(race())
    assert sorted(won) == [False, True]
    assert store.record.transitions == 1  # type: ignore[union-attr]


def test_a_released_lease_is_taken_at_once():
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    step(a)
    step(b)
    asyncio.run(a.release())
    assert not a.is_leader() and store.record.holder == ""  # type: ignore[union-attr]
    clock.t += 0.1
    assert step(b)


def test_a_restarted_replica_with_the_same_identity_renews_its_own_lease():
    store, clock = MemoryLease(), Clock()
    step(elector(store, clock, "pod-0"))
    clock.t += 5
    again = elector(store, clock, "pod-0")
    assert step(again) and store.record.transitions == 0  # type: ignore[union-attr]


def test_timings_that_could_let_two_leaders_overlap_are_refused():
    with pytest.raises(ValueError, match="renew deadline < lease duration"):
        Elector(MemoryLease(), "a", lease_duration_s=10, renew_deadline_s=10)


def test_time_left_counts_down_to_the_renew_deadline_and_is_zero_for_a_follower():
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.time_left() == 0
    assert step(a) and not step(b)
    assert a.time_left() == 10 and b.time_left() == 0
    clock.t += 7.5
    assert a.time_left() == 2.5 and a.is_leader()
    clock.t += 2.5
    assert a.time_left() == 0 and not a.is_leader()
