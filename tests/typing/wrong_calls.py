"""Calls that `mypy --strict` must reject: each line ending in `# mypy: error` must be
reported, and no other line (tests/core/test_typing.py runs mypy on this file).

Never run: most of these lines raise at run time too (TypeError or ValueError).
"""

from __future__ import annotations

import redis
import redis.asyncio

import ratelimit
import ratelimit.sync
from ratelimit import Decision, Rate
from ratelimit.http import install, rate_limit

r = redis.asyncio.Redis()
s = redis.Redis()


async def constructors() -> None:
    ratelimit.SlidingWindowLimiter(r, "10/s")  # fine: a rate string
    ratelimit.SlidingWindowLimiter(r, 1, limit="ten")  # mypy: error
    ratelimit.SlidingWindowLimiter(r, "1s", limit=10, on_eror="allow")  # mypy: error
    ratelimit.SlidingWindowLimiter(r, "10/s", on_error="alow")  # mypy: error
    ratelimit.SlidingWindowLimiter(r, [10, 1])  # mypy: error
    ratelimit.SlidingWindowLimiter(r, 1.5, 10)  # mypy: error
    ratelimit.FixedWindowLimiter(r, window_ms=2.5, limit=10)  # mypy: error
    ratelimit.FixedWindowLimiter(r, 1, 10, prefix=5)  # mypy: error
    ratelimit.FixedWindowLimiter(r, 1, 10, timeout="1s")  # mypy: error
    ratelimit.FixedWindowLimiter(r, 1, 10, clock=42)  # mypy: error
    ratelimit.FixedWindowLimiter(r, 1, 10, key_secret="text, not bytes")  # mypy: error
    ratelimit.FixedWindowLimiter(r, 1, 10, readable_keys="yes")  # mypy: error
    ratelimit.FixedWindowLimiter(r, 1, 10, plain_keys="yes")  # mypy: error
    ratelimit.FixedWindowLimiter(r, 1, 10, near_cache="on")  # mypy: error
    ratelimit.SlidingWindowCounterLimiter(r, 1, 10, wait_replicas="1")  # mypy: error
    ratelimit.SlidingWindowLimiter(r, 1, 10, storage="sorted_set")  # mypy: error
    ratelimit.SlidingWindowLimiter(r, 1, 10, burst=5)  # mypy: error
    ratelimit.TokenBucketLimiter(r, 1, 10, storage="compact")  # mypy: error
    ratelimit.TokenBucketLimiter(r, 1, 10, burst="5")  # mypy: error
    ratelimit.TokenBucketLimiter(r, Rate("10", 1000))  # mypy: error
    ratelimit.sync.FixedWindowLimiter(s, 1, 10, auto_pipeline=False)  # mypy: error
    ratelimit.SlidingWindowLimiter(s, "10/s")  # mypy: error
    ratelimit.sync.SlidingWindowLimiter(r, "10/s")  # mypy: error
    ratelimit.TokenBucketLimiter()  # mypy: error


async def checks() -> None:
    limiter = ratelimit.SlidingWindowLimiter(r, "10/s")
    await limiter.check(identity=5)  # mypy: error
    await limiter.check("user", cost="2")  # mypy: error
    await limiter.check("user", weight=2)  # mypy: error
    await limiter.check_many(["a", "b"], costs="1")  # mypy: error
    await limiter.check_many("a", 1, 2)  # mypy: error
    forgot_await: Decision = limiter.check("user")  # mypy: error
    print(forgot_await)
    decision = await limiter.check("user")
    print(decision.retry_after_s)  # mypy: error
    decision.allowed = False  # mypy: error
    limiter.with_options(limt=3)  # mypy: error
    limiter.with_options(on_error="ignore")  # mypy: error
    limiter.with_options(storage="log")  # mypy: error
    rate_limit(object())  # mypy: error
    rate_limit(limiter, scope=7)  # mypy: error
    rate_limit(limiter, cost="2")  # mypy: error
    install(object())  # mypy: error


async def tiered() -> None:
    ratelimit.TieredLimiter(r, ["10/s", "1000/h"])  # fine
    ratelimit.TieredLimiter(r, 10)  # mypy: error
    ratelimit.TieredLimiter(r, ["10/s", 1000])  # mypy: error
    ratelimit.TieredLimiter(r, "10/s; 1000/h", algorithm="sliding")  # mypy: error
    ratelimit.TieredLimiter(r, "10/s; 1000/h", burst=5)  # mypy: error
    ratelimit.TieredLimiter(r, window_seconds=1, limit=10)  # mypy: error
    ratelimit.TieredLimiter(s, "10/s; 1000/h")  # mypy: error
    ratelimit.sync.TieredLimiter(s, "10/s", auto_pipeline=False)  # mypy: error
    limiter = ratelimit.TieredLimiter(r, "10/s; 1000/h")
    decision = await limiter.check("user")
    print(limiter.rates[decision.tier])  # mypy: error
    forgot_await: Decision = limiter.check("user")  # mypy: error
    print(forgot_await)


def sync_checks() -> None:
    limiter = ratelimit.sync.TokenBucketLimiter(s, 1, 10, burst=3)
    limiter.check(b"user", 1)  # fine
    limiter.check(["user"])  # mypy: error
    limiter.check_many([1, 2])  # mypy: error
    limiter.aclose()  # mypy: error
