"""Atomic Redis rate limiters: sliding-window log, fixed window, sliding-window
counter and token bucket (GCRA), each one Lua script under `ratelimit/lua/`.

The classes here take a `redis.asyncio` client; `ratelimit.sync` has the same four
for a synchronous `redis.Redis`. `connect()` gives a client for `REDIS_URL`, or an
embedded fakeredis when none is set.
"""

from .backends import connect, connect_sync, is_embedded
from .decision import Decision
from .errors import RateLimiterUnavailable
from .limiters import (
    FixedWindowLimiter,
    SlidingWindowCounterLimiter,
    SlidingWindowLimiter,
    TokenBucketLimiter,
)


def __getattr__(name: str):
    # The replay needs numpy and pandas; load them only when it is used.
    if name in ("replay", "replay_async"):
        from . import simulation

        return getattr(simulation, name)
    raise AttributeError(f"module 'ratelimit' has no attribute {name!r}")


__all__ = [
    "Decision",
    "FixedWindowLimiter",
    "RateLimiterUnavailable",
    "SlidingWindowCounterLimiter",
    "SlidingWindowLimiter",
    "TokenBucketLimiter",
    "connect",
    "connect_sync",
    "is_embedded",
    "replay",
    "replay_async",
]
