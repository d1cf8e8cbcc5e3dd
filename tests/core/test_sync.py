"""The synchronous limiters share the scripts and rules: same trace, same decisions."""

from __future__ import annotations

import asyncio

import fakeredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ratelimit
import ratelimit.sync
from ratelimit.clock import ManualClock

PAIRS = [
    (ratelimit.SlidingWindowLimiter, ratelimit.sync.SlidingWindowLimiter),
    (ratelimit.FixedWindowLimiter, ratelimit.sync.FixedWindowLimiter),
    (ratelimit.SlidingWindowCounterLimiter, ratelimit.sync.SlidingWindowCounterLimiter),
    (ratelimit.TokenBucketLimiter, ratelimit.sync.TokenBucketLimiter),
]

steps = st.lists(
    st.tuples(st.integers(0, 400), st.integers(1, 5), st.sampled_from(["a", "b"])),
    min_size=1,
    max_size=60,
)


def replay_sync(limiter, clock, trace):
    out = []
    for gap_ms, cost, who in trace:
        clock.advance(gap_ms / 1000)
        out.append(limiter.check(who, cost=cost))
    return out


async def replay_async(limiter, clock, trace):
    out = []
    for gap_ms, cost, who in trace:
        clock.advance(gap_ms / 1000)
        out.append(await limiter.check(who, cost=cost))
    return out


@pytest.mark.parametrize(("async_cls", "sync_cls"), PAIRS, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(trace=steps)
def test_sync_and_async_decide_alike(async_cls, sync_cls, trace):
    a_clock, s_clock = ManualClock(5_000.0), ManualClock(5_000.0)
    a = async_cls(fakeredis.FakeAsyncRedis(), 1, 5, clock=a_clock)
    s = sync_cls(fakeredis.FakeRedis(), 1, 5, clock=s_clock)
    assert asyncio.run(replay_async(a, a_clock, trace)) == replay_sync(s, s_clock, trace)


@pytest.mark.parametrize(("async_cls", "sync_cls"), PAIRS, ids=lambda c: c.__name__)
async def test_same_decisions_on_the_backend(async_cls, sync_cls, client, sync_client, prefix):
    trace = [(0, 1, "a")] * 4 + [(150, 2, "a"), (0, 3, "b"), (900, 1, "a"), (0, 5, "a")] * 3
    a_clock, s_clock = ManualClock(7_000.0), ManualClock(7_000.0)
    a = async_cls(client, 1, 5, prefix=f"{prefix}:a", clock=a_clock)
    s = sync_cls(sync_client, 1, 5, prefix=f"{prefix}:s", clock=s_clock)
    assert await replay_async(a, a_clock, trace) == replay_sync(s, s_clock, trace)
