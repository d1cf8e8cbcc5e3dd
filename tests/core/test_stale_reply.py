"""A reply left unread on a pooled connection is never read as a decision.

An exception that lands while redis-py connects (KeyboardInterrupt, a gevent timeout)
can leave the reply of an earlier command unread on a connection that goes back to the
pool. The next check on it would read that reply as its own, and every later one the
reply meant for the check before it. Made deterministic here: a PING is sent on a
pooled connection while the server is paused, and the connection handed back before
its reply arrives; the next check meets the PONG first.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

import ratelimit
import ratelimit.sync
from ratelimit.lanes import StaleReply

pytestmark = pytest.mark.private_redis

PAUSE_MS = 300


def pause(admin: redis.Redis) -> None:
    admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")


async def test_async_check_drops_a_connection_with_a_stray_reply(private_redis):
    client = redis.asyncio.Redis.from_url(private_redis.url)
    limiter = ratelimit.SlidingWindowLimiter(client, 60, 2, on_error="raise", timeout=5)
    denying = limiter.with_options(on_error="deny")
    try:
        assert (await limiter.check("warm")).allowed
        await asyncio.sleep(0)  # the lane gives its connection back to the pool
        with private_redis.client() as admin:
            pause(admin)
            stray = await client.connection_pool.get_connection()
            await stray.send_command("PING")  # its PONG comes once the pause ends
            await client.connection_pool.release(stray)
            with pytest.raises(ratelimit.RateLimiterUnavailable, match="no script answers"):
                await limiter.check("hot")
            assert not stray.is_connected  # dropped, not handed to the next check
        # Every later check reads its own reply: exactly the limit admitted.
        decisions = [await denying.check("hot") for _ in range(4)]
        assert not any(d.degraded for d in decisions)
        # The stray reply's check ran in Redis (its reply was the one dropped): one unit
        # of the identity's two is used, so one more is admitted, then none.
        assert [d.allowed for d in decisions] == [True, False, False, False]
    finally:
        await client.aclose()


def test_sync_check_drops_a_connection_with_a_stray_reply(private_redis):
    client = redis.Redis.from_url(private_redis.url)
    limiter = ratelimit.sync.SlidingWindowLimiter(client, 60, 2, on_error="allow", timeout=5)
    try:
        assert limiter.check("warm").allowed
        limiter.close()  # the lane's connection back to the pool (closed: it reconnects)
        pool = limiter._client.connection_pool
        with private_redis.client() as admin:
            pause(admin)
            stray = pool.get_connection()
            stray.send_command("PING")
            pool.release(stray)
            degraded = limiter.check("hot")
            assert degraded.degraded and degraded.allowed  # the policy, not a decision
            assert not stray.is_connected
        decisions = [limiter.check("hot") for _ in range(3)]
        assert not any(d.degraded for d in decisions)
        # The stray reply's check ran in Redis (its reply was the one dropped): the
        # identity has used one unit already, so one more is admitted, then none.
        assert [d.allowed for d in decisions] == [True, False, False]
    finally:
        limiter.close()
        client.close()


def test_a_stale_reply_is_recognised_only_for_script_calls():
    from ratelimit.lanes import _own

    assert _own(("EVALSHA", "sha", 1, "k"), 5) == 5
    assert _own(("EVAL", "body", 1, "k"), [1, 2, 3, 4]) == [1, 2, 3, 4]
    assert _own(("SCRIPT", "LOAD", "body"), b"sha") == b"sha"
    assert _own(("WAIT", 1, 10), 0) == 0
    noscript = redis.exceptions.NoScriptError("NOSCRIPT")
    assert _own(("EVALSHA", "sha", 1, "k"), noscript) is noscript
    for stray in (b"OK", "OK", b"PONG", None):
        with pytest.raises(StaleReply):
            _own(("EVALSHA", "sha", 1, "k"), stray)
