"""Bad parameters get a ValueError naming the parameter, never a wrong decision."""

from __future__ import annotations

import math

import fakeredis
import pytest

import ratelimit
import ratelimit.sync
from ratelimit.clock import ManualClock

ASYNC_CLASSES = [
    ratelimit.SlidingWindowLimiter,
    ratelimit.FixedWindowLimiter,
    ratelimit.SlidingWindowCounterLimiter,
    ratelimit.TokenBucketLimiter,
]
SYNC_CLASSES = [
    ratelimit.sync.SlidingWindowLimiter,
    ratelimit.sync.FixedWindowLimiter,
    ratelimit.sync.SlidingWindowCounterLimiter,
    ratelimit.sync.TokenBucketLimiter,
]

BAD_CONSTRUCTION = [
    # (args, kwargs, parameter named in the message)
    ((1, 0), {}, "limit"),
    ((1, -5), {}, "limit"),
    ((1, 2.5), {}, "limit"),
    ((1, "10"), {}, "limit"),
    ((1, True), {}, "limit"),
    ((1, None), {}, "limit"),
    ((1, 10**10), {}, "limit"),
    ((0, 10), {}, "window_seconds"),
    ((-1, 10), {}, "window_seconds"),
    ((0.5, 10), {}, "window_seconds"),
    ((math.nan, 10), {}, "window_seconds"),
    ((None, 10), {"window_ms": 0}, "window_ms"),
    ((None, 10), {"window_ms": 1.5}, "window_ms"),
    ((None, 10), {"window_ms": 10**15}, "window_ms"),
    ((None, 10), {}, "window_seconds and window_ms"),
    ((1, 10), {"window_ms": 1000}, "window_seconds and window_ms"),
    ((1, 10), {"prefix": ""}, "prefix"),
    ((1, 10), {"prefix": "a{b}"}, "prefix"),
    ((1, 10), {"prefix": 7}, "prefix"),
    ((1, 10), {"on_error": "ignore"}, "on_error"),
    ((1, 10), {"timeout": 0}, "timeout"),
    ((1, 10), {"timeout": -1}, "timeout"),
    ((1, 10), {"timeout": math.inf}, "timeout"),
    ((1, 10), {"timeout": "1"}, "timeout"),
    ((1, 10), {"clock": 5}, "clock"),
    ((1, 10), {"key_secret": "text"}, "key_secret"),
    ((1, 10), {"key_secret": b"x" * 65}, "key_secret"),
]


@pytest.mark.parametrize(
    "cls", ASYNC_CLASSES + SYNC_CLASSES, ids=lambda c: c.__module__ + "." + c.__name__
)
@pytest.mark.parametrize(("args", "kwargs", "name"), BAD_CONSTRUCTION)
def test_bad_constructor_arguments_name_the_parameter(cls, args, kwargs, name):
    client = fakeredis.FakeAsyncRedis() if cls in ASYNC_CLASSES else fakeredis.FakeRedis()
    with pytest.raises(ValueError, match=name):
        cls(client, *args, **kwargs)


@pytest.mark.parametrize("burst", [0, -1, 1.5, "3"])
def test_bad_burst(burst):
    with pytest.raises(ValueError, match="burst"):
        ratelimit.TokenBucketLimiter(fakeredis.FakeAsyncRedis(), 1, 10, burst=burst)


BAD_COSTS = [0, -1, 11, 2.0, "1", None, True]


@pytest.mark.parametrize("cls", ASYNC_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("cost", BAD_COSTS)
async def test_bad_cost_is_rejected_before_redis(cls, cost):
    client = fakeredis.FakeAsyncRedis()
    limiter = cls(client, 1, 10, on_error="allow")
    with pytest.raises(ValueError, match="cost"):
        await limiter.check("alice", cost=cost)
    assert await client.dbsize() == 0, "a bad request must not touch Redis"


@pytest.mark.parametrize("cls", SYNC_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("cost", BAD_COSTS)
def test_bad_cost_sync(cls, cost):
    client = fakeredis.FakeRedis()
    with pytest.raises(ValueError, match="cost"):
        cls(client, 1, 10).check("alice", cost=cost)
    assert client.dbsize() == 0


async def test_cost_above_burst_is_rejected():
    limiter = ratelimit.TokenBucketLimiter(fakeredis.FakeAsyncRedis(), 1, 10, burst=3)
    with pytest.raises(ValueError, match="burst"):
        await limiter.check("alice", cost=4)


@pytest.mark.parametrize("identity", ["", b"", None, 42, ["a"]])
async def test_bad_identity(identity):
    limiter = ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 10)
    with pytest.raises(ValueError, match="identity"):
        await limiter.check(identity)


@pytest.mark.parametrize("value", [math.nan, math.inf, "now", None])
async def test_clock_returning_garbage_is_an_error(value):
    limiter = ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 10, clock=lambda: value)
    with pytest.raises(ValueError, match="clock"):
        await limiter.check("alice")


async def test_window_ms_gives_sub_second_windows():
    clock = ManualClock(100.0)
    limiter = ratelimit.SlidingWindowLimiter(
        fakeredis.FakeAsyncRedis(), window_ms=250, limit=2, clock=clock
    )
    assert limiter.window_ms == 250
    assert [(await limiter.check("a")).allowed for _ in range(3)] == [True, True, False]
    clock.advance(0.25)
    assert (await limiter.check("a")).allowed


@pytest.mark.parametrize("slack", [-1, 1.5, "0", True])
def test_bad_ttl_slack(slack):
    with pytest.raises(ValueError, match="ttl_slack_ms"):
        ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 10, ttl_slack_ms=slack)


async def test_ttl_slack_extends_the_key_ttl():
    client = fakeredis.FakeAsyncRedis()
    limiter = ratelimit.SlidingWindowLimiter(client, 1, 10, ttl_slack_ms=60_000)
    await limiter.check("alice")
    assert 60_000 < await client.pttl(limiter.key_for("alice")) <= 61_000


def test_virtual_clocks_get_ttl_slack_by_default_real_ones_do_not():
    client = fakeredis.FakeAsyncRedis()
    assert ratelimit.SlidingWindowLimiter(client, 1, 10).ttl_slack_ms == 0
    assert ratelimit.SlidingWindowLimiter(client, 1, 10, clock="redis").ttl_slack_ms == 0
    virtual = ratelimit.SlidingWindowLimiter(client, 1, 10, clock=ManualClock())
    assert virtual.ttl_slack_ms == 3_600_000
    explicit = ratelimit.SlidingWindowLimiter(client, 1, 10, clock=ManualClock(), ttl_slack_ms=0)
    assert explicit.ttl_slack_ms == 0


def test_sliding_log_limit_is_capped_where_its_members_stay_sane():
    client = fakeredis.FakeAsyncRedis()
    assert ratelimit.SlidingWindowLimiter(client, 1, 1_000_000).limit == 1_000_000
    with pytest.raises(ValueError, match="limit must be <= 1000000"):
        ratelimit.SlidingWindowLimiter(client, 1, 1_000_001)
    assert ratelimit.FixedWindowLimiter(client, 1, 10**9).limit == 10**9
