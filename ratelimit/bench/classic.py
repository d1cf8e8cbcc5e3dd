"""The classic sliding-log recipe, written the way blog posts and FastAPI snippets do it.

One MULTI/EXEC pipeline per request: ZREMRANGEBYSCORE the old entries, ZADD a member
"<ms>:<perf_counter_ns>", ZCARD, EXPIRE; admit when the count (which already
includes this request) is within the limit. A new limiter object is built for every
request, as in a dependency that does `ClassicLimiter(redis, ...)` inside the route.

It is the peer our sliding log is measured against, with its known flaws kept on
purpose: a rejected request is still added (so rejections eat budget), and the member
is only unique per process. It is here to be benchmarked, not used.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wall_ms() -> int:
    """The host's clock in whole ms, as the recipe reads it."""
    return int(time.time() * 1000)


class ClassicLimiter:
    """`limit` requests per `window_seconds` for one client, the classic way."""

    def __init__(
        self,
        redis: Any,
        limit: int,
        window_seconds: int,
        prefix: str = "classic",
        clock: Callable[[], int] = wall_ms,
    ) -> None:
        self.redis = redis
        self.limit = limit
        self.window_ms = window_seconds * 1000
        self.window_seconds = window_seconds
        self.prefix = prefix
        self.clock = clock

    async def is_allowed(self, identity: str) -> bool:
        key = f"{self.prefix}:{identity}"
        now = self.clock()
        member = f"{now}:{time.perf_counter_ns()}"
        pipe = self.redis.pipeline(transaction=True)
        pipe.zremrangebyscore(key, 0, now - self.window_ms)
        pipe.zadd(key, {member: now})
        pipe.zcard(key)
        pipe.expire(key, self.window_seconds)
        _, _, count, _ = await pipe.execute()
        return int(count) <= self.limit


async def classic_check(
    redis: Any,
    identity: str,
    limit: int,
    window_seconds: int,
    prefix: str = "classic",
    clock: Callable[[], int] = wall_ms,
) -> bool:
    """One request as the snippet handles it: build the limiter, ask it, drop it."""
    return await ClassicLimiter(redis, limit, window_seconds, prefix, clock).is_allowed(identity)
