"""Closing limiters and clients leaves none of their connections open on the server.

Counted the way an operator would, with CLIENT LIST on a private server: only the
admin connection that asks remains.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio

import ratelimit
import ratelimit.sync

pytestmark = pytest.mark.private_redis


def others(admin: redis.Redis) -> int:
    """Connections to the server besides the admin's own."""
    return len(admin.client_list()) - 1


def left_open(admin: redis.Redis, within: float = 5.0) -> int:
    """`others` once the server has seen the closes: a socket closed just before the
    admin asks may be handled after the admin's CLIENT LIST in the same turn of the
    server's event loop, so a count above 0 is asked again until `within` runs out."""
    deadline = time.monotonic() + within
    while (count := others(admin)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return count


def sync_limiters(client: redis.Redis) -> list[ratelimit.sync.SyncLimiter]:
    """Three limiters with three timeouts: three bounded copies of the client."""
    return [
        ratelimit.sync.SlidingWindowLimiter(client, 1, 10, timeout=t, prefix=f"p{i}")
        for i, t in enumerate((0.5, 1.0, 2.0))
    ]


def test_closed_sync_limiters_hold_no_connection(private_redis):
    with private_redis.client() as admin:
        client = redis.Redis.from_url(private_redis.url)
        limiters = sync_limiters(client)
        for limiter in limiters:
            limiter.check("a")
            limiter.check_many(["b", "c"])
        assert others(admin) >= 3  # each limiter's lane keeps its connection
        for limiter in limiters:
            limiter.close()
        client.close()
        assert left_open(admin) == 0
        # A closed limiter still works: it connects again when it is used.
        assert limiters[0].check("a").allowed
        limiters[0].close()
        assert left_open(admin) == 0


def test_a_sync_limiter_is_a_context_manager(private_redis):
    with private_redis.client() as admin:
        client = redis.Redis.from_url(private_redis.url)
        with ratelimit.sync.FixedWindowLimiter(client, 1, 5) as limiter:
            assert limiter.check("a").allowed
            assert others(admin) >= 1
        client.close()
        assert left_open(admin) == 0


async def test_closed_async_limiters_and_client_hold_no_connection(private_redis):
    with private_redis.client() as admin:
        client = redis.asyncio.Redis.from_url(private_redis.url)
        async with ratelimit.SlidingWindowLimiter(client, 1, 10) as limiter:
            for _ in range(3):
                await limiter.check("a")  # one after another: the lane keeps one
            assert limiter._lane is not None and limiter._lane.idle == 1
            await asyncio.gather(*(limiter.check("b") for _ in range(20)))
        assert limiter._lane.idle == 0  # given back to the client's pool
        await client.aclose()
        assert left_open(admin) == 0


async def test_closing_only_the_async_client_closes_what_the_lane_kept(private_redis):
    with private_redis.client() as admin:
        client = redis.asyncio.Redis.from_url(private_redis.url)
        limiter = ratelimit.TokenBucketLimiter(client, 1, 10)
        await limiter.check("a")
        assert limiter._lane.idle == 1
        await client.aclose()  # the lane's connection is the pool's, closed with it
        assert left_open(admin) == 0
