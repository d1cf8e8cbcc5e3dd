"""The compact sliding log (`storage="compact"`): the sorted-set log's decisions in a
hash of 6-byte entries, on fakeredis and real Redis."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ratelimit.sync
from ratelimit import SlidingWindowLimiter, algorithms
from ratelimit import clock as clocks
from ratelimit.clock import ManualClock
from ratelimit.lab import reference

CHUNK = 63  # entries per chunk in lua/compact_log.lua


def compact(client, *args, **options) -> SlidingWindowLimiter:
    return SlidingWindowLimiter(client, *args, storage="compact", **options)


def test_storage_picks_the_script_and_the_key_tag():
    import fakeredis

    client = fakeredis.FakeAsyncRedis()
    log = compact(client, 1, 10)
    assert log.algorithm is algorithms.COMPACT_LOG and log.storage == "compact"
    assert log.key_for("a").startswith("rl:logc:1000:{")
    assert SlidingWindowLimiter(client, 1, 10).storage == "compact"  # the default
    sorted_set = SlidingWindowLimiter(client, 1, 10, storage="sorted-set")
    assert sorted_set.algorithm is algorithms.SLIDING_LOG
    assert log.with_options(limit=5).storage == "compact"
    assert algorithms.get(log) is algorithms.COMPACT_LOG
    with pytest.raises(ValueError, match="storage must be one of sorted-set, compact"):
        SlidingWindowLimiter(client, 1, 10, storage="list")
    with pytest.raises(AttributeError, match="fixed once a limiter is built"):
        log.algorithm = algorithms.SLIDING_LOG


async def test_twelve_requests_at_ten_per_second(client, prefix):
    limiter = compact(client, 1, 10, prefix=prefix)
    decisions = [await limiter.check("alice") for _ in range(12)]
    assert [d.allowed for d in decisions] == [True] * 10 + [False] * 2
    assert [d.remaining for d in decisions[:10]] == list(range(9, -1, -1))
    assert all(d.retry_after >= 1 and d.remaining == 0 for d in decisions[10:])
    key = limiter.key_for("alice")
    assert await client.type(key) == b"hash"
    assert 0 < await client.pttl(key) <= 1000


async def test_a_rejection_writes_nothing(client, prefix, clock):
    limiter = compact(client, 1, 3, prefix=prefix, clock=clock)
    key = limiter.key_for("alice")
    for _ in range(3):
        assert (await limiter.check("alice")).allowed
    before = await client.hgetall(key)
    for _ in range(5):
        clock.advance(0.1)
        assert not (await limiter.check("alice")).allowed
    assert await client.hgetall(key) == before


async def test_a_late_request_is_decided_at_the_newest_entry(client, prefix, clock):
    """As the sorted-set log: a request stamped before the newest entry is decided and
    recorded at the newest entry's time, never trimming what an earlier one counted."""
    limiter = compact(client, 1, 3, prefix=prefix, clock=clock)
    base = clocks.to_ms(clock())
    for offset_ms in (0, 1, 2, 1_001):
        clock.set_ms(base + offset_ms)
        assert (await limiter.check("alice")).allowed
    clock.set_ms(base + 999)
    late = await limiter.check("alice")
    assert late.allowed and late.decided_at_ms == base + 1_001
    clock.set_ms(base + 1_001)
    assert not (await limiter.check("alice")).allowed  # 2, 1001, 1001 are in the window


async def test_fifty_concurrent_checks_admit_exactly_the_limit(client, prefix):
    for round_ in range(10):
        limiter = compact(client, 60, 10, prefix=f"{prefix}:{round_}")
        decisions = await asyncio.gather(*(limiter.check("alice") for _ in range(50)))
        assert sum(d.allowed for d in decisions) == 10


async def test_key_outlives_an_entry_stamped_in_the_future(client, prefix):
    ahead = compact(client, 1, 10, prefix=prefix, clock=lambda: time.time() + 5)
    now = compact(client, 1, 10, prefix=prefix, clock_tolerance_ms=10_000)
    await ahead.check("alice")
    assert (await now.check("alice")).reset_after_ms > 5000
    assert await client.pttl(now.key_for("alice")) > 5000


async def test_an_entry_beyond_the_tolerance_is_brought_back_to_it(client, prefix):
    ahead = compact(client, 1, 10, prefix=prefix, clock=lambda: time.time() + 5)
    now = compact(client, 1, 10, prefix=prefix)
    await ahead.check("alice")
    decision = await now.check("alice")
    assert decision.remaining == 8
    # Window + tolerance, plus a slack for the moments between the two checks' clocks
    # (a few ms on a quiet machine, 10 measured beside two CPU burners).
    assert 1000 < decision.reset_after_ms <= 2000 + 25
    assert 1000 < await client.pttl(now.key_for("alice")) <= 2000 + 25


def test_chunks_are_written_once_and_dropped_once_left_behind(sync_client, prefix):
    """Fields stay bounded by the entries in the window: the head, the tail and the
    chunks between them; chunks the window has left are deleted."""
    clock = ManualClock(1_000_000.0)
    limiter = ratelimit.sync.SlidingWindowLimiter(
        sync_client, 10, 1000, prefix=prefix, clock=clock, storage="compact"
    )
    key = limiter.key_for("alice")
    start = clocks.to_ms(clock())
    for second in range(40):  # one every 20 ms for 40 s: 500 in a 10 s window
        for i in range(50):
            clock.set_ms(start + 1000 * second + 20 * i)
            assert limiter.check("alice").allowed
        fields = sync_client.hkeys(key)
        in_window = min(50 * (second + 1), 500)
        assert len(fields) <= -(-in_window // CHUNK) + 2, (second, fields)
    clock.set_ms(start + 40_000)  # the entry stamped 30,000 ms has just left: 499 are in
    assert limiter.check("alice").remaining == 1000 - 499 - 1


# Each example writes under a prefix of its own, so sharing the client is safe.
SHARED_FIXTURE = [HealthCheck.function_scoped_fixture]


@settings(max_examples=40, deadline=None, suppress_health_check=SHARED_FIXTURE)
@given(
    limit=st.integers(60, 300),
    steps=st.lists(
        st.tuples(
            st.one_of(st.just(0), st.integers(1, 30), st.integers(500, 5000)),  # gap, ms
            st.integers(1, 300),  # cost (clipped to the limit)
            st.booleans(),  # late: stamped 40 ms before the clock
        ),
        min_size=1,
        max_size=120,
    ),
)
def test_many_chunks_decide_like_the_model(sync_client, prefix, limit, steps):
    """Limits above a chunk, costs up to the limit, pauses that leave whole chunks
    behind and late stamps: every decision equals the reference model's."""
    clock = ManualClock(1_796_000_000.0)
    name = f"{prefix}:{time.perf_counter_ns()}"
    limiter = ratelimit.sync.SlidingWindowLimiter(
        sync_client, None, limit, window_ms=1000, prefix=name, clock=clock, storage="compact",
        ttl_slack_ms=60_000,
    )  # fmt: skip
    model = reference.SlidingWindowLimiter(None, limit, window_ms=1000, clock=clock)
    now = clocks.to_ms(clock())
    for gap, cost, late in steps:
        now += gap
        clock.set_ms(now - 40 if late else now)
        cost = min(cost, limit)
        assert limiter.check("who", cost=cost) == model.check("who", cost=cost)


def test_memory_per_admitted_unit(real_redis_url, prefix):
    """At most 12 bytes per admitted unit from 128 entries up (MEMORY USAGE)."""
    client = redis.Redis.from_url(real_redis_url)
    try:
        for n in (128, 129, 1_000, 20_000):
            limiter = ratelimit.sync.SlidingWindowLimiter(
                client, 3600, n, prefix=f"{prefix}:{n}", storage="compact"
            )
            for start in range(0, n, 5_000):
                limiter.check_many(["who"] * min(5_000, n - start))
            key = limiter.key_for("who")
            assert not limiter.check("who").allowed  # full: exactly n entries
            assert client.memory_usage(key, samples=0) / n <= 12.0, n
    finally:
        client.close()


def test_a_whole_limit_at_once_spans_many_chunks(sync_client, prefix):
    clock = ManualClock(1_000_000.0)
    limiter = ratelimit.sync.SlidingWindowLimiter(
        sync_client, 1, 100_000, prefix=prefix, clock=clock, storage="compact"
    )
    assert limiter.check("who", cost=100_000).remaining == 0
    rejected = limiter.check("who")
    assert not rejected.allowed and rejected.retry_after_ms == 1000
    clock.advance(1.0)
    assert limiter.check("who", cost=100_000).allowed
    assert len(sync_client.hkeys(limiter.key_for("who"))) <= 100_000 // CHUNK + 3


def test_commands_per_check(private_redis):
    """HGET, HSET and PEXPIRE to admit; HGET alone to reject, while nothing has left
    the window and the log fits one chunk (INFO commandstats, on a server of the test's
    own, so that no other test's commands are counted)."""
    client = redis.Redis.from_url(private_redis.url)
    try:
        limiter = ratelimit.sync.SlidingWindowLimiter(client, 60, 10, storage="compact")
        limiter.check("warm-up")

        def calls() -> dict[str, int]:
            stats = client.info("commandstats")
            return {k: stats.get(f"cmdstat_{k}", {}).get("calls", 0) for k in
                    ("hmget", "hset", "pexpire", "hget", "hdel")}  # fmt: skip

        before = calls()
        for _ in range(10):
            assert limiter.check("alice").allowed
        for _ in range(5):
            assert not limiter.check("alice").allowed
        after = calls()
        assert {k: after[k] - before[k] for k in after} == {
            "hget": 15, "hset": 10, "pexpire": 10, "hmget": 0, "hdel": 0
        }  # fmt: skip
    finally:
        client.close()
