"""The four limiters for a synchronous `redis.Redis` client, same scripts and rules.

from ratelimit.sync import SlidingWindowLimiter, connect_sync
limiter = SlidingWindowLimiter(connect_sync(), 1, 10)
limiter.check("api-key-123")
"""

from __future__ import annotations

from typing import Any

import redis.exceptions

from . import algorithms
from ._core import UNAVAILABLE, GcraOptions, LimiterBase
from .backends import bounded_client, connect_sync
from .decision import Decision

__all__ = [
    "FixedWindowLimiter",
    "SlidingWindowCounterLimiter",
    "SlidingWindowLimiter",
    "SyncLimiter",
    "TokenBucketLimiter",
    "connect_sync",
]


class SyncLimiter(LimiterBase):
    """Shared `check` for the synchronous limiters."""

    def _client_for_script(self, redis: Any) -> Any:
        return bounded_client(redis, self.timeout)

    def check(self, identity: str | bytes, cost: int = 1) -> Decision:
        """Admit or reject one request; see `ratelimit.limiters.AsyncLimiter.check`."""
        keys, args = self._prepare(identity, cost)
        try:
            reply = self._run(keys, args)
        except UNAVAILABLE as exc:
            return self._unavailable(exc)
        return self._decision(reply)

    def _run(self, keys: list[str], args: list[Any]) -> list[int]:
        try:
            return self._script(keys=keys, args=args)
        except redis.exceptions.ConnectionError:
            # As in the async limiter: one retry on a fresh connection.
            return self._script(keys=keys, args=args)


class SlidingWindowLimiter(SyncLimiter):
    """Sliding-window log: exact; one sorted-set member per admitted unit of cost."""

    algorithm = algorithms.SLIDING_LOG


class FixedWindowLimiter(SyncLimiter):
    """Fixed window: one counter per aligned window; up to 2x the limit at a boundary."""

    algorithm = algorithms.FIXED_WINDOW


class SlidingWindowCounterLimiter(SyncLimiter):
    """Sliding-window counter: the previous window weighted by overlap; O(1), approximate."""

    algorithm = algorithms.SLIDING_WINDOW_COUNTER


class TokenBucketLimiter(GcraOptions, SyncLimiter):
    """Token bucket as GCRA: `limit` per window sustained, `burst` at once (default limit)."""

    algorithm = algorithms.GCRA
