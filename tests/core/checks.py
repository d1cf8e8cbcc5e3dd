"""What the library's failure and cluster tests share: one check of either flavour (a
sync limiter's in a worker thread, so the test can act on the server meanwhile), timed,
and the check that a failure policy, and only it, decided."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable


async def check(limiter: Any, identity: Any, cost: Any = 1) -> Decision:
    """One check: awaited for an asyncio limiter, in a worker thread for a sync one."""
    if isinstance(limiter, ratelimit.sync.SyncLimiter):
        return await asyncio.to_thread(limiter.check, identity, cost)
    return await limiter.check(identity, cost=cost)


async def peek(limiter: Any, identity: Any, cost: Any = 1) -> Decision:
    """`peek`, the same way."""
    if isinstance(limiter, ratelimit.sync.SyncLimiter):
        return await asyncio.to_thread(limiter.peek, identity, cost)
    return await limiter.peek(identity, cost=cost)


async def reset(limiter: Any, identity: Any) -> bool:
    """`reset`, the same way."""
    if isinstance(limiter, ratelimit.sync.SyncLimiter):
        return await asyncio.to_thread(limiter.reset, identity)
    return await limiter.reset(identity)


async def check_many(limiter: Any, identities: list[str], costs: Any = 1) -> list[Decision]:
    """`check_many`, the same way."""
    if isinstance(limiter, ratelimit.sync.SyncLimiter):
        return await asyncio.to_thread(limiter.check_many, identities, costs)
    return await limiter.check_many(identities, costs)


async def timed_check(limiter: Any, identity: str) -> tuple[Decision | Exception, float]:
    """The outcome of one check (a Decision or RateLimiterUnavailable) and its duration."""
    start = time.monotonic()
    try:
        outcome: Decision | Exception = await check(limiter, identity)
    except RateLimiterUnavailable as exc:
        outcome = exc
    return outcome, time.monotonic() - start


def assert_policy(outcome: Decision | Exception, on_error: str, *causes: type) -> None:
    """The failure policy `on_error` was applied, and nothing else happened; under
    "raise", the error is chained from one of `causes` when any are given."""
    if on_error == "raise":
        assert isinstance(outcome, RateLimiterUnavailable), outcome
        if causes:
            assert isinstance(outcome.__cause__, causes), repr(outcome.__cause__)
        return
    assert isinstance(outcome, Decision) and outcome.degraded, outcome
    assert outcome.allowed == (on_error == "allow"), outcome
    if not outcome.allowed:
        assert outcome.retry_after >= 1, outcome
