"""`ratelimit.teaching` holds code that is wrong on purpose: check that it is wrong in
exactly the way chapter 4 says (over-admits under concurrency on a real Redis, loses
requests whose classic members collide), right when used sequentially, and never
offered as a limiter by the public API."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import redis
import redis.asyncio

import ratelimit
from ratelimit import SlidingWindowLimiter
from ratelimit.clock import ManualClock
from ratelimit.teaching import NonAtomicSlidingLog, NonAtomicSlidingLogSync, classic_member

LIMIT = 10
CONCURRENT = 50


def test_not_part_of_the_public_api():
    assert not hasattr(ratelimit, "NonAtomicSlidingLog")
    assert not any("NonAtomic" in name or "teaching" in name for name in ratelimit.__all__)
    assert "wrong" in NonAtomicSlidingLog.__doc__.lower()
    assert "wrong" in NonAtomicSlidingLogSync.__doc__.lower()


async def test_sequential_checks_are_decided_correctly(client, prefix, clock):
    """One request at a time there is nothing to interleave: exactly the limit gets in,
    and entries leave the window on time."""
    naive = NonAtomicSlidingLog(client, 1, LIMIT, prefix=prefix, clock=clock)
    decisions = []
    for _ in range(12):
        decisions.append(await naive.check("alice"))
        clock.advance(0.01)
    assert decisions == [True] * LIMIT + [False] * 2
    assert await client.zcard(naive.key_for("alice")) == LIMIT
    clock.advance(1.0)  # every entry has left the window
    assert await naive.check("alice")


def test_sequential_sync_checks_are_decided_correctly(sync_client, prefix, clock):
    naive = NonAtomicSlidingLogSync(sync_client, 1, LIMIT, prefix=prefix, clock=clock)
    decisions = [naive.check("alice") for _ in range(12)]
    assert decisions == [True] * LIMIT + [False] * 2
    assert sync_client.zcard(naive.key_for("alice")) == LIMIT


async def test_over_admits_under_concurrency_on_real_redis(real_redis_url, prefix):
    """50 requests in flight at once (asyncio): far more than the limit get in, while
    the Lua limiter on the same server admits exactly the limit."""
    client = redis.asyncio.Redis.from_url(real_redis_url)
    try:
        naive_counts, lua_counts = [], []
        for round_ in range(5):
            naive = NonAtomicSlidingLog(client, 1, LIMIT, prefix=f"{prefix}:naive")
            # (A minute: a stalled machine must not open a second window for it.)
            lua = SlidingWindowLimiter(client, 60, LIMIT, prefix=f"{prefix}:lua")
            who = f"round-{round_}"
            admitted = await asyncio.gather(*(naive.check(who) for _ in range(CONCURRENT)))
            naive_counts.append(sum(admitted))
            decisions = await asyncio.gather(*(lua.check(who) for _ in range(CONCURRENT)))
            lua_counts.append(sum(d.allowed for d in decisions))
        assert max(naive_counts) > LIMIT, naive_counts
        assert min(naive_counts) >= LIMIT, naive_counts  # it never admits fewer
        assert lua_counts == [LIMIT] * 5
    finally:
        await client.aclose()


def test_sync_variant_over_admits_from_threads_on_real_redis(real_redis_url, prefix):
    """50 threads released together, each with its own connection: over-admits too."""
    client = redis.Redis.from_url(real_redis_url)
    try:
        counts = []
        with ThreadPoolExecutor(CONCURRENT) as pool:
            for round_ in range(10):
                naive = NonAtomicSlidingLogSync(client, 1, LIMIT, prefix=prefix)
                start = threading.Barrier(CONCURRENT)

                def one(_: int, naive=naive, start=start, who=f"round-{round_}") -> bool:
                    start.wait(timeout=10)
                    return naive.check(who)

                counts.append(sum(pool.map(one, range(CONCURRENT))))
        assert max(counts) > LIMIT, counts
    finally:
        client.close()


async def test_coinciding_counters_lose_a_request(client, prefix):
    """Two hosts, the same millisecond, counters that coincide: one member, one request
    lost. The real limiter, under the same conditions, counts both."""
    frozen = ManualClock(1_796_000_000.0)
    hosts = [NonAtomicSlidingLog(client, 1, LIMIT, prefix=prefix, clock=frozen) for _ in "ab"]
    assert [await h.check("alice") for h in hosts] == [True, True]  # both admitted...
    key = hosts[0].key_for("alice")
    assert await client.zrange(key, 0, -1) == [classic_member(1_796_000_000_000, 1).encode()]
    assert await client.zcard(key) == 1  # ...but counted once

    ours = [SlidingWindowLimiter(client, 1, LIMIT, prefix=prefix, clock=frozen) for _ in "ab"]
    assert [(await h.check("alice")).remaining for h in ours] == [LIMIT - 1, LIMIT - 2]
    assert await client.zcard(ours[0].key_for("alice")) == 2


def test_classic_member_format():
    assert classic_member(1_796_000_000_123, 7) == "1796000000123:7"
