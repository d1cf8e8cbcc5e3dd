"""Options are fixed once a limiter is built; `with_options` makes a changed copy."""

from __future__ import annotations

import time

import fakeredis
import pytest

import ratelimit
import ratelimit.sync
from ratelimit import algorithms
from ratelimit.clock import ManualClock
from ratelimit.lab import reference  # noqa: F401  (registers the models: kind "reference")

KINDS = ["async", "sync", "reference"]
OPTIONS = {
    "window_ms": 2_000,
    "limit": 3,
    "prefix": "other",
    "clock": "redis",
    "on_error": "deny",
    "timeout": 0.5,
    "readable_keys": True,
    "ttl_slack_ms": 5,
}


def build(algorithm: algorithms.Algorithm, kind: str, **options):
    cls = algorithm.limiter_class(kind)
    if kind == "reference":
        return cls(1, 10, **options)
    client = fakeredis.FakeAsyncRedis() if kind == "async" else fakeredis.FakeRedis()
    return cls(client, 1, 10, **options)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", algorithms.ALGORITHMS, ids=algorithms.NAMES)
def test_an_option_cannot_be_reassigned(algorithm, kind):
    limiter = build(algorithm, kind)
    names = [*OPTIONS, "algorithm", "redis", "near_cache", "burst"]
    present = [name for name in names if hasattr(limiter, name)]
    assert len(present) >= len(OPTIONS) + 1
    for name in present:
        before = getattr(limiter, name)
        with pytest.raises(AttributeError, match=rf"with_options\({name}="):
            setattr(limiter, name, before)
        assert getattr(limiter, name) is before


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", algorithms.ALGORITHMS, ids=algorithms.NAMES)
def test_with_options_copies_and_changes_only_what_it_is_told(algorithm, kind):
    key_secret = b"s" * 16
    limiter = build(algorithm, kind, key_secret=key_secret)
    for name, value in OPTIONS.items():
        copy = limiter.with_options(**{name: value})
        assert copy is not limiter and type(copy) is type(limiter)
        assert getattr(copy, name) == value
        unchanged = [n for n in OPTIONS if n not in (name, "ttl_slack_ms")]
        assert [getattr(copy, n) for n in unchanged] == [getattr(limiter, n) for n in unchanged]
        assert getattr(copy, "redis", None) is getattr(limiter, "redis", None)
    # The original is untouched, and the key secret travels with the copy.
    assert (limiter.window_ms, limiter.limit, limiter.clock) == (1_000, 10, time.time)
    assert limiter.with_options(prefix="rl").key_for("alice") == limiter.key_for("alice")


def test_a_virtual_clock_in_a_copy_gets_the_virtual_clock_slack():
    limiter = ratelimit.sync.SlidingWindowLimiter(fakeredis.FakeRedis(), 1, 10)
    assert limiter.ttl_slack_ms == 0
    assert limiter.with_options(clock=ManualClock()).ttl_slack_ms == 3_600_000
    pinned = limiter.with_options(ttl_slack_ms=7)
    assert pinned.with_options(clock=ManualClock()).ttl_slack_ms == 7


def test_window_seconds_replaces_window_ms():
    limiter = ratelimit.sync.FixedWindowLimiter(fakeredis.FakeRedis(), window_ms=250, limit=5)
    assert limiter.with_options(window_seconds=3).window_ms == 3_000
    assert limiter.with_options(window_ms=40).window_ms == 40


def test_gcra_keeps_its_burst_and_can_change_it():
    limiter = ratelimit.TokenBucketLimiter(fakeredis.FakeAsyncRedis(), 1, 10, burst=4)
    assert limiter.with_options(limit=20).burst == 4
    assert limiter.with_options(burst=None).burst == 10
    with pytest.raises(ValueError, match="burst"):
        limiter.with_options(burst=0)


def test_a_copy_has_a_near_cache_of_its_own():
    limiter = ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 10, near_cache=5)
    copy = limiter.with_options(prefix="copy")
    assert copy.near_cache is not limiter.near_cache and copy.near_cache.max_entries == 5
    assert limiter.with_options(near_cache=False).near_cache is None


def test_bad_changes_are_refused_clearly():
    limiter = ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 10)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        limiter.with_options(colour="red")  # type: ignore[call-arg]
    # Options of another limiter's constructor: named, then refused for this one.
    with pytest.raises(TypeError, match="SlidingWindowLimiter has no option.*burst"):
        limiter.with_options(burst=5)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        limiter.with_options(limit=0)
    with pytest.raises(ValueError, match="exactly one of window_seconds and window_ms"):
        limiter.with_options(window_seconds=None)


async def test_a_copy_decides_on_the_same_redis_state():
    client = fakeredis.FakeAsyncRedis()
    clock = ManualClock(1_000.0)
    limiter = ratelimit.SlidingWindowLimiter(client, 1, 2, clock=clock)
    copy = limiter.with_options(timeout=2.0)
    assert (await limiter.check("a")).allowed and (await copy.check("a")).allowed
    assert not (await limiter.check("a")).allowed  # the copy's admission was counted


async def test_window_ms_gives_sub_second_windows():
    clock = ManualClock(100.0)
    limiter = ratelimit.SlidingWindowLimiter(
        fakeredis.FakeAsyncRedis(), window_ms=250, limit=2, clock=clock
    )
    assert limiter.window_ms == 250
    assert [(await limiter.check("a")).allowed for _ in range(3)] == [True, True, False]
    clock.advance(0.25)
    assert (await limiter.check("a")).allowed


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
    assert ratelimit.FixedWindowLimiter(client, 86_400, 10**9).limit == 10**9
    # The fixed window's script keeps window numbers modulo a bound set by the limit:
    # past about 70 million per second it could confuse windows a year apart.
    assert ratelimit.FixedWindowLimiter(client, 1, 7 * 10**7).limit == 7 * 10**7
    with pytest.raises(ValueError, match="fixed window of 80000000 per 1000 ms is beyond"):
        ratelimit.FixedWindowLimiter(client, 1, 8 * 10**7)
