"""Bounded load: several processes x tasks hammer one identity for a few
seconds on loopback (`tests/core/loadgen.py`), and every decision is checked afterwards.

- On the real Redis and on a local Redis Cluster, the sliding log on Redis's clock
  never admits more than the limit in any rolling window of its width (by the times
  the script decided at), and right after the run the key holds exactly the admitted
  requests of the last window: no record lost, none doubled.
- Replicas with skewed application clocks: the overshoot against true time is measured
  and must stay within what the skew and the observed latency allow (derived below).
- The fixed window, the sliding-window counter and GCRA stay within their documented
  bounds under concurrency; the sync sliding log is as exact as the async one.

Run with `-s` to see the figures (checks/s, peaks, overshoot).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import numpy as np
import pandas as pd
import pytest
import redis

import ratelimit
import ratelimit.sync
from ratelimit.clock import ManualClock
from ratelimit.devtools.process import free_port
from ratelimit.lab import metrics
from tests.core.loadgen import CHECK_COLUMNS, LoadConfig, LoadResult, hammer, run_load

LIMIT, WINDOW_MS = 50, 1000
PROCESSES, TASKS, DURATION = 3, 20, 2.0
SKEW_MS = (0, 150, -150)  # one clock offset per process: replicas up to 300 ms apart
SLACK_MS = 60_000  # keys outlive the run, so the log can be read without an expiry race


def config_for(url: str, prefix: str, **options: Any) -> LoadConfig:
    base: dict[str, Any] = {
        "limit": LIMIT,
        "window_ms": WINDOW_MS,
        "processes": PROCESSES,
        "tasks": TASKS,
        "duration": DURATION,
        "ttl_slack_ms": SLACK_MS,
    }
    return LoadConfig(url, prefix=prefix, **(base | options))


def log_scores(reader: Any, key: str) -> list[int]:
    return sorted(int(score) for _, score in reader.zrange(key, 0, -1, withscores=True))


def assert_exact_under_load(result: LoadResult, reader: Any) -> None:
    """The sliding log's promises under a load that really exceeds the limit."""
    print(f"\n{result.summary()}")
    assert result.n_errors == 0 and result.n_degraded == 0
    assert set(result.checks["process"]) == set(range(result.config.processes))
    assert result.n_checks > 10 * result.n_admitted  # hammered: most were rejected
    assert result.n_admitted >= 2 * result.config.limit  # several windows filled
    # Never more than the limit in any window (t - W, t] of the script's clock, and
    # the load reached it.
    assert result.max_admitted() == result.config.limit
    # Redis's clock is this host's: bracketed by when each check was sent and
    # answered, no true window certainly held more either.
    assert result.true_peak()[0] <= result.config.limit
    # The log holds exactly the admits since the last trim.
    assert log_scores(reader, result.config.key) == result.expected_log().tolist()


# Real Redis and Redis Cluster -----------------------------------------------------


@pytest.mark.real_redis
def test_sliding_log_under_load_on_real_redis(real_redis_url, prefix):
    """3 processes x 20 tasks for 2 s at 50 per second on Redis's clock. The processes
    also have skewed app clocks (SKEW_MS), which the limiter must not care about."""
    result = run_load(config_for(real_redis_url, prefix, clock="redis", offsets_ms=SKEW_MS))
    with redis.Redis.from_url(real_redis_url) as reader:
        assert_exact_under_load(result, reader)


@pytest.mark.real_redis
def test_sliding_log_under_load_on_one_app_clock(real_redis_url, prefix):
    """The same on the default clock, this host's, shared by all processes.

    A check stamps its time before it waits in its client's queue, so checks reach
    Redis out of order; the script decides and records a late one at the newest
    entry's time, which keeps every window of recorded times within the limit.
    """
    result = run_load(config_for(real_redis_url, prefix))
    assert result.config.clock != "redis"
    with redis.Redis.from_url(real_redis_url) as reader:
        assert_exact_under_load(result, reader)


def test_sliding_log_under_load_on_cluster(cluster):
    """The same through the cluster client: one identity lives on one shard."""
    prefix = f"test:{uuid.uuid4().hex[:12]}"
    result = run_load(config_for(cluster.url, prefix, clock="redis"))
    reader = ratelimit.connect_sync(cluster.url)
    try:
        assert_exact_under_load(result, reader)
    finally:
        reader.delete(result.config.key)
        reader.close()


def skew_bound(limit: int, window_ms: int, spread_ms: int, latency_ms: float) -> int:
    """Most admits a sliding log on skewed app clocks lets run in one true window.

    Replica clocks are offset within a spread S, and a check reads its clock at most
    L before Redis runs it (L = the largest latency). Take the admits Redis ran within
    a true interval (T - W', T], W' = W - S - L, and the last of them to run, stamped
    s* <= T + max offset. Every other one was stamped after T - W' + min offset - L =
    T + max offset - W >= s* - W, so it counts against s* unless a check that ran
    earlier trimmed it, which takes a stamp above its stamp + W > T + max offset: no
    clock read that by then. So such an interval holds at most `limit`, and a true
    window of W is covered by ceil(W / W') of them.
    """
    short = window_ms - spread_ms - latency_ms - 2  # 2 ms for flooring stamps to whole ms
    assert short > 0, f"latency {latency_ms:.0f} ms is too high to bound a {window_ms} ms window"
    return limit * math.ceil(window_ms / short)


@pytest.mark.real_redis
def test_skewed_app_clocks_overshoot_is_bounded(real_redis_url, prefix):
    """Replicas 300 ms apart, each on its own app clock: the admits that certainly ran
    in one true second (`true_peak`) are measured and stay within `skew_bound`."""
    result = run_load(config_for(real_redis_url, prefix, clock="app", offsets_ms=SKEW_MS))
    assert result.n_errors == 0 and result.n_degraded == 0
    at_least, at_most = result.true_peak()
    bound = skew_bound(LIMIT, WINDOW_MS, max(SKEW_MS) - min(SKEW_MS), result.max_latency * 1000)
    print(
        f"\n{result.summary()}\nskewed app clocks: {at_least} to {at_most} admitted in one "
        f"true second (overshoot at least {at_least / LIMIT:.2f}x), bound {bound}"
    )
    assert at_least <= bound


# The other algorithms, and the sync limiter, in this process ------------------------

FAST_LIMIT, FAST_WINDOW_MS = 20, 500


async def hammer_here(limiter: Any, config: LoadConfig) -> LoadResult:
    checks = await hammer(limiter, config.identity, tasks=10, duration=1.5)
    return LoadResult.from_checks(config, checks)


@pytest.mark.real_redis
@pytest.mark.parametrize("algorithm", ["fw", "swc", "gcra"])
async def test_approximate_algorithms_stay_within_their_bounds(algorithm, real_redis_url, prefix):
    """10 tasks for 1.5 s at 20 per 500 ms, on Redis's clock.

    - fixed window: at most `limit` per aligned window, so at most 2 x limit in a
      rolling one (README);
    - GCRA (burst = limit): at most burst + limit - 1 in a rolling window (README);
    - sliding-window counter: an admit at elapsed e into window k needs
      p (W - e) / W + c + 1 <= limit, with p <= limit the previous window's count; the
      rolling window holds at most p + c + 1 <= limit + p e / W < 2 x limit.
    """
    config = config_for(
        real_redis_url, prefix, algorithm=algorithm, clock="redis", limit=FAST_LIMIT,
        window_ms=FAST_WINDOW_MS,
    )  # fmt: skip
    client = ratelimit.connect(real_redis_url)
    try:
        result = await hammer_here(config.limiter(client), config)
    finally:
        await client.aclose()
    assert result.n_errors == 0 and result.n_degraded == 0
    peak = result.max_admitted()
    print(f"\n{algorithm}: {result.n_checks} checks, rolling-window peak {peak}/{FAST_LIMIT}")
    assert peak >= FAST_LIMIT  # the load reached the limit
    if algorithm == "fw":
        stamps = result.admitted["decided_ms"].to_numpy(dtype=np.int64)
        per_window = np.bincount(stamps // FAST_WINDOW_MS - stamps.min() // FAST_WINDOW_MS)
        assert per_window.max() == FAST_LIMIT
        assert peak <= 2 * FAST_LIMIT
    elif algorithm == "gcra":
        assert peak <= FAST_LIMIT + FAST_LIMIT - 1
    else:
        assert peak < 2 * FAST_LIMIT


@pytest.mark.real_redis
async def test_sync_sliding_log_under_concurrent_threads(real_redis_url, prefix):
    """`ratelimit.sync` from 10 threads: as exact as the asyncio limiter."""
    config = config_for(
        real_redis_url, prefix, clock="redis", limit=FAST_LIMIT, window_ms=FAST_WINDOW_MS
    )
    client = ratelimit.connect_sync(real_redis_url)
    limiter = ratelimit.sync.SlidingWindowLimiter(
        client, prefix=prefix, window_ms=FAST_WINDOW_MS, limit=FAST_LIMIT, clock="redis",
        ttl_slack_ms=SLACK_MS, storage="sorted-set",
    )  # fmt: skip
    try:
        result = await hammer_here(limiter, config)
        assert result.n_errors == 0 and result.n_degraded == 0
        assert result.max_admitted() == FAST_LIMIT
        assert log_scores(client, config.key) == result.expected_log().tolist()
    finally:
        client.close()


# The load generator itself (no server) -----------------------------------------------


async def test_hammer_records_every_check_for_the_metrics():
    """One row per check; `time` floors back to the decision's ms exactly, so the
    metrics module reads the same peak as `max_admitted`."""
    clock = ManualClock(1_000_000.0)
    config = LoadConfig("redis://unused", limit=5, window_ms=1000)
    # A patient limiter: this is about what is recorded, and a busy host must not turn
    # checks into timeouts.
    limiter = ratelimit.SlidingWindowLimiter(
        ratelimit.connect(embedded=True), window_ms=1000, limit=5, clock=clock, timeout=30
    )
    await limiter.check("warm-up")  # fakeredis compiles the script on first use, blocking
    stop = asyncio.Event()
    load = asyncio.create_task(hammer(limiter, "who", tasks=3, duration=60, stop=stop))
    while (await limiter.peek("who")).allowed:  # until the five are admitted,
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # then rejections for a while
    stop.set()
    checks = await load
    result = LoadResult.from_checks(config, checks)
    assert list(checks.columns) == [*CHECK_COLUMNS, "replica"]
    assert not checks["degraded"].any() and (checks["error"] == "").all()
    assert result.n_checks >= 5 and result.n_admitted == 5  # the virtual clock stood still
    assert (result.decided["decided_ms"] == 1_000_000_000).all()
    assert (metrics.seconds_to_ms(result.decided["time"]) == 1_000_000_000).all()
    assert metrics.overshoot(result.decided, 5, 1.0) * 5 == result.max_admitted() == 5
    assert (checks["received"] >= checks["sent"]).all() and (checks["latency"] >= 0).all()


async def test_hammer_counts_unexpected_errors_and_goes_on():
    """A check that raises something other than the policy's error is recorded (it
    would be a 500 in an API) and the load goes on."""

    class Broken:
        calls = 0

        async def check(self, identity: str, cost: int = 1) -> None:
            Broken.calls += 1
            raise RuntimeError("boom")

    checks = await hammer(Broken(), "who", tasks=2, duration=0.1)
    assert len(checks) == Broken.calls > 2
    assert set(checks["error"]) == {"RuntimeError"}
    assert not checks["allowed"].any() and checks["decided_ms"].isna().all()


def test_true_peak_brackets_every_possible_execution():
    """`true_peak` against brute force over every whole-ms window end, on random
    (sent, received) intervals, some longer than the window."""
    rng = np.random.default_rng(8)
    n = 60
    sent_ms = rng.integers(0, 3000, n)
    received_ms = sent_ms + rng.choice([0, 3, 40, 300, 700], n)
    cost = rng.integers(1, 4, n)
    window = 500
    checks = pd.DataFrame(
        {
            "sent": (sent_ms + 0.5) / 1000,
            "received": (received_ms + 0.5) / 1000,
            "cost": cost,
            "allowed": True,
            "degraded": False,
            "error": "",
            "decided_ms": pd.array(sent_ms, dtype="Int64"),
        }
    )
    result = LoadResult.from_checks(LoadConfig("redis://x", limit=10, window_ms=window), checks)
    at_least = at_most = 0
    for end in range(-window, 4000):
        lo = end - window
        at_least = max(at_least, cost[(sent_ms > lo) & (received_ms <= end)].sum())
        at_most = max(at_most, cost[(received_ms > lo) & (sent_ms <= end)].sum())
    assert result.true_peak() == (at_least, at_most)
    assert at_least < at_most  # the case is not trivial


def test_decision_carries_the_time_it_was_decided_at():
    clock = ManualClock(1234.5678)
    limiter = ratelimit.sync.SlidingWindowLimiter(
        ratelimit.connect_sync(embedded=True), 1, 2, clock=clock
    )
    first = limiter.check("who")
    assert first.decided_at_ms == 1_234_567
    clock.advance(0.25)
    second = limiter.check("who")
    assert second.decided_at_ms == 1_234_817
    assert second == ratelimit.Decision(True, 2, 0, 0, second.reset_after_ms)  # not compared


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"algorithm": "leaky"}, "algorithm"),
        ({"clock": "ntp"}, "clock"),
        ({"processes": 0}, "processes"),
        ({"tasks": 0}, "tasks"),
        ({"duration": 0}, "duration"),
        ({"duration": float("inf")}, "duration"),
        ({"processes": 2, "offsets_ms": (0,)}, "offsets_ms"),
        ({"processes": 1, "offsets_ms": (0.5,)}, "offsets_ms"),
        ({"limit": 0}, "limit"),
        ({"cost": 11, "limit": 10}, "cost"),
        ({"on_error": "ignore"}, "on_error"),
        ({"identity": ""}, "identity"),
        ({"think_time": -1}, "think_time"),
    ],
)
def test_bad_load_options_are_refused_before_anything_starts(options, message):
    with pytest.raises(ValueError, match=message):
        LoadConfig("redis://127.0.0.1:6379/0", **options)


def test_a_failing_process_raises_instead_of_hanging():
    """Nobody listens at the URL: the worker's connection fails, and run_load says so
    with the worker's traceback rather than waiting for results that never come."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(RuntimeError, match="load process 0 failed"):
        run_load(LoadConfig(url, processes=1, tasks=1, duration=0.1, timeout=0.2))


@pytest.mark.parametrize(
    "argv", [["--offsets-ms", "0,x"], ["--processes", "2", "--offsets-ms", "0"], ["--limit", "0"]]
)
def test_command_line_refuses_bad_options(argv, capsys):
    from tests.core.loadgen import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err
