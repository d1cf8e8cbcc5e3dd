"""One asyncio client and its limiters used from successive `asyncio.run()` calls.

Scripts, Celery tasks and sync views that call `asyncio.run` reuse a client made
once. A connection opened in a loop that is gone cannot work in the next one: it is
closed and opened again, and every check of every run is answered, none counted
without being answered.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

import ratelimit

pytestmark = pytest.mark.real_redis

RUNS = 4
LIMIT = 1000


def test_every_run_answers_every_check(real_redis_url, prefix):
    client = redis.asyncio.Redis.from_url(real_redis_url)
    limiter = ratelimit.SlidingWindowLimiter(
        client, 60, LIMIT, prefix=prefix, storage="sorted-set", on_error="raise"
    )
    answered: list[ratelimit.Decision] = []

    async def one_run() -> None:
        for _ in range(3):  # one after another: the lane keeps a connection of this loop
            answered.append(await limiter.check("who"))
        answered.extend(await asyncio.gather(*(limiter.check("who") for _ in range(5))))
        answered.extend(await limiter.check_many(["who"] * 3))
        await client.set(f"{prefix}:own", "the client's own commands work too")

    for _ in range(RUNS):
        asyncio.run(one_run())  # raises if any check raised
    assert len(answered) == RUNS * 11
    assert not any(d.degraded for d in answered) and all(d.allowed for d in answered)
    # Each admitted check counted exactly once: the log holds one member per answer.
    with redis.Redis.from_url(real_redis_url) as admin:
        assert admin.zcard(limiter.key_for("who")) == len(answered)
    assert [d.remaining for d in answered] == list(range(LIMIT - 1, LIMIT - 1 - len(answered), -1))
