"""The client's QPS/burst token bucket and the reflector's backoff: pure rules, checked on a
given clock and a seeded random source."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railyard.kube.ratelimit import TokenBucket
from railyard.kube.reflector import Backoff


def test_a_burst_goes_at_once_then_requests_are_spaced_by_one_over_qps():
    bucket = TokenBucket(qps=10, burst=3)
    assert [bucket.reserve(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve(0.0) == pytest.approx(0.1)
    assert bucket.reserve(0.0) == pytest.approx(0.2)  # queued behind the one before


def test_an_idle_bucket_refills_only_up_to_its_burst():
    bucket = TokenBucket(qps=10, burst=2)
    bucket.reserve(0.0)
    bucket.reserve(0.0)
    assert bucket.reserve(100.0) == 0.0
    assert bucket.reserve(100.0) == 0.0
    assert bucket.reserve(100.0) == pytest.approx(0.1)


@pytest.mark.parametrize(("qps", "burst"), [(0, 1), (-1, 1), (1, 0)])
def test_a_bucket_without_rate_or_room_is_refused(qps, burst):
    with pytest.raises(ValueError):
        TokenBucket(qps=qps, burst=burst)


@given(qps=st.floats(0.5, 1000), burst=st.integers(1, 50),
       gaps=st.lists(st.floats(0, 2), min_size=1, max_size=200))
def test_no_more_requests_start_than_burst_plus_qps_times_elapsed(qps, burst, gaps):
    bucket = TokenBucket(qps=qps, burst=burst)
    now, starts = 0.0, []
    for gap in gaps:
        now += gap
        starts.append(now + bucket.reserve(now))
    # In order (up to rounding): each waits behind the ones queued before it.
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(starts))
    for i, start in enumerate(starts):
        assert i + 1 <= burst + qps * start + 1e-6


def test_backoff_grows_with_jitter_up_to_its_cap_and_resets():
    backoff = Backoff(initial_s=1, cap_s=8, factor=2, rng=random.Random(7))
    delays = [backoff.next() for _ in range(8)]
    ceilings = [1, 2, 4, 8, 8, 8, 8, 8]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == len(delays)  # jittered, not in step
    backoff.reset()
    assert backoff.next() <= 1
