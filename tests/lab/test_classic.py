"""`ratelimit.lab.classic` holds the classic recipe, wrong on purpose: check that it is
wrong in exactly the ways chapter 4 and the bench say (over-admits under concurrency on
a real Redis, loses requests whose members collide, lets rejections eat the budget in a
transaction), right when used sequentially, and never offered by the library."""

from __future__ import annotations

import asyncio
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import fakeredis
import redis
import redis.asyncio

import ratelimit
from ratelimit import SlidingWindowLimiter
from ratelimit.clock import ManualClock
from ratelimit.lab import classic as classic_module
from ratelimit.lab.classic import ClassicSlidingLog, classic_member, classic_members

LIMIT = 10
CONCURRENT = 50


def test_not_part_of_the_library():
    assert not hasattr(ratelimit, "ClassicSlidingLog")
    assert not any("Classic" in name for name in ratelimit.__all__)
    assert "wrong on purpose" in classic_module.__doc__


async def test_sequential_checks_are_decided_correctly(client, prefix, clock):
    """One request at a time there is nothing to interleave: exactly the limit gets in,
    and entries leave the window on time."""
    naive = ClassicSlidingLog(client, 1, LIMIT, prefix=prefix, clock=clock)
    decisions = []
    for _ in range(12):
        decisions.append(await naive.check("alice"))
        clock.advance(0.01)
    assert decisions == [True] * LIMIT + [False] * 2
    assert await client.zcard(naive.key_for("alice")) == LIMIT
    clock.advance(1.0)  # every entry has left the window
    assert await naive.check("alice")


def test_sequential_sync_checks_are_decided_correctly(sync_client, prefix, clock):
    naive = ClassicSlidingLog(sync_client, 1, LIMIT, prefix=prefix, clock=clock)
    decisions = [naive.check_sync("alice") for _ in range(12)]
    assert decisions == [True] * LIMIT + [False] * 2
    assert sync_client.zcard(naive.key_for("alice")) == LIMIT


async def test_over_admits_under_concurrency_on_real_redis(real_redis_url, prefix):
    """50 requests in flight at once (asyncio): far more than the limit get in, while
    the Lua limiter on the same server admits exactly the limit."""
    client = redis.asyncio.Redis.from_url(real_redis_url)
    try:
        naive_counts, lua_counts = [], []
        for round_ in range(5):
            naive = ClassicSlidingLog(client, 1, LIMIT, prefix=f"{prefix}:naive")
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
                naive = ClassicSlidingLog(client, 1, LIMIT, prefix=prefix)
                start = threading.Barrier(CONCURRENT)

                def one(_: int, naive=naive, start=start, who=f"round-{round_}") -> bool:
                    start.wait(timeout=10)
                    return naive.check_sync(who)

                counts.append(sum(pool.map(one, range(CONCURRENT))))
        assert max(counts) > LIMIT, counts
    finally:
        client.close()


async def test_coinciding_counters_lose_a_request(client, prefix):
    """Two hosts, the same millisecond, suffixes that coincide (each host counts its
    requests from 1): one member, one request lost. The real limiter, under the same
    conditions, counts both."""
    frozen = ManualClock(1_796_000_000.0)
    hosts = [
        ClassicSlidingLog(
            client, 1, LIMIT, prefix=prefix, clock=frozen, suffix=itertools.count(1).__next__
        )
        for _ in "ab"
    ]
    assert [await h.check("alice") for h in hosts] == [True, True]  # both admitted...
    key = hosts[0].key_for("alice")
    assert await client.zrange(key, 0, -1) == [classic_member(1_796_000_000_000, 1).encode()]
    assert await client.zcard(key) == 1  # ...but counted once

    ours = [
        SlidingWindowLimiter(client, 1, LIMIT, prefix=prefix, clock=frozen, storage="sorted-set")
        for _ in "ab"
    ]
    assert [(await h.check("alice")).remaining for h in ours] == [LIMIT - 1, LIMIT - 2]
    assert await client.zcard(ours[0].key_for("alice")) == 2


def test_classic_member_format():
    assert classic_member(1_796_000_000_123, 7) == "1796000000123:7"
    members = classic_members(1_000, 3, suffix=itertools.count(5).__next__)
    assert members == [("1000:5", 1000), ("1001:6", 1001), ("1002:7", 1002)]


async def test_default_members_are_ms_and_perf_counter_ns(client, prefix, clock):
    recipe = ClassicSlidingLog(client, 1, LIMIT, prefix=prefix, clock=clock)
    assert await recipe.check("k") and await recipe.check_transaction("k")
    members = [m.decode() for m in await client.zrange(recipe.key_for("k"), 0, -1)]
    assert len(members) == 2 and len(set(members)) == 2
    assert all(m.split(":")[0] == "1000000000" and m.split(":")[1].isdigit() for m in members)


async def test_transaction_agrees_with_our_log_until_a_rejection_eats_budget(prefix):
    """The MULTI/EXEC form (what the bench times) admits like our log while nothing is
    rejected, then falls behind: it records rejected requests too."""
    client = fakeredis.FakeAsyncRedis()
    clock = ManualClock(1_000_000.0)
    ours = SlidingWindowLimiter(client, 10, 10, prefix=prefix, clock=clock)
    recipe = ClassicSlidingLog(client, 10, 10, prefix=prefix, clock=clock)

    async def burst(n: int) -> tuple[int, int]:
        a = [(await ours.check("k")).allowed for _ in range(n)]
        b = [await recipe.check_transaction("k") for _ in range(n)]
        return sum(a), sum(b)

    # 12 at once: both admit 10; one window later the log is empty for both.
    assert await burst(12) == (10, 10)
    clock.advance(10.001)
    assert await burst(7) == (7, 7)
    # Rejected requests half a window later: the recipe records them anyway.
    assert await burst(5) == (3, 3)
    clock.advance(5)
    assert await burst(8) == (0, 0)
    # One window after: ours holds nothing; the recipe still holds the 8 rejected, so
    # only 2 of 6 get in.
    clock.advance(5.001)
    assert await burst(6) == (6, 2)
    await client.aclose()


async def test_a_forgotten_expire_leaves_the_key_forever(client, prefix, clock):
    forgetful = ClassicSlidingLog(client, 1, LIMIT, prefix=prefix, clock=clock, expire=False)
    careful = ClassicSlidingLog(client, 1, LIMIT, prefix=f"{prefix}:c", clock=clock)
    assert await forgetful.check("k") and await forgetful.check_transaction("k")
    assert await careful.check("k") and await careful.check_transaction("k")
    assert await client.pttl(forgetful.key_for("k")) == -1  # no TTL: it never expires
    assert 0 < await client.pttl(careful.key_for("k")) <= 1_000
