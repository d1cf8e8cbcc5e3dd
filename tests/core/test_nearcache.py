"""The rejection near-cache never changes a decision, and its hits cost no Redis call.

The main property replays random traces twice on one backend, under two key
prefixes: a limiter with the near-cache beside "another process" (a second limiter
without it, writing the same keys), and the same pair without the cache. Rejections
never write, so both worlds hold the same Redis state at every step, and every
decision can be compared with the one Redis gives.
"""

from __future__ import annotations

import asyncio
import uuid

import fakeredis
import pytest
import redis
import redis.asyncio
from hypothesis import example, given, settings
from hypothesis import strategies as st

import ratelimit
import ratelimit.sync
from ratelimit import _core, algorithms
from ratelimit.algorithms import FIXED_WINDOW, SLIDING_LOG
from ratelimit.clock import ManualClock
from ratelimit.decision import Decision
from ratelimit.devtools.process import free_port
from ratelimit.nearcache import NearCache

WINDOW_MS = 1000
LIMIT = 4
START_MS = 1_000_000_000


class CountingFake(fakeredis.FakeAsyncRedis):
    """An embedded client that counts the commands it sends."""

    calls = 0

    async def execute_command(self, *args, **kwargs):
        self.calls += 1
        return await super().execute_command(*args, **kwargs)


class CountingRedis(redis.asyncio.Redis):
    """A real-Redis client that counts the commands it sends."""

    calls = 0

    async def execute_command(self, *args, **kwargs):
        self.calls += 1
        return await super().execute_command(*args, **kwargs)


class CountingSyncFake(fakeredis.FakeRedis):
    calls = 0

    def execute_command(self, *args, **kwargs):
        self.calls += 1
        return super().execute_command(*args, **kwargs)


# One step: (ms to advance, who checks, identity, cost). Time never runs back: every
# writer shares one clock, the condition under which the cache is exact.
steps = st.lists(
    st.tuples(
        st.integers(0, 300),
        st.sampled_from(["main", "main", "main", "other"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 3),
    ),
    min_size=1,
    max_size=60,
)

CLASSES = [a.limiter_class() for a in algorithms.ALGORITHMS if a.near_cache]
# Always among the examples: one client at 3x its limit, then another one joins.
ABUSER = [(7, "main", "a", 1)] * 12 + [(5, "other", "a", 1), (5, "main", "a", 1)]


async def compare_worlds(cls, main_client, other_client, prefix, trace) -> int:
    """Replay `trace` in both worlds, assert the decisions agree; return the local hits."""
    clock = ManualClock()
    now = START_MS
    clock.set_ms(now)

    def make(client, world, near_cache=False):
        return cls(
            client,
            None,
            LIMIT,
            window_ms=WINDOW_MS,
            prefix=f"{prefix}:{world}",
            clock=clock,
            near_cache=near_cache,
        )

    cached, cached_other = make(main_client, "A", True), make(other_client, "A")
    plain, plain_other = make(other_client, "B"), make(other_client, "B")
    # Identities that another process got admitted on since the cached limiter last
    # heard from Redis about them: Redis may then report a later retry than the cache.
    touched: set[str] = set()
    for gap, who, identity, cost in trace:
        now += gap
        clock.set_ms(now)
        if who == "other":
            mine = await cached_other.check(identity, cost)
            assert mine == await plain_other.check(identity, cost)
            if mine.allowed:
                touched.add(identity)
            continue
        before = main_client.calls
        got = await cached.check(identity, cost)
        want = await plain.check(identity, cost)
        assert got.allowed == want.allowed, (got, want)
        if main_client.calls > before:  # Redis answered: the very same decision
            assert got == want
            touched.discard(identity)
            continue
        assert not got.allowed  # only rejections are ever answered locally
        exact_remaining = cost == 1 or cls.algorithm == FIXED_WINDOW
        if identity not in touched:
            assert (got.retry_after_ms, got.reset_after_ms) == (
                want.retry_after_ms,
                want.reset_after_ms,
            )
            assert got == want if exact_remaining else got.remaining <= want.remaining
        else:  # still rejected; the cache knows only the state at its rejection
            assert 1 <= got.retry_after_ms <= want.retry_after_ms
            assert got.reset_after_ms <= want.reset_after_ms
        assert got.decided_at_ms == now
    return cached.near_cache.hits


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_cached_decisions_equal_redis_decisions_embedded(cls):
    hits: list[int] = []

    @settings(max_examples=80, deadline=None)
    @given(trace=steps)
    @example(trace=ABUSER)
    def prop(trace):
        async def run() -> None:
            server = fakeredis.FakeServer()
            main = CountingFake(server=server)
            other = fakeredis.FakeAsyncRedis(server=server)
            hits.append(await compare_worlds(cls, main, other, "nc", trace))

        asyncio.run(run())

    prop()
    assert sum(hits) > 0  # the traces did exercise the cache


@pytest.mark.real_redis
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_cached_decisions_equal_redis_decisions_real(cls, real_redis_url, prefix):
    hits: list[int] = []

    @settings(max_examples=15, deadline=None)
    @given(trace=steps)
    @example(trace=ABUSER)
    def prop(trace):
        async def run() -> None:
            main = CountingRedis.from_url(real_redis_url, socket_timeout=5)
            other = redis.asyncio.Redis.from_url(real_redis_url, socket_timeout=5)
            try:
                # A fresh sub-prefix per example: the worlds start empty.
                sub = f"{prefix}:{uuid.uuid4().hex[:8]}"
                hits.append(await compare_worlds(cls, main, other, sub, trace))
            finally:
                await main.aclose()
                await other.aclose()

        asyncio.run(run())

    prop()
    assert sum(hits) > 0


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
async def test_an_abusive_client_is_rejected_locally_without_redis_calls(cls):
    """10x the limit within one window: after the first rejection, Redis is not asked
    again until the retry time has passed, and the decisions are Redis's own."""
    server = fakeredis.FakeServer()
    main = CountingFake(server=server)
    clock = ManualClock()
    clock.set_ms(START_MS)
    kw = dict(window_ms=WINDOW_MS, clock=clock)
    cached = cls(main, None, 10, prefix="A", near_cache=True, **kw)
    plain = cls(fakeredis.FakeAsyncRedis(server=server), None, 10, prefix="B", **kw)
    calls_at_rejection = None
    for i in range(100):  # one request per ms: 100 in the first 100 ms
        clock.set_ms(START_MS + i)
        got, want = await cached.check("abuser"), await plain.check("abuser")
        assert got == want
        if not got.allowed and calls_at_rejection is None:
            calls_at_rejection = main.calls
    assert calls_at_rejection is not None
    assert main.calls == calls_at_rejection  # 89 further rejections, 0 Redis calls
    assert cached.near_cache.hits == 89
    clock.set_ms(START_MS + WINDOW_MS)  # the first entry has left: Redis is asked again
    assert (await cached.check("abuser")).allowed
    assert main.calls == calls_at_rejection + 1


def test_sync_limiters_cache_the_same_way():
    server = fakeredis.FakeServer()
    main = CountingSyncFake(server=server)
    clock = ManualClock()
    now = START_MS
    for sync_cls in (ratelimit.sync.SlidingWindowLimiter, ratelimit.sync.FixedWindowLimiter):
        kw = dict(window_ms=WINDOW_MS, clock=clock, prefix=f"s:{sync_cls.__name__}")
        cached = sync_cls(main, None, 3, near_cache=True, **{**kw, "prefix": kw["prefix"] + "A"})
        plain = sync_cls(fakeredis.FakeRedis(server=server), None, 3, **kw)
        local = 0
        for i in range(40):
            now += 37
            clock.set_ms(now)
            before = main.calls
            cost = 1 + (i // 5) % 2  # runs of one cost, as a client sends them
            got = cached.check("x", cost)
            want = plain.check("x", cost)
            assert (got.allowed, got.retry_after_ms, got.reset_after_ms) == (
                want.allowed,
                want.retry_after_ms,
                want.reset_after_ms,
            )
            if cost == 1 or sync_cls is ratelimit.sync.FixedWindowLimiter:
                assert got == want
            else:  # the log at cost > 1: older entries may have left meanwhile
                assert got.remaining <= want.remaining
            local += main.calls == before
        assert local == cached.near_cache.hits > 0


async def test_smaller_costs_still_ask_redis_and_larger_ones_too_for_the_log():
    """A rejection at cost c says nothing about a smaller cost; for the log, a larger
    cost's retry depends on an entry the cache never saw."""
    main = CountingFake()
    clock = ManualClock()
    clock.set_ms(START_MS)
    limiter = ratelimit.SlidingWindowLimiter(main, 1, 4, clock=clock, near_cache=True)
    assert (await limiter.check("a", 3)).allowed
    assert not (await limiter.check("a", 2)).allowed
    calls = main.calls
    assert not (await limiter.check("a", 2)).allowed and main.calls == calls  # local
    assert (await limiter.check("a", 1)).allowed and main.calls == calls + 1
    assert not (await limiter.check("a", 3)).allowed and main.calls == calls + 2


def test_redis_clock_counts_from_sending_and_reports_from_receiving(monkeypatch):
    """clock="redis": the script's time is unknown here, so the rejection holds for T
    from the moment the request left (never too long), and retry/reset count from the
    moment the answer arrived (never too short)."""
    queued: list[float] = []  # monotonic readings (s) for the next calls, then `now`
    now = [1.0]
    monkeypatch.setattr(_core, "_monotonic", lambda: queued.pop(0) if queued else now[0])
    client = CountingSyncFake()
    limiter = ratelimit.sync.SlidingWindowLimiter(client, 1, 1, clock="redis", near_cache=True)
    assert limiter.check("a").allowed
    queued[:] = [5_000.000, 5_000.050]  # sent, then the answer arrives 50 ms later
    rejected = limiter.check("a")
    assert not rejected.allowed and rejected.retry_after_ms > 1
    retry, calls = rejected.retry_after_ms, client.calls
    now[0] = 5_000.000 + (retry - 1) / 1000  # 1 ms before T is up, counted from sending
    local = limiter.check("a")
    assert client.calls == calls and not local.allowed
    assert local.retry_after_ms == 51  # counted from the arrival: 1 ms + 50 ms
    now[0] = 5_000.000 + retry / 1000  # T is up: Redis decides again
    limiter.check("a")
    assert client.calls > calls


def rejection(retry: int = 100, reset: int = 200, remaining: int = 0) -> Decision:
    return Decision(False, 10, remaining, retry, reset, decided_at_ms=7)


def test_memory_is_bounded_and_expired_entries_go_first():
    cache = NearCache(SLIDING_LOG, 10, size=8)
    for i in range(4):  # these expire at 100
        cache.remember(f"old{i}", 1, rejection(retry=100), 0, 0)
    for i in range(4):  # these hold until 10_050
        cache.remember(f"live{i}", 1, rejection(retry=10_000), 50, 50)
    cache.remember("new", 1, rejection(retry=10_000), 200, 200)  # full: the expired go
    assert len(cache) == 5
    assert all(cache.lookup(f"live{i}", 1, 300) is not None for i in range(4))
    for i in range(20):
        cache.remember(f"more{i}", 1, rejection(retry=10_000), 300, 300)
        assert len(cache) <= 8
    assert cache.lookup("more19", 1, 301) is not None  # the newest stay
    assert cache.lookup("live0", 1, 301) is None  # the oldest were evicted


def test_allowed_and_degraded_decisions_are_not_cached():
    cache = NearCache(SLIDING_LOG, 10)
    cache.remember("a", 1, Decision(True, 10, 3, 0, 500), 0, 0)
    cache.remember("b", 1, Decision(False, 10, 0, 1000, 1000, degraded=True), 0, 0)
    assert len(cache) == 0


async def test_a_degraded_rejection_does_not_stick():
    """Redis down, on_error="deny": each check is a degraded rejection of its own;
    nothing is cached, so the first check after Redis is back asks it."""
    client = redis.asyncio.Redis(port=free_port(), socket_connect_timeout=0.2)
    limiter = ratelimit.SlidingWindowLimiter(
        client, 1, 10, on_error="deny", timeout=0.5, near_cache=True
    )
    try:
        decision = await limiter.check("a")
        assert decision.degraded and not decision.allowed
        assert len(limiter.near_cache) == 0
    finally:
        await client.aclose()


def test_near_cache_time_runs_backwards_safely():
    cache = NearCache(FIXED_WINDOW, 10)
    cache.remember("a", 1, rejection(retry=100, reset=100), 1_000, 1_000)
    assert cache.lookup("a", 1, 999) is None  # before the rejection: Redis decides
    assert cache.lookup("a", 5, 1_050).retry_after_ms == 50  # larger costs too (fw)
    assert cache.lookup("a", 1, 1_100) is None and len(cache) == 0


@pytest.mark.parametrize(
    "cls",
    [
        ratelimit.TokenBucketLimiter,
        ratelimit.SlidingWindowCounterLimiter,
        ratelimit.sync.TokenBucketLimiter,
        ratelimit.sync.SlidingWindowCounterLimiter,
    ],
    ids=lambda c: f"{c.__module__}.{c.__name__}",
)
def test_inexact_algorithms_refuse_the_cache(cls):
    client = (
        fakeredis.FakeRedis() if cls.__module__.endswith("sync") else fakeredis.FakeAsyncRedis()
    )
    with pytest.raises(ValueError, match="near_cache is exact only for"):
        cls(client, 1, 10, near_cache=True)
    assert cls(client, 1, 10).near_cache is None


@pytest.mark.parametrize("bad", [0, -1, "yes", 1.5, 10**9])
def test_bad_near_cache_values_are_refused(bad):
    with pytest.raises(ValueError, match="near_cache must be"):
        ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 10, near_cache=bad)


def test_near_cache_size_is_configurable():
    limiter = ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 10, near_cache=50)
    assert limiter.near_cache.max_entries == 50
