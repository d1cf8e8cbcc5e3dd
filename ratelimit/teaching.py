"""Deliberately broken code, kept for the notebooks and tests that show what goes wrong.

Nothing here is a rate limiter and nothing here is exported from `ratelimit`: use
`ratelimit.SlidingWindowLimiter` (or `ratelimit.sync.SlidingWindowLimiter`) to limit
anything. Chapter 4 (`notebooks/04_atomicity_and_failures.ipynb`) and
`tests/test_teaching.py` run the code below to show its two flaws next to the real thing.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["NonAtomicSlidingLog", "NonAtomicSlidingLogSync", "classic_member"]


def classic_member(now_ms: int, counter: int) -> str:
    """The classic recipe's sorted-set member, "<ms>:<counter>".

    Unique only within one process: two hosts whose counters happen to coincide write
    the same member in the same millisecond, and the second ZADD overwrites the first.
    """
    return f"{now_ms}:{counter}"


class _NonAtomicBase:
    def __init__(
        self,
        redis: Any,
        window_seconds: float,
        limit: int,
        *,
        prefix: str = "teaching:nonatomic",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.window_ms = round(window_seconds * 1000)
        self.limit = limit
        self.prefix = prefix
        self.clock = clock
        self.counter = 0  # this "host's" request counter, the classic member suffix
        self._lock = threading.Lock()  # only so that threads never reuse a counter value

    def key_for(self, identity: str) -> str:
        """The sorted set for `identity` (readable, unhashed: this is not the real thing)."""
        return f"{self.prefix}:{identity}"

    def _begin(self) -> tuple[int, str]:
        now = math.floor(self.clock() * 1000)
        with self._lock:
            self.counter += 1
            counter = self.counter
        return now, classic_member(now, counter)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(window_ms={self.window_ms}, limit={self.limit})"


class NonAtomicSlidingLog(_NonAtomicBase):
    """A sliding-window log done WRONG, on purpose. Never use it to limit anything.

    It is the classic recipe as four separate commands on an asyncio Redis client:

        ZREMRANGEBYSCORE key -inf now-window   # trim
        ZCARD key                              # count; reject if >= limit
        ZADD key now "<ms>:<counter>"          # add
        PEXPIRE key window

    Two things are wrong with it, and chapter 4 shows both:

    1. Not atomic. Between one request's ZCARD and its ZADD, other requests run their
       own ZCARD and see the same count; under concurrency all of them see "room left"
       and all get in. (Sequentially it decides correctly.)
    2. Members are "<ms>:<counter>" with a counter per process ("host"): two hosts
       whose counters coincide write the same member in the same millisecond, and the
       sorted set counts the two requests once.

    `ratelimit.SlidingWindowLimiter` runs the same steps as one Lua script (nothing
    can interleave) and lets the script pick members that are unique in the set.
    `check` returns a plain bool, not a `ratelimit.Decision`.
    """

    async def check(self, identity: str) -> bool:
        """Admit (True) or reject (False) one request, in four separate round trips."""
        now, member = self._begin()
        key = self.key_for(identity)
        await self.redis.zremrangebyscore(key, "-inf", now - self.window_ms)
        if await self.redis.zcard(key) >= self.limit:
            return False
        # Anything may have happened since ZCARD answered: this is the race.
        await self.redis.zadd(key, {member: now})
        await self.redis.pexpire(key, self.window_ms)
        return True


class NonAtomicSlidingLogSync(_NonAtomicBase):
    """`NonAtomicSlidingLog` for a synchronous `redis.Redis` client: the same four
    separate commands, the same two flaws; wrong on purpose, never use it."""

    def check(self, identity: str) -> bool:
        """Admit (True) or reject (False) one request, in four separate round trips."""
        now, member = self._begin()
        key = self.key_for(identity)
        self.redis.zremrangebyscore(key, "-inf", now - self.window_ms)
        if self.redis.zcard(key) >= self.limit:
            return False
        self.redis.zadd(key, {member: now})
        self.redis.pexpire(key, self.window_ms)
        return True
