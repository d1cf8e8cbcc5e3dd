"""Concurrency leases (`ConcurrencyLimiter`, asyncio and sync) on the embedded fakeredis
and a real Redis, and on a Redis Cluster: at most `limit` leases held per identity, a
rejection's wait is the earliest lease's expiry, release and renew say whether the
lease was held, a dead holder's lease expires after `lease_seconds`, concurrent
acquires never hold more than the limit, `hold` releases on every exit, and Redis
being down gets the failure policy (a release never raises into `hold`'s exit)."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from redis.crc import key_slot

import ratelimit
import ratelimit.sync
from ratelimit import ConcurrencyLimiter, RateLimiterUnavailable, algorithms
from ratelimit._core import LEASE_ACQUIRE
from ratelimit.clock import ManualClock
from ratelimit.devtools.process import free_port
from ratelimit.keys import route_key

MODES = pytest.mark.parametrize("mode", ["async", "sync"])


def make(mode: str, client: Any, *args: Any, **kwargs: Any) -> Any:
    cls = ratelimit.ConcurrencyLimiter if mode == "async" else ratelimit.sync.ConcurrencyLimiter
    return cls(client, *args, **kwargs)


async def call(limiter: Any, method: str, *args: Any) -> Any:
    """`limiter.<method>(*args)`: awaited, or in a worker thread for a sync limiter."""
    bound = getattr(limiter, method)
    if isinstance(limiter, ratelimit.sync.SyncLimiter):
        return await asyncio.to_thread(bound, *args)
    return await bound(*args)


@pytest.fixture
def either(mode, client, sync_client):
    """The client of the mode under test, on the backend under test."""
    return client if mode == "async" else sync_client


async def held(client: Any, key: str) -> int:
    count = client.zcard(key)
    return await count if asyncio.iscoroutine(count) else count


# Acquire, reject, release, renew -------------------------------------------------------


@MODES
async def test_limit_leases_then_a_rejection_until_the_earliest_expires(mode, either, prefix):
    clock = ManualClock(1_000.0)
    limiter = make(mode, either, 3, 10, prefix, clock=clock)
    first = await call(limiter, "acquire", "who")
    clock.advance(2)
    others = [await call(limiter, "acquire", "who") for _ in range(2)]
    assert [d.allowed for d in (first, *others)] == [True, True, True]
    assert [d.remaining for d in (first, *others)] == [2, 1, 0]
    leases = {d.lease for d in (first, *others)}
    assert len(leases) == 3 and None not in leases
    clock.advance(1)
    rejected = await call(limiter, "acquire", "who")
    assert not rejected.allowed and rejected.lease is None and rejected.remaining == 0
    # The first lease expires 10 s after it was taken, 7 s from now; the last at 9 s.
    assert rejected.retry_after_ms == 7_000 and rejected.retry_after == 7
    assert rejected.reset_after_ms == 9_000
    assert await held(either, limiter.key_for("who")) == 3
    # Another identity has its own leases.
    assert (await call(limiter, "acquire", "someone else")).allowed


@MODES
async def test_release_frees_a_slot_and_says_whether_the_lease_was_held(mode, either, prefix):
    limiter = make(mode, either, 1, 30, prefix, clock=ManualClock(5.0))
    lease = (await call(limiter, "acquire", "who")).lease
    assert not (await call(limiter, "acquire", "who")).allowed
    assert await call(limiter, "release", "who", lease) is True
    assert await call(limiter, "release", "who", lease) is False  # idempotent
    assert await call(limiter, "release", "who", "never-issued") is False
    assert await call(limiter, "release", "who", None) is False  # a degraded admit's
    again = await call(limiter, "acquire", "who")
    assert again.allowed and again.lease != lease
    assert await held(either, limiter.key_for("who")) == 1


@MODES
async def test_renew_extends_a_held_lease_and_never_takes_one_back(mode, either, prefix):
    clock = ManualClock(100.0)
    limiter = make(mode, either, 1, 10, prefix, clock=clock)
    lease = (await call(limiter, "acquire", "who")).lease
    clock.advance(8)
    assert await call(limiter, "renew", "who", lease) is True
    clock.advance(8)  # 16 s after the acquire, 8 s after the renew: still held
    blocked = await call(limiter, "acquire", "who")
    assert not blocked.allowed and blocked.retry_after_ms == 2_000
    clock.advance(2)  # now expired
    assert await call(limiter, "renew", "who", lease) is False
    assert await held(either, limiter.key_for("who")) == 0
    assert (await call(limiter, "acquire", "who")).allowed


@MODES
async def test_a_dead_holders_lease_expires_after_lease_seconds(mode, either, prefix):
    clock = ManualClock(50.0)
    limiter = make(mode, either, 2, 30, prefix, clock=clock)
    for _ in range(2):  # taken by holders that never release
        assert (await call(limiter, "acquire", "who")).allowed
    clock.advance(29.999)
    assert not (await call(limiter, "acquire", "who")).allowed
    clock.advance(0.001)
    after = await call(limiter, "acquire", "who")
    assert after.allowed and after.remaining == 1  # both dead leases were dropped
    assert await held(either, limiter.key_for("who")) == 1


@MODES
async def test_a_short_lease_on_redis_clock_expires_no_sooner_than_its_lifetime(
    mode, either, prefix
):
    """Redis's clock (the default): a lease of 300 ms blocks the next acquire until it
    has expired, and no longer than it takes to notice (polled every 20 ms)."""
    limiter = make(mode, either, 1, prefix=prefix, lease_ms=300)
    assert limiter.clock == "redis"
    start = time.monotonic()  # before Redis stamps the lease: a lower bound of its start
    taken = await call(limiter, "acquire", "who")
    assert taken.allowed
    first_no = await call(limiter, "acquire", "who")
    assert not first_no.allowed and 0 < first_no.retry_after_ms <= 300
    while not (await call(limiter, "acquire", "who")).allowed:
        assert time.monotonic() - start < 5, "the lease never expired"
        await asyncio.sleep(0.02)
    # Redis's TIME and this host's monotonic clock both count real time (to the ms).
    assert time.monotonic() - start >= 0.3 - 0.002


# Concurrency ----------------------------------------------------------------------------


async def test_fifty_concurrent_acquires_hold_exactly_the_limit(client, prefix):
    limiter = ConcurrencyLimiter(client, 4, 30, prefix)
    decisions = await asyncio.gather(*(limiter.acquire("hot") for _ in range(50)))
    admitted = [d for d in decisions if d.allowed]
    assert len(admitted) == 4 and len({d.lease for d in admitted}) == 4
    assert all(d.retry_after_ms > 0 and d.lease is None for d in decisions if not d.allowed)
    assert await client.zcard(limiter.key_for("hot")) == 4
    members = {m.decode() for m in await client.zrange(limiter.key_for("hot"), 0, -1)}
    assert members == {d.lease for d in admitted}


def test_fifty_threads_acquire_exactly_the_limit(sync_client, prefix):
    limiter = ratelimit.sync.ConcurrencyLimiter(sync_client, 4, 30, prefix)
    with ThreadPoolExecutor(50) as pool:
        decisions = list(pool.map(lambda _: limiter.acquire("hot"), range(50)))
    assert sum(d.allowed for d in decisions) == 4
    assert sync_client.zcard(limiter.key_for("hot")) == 4


async def test_holders_in_flight_never_exceed_the_limit(client, prefix):
    """Waves of 60 tasks in `hold`: the admitted ones stay inside until every task of
    the wave has its decision, so exactly 3 are in flight at once; each wave's leases
    are all given back, so the next wave gets 3 again."""
    limiter = ConcurrencyLimiter(client, 3, 30, prefix, timeout=20)
    for _ in range(2):
        in_flight = peak = decided = 0
        everyone_decided = asyncio.Event()

        async def worker(everyone_decided: asyncio.Event = everyone_decided) -> None:
            nonlocal in_flight, peak, decided
            async with limiter.hold("busy") as decision:
                decided += 1
                if decided == 60:
                    everyone_decided.set()
                if decision.allowed:
                    in_flight += 1
                    peak = max(peak, in_flight)
                    await everyone_decided.wait()
                    in_flight -= 1

        await asyncio.gather(*(worker() for _ in range(60)))
        assert peak == 3 and in_flight == 0
        assert await client.zcard(limiter.key_for("busy")) == 0


async def test_an_acquire_sent_again_holds_one_lease(client, prefix):
    """A retry after a dropped connection sends the same call again (ratelimit.plan):
    the lease id is the client's, so the second run renews it rather than adding one."""
    limiter = ConcurrencyLimiter(client, 2, 30, prefix, clock=ManualClock(10.0))
    keys, args = limiter._prepare("who", 1)
    assert args[1] == LEASE_ACQUIRE
    first = limiter._decided(await limiter._run(keys, args), keys, args, 0.0)
    again = limiter._decided(await limiter._run(keys, args), keys, args, 0.0)
    assert first.allowed and again.allowed and first.lease == again.lease
    assert await client.zcard(keys[0]) == 1
    assert (await limiter.acquire("who")).remaining == 0


# hold() --------------------------------------------------------------------------------


async def test_hold_releases_on_exit_exception_and_cancellation(client, prefix):
    limiter = ConcurrencyLimiter(client, 1, 30, prefix)
    key = limiter.key_for("who")
    async with limiter.hold("who") as decision:
        assert decision.allowed and await client.zcard(key) == 1
    assert await client.zcard(key) == 0

    with pytest.raises(ZeroDivisionError):
        async with limiter.hold("who"):
            raise ZeroDivisionError("the body failed")
    assert await client.zcard(key) == 0

    inside = asyncio.Event()

    async def stuck() -> None:
        async with limiter.hold("who") as decision:
            assert decision.allowed
            inside.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(stuck())
    await inside.wait()
    assert await client.zcard(key) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await client.zcard(key) == 0


async def test_hold_without_a_slot_runs_the_body_with_the_rejection(client, prefix):
    limiter = ConcurrencyLimiter(client, 1, 30, prefix)
    async with limiter.hold("who") as outer:
        async with limiter.hold("who") as inner:
            assert outer.allowed and not inner.allowed and inner.retry_after >= 1
        assert await client.zcard(limiter.key_for("who")) == 1  # the outer one, still held
    assert await client.zcard(limiter.key_for("who")) == 0


def test_sync_hold_releases_on_exit_and_exception(sync_client, prefix):
    limiter = ratelimit.sync.ConcurrencyLimiter(sync_client, 1, 30, prefix)
    key = limiter.key_for("who")
    with pytest.raises(KeyError):
        with limiter.hold("who") as decision:
            assert decision.allowed and sync_client.zcard(key) == 1
            raise KeyError("boom")
    assert sync_client.zcard(key) == 0
    with limiter.hold("who") as first, limiter.hold("who") as second:
        assert first.allowed and not second.allowed
    assert sync_client.zcard(key) == 0


# Redis down: the failure policy --------------------------------------------------------


@MODES
async def test_redis_down_follows_the_failure_policy(mode, caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens
    client = ratelimit.connect(url) if mode == "async" else ratelimit.connect_sync(url)
    try:
        strict = make(mode, client, 2, 30, on_error="raise", timeout=0.5)
        with pytest.raises(RateLimiterUnavailable):
            await call(strict, "acquire", "who")
        with pytest.raises(RateLimiterUnavailable):
            await call(strict, "release", "who", "some-lease")

        open_ = make(mode, client, 2, 30, on_error="allow", timeout=0.5)
        admitted = await call(open_, "acquire", "who")
        assert admitted.allowed and admitted.degraded and admitted.lease is None
        closed = make(mode, client, 2, 30, on_error="deny", timeout=0.5)
        denied = await call(closed, "acquire", "who")
        assert not denied.allowed and denied.degraded and denied.retry_after == 1
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ratelimit"):
            assert await call(closed, "release", "who", "some-lease") is False
            assert await call(open_, "renew", "who", "some-lease") is False
        assert len(caplog.records) == 2
    finally:
        result = client.aclose() if mode == "async" else client.close()
        if asyncio.iscoroutine(result):
            await result


async def test_a_release_that_fails_never_raises_into_holds_exit(prefix, caplog):
    """on_error="raise": the acquire succeeded, then Redis went away (here: the release
    is made to fail); leaving `hold` logs the failure and does not raise."""
    client = ratelimit.connect(embedded=True)
    limiter = ConcurrencyLimiter(client, 1, 30, prefix, on_error="raise")

    async def broken(*args: Any) -> Any:
        raise redis.exceptions.ConnectionError("gone")

    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        async with limiter.hold("who") as decision:
            assert decision.allowed
            object.__setattr__(limiter, "_run", broken)
    assert any("lease not released" in r.getMessage() for r in caplog.records)
    assert await client.zcard(limiter.key_for("who")) == 1  # it expires by itself
    await client.aclose()


# Keys, the cluster, bad input ----------------------------------------------------------


def test_keys_carry_the_lease_tag_and_lifetime(prefix):
    embedded = ratelimit.connect_sync(embedded=True)
    limiter = ratelimit.sync.ConcurrencyLimiter(embedded, 4, 30, prefix)
    key = limiter.key_for("api-key")
    assert key.startswith(f"{prefix}:lease:30000:{{") and key.endswith("}")
    assert algorithms.get("lease") is algorithms.LEASES is limiter.algorithm
    assert route_key("k", scope="geofence", prefix=prefix, algorithm="lease", window_ms=30_000) == (
        limiter.key_for("geofence:key:k")
    )
    # A rate limiter of the same identity, prefix and window has another key.
    rate = ratelimit.sync.SlidingWindowLimiter(ratelimit.connect_sync(embedded=True), 30, 4, prefix)
    assert rate.key_for("api-key") != key
    assert limiter.with_options(limit=9).key_for("api-key") == key  # a new limit keeps it
    assert limiter.with_options(limit=9).limit == 9


@MODES
async def test_on_a_cluster_a_lease_is_one_key_in_one_slot(mode, cluster, prefix):
    client = (ratelimit.connect if mode == "async" else ratelimit.connect_sync)(cluster.url)
    try:
        limiter = make(mode, client, 2, 30, prefix)
        identities = ["{alice}", "a\nb", "x" * 10_000, "plain"]
        leases = {}
        for who in identities:
            decisions = [await call(limiter, "acquire", who) for _ in range(3)]
            assert [d.allowed for d in decisions] == [True, True, False]
            leases[who] = decisions[0].lease
        for who in identities:
            key = limiter.key_for(who)
            with cluster.nodes[0].admin() as admin:
                assert admin.cluster("KEYSLOT", key) == key_slot(key.encode())
            assert await call(limiter, "release", who, leases[who]) is True
            assert (await call(limiter, "acquire", who)).allowed
    finally:
        result = client.aclose() if mode == "async" else client.close()
        if asyncio.iscoroutine(result):
            await result


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lease_seconds": 0}, "lease_seconds must be"),
        ({"lease_seconds": "30"}, "lease_seconds must be"),
        ({"lease_seconds": True}, "lease_seconds must be"),
        ({"lease_seconds": 5, "lease_ms": 5000}, "lease_seconds or lease_ms"),
        ({"lease_ms": 0}, "window_ms must be"),
        ({"limit": 0}, "limit must be"),
        ({"limit": 2.5}, "limit must be"),
        ({"near_cache": True}, "near_cache does not apply"),
        ({"on_error": "maybe"}, "on_error"),
    ],
)
def test_bad_options_name_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ratelimit.sync.ConcurrencyLimiter(ratelimit.connect_sync(embedded=True), **kwargs)


def test_bad_calls_name_the_parameter(prefix):
    embedded = ratelimit.connect_sync(embedded=True)
    limiter = ratelimit.sync.ConcurrencyLimiter(embedded, 2, 30, prefix)
    with pytest.raises(ValueError, match="cost must be 1"):
        limiter.check("who", 2)
    with pytest.raises(ValueError, match="lease must be"):
        limiter.release("who", "")
    with pytest.raises(ValueError, match="lease must be"):
        limiter.renew("who", 7)
    with pytest.raises(ValueError, match="identity"):
        limiter.acquire("")


@pytest.mark.private_redis
@pytest.mark.parametrize("redis_clock", [False, True], ids=["app-clock", "redis-clock"])
def test_commands_per_path_match_info_commandstats(private_redis, redis_clock):
    """The registry's count of commands per acquire (admitted or not) is what Redis
    counts; a release is one ZREM; Redis's clock adds one TIME to each acquire (a
    release needs no time)."""
    client = private_redis.client()
    clock = "redis" if redis_clock else ManualClock(1_000.0)
    limiter = ratelimit.sync.ConcurrencyLimiter(client, 2, 60, clock=clock)
    limiter.acquire("warm-up")  # loads the script
    client.config_resetstat()
    counts = algorithms.LEASES.commands
    decisions = [limiter.acquire("who") for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert limiter.release("who", decisions[0].lease) is True
    stats = client.info("commandstats")
    ours = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_script", "cmdstat_config", "cmdstat_info")
    inner = {k: v["calls"] for k, v in stats.items() if not k.startswith(ours)}
    time_calls = 3 if redis_clock else 0
    assert sum(inner.values()) == counts.opening + counts.admit + counts.reject + 1 + time_calls
    assert inner["cmdstat_zrem"] == 1 and inner.get("cmdstat_time", 0) == time_calls
    client.close()


@MODES
async def test_a_lease_has_no_peek_and_reset_forgets_every_lease(mode, either, prefix):
    limiter = make(mode, either, 2, 10, prefix, clock=ManualClock(1_000.0))
    for _ in range(2):
        assert (await call(limiter, "acquire", "who")).allowed
    assert not (await call(limiter, "acquire", "who")).allowed
    with pytest.raises(TypeError, match="ConcurrencyLimiter has no peek"):
        await call(limiter, "peek", "who")
    assert await held(either, limiter.key_for("who")) == 2  # the refused peek sent nothing
    assert await call(limiter, "reset", "who") is True
    assert await held(either, limiter.key_for("who")) == 0
    assert (await call(limiter, "acquire", "who")).allowed


def test_leases_refuse_plain_keys_that_would_share_a_routes_key():
    client = ratelimit.connect(embedded=True)
    with pytest.raises(ValueError, match="plain_keys does not apply to leases"):
        ratelimit.ConcurrencyLimiter(client, 4, 30, plain_keys=True)
