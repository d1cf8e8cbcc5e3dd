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
from ratelimit import algorithms
from ratelimit.lab import reference, traffic
from ratelimit.lab.simulation import replay, replay_async

DECISIONS = ["allowed", "remaining", "retry_after_ms", "degraded"]
ALGORITHMS = [a.class_name for a in algorithms.ALGORITHMS]


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
    first, second = table([0.0], ["a"]), table([0.5], ["a"])
    client = redis.Redis.from_url(real_redis_url)

    def two_replays(limiter, **options):
        one = replay(first, limiter, keep_state=True, **options)
        time.sleep(1.2)  # real time only: the second request is 0.5 s later in virtual time
        two = replay(second, limiter, **options)
        return pd.concat([one, two], ignore_index=True)

    model = replay(table([0.0, 0.5], ["a", "a"]), reference.SlidingWindowLimiter(1, 1))
    assert model["allowed"].tolist() == [True, False]
    kept = two_replays(ratelimit.sync.SlidingWindowLimiter(client, 1, 1, prefix=prefix))
    pd.testing.assert_frame_equal(model, kept)
    # The control: without the slack, real-time expiry changes the answer.
    control = ratelimit.sync.SlidingWindowLimiter(client, 1, 1, prefix=f"{prefix}:control")
    assert two_replays(control, ttl_slack_ms=0)["allowed"].tolist() == [True, True]
    client.close()


def test_a_replay_leaves_the_limiter_as_it_was(real_redis_url, prefix):
    """A limiter whose first check happens inside a replay must not keep the replay's
    hour of TTL slack: its next live check writes a key that expires after one window."""
    client = redis.Redis.from_url(real_redis_url)
    limiter = ratelimit.sync.SlidingWindowLimiter(client, 1, 10, prefix=prefix)
    replay(table([0.0, 0.1], ["replayed", "replayed"]), limiter)
    assert limiter.check("live-user").allowed
    assert 0 < client.pttl(limiter.key_for("live-user")) <= 1_000
    client.close()


@pytest.mark.parametrize("name", [a.class_name for a in algorithms.ALGORITHMS if a.name != "gcra"])
def test_a_replay_outlasting_the_window_after_a_live_check_decides_like_the_model(
    real_redis_url, prefix, name
):
    """A limiter that made a live check before the replay must still get the replay's TTL
    slack: 10 requests at 0 ms, then thousands at 49 ms of a 50 ms window. The replay
    takes longer than the window in real time (several times over on a fast host), so
    without slack the first 10 would expire while still in the virtual window and the
    rest would be admitted."""
    client = redis.Redis.from_url(real_redis_url)
    limiter = getattr(ratelimit.sync, name)(client, limit=10, window_ms=50, prefix=prefix)
    assert limiter.check("live-user").allowed
    trace = table([0.0] * 10 + [0.049] * 8_000, ["attacker"] * 8_010)
    started = time.monotonic()
    decided = replay(trace, limiter)
    assert time.monotonic() - started > 0.05  # the replay did outlast the window
    model = replay(trace, getattr(reference, name)(limit=10, window_ms=50))
    assert model["allowed"].sum() == 10
    pd.testing.assert_frame_equal(model, decided)
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
    # The result shares no writable state with the input, nor with a replay of itself.
    again = replay(out, reference.SlidingWindowLimiter(1, 1))
    assert again["allowed"].tolist() == [False, True, False, True]
    assert out["allowed"].tolist() == [False, True, True, True]
    out.loc[0, "time"] = 99.0
    again.loc[1, "identity"] = "c"
    pd.testing.assert_frame_equal(trace, before)
    assert out["identity"].tolist() == ["a", "a", "a", "b"]


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


def test_a_replay_drives_a_copy_and_never_the_limiter_itself():
    clock = ratelimit.clock.ManualClock(5.0)
    limiter = ratelimit.sync.SlidingWindowLimiter(fakeredis.FakeRedis(), 1, 10, clock=clock)
    seen = []
    original = type(limiter).with_options

    def spy(self, **changes):
        copy = original(self, **changes)
        seen.append((self, copy, changes))
        return copy

    type(limiter).with_options = spy
    try:
        replay(table([0.0], ["a"]), limiter)
    finally:
        type(limiter).with_options = original
    [(driven_from, copy, changes)] = seen
    assert driven_from is limiter and copy is not limiter and copy.redis is limiter.redis
    assert changes["ttl_slack_ms"] == 3_600_000 and changes["clock"] is not clock
    assert limiter.clock is clock and limiter.ttl_slack_ms == 3_600_000


def test_progress_bar_is_silent_under_pytest_and_shown_on_request(capsys):
    trace = table(np.linspace(0, 100, 120_000), ["a"] * 120_000)
    replay(trace, reference.FixedWindowLimiter(1, 10))
    assert capsys.readouterr().err == ""
    replay(trace, reference.FixedWindowLimiter(1, 10), progress=True)
    assert "req" in capsys.readouterr().err


def test_the_replay_lives_in_the_lab_not_the_library():
    import ratelimit.lab

    assert ratelimit.lab.replay is replay and ratelimit.lab.replay_async is replay_async
    assert not hasattr(ratelimit, "replay")


def test_degraded_decisions_are_marked():
    """A Redis that cannot answer: the failure policy decides, and the table says so."""
    server = fakeredis.FakeServer()
    server.connected = False
    limiter = ratelimit.sync.SlidingWindowLimiter(
        fakeredis.FakeRedis(server=server), 1, 10, on_error="allow"
    )
    trace = table([0.0, 0.5], ["a", "a"])
    out = replay(trace, limiter, keep_state=True)  # (no keys to delete without Redis)
    assert out["degraded"].tolist() == [True, True] and out["allowed"].all()
    assert not replay(trace, reference.SlidingWindowLimiter(1, 10))["degraded"].any()


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_compiled_replay_decides_and_keeps_state_as_the_model(name):
    """The mixed trace (late replicas, costs, bursts): compiled and through the model's
    own `run`, the same table and the same state left in the model, starting from state
    an earlier replay kept."""
    trace = mixed_trace()
    earlier, later = trace.iloc[:4_000], trace.iloc[4_000:]
    fast, slow = getattr(reference, name)(1, 10), getattr(reference, name)(1, 10)
    for model in (fast, slow):
        replay(earlier, model, keep_state=True, compiled=False)
    assert slow.state  # the later replay starts from kept state
    out_fast = replay(later, fast, keep_state=True)
    out_slow = replay(later, slow, keep_state=True, compiled=False)
    pd.testing.assert_frame_equal(out_fast, out_slow)
    assert fast.state == slow.state and list(fast.state) == list(slow.state)
    assert 0.2 < out_fast["allowed"].mean() < 0.95
