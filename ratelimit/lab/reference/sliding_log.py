"""Sliding-window log, as in lua/sliding_log.lua: one sorted list of unit stamps."""

from __future__ import annotations

from bisect import bisect_right

from ratelimit import clock as clocks
from ratelimit.algorithms import DEFAULT_LOG_STORAGE, LogStorage
from ratelimit.policy import LogPolicy, OnError
from ratelimit.rates import Rate

from .base import Outcome, ReferenceLimiter


class SlidingWindowLimiter(LogPolicy, ReferenceLimiter):
    """Exact: admits while the cost stamped in (at - window, at] stays within the limit,
    where `at` is the later of the request's time and the newest stamp, once stamps
    more than `clock_tolerance_ms` ahead of the request have moved back to that bound
    (the script bounds them by Redis's clock on the default clock). `storage` is
    accepted for parity with the Redis limiters; both storages decide like this."""

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
        storage: LogStorage = DEFAULT_LOG_STORAGE,
    ) -> None:
        self._use_storage(storage)
        super().__init__(
            window_seconds, limit, prefix, window_ms=window_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys, plain_keys=plain_keys,
            key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms,
        )  # fmt: skip


    def run(self, identity: bytes, times_ms: list[int], costs: list[int]) -> Outcome:
        window, limit = self.window_ms, self.limit
        # One stamp per admitted unit of cost, like the sorted set's members.
        stamps: list[int] = self.state.setdefault(identity, [])
        allowed, remaining, retry, reset = [], [], [], []
        skew = self.clock_tolerance_ms
        for now, cost in zip(times_ms, costs, strict=True):
            if skew is not None and stamps and stamps[-1] > now + skew:
                # Stamps beyond the bound (this check's time + skew) move back to it.
                first = bisect_right(stamps, now + skew)
                stamps[first:] = [now + skew] * (len(stamps) - first)
            # As in the script: decided and recorded at the later of the request's own
            # time and the newest stamp, so the stamps never run backwards.
            at = stamps[-1] if stamps and stamps[-1] > now else now
            edge = at - window
            start = bisect_right(stamps, edge) if stamps and stamps[0] <= edge else 0
            count = len(stamps) - start
            if count + cost > limit:
                # Rejected: nothing changes, not even a trim.
                allowed.append(False)
                remaining.append(max(limit - count, 0))
                retry.append(stamps[start + count + cost - limit - 1] + window - now)
                reset.append(stamps[-1] + window - now)
                continue
            if start:
                del stamps[:start]
            if cost == 1:
                stamps.append(at)
            else:
                stamps.extend([at] * cost)
            allowed.append(True)
            remaining.append(limit - count - cost)
            retry.append(0)
            reset.append(at + window - now)
        return allowed, remaining, retry, reset
