"""Atomic Redis rate limiters: sliding-window log, fixed window, sliding-window
counter and token bucket (GCRA), each one Lua script under `ratelimit/lua/`.

The classes here take a `redis.asyncio` client; `ratelimit.sync` has the same four
for a synchronous `redis.Redis`. A limit is a rate string or a `Rate`
(`SlidingWindowLimiter(redis, "10/s")`, see `parse_rate`) or a window and a limit
(`SlidingWindowLimiter(redis, 1, 10)`). `ConcurrencyLimiter` bounds requests in flight
rather than a rate: each holds a lease until released (`ratelimit/lua/leases.lua`).
`TieredLimiter` puts several rates on one identity at once ("10/s" and "1000/h").
`connect()` gives a client for `REDIS_URL`, or an
embedded fakeredis when none is set. `ratelimit.http` puts a limiter on FastAPI routes.

This package is the library a service imports; it needs neither numpy, pandas nor
matplotlib. The lab that simulates and measures it lives in `ratelimit.lab` (the
`lab` extra), and the tooling for private servers in `ratelimit.devtools`.
"""

from .backends import connect, connect_sync, is_embedded
from .decision import Decision
from .doctor import Finding, Report, doctor
from .errors import RateLimiterUnavailable
from .limiters import (
    ConcurrencyLimiter,
    FixedWindowLimiter,
    SlidingWindowCounterLimiter,
    SlidingWindowLimiter,
    TieredLimiter,
    TokenBucketLimiter,
)
from .rates import Rate, parse_rate, parse_rates

__all__ = [
    "ConcurrencyLimiter",
    "Decision",
    "Finding",
    "FixedWindowLimiter",
    "Rate",
    "RateLimiterUnavailable",
    "Report",
    "SlidingWindowCounterLimiter",
    "SlidingWindowLimiter",
    "TieredLimiter",
    "TokenBucketLimiter",
    "connect",
    "connect_sync",
    "doctor",
    "is_embedded",
    "parse_rate",
    "parse_rates",
]
