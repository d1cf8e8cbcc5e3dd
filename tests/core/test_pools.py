"""More callers than the client's pool has connections: they wait for one, within
the limiter's timeout, instead of failing at once.

redis-py's `ConnectionPool` (100 connections unless told otherwise) raises
MaxConnectionsError as soon as every connection is in use. A check that meets it
waits, first come first served, for the connection another check gives back; only a
wait longer than `timeout` goes to the failure policy, with a message naming the
pool's class and size.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis
import redis.asyncio

import ratelimit
import ratelimit.sync
from ratelimit import RateLimiterUnavailable

pytestmark = pytest.mark.real_redis

THREADS = 150
CHECKS_PER_THREAD = 100
TASKS = 300
CHECKS_PER_TASK = 5
SHORT = 0.3  # the timeout of the checks that find the pool held


def zcards(url: str, limiter: Any, identities: list[str]) -> list[int]:
    with redis.Redis.from_url(url) as admin:
        return [admin.zcard(limiter.key_for(who)) for who in identities]


def test_threads_beyond_the_default_pool_are_all_answered(real_redis_url, prefix):
    client = redis.Redis.from_url(real_redis_url)
    assert type(client.connection_pool) is redis.ConnectionPool
    assert client.connection_pool.max_connections == 100 < THREADS  # redis-py's default
    limiter = ratelimit.sync.SlidingWindowLimiter(
        client, 60, 1000, prefix=prefix, storage="sorted-set", on_error="allow"
    )
    counts: list[Counter] = []
    start = threading.Barrier(THREADS)

    def worker(who: str) -> None:
        mine = Counter()
        start.wait()
        for _ in range(CHECKS_PER_THREAD):
            decision = limiter.check(who)
            mine["answered"] += 1
            mine["degraded"] += decision.degraded
            mine["admitted"] += decision.allowed and not decision.degraded
        counts.append(mine)

    identities = [f"thread-{i}" for i in range(THREADS)]
    threads = [threading.Thread(target=worker, args=(who,)) for who in identities]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        total = sum(counts, Counter())
        checks = THREADS * CHECKS_PER_THREAD
        assert total == Counter(answered=checks, admitted=checks), total
        # Each admit counted exactly once in Redis.
        assert zcards(real_redis_url, limiter, identities) == [CHECKS_PER_THREAD] * THREADS
    finally:
        limiter.close()
        client.close()


def answered_once_given_back(limiter: ratelimit.sync.SyncLimiter) -> ratelimit.Decision:
    """A check made while every connection of the limiter's pool is held, one of them
    given back to the pool a moment later."""
    pool = limiter._client.connection_pool  # the limiter's copy: one per timeout
    held = [pool.get_connection() for _ in range(pool.max_connections)]
    release = threading.Timer(SHORT / 3, pool.release, args=(held.pop(),))
    release.start()
    try:
        return limiter.check("who")
    finally:
        release.join()
        for conn in held:
            pool.release(conn)


def counting(pool: Any, monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Count how often `pool` is asked for a connection (`get_connection`), or whether
    it has one (`can_get_connection`, asyncio pools)."""
    asked: Counter = Counter()
    for name in ("get_connection", "can_get_connection"):
        method = getattr(pool, name, None)
        if method is not None:

            def counted(*args: Any, method: Any = method, **kwargs: Any) -> Any:
                asked["times"] += 1
                return method(*args, **kwargs)

            monkeypatch.setattr(pool, name, counted)
    return asked


@pytest.mark.parametrize("on_error", ["raise", "allow"])
def test_sync_check_waits_for_a_held_pool_then_names_it(
    real_redis_url, prefix, on_error, monkeypatch, caplog
):
    client = redis.Redis.from_url(real_redis_url, max_connections=2)
    limiter = ratelimit.sync.SlidingWindowLimiter(
        client, 60, 10, prefix=prefix, on_error=on_error, timeout=SHORT
    )
    caplog.set_level(logging.WARNING, logger="ratelimit")
    pool = limiter._client.connection_pool  # the limiter's copy: same class and size
    held = [pool.get_connection() for _ in range(2)]
    asked = counting(pool, monkeypatch)
    try:
        started = time.monotonic()
        if on_error == "raise":
            with pytest.raises(RateLimiterUnavailable) as failure:
                limiter.check("who")
            message = str(failure.value)
        else:
            decision = limiter.check("who")
            assert decision.degraded and decision.allowed, decision
            [message] = [r.getMessage() for r in caplog.records]
        # It waited, asking the pool again and again, rather than failing at once.
        assert time.monotonic() - started >= SHORT
        assert asked["times"] > 2, asked
        assert "ConnectionPool" in message and "max_connections=2" in message, message

    finally:
        for conn in held:
            pool.release(conn)
    try:
        # A connection given back to the pool while a check waits is the check's.
        patient = limiter.with_options(timeout=5)
        waited = answered_once_given_back(patient)
        assert not waited.degraded and waited.allowed and waited.remaining == 9, waited
    finally:
        patient.close()
        limiter.close()
        client.close()


@pytest.mark.parametrize("on_error", ["raise", "allow"])
async def test_async_check_waits_for_a_held_pool_then_names_it(
    real_redis_url, prefix, on_error, monkeypatch, caplog
):
    client = redis.asyncio.Redis.from_url(real_redis_url, max_connections=2)
    limiter = ratelimit.SlidingWindowLimiter(
        client, 60, 10, prefix=prefix, on_error=on_error, timeout=SHORT
    )
    caplog.set_level(logging.WARNING, logger="ratelimit")
    pool = client.connection_pool
    held = [await pool.get_connection() for _ in range(2)]
    asked = counting(pool, monkeypatch)
    try:
        started = time.monotonic()
        if on_error == "raise":
            with pytest.raises(RateLimiterUnavailable) as failure:
                await limiter.check("who")
            message = str(failure.value)
        else:
            decision = await limiter.check("who")
            assert decision.degraded and decision.allowed, decision
            [message] = [r.getMessage() for r in caplog.records]
        assert time.monotonic() - started >= SHORT
        assert asked["times"] > 2, asked
        assert "ConnectionPool" in message and "max_connections=2" in message, message

        async def give_back_soon() -> None:
            await asyncio.sleep(SHORT / 3)
            await pool.release(held.pop())

        waited, _ = await asyncio.gather(
            limiter.with_options(timeout=5).check("who"), give_back_soon()
        )
        assert not waited.degraded and waited.allowed and waited.remaining == 9, waited
    finally:
        for conn in held:
            await pool.release(conn)
        await limiter.aclose()
        await client.aclose()


@pytest.mark.parametrize("auto_pipeline", [False, True])
async def test_tasks_beyond_a_small_pool_are_all_answered(real_redis_url, prefix, auto_pipeline):
    client = redis.asyncio.Redis.from_url(real_redis_url, max_connections=10)
    limiter = ratelimit.SlidingWindowLimiter(
        client, 60, 1000, prefix=prefix, storage="sorted-set", on_error="allow",
        auto_pipeline=auto_pipeline, timeout=5,
    )  # fmt: skip
    identities = [f"task-{i}" for i in range(TASKS)]

    async def task(who: str) -> list[ratelimit.Decision]:
        answered = []
        for i in range(CHECKS_PER_TASK):
            if i % 2:  # a round trip of its own, auto-pipelined checks or not
                answered += await limiter.check_many([who])
            else:
                answered.append(await limiter.check(who))
        return answered

    try:
        outcomes = await asyncio.gather(*(task(who) for who in identities))
        decisions = [d for answered in outcomes for d in answered]
        assert len(decisions) == TASKS * CHECKS_PER_TASK
        assert not [d for d in decisions if d.degraded or not d.allowed]
    finally:
        await limiter.aclose()
        await client.aclose()
    assert zcards(real_redis_url, limiter, identities) == [CHECKS_PER_TASK] * TASKS


def test_a_blocking_pool_waits_at_most_the_timeout(real_redis_url, prefix):
    """A `BlockingConnectionPool` waits for a connection by itself, as redis-py does;
    the limiter's copy of it waits at most the limiter's timeout, not the pool's 20 s."""
    pool = redis.BlockingConnectionPool.from_url(real_redis_url, max_connections=2)
    client = redis.Redis(connection_pool=pool)
    limiter = ratelimit.sync.SlidingWindowLimiter(
        client, 60, 10, prefix=prefix, on_error="raise", timeout=SHORT
    )
    copy = limiter._client.connection_pool
    assert type(copy) is redis.BlockingConnectionPool and copy.max_connections == 2
    assert copy.timeout == SHORT and pool.timeout == 20
    held = [copy.get_connection() for _ in range(2)]
    try:
        started = time.monotonic()
        with pytest.raises(RateLimiterUnavailable, match="No connection available"):
            limiter.check("who")
        assert time.monotonic() - started < 10  # (not the pool's own 20 s)
    finally:
        for conn in held:
            copy.release(conn)
    try:
        patient = limiter.with_options(timeout=5)
        waited = answered_once_given_back(patient)
        assert not waited.degraded and waited.remaining == 9, waited
    finally:
        patient.close()
        limiter.close()
        client.close()
