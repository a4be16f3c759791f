"""Client-side QPS/burst for the API server, as client-go's `--kube-api-qps/--kube-api-burst`:
a token bucket that holds `burst` tokens and refills at `qps` per second.

`TokenBucket.reserve(now)` is the pure rule (how long this request must wait; the token is
taken either way, so waiters queue in order); `RateLimit.wait()` sleeps that long. Watches
take one token when they start, not per event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    qps: float
    burst: int
    tokens: float = -1.0  # -1: full at the first reserve
    at: float | None = None

    def __post_init__(self) -> None:
        if self.qps <= 0 or self.burst < 1:
            raise ValueError(f"QPS must be > 0 and burst ≥ 1, got {self.qps} and {self.burst}")

    def reserve(self, now: float) -> float:
        """Take one token; return how many seconds to wait before using it (0: now). The
        bucket may go negative: each later caller waits behind the ones already queued."""
        if self.at is None:
            self.tokens, self.at = float(self.burst), now
        elif now > self.at:
            self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.qps)
            self.at = now
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.qps


class RateLimit:
    """The token bucket on the event loop's clock."""

    def __init__(self, qps: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.bucket = TokenBucket(qps, burst)
        self._clock = clock

    async def wait(self) -> None:
        delay = self.bucket.reserve(self._clock())
        if delay > 0:
            await asyncio.sleep(delay)
