"""The reference models and the Lua scripts make identical decisions.

Hypothesis draws traces (identities, ties, bursts, gaps past the window, clocks
stepping back as skewed replicas do, costs, limits, windows) and replays each through
the in-memory model and through the script on fakeredis and on a real Redis. Every
field of every Decision must match. Divergences found are kept below as regressions.
"""

from __future__ import annotations

import uuid

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit import algorithms
from ratelimit.clock import ManualClock
from ratelimit.lab import reference

PAIRS = {
    a.name: (a.limiter_class("reference"), a.limiter_class("sync")) for a in algorithms.ALGORITHMS
}
SLACK_MS = 600_000  # real-time expiry must not cut a replay short


@st.composite
def scenarios(draw, gcra: bool = False):
    window_ms = draw(st.sampled_from([1, 7, 100, 1000, 1500]) | st.integers(1, 5000))
    limit = draw(st.integers(1, 12))
    options = {"window_ms": window_ms, "limit": limit}
    if gcra:
        options["burst"] = draw(st.integers(1, 2 * limit))
    max_cost = min(limit, options.get("burst", limit))
    start_ms = draw(st.sampled_from([0, 999, 1_000_000, 1_796_000_000_123]))
    gap = st.one_of(
        st.just(0),  # ties: the same millisecond
        st.integers(1, 5),  # bursts
        st.integers(0, 2 * window_ms),  # ordinary spacing
        st.integers(-window_ms, -1),  # a replica whose clock is behind
    )
    steps = draw(
        st.lists(
            st.tuples(gap, st.integers(1, max_cost), st.sampled_from(["a", "b", "c"])),
            min_size=1,
            max_size=40,
        )
    )
    return options, start_ms, steps


def replay(limiter, clock: ManualClock, start_ms: int, steps) -> list:
    now_ms, out = start_ms, []
    for gap, cost, who in steps:
        now_ms += gap
        # Whole ms plus a fraction: the limiter floors, both sides must agree.
        clock.set((now_ms + 0.25) / 1000)
        out.append(limiter.check(who, cost=cost))
    return out


def assert_same(name: str, client, scenario) -> None:
    options, start_ms, steps = scenario
    model_cls, lua_cls = PAIRS[name]
    model_clock, lua_clock = ManualClock(), ManualClock()
    model = model_cls(clock=model_clock, **options)
    lua = lua_cls(
        client,
        prefix=f"test:{uuid.uuid4().hex[:12]}",
        clock=lua_clock,
        ttl_slack_ms=SLACK_MS,
        **options,
    )
    try:
        expected = replay(model, model_clock, start_ms, steps)
        actual = replay(lua, lua_clock, start_ms, steps)
    finally:
        for who in "abc":
            client.delete(lua.key_for(who))
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert a == e, f"step {i} {steps[i]}: model {e} != lua {a}"


@pytest.mark.parametrize("name", list(PAIRS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_model_matches_lua_on_fakeredis(name, data):
    assert_same(name, fakeredis.FakeRedis(), data.draw(scenarios(gcra=name == "gcra")))


@pytest.fixture(scope="module")
def real_client(real_redis_url):
    client = redis.Redis.from_url(real_redis_url)
    yield client
    client.close()


@pytest.mark.parametrize("name", list(PAIRS))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_model_matches_lua_on_real_redis(name, real_client, data):
    assert_same(name, real_client, data.draw(scenarios(gcra=name == "gcra")))


def test_check_uses_the_same_options_and_validation_as_the_redis_limiters():
    with pytest.raises(ValueError, match="cost"):
        reference.SlidingWindowLimiter(1, 10).check("a", cost=11)
    with pytest.raises(ValueError, match="limit"):
        reference.FixedWindowLimiter(1, 0)
    with pytest.raises(ValueError, match="identity"):
        reference.TokenBucketLimiter(1, 10).check("")
    model = reference.TokenBucketLimiter(1, 10, burst=3, clock=ManualClock(5.0))
    assert [model.check("a").allowed for _ in range(4)] == [True, True, True, False]


def test_redis_clock_falls_back_to_the_host_clock():
    model = reference.SlidingWindowLimiter(1, 2, clock="redis")
    assert [model.check("a").allowed for _ in range(3)] == [True, True, False]
