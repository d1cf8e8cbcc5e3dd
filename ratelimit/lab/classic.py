"""The classic sliding-log recipe, wrong on purpose: the yardstick ours is measured by.

Never use it to limit anything: use `ratelimit.SlidingWindowLimiter`. It is the recipe
blog posts and snippets write, a sorted set per client with members "<ms>:<suffix>",
kept here so that chapter 4 can show its flaws and `make bench` can time it:

    recipe = ClassicSlidingLog(redis, 1, 10)    # 10 per second, like the real limiter
    await recipe.check("alice")                 # trim, count, add, expire: 4 round trips
    recipe.check_sync("alice")                  # the same for a synchronous client
    await recipe.check_transaction("alice")     # one MULTI/EXEC, as the snippets send it
    ClassicTransactionLog(redis, 1, 10)         # the same, with MULTI/EXEC as its `check`

Its flaws, each shown by chapter 4 and the tests:

1. `check` is not atomic. Between one request's ZCARD and its ZADD, others run their own
   ZCARD and see the same count: under concurrency they all see room and all get in.
2. `check_transaction` is atomic, but it adds the request before counting it, so a
   rejected request is recorded too and rejections eat the budget: a client that keeps
   sending faster than the limit is rejected for as long as it keeps sending.
3. The member is chosen by the host: `suffix()` (by default `time.perf_counter_ns`)
   is unique within one process at best. Two hosts whose suffixes coincide in the same
   millisecond write one member, and the set counts two requests once.
4. With `expire=False` (the EXPIRE forgotten, as it often is) an idle client's key
   stays forever: chapter 3 counts the leak.

`ratelimit.SlidingWindowLimiter` runs trim, count and add as one Lua script and picks
its members inside Redis. Decisions here are plain bools, not `ratelimit.Decision`s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ClassicSlidingLog", "ClassicTransactionLog", "classic_member", "classic_members"]


def classic_member(now_ms: int, suffix: int) -> str:
    """The recipe's sorted-set member, "<ms>:<suffix>"."""
    return f"{now_ms}:{suffix}"


def classic_members(
    start_ms: int, entries: int, suffix: Callable[[], int] = time.perf_counter_ns
) -> list[tuple[str, int]]:
    """(member, score) of `entries` requests at consecutive ms from `start_ms`, as the
    recipe writes them (for memory probes)."""
    return [(classic_member(start_ms + i, suffix()), start_ms + i) for i in range(entries)]


class ClassicSlidingLog:
    """`limit` requests per `window_seconds` per identity, the classic way (see the
    module docstring for what is wrong with it)."""

    def __init__(
        self,
        redis: Any,
        window_seconds: float,
        limit: int,
        *,
        prefix: str = "classic",
        clock: Callable[[], float] = time.time,
        suffix: Callable[[], int] = time.perf_counter_ns,
        expire: bool = True,
    ) -> None:
        self.redis = redis
        self.window_ms = round(window_seconds * 1000)
        self.limit = limit
        self.prefix = prefix
        self.clock = clock
        self.suffix = suffix
        self.expire = expire

    def key_for(self, identity: str) -> str:
        """The sorted set for `identity` (readable, unhashed: this is not the real thing)."""
        return f"{self.prefix}:{identity}"

    def _stamp(self) -> tuple[int, str]:
        now = math.floor(self.clock() * 1000)
        return now, classic_member(now, self.suffix())

    async def check(self, identity: str) -> bool:
        """Admit (True) or reject (False) one request, in four separate round trips."""
        now, member = self._stamp()
        key, redis = self.key_for(identity), self.redis
        await redis.zremrangebyscore(key, "-inf", now - self.window_ms)
        if await redis.zcard(key) >= self.limit:
            return False
        # Anything may have happened since ZCARD answered: this is the race.
        await redis.zadd(key, {member: now})
        if self.expire:
            await redis.pexpire(key, self.window_ms)
        return True

    def check_sync(self, identity: str) -> bool:
        """`check` for a synchronous client: the same four commands, the same race."""
        now, member = self._stamp()
        key, redis = self.key_for(identity), self.redis
        redis.zremrangebyscore(key, "-inf", now - self.window_ms)
        if redis.zcard(key) >= self.limit:
            return False
        redis.zadd(key, {member: now})
        if self.expire:
            redis.pexpire(key, self.window_ms)
        return True

    def _queue_transaction(self, identity: str) -> Any:
        """The MULTI/EXEC pipeline of one check, queued and not yet sent; the count
        (this request included) is its third reply."""
        now, member = self._stamp()
        key = self.key_for(identity)
        pipe = self.redis.pipeline(transaction=True)
        pipe.zremrangebyscore(key, 0, now - self.window_ms)
        pipe.zadd(key, {member: now})
        pipe.zcard(key)
        if self.expire:
            pipe.pexpire(key, self.window_ms)
        return pipe

    async def check_transaction(self, identity: str) -> bool:
        """One MULTI/EXEC: trim, add, count, expire; admitted when the count (this
        request included) is within the limit. A rejected request stays recorded."""
        count = (await self._queue_transaction(identity).execute())[2]
        return int(count) <= self.limit

    def check_transaction_sync(self, identity: str) -> bool:
        """`check_transaction` for a synchronous client: the same MULTI/EXEC."""
        count = self._queue_transaction(identity).execute()[2]
        return int(count) <= self.limit

    def __repr__(self) -> str:
        return f"{type(self).__name__}(window_ms={self.window_ms}, limit={self.limit})"


class ClassicTransactionLog(ClassicSlidingLog):
    """The recipe's MULTI/EXEC form as a limiter of its own: `check` and `check_sync`
    send `check_transaction`, so code that drives a limiter by `check` races it too.
    Atomic, and still wrong: every request it rejects stays in the set and counts."""

    async def check(self, identity: str) -> bool:
        """Admit (True) or reject (False) one request, in one MULTI/EXEC (add, then count)."""
        return await self.check_transaction(identity)

    def check_sync(self, identity: str) -> bool:
        """`check` for a synchronous client."""
        return self.check_transaction_sync(identity)
