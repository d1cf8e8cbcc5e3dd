"""Token bucket as GCRA, as in lua/gcra.lua: the theoretical arrival time (TAT)."""

from __future__ import annotations

import math

from ratelimit import algorithms
from ratelimit import clock as clocks
from ratelimit.policy import GcraPolicy, OnError
from ratelimit.rates import Rate

from .base import Outcome, ReferenceLimiter

# As in the script: times within a microsecond count as equal (float rounding at
# ~1e12 ms must not make an on-time request early).
EPSILON = 0.001


class TokenBucketLimiter(GcraPolicy, ReferenceLimiter):
    """`limit` per window sustained, `burst` at once; state is one float per identity."""

    algorithm = algorithms.GCRA

    def __init__(
        self,
        window_seconds: int | str | Rate | None = None,
        limit: int | None = None,
        prefix: str = "rl",
        *,
        window_ms: int | None = None,
        clock: clocks.Clock = clocks.DEFAULT,
        on_error: OnError = "raise",
        timeout: float = 1.0,
        readable_keys: bool = False,
        plain_keys: bool = False,
        key_secret: bytes | None = None,
        ttl_slack_ms: int | None = None,
        clock_tolerance_ms: int | None = None,
        burst: int | None = None,
    ) -> None:
        self._use_burst(burst)
        super().__init__(
            window_seconds, limit, prefix, window_ms=window_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys, plain_keys=plain_keys,
            key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms,
        )  # fmt: skip

    def run(self, identity: bytes, times_ms: list[int], costs: list[int]) -> Outcome:
        interval = self.window_ms / self.limit
        tolerance = interval * self.burst
        stored: float | None = self.state.get(identity)
        allowed, remaining, retry, reset = [], [], [], []
        for now, cost in zip(times_ms, costs, strict=True):
            tat = now if stored is None or stored < now else stored
            if self.clock_tolerance_ms is not None:
                # A TAT no check at the bound (this check's time + skew) could leave
                # moves back to the latest such a check could.
                bound = now + self.clock_tolerance_ms
                if tat > bound + tolerance:
                    tat = stored = max(bound + tolerance, now)
            new_tat = tat + interval * cost
            allow_at = new_tat - tolerance
            if allow_at - now > EPSILON:
                allowed.append(False)
                remaining.append(max(math.floor((now - (tat - tolerance) + EPSILON) / interval), 0))
                retry.append(math.ceil(allow_at - now - EPSILON))
                reset.append(math.ceil(tat - now))
                continue
            stored = new_tat
            allowed.append(True)
            remaining.append(math.floor((now - allow_at + EPSILON) / interval))
            retry.append(0)
            reset.append(math.ceil(new_tat - now))
        if stored is not None:
            self.state[identity] = stored
        return allowed, remaining, retry, reset
