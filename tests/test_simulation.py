"""`replay`: virtual time, replica clocks, TTL handling, and the same decisions everywhere."""

from __future__ import annotations

import time

import fakeredis
import numpy as np
import pandas as pd
import pytest
import redis

import ratelimit
import ratelimit.sync
from ratelimit import reference, traffic
from ratelimit.simulation import replay, replay_async

DECISIONS = ["allowed", "remaining", "retry_after_ms"]
ALGORITHMS = [
    "SlidingWindowLimiter",
    "FixedWindowLimiter",
    "SlidingWindowCounterLimiter",
    "TokenBucketLimiter",
]


def table(times, identities, costs=None, replicas=None) -> pd.DataFrame:
    n = len(times)
    return pd.DataFrame(
        {
            "time": np.asarray(times, dtype=float),
            "identity": list(identities),
            "cost": np.asarray(costs if costs is not None else [1] * n, dtype=np.int64),
            "replica": np.asarray(replicas if replicas is not None else [0] * n, dtype=np.int64),
        }
    )


def mixed_trace() -> pd.DataFrame:
    """About 10,000 requests of every kind the generators make, merged into one trace:
    steady, bursty, the boundary attacker, a Zipf fleet, cost-weighted geofence
    queries, and a client spread over replicas with skewed clocks."""
    return traffic.merge(
        traffic.poisson(15, 60, identity="steady", seed=1),
        traffic.on_off(60, 2, 3, 60, identity="bursty", seed=2),
        traffic.boundary_attack(10, 1.0, boundary=5.0, cycles=10),
        traffic.zipf_fleet(300, 80, 60, seed=3),
        traffic.geofence_mix(12, 60, identity="geo", seed=4),
        traffic.skewed_replicas(14, 60, replicas=3, max_offset=0.4, identity="skewed", seed=5),
    )


@pytest.mark.parametrize("name", ALGORITHMS)
def test_ten_thousand_requests_decided_alike_everywhere(name, backend, sync_client, prefix):
    trace = mixed_trace()
    assert 9_000 < len(trace) < 12_000 and trace["cost"].max() > 1
    model = replay(trace, getattr(reference, name)(1, 10))
    lua = replay(trace, getattr(ratelimit.sync, name)(sync_client, 1, 10, prefix=prefix))
    pd.testing.assert_frame_equal(model, lua)
    assert 0.2 < model["allowed"].mean() < 0.95  # the trace does exercise both answers


async def test_replay_async_matches_the_model(client, prefix):
    trace = mixed_trace().iloc[:2_000]
    model = replay(trace, reference.SlidingWindowLimiter(1, 10))
    lua = await replay_async(trace, ratelimit.SlidingWindowLimiter(client, 1, 10, prefix=prefix))
    pd.testing.assert_frame_equal(model, lua)


def test_replay_slower_than_real_time_on_real_redis(real_redis_url, prefix):
    """The second request is 0.5 s after the first in virtual time but over 1 s later in
    real time: with a 1 s TTL the key would be gone; the replay's TTL slack keeps it."""
    trace = table([0.0, 0.5], ["a", "a"])
    client = redis.Redis.from_url(real_redis_url)

    def slowed(limiter):
        check = limiter.check
        calls = []

        def slow_check(identity, cost=1):
            calls.append(identity)
            if len(calls) == 2:
                time.sleep(1.2)
            return check(identity, cost)

        limiter.check = slow_check
        return limiter

    model = replay(trace, reference.SlidingWindowLimiter(1, 1))
    assert model["allowed"].tolist() == [True, False]
    kept = replay(trace, slowed(ratelimit.sync.SlidingWindowLimiter(client, 1, 1, prefix=prefix)))
    pd.testing.assert_frame_equal(model, kept)
    # The control: without the slack, real-time expiry changes the answer.
    lost = replay(
        trace,
        slowed(ratelimit.sync.SlidingWindowLimiter(client, 1, 1, prefix=f"{prefix}:control")),
        ttl_slack_ms=0,
    )
    assert lost["allowed"].tolist() == [True, True]
    client.close()


def test_replica_offsets_and_redis_clock():
    """Two replicas 1.5 s apart over-admit; the Redis clock stands for one true clock.

    The replica behind takes the first half second, the one ahead the second: to the
    replica ahead, every entry of the other looks a window old.
    """
    times = np.arange(40) * 0.025  # 40 requests in one second
    trace = table(times, ["a"] * 40, replicas=(np.arange(40) < 20).astype(int))
    skew = {0: 0.0, 1: -1.5}
    skewed = replay(trace, reference.SlidingWindowLimiter(1, 10), offsets=skew)
    agreed = replay(trace, reference.SlidingWindowLimiter(1, 10, clock="redis"), offsets=skew)
    assert skewed["allowed"].sum() == 20
    assert agreed["allowed"].sum() == 10
    with_column = trace.assign(clock_offset=np.where(trace["replica"] == 1, -1.5, 0.0))
    pd.testing.assert_frame_equal(
        replay(with_column, reference.SlidingWindowLimiter(1, 10))[DECISIONS], skewed[DECISIONS]
    )


def test_rows_keep_their_order_and_the_input_is_untouched():
    trace = table([0.3, 0.1, 0.2, 0.1], ["a", "a", "a", "b"])
    before = trace.copy()
    out = replay(trace, reference.SlidingWindowLimiter(1, 2))
    pd.testing.assert_frame_equal(trace, before)
    assert list(out.columns) == [*trace.columns, *DECISIONS]
    # Decided in time order: 0.1 (a), 0.2 (a) admitted, 0.3 (a) rejected.
    assert out["allowed"].tolist() == [False, True, True, True]
    assert out["retry_after_ms"].tolist()[0] == 800


def test_extra_columns_pass_through():
    trace = table([0.0], ["a"]).assign(radius_m=[750.0])
    assert replay(trace, reference.FixedWindowLimiter(1, 5))["radius_m"].tolist() == [750.0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.drop(columns="cost"), "missing column"),
        (lambda t: t.assign(cost=[1.5]), "integers"),
        (lambda t: t.assign(cost=[11]), "between 1 and the limit"),
        (lambda t: t.assign(identity=[""]), "identity"),
        (lambda t: t.assign(time=[np.nan]), "finite"),
        (lambda t: t.assign(time=[np.inf]), "finite"),
    ],
)
def test_bad_tables_get_clear_errors(change, message):
    with pytest.raises(ValueError, match=message):
        replay(change(table([0.0], ["a"])), reference.SlidingWindowLimiter(1, 10))


def test_async_limiter_needs_replay_async():
    limiter = ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 10)
    with pytest.raises(TypeError, match="replay_async"):
        replay(table([0.0], ["a"]), limiter)


def test_state_is_dropped_unless_kept():
    client = fakeredis.FakeRedis()
    limiter = ratelimit.sync.SlidingWindowLimiter(client, 1, 10)
    replay(table([0.0, 0.1], ["a", "b"]), limiter)
    assert client.dbsize() == 0
    replay(table([0.0, 0.1], ["a", "b"]), limiter, keep_state=True)
    assert client.dbsize() == 2
    model = reference.SlidingWindowLimiter(1, 10)
    replay(table([0.0], ["a"]), model)
    assert model.state == {}


def test_limiter_clock_and_slack_are_restored():
    clock = ratelimit.clock.ManualClock(5.0)
    limiter = ratelimit.sync.SlidingWindowLimiter(fakeredis.FakeRedis(), 1, 10, clock=clock)
    replay(table([0.0], ["a"]), limiter)
    assert limiter.clock is clock and limiter.ttl_slack_ms == 3_600_000
    real = ratelimit.sync.SlidingWindowLimiter(fakeredis.FakeRedis(), 1, 10)
    replay(table([0.0], ["a"]), real)
    assert real.clock is time.time and real.ttl_slack_ms == 0


def test_progress_bar_is_silent_under_pytest_and_shown_on_request(capsys):
    trace = table(np.linspace(0, 100, 120_000), ["a"] * 120_000)
    replay(trace, reference.FixedWindowLimiter(1, 10))
    assert capsys.readouterr().err == ""
    replay(trace, reference.FixedWindowLimiter(1, 10), progress=True)
    assert "req" in capsys.readouterr().err


def test_top_level_names():
    assert ratelimit.replay is replay and ratelimit.replay_async is replay_async
