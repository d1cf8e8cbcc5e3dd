"""Hand-computed traces: every limiter's decisions against tables worked out on paper.

Each expected value below was derived from the algorithm's definition by hand, never
by calling the library. Times are ms offsets from the `clock` fixture's start
(1_000_000_000 ms, a whole second, so window boundaries fall on multiples of the
window). A row is

    (at_ms, cost, allowed, remaining, retry_after_ms, reset_after_ms)
"""

from __future__ import annotations

import asyncio

import fakeredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ratelimit
import ratelimit.sync
from ratelimit import algorithms
from ratelimit.clock import ManualClock, to_ms

START_MS = 1_000_000_000  # the clock fixture's start (1_000_000.0 s), in ms
Y, N = True, False

# Sliding log, 5 per 1000 ms. An entry stamped s is in the window while s > t - 1000.
SLIDING_LOG = [
    (0, 1, Y, 4, 0, 1000),  # log: 0
    (0, 2, Y, 2, 0, 1000),  # same ms, cost 2 -> log: 0 0 0
    (100, 1, Y, 1, 0, 1000),  # log: 0 0 0 100
    (100, 2, N, 1, 900, 1000),  # 4 + 2 > 5: the oldest (0) must leave: 0 + 1000 - 100
    (250, 1, Y, 0, 0, 1000),  # log: 0 0 0 100 250
    (999, 1, N, 0, 1, 251),  # the 0s are still in (0 > -1); reset: 250 + 1000 - 999
    (999, 4, N, 0, 101, 251),  # four must leave: the 4th oldest is 100 -> 100 + 1000 - 999
    (1000, 3, Y, 0, 0, 1000),  # edge: 0 <= 1000 - 1000, the three 0s are gone
    (1099, 1, N, 0, 1, 901),  # 100 still in; reset: newest 1000 + 1000 - 1099
    (1100, 1, Y, 0, 0, 1000),  # 100 gone -> log: 250 1000 1000 1000 1100
    (2500, 5, Y, 0, 0, 1000),  # all gone: full budget back
    (2500, 1, N, 0, 1000, 1000),  # the oldest of the five (2500) leaves at 3500
]

# Fixed window, 5 per 1000 ms: windows [k*1000, (k+1)*1000); only admitted cost counts.
FIXED_WINDOW = [
    (0, 1, Y, 4, 0, 1000),
    (0, 3, Y, 1, 0, 1000),  # same ms, cost 3: used 4
    (400, 2, N, 1, 600, 600),  # 4 + 2 > 5: wait for the window at 1000
    (400, 1, Y, 0, 0, 600),  # the rejection did not count: used 5
    (999, 1, N, 0, 1, 1),
    (1000, 5, Y, 0, 0, 1000),  # edge: a new, empty window
    (1001, 1, N, 0, 999, 999),
    (3500, 2, Y, 3, 0, 500),  # recovery, two windows later
    (3500, 4, N, 3, 500, 500),
]

# Fixed window, 5 per 1000 ms, with late requests (stamped before the stored window, as
# from a host whose clock is behind): the stored window never moves backwards, so a late
# request counts in it and waits for its end.
FIXED_WINDOW_LATE = [
    (1500, 3, Y, 2, 0, 500),  # window 1: used 3
    (900, 1, Y, 1, 0, 1100),  # late: counts in window 1 (used 4), which ends at 2000
    (950, 2, N, 1, 1050, 1050),  # 4 + 2 > 5 in window 1: wait for 2000
    (1999, 1, Y, 0, 0, 1),  # used 5
    (2000, 5, Y, 0, 0, 1000),  # window 2: a new, empty window
    (1999, 1, N, 0, 1001, 1001),  # late into the full window 2, which ends at 3000
]

# Sliding-window counter, 10 per 1000 ms: estimate = prev * (1000 - elapsed) / 1000 + cur.
# Rejected: remaining = floor(10 - estimate), retry = first whole ms the request fits.
# reset = end of the window after the current one while cur > 0, else end of this one.
SLIDING_WINDOW_COUNTER = [
    (0, 4, Y, 6, 0, 2000),  # window 0: cur 4
    (0, 6, Y, 0, 0, 2000),  # same ms: estimate 4 + 6 = 10 fits exactly; cur 10
    (500, 1, N, 0, 600, 1500),  # in window 1, 10 * (1000 - e) / 1000 + 1 <= 10 at e = 100
    (1100, 1, Y, 0, 0, 1900),  # window 1, e = 100: 9 + 1 = 10; prev 10, cur 1
    (1100, 1, N, 0, 100, 1900),  # same ms: 10 - e / 100 + 2 <= 10 at e = 200
    (1250, 3, N, 1, 150, 1750),  # estimate 7.5 + 1 = 8.5; 10 - e / 100 + 4 <= 10 at e = 400
    (1400, 3, Y, 0, 0, 1600),  # estimate 6 + 1 = 7; 7 + 3 = 10 fits exactly; cur 4
    (2000, 2, Y, 4, 0, 2000),  # edge of window 2: prev 4, cur 0 -> estimate 4; cur 2
    (2500, 7, N, 6, 250, 1500),  # estimate 2 + 2 = 4; 4 - e / 250 + 9 <= 10 at e = 750
    (2750, 7, Y, 0, 0, 1250),  # estimate 1 + 2 = 3; 3 + 7 = 10; cur 9
    (2999, 1, N, 0, 1, 1001),  # estimate 9.004; fits at 3000 (prev 9, cur 0 -> 9 + 1)
    (3000, 2, N, 1, 112, 1000),  # 9 - 9e / 1000 + 2 <= 10 at e >= 111.1 -> 112; reset: cur 0
    (5000, 10, Y, 0, 0, 2000),  # both counts stale: full budget back
]

# GCRA, 10 per 1000 ms, burst 10: interval T = 100, tolerance 1000. TAT starts at now.
# Admit when new_tat - 1000 <= now with new_tat = max(tat, now) + 100 * cost.
GCRA = [
    (0, 1, Y, 9, 0, 100),  # TAT 100
    (0, 4, Y, 5, 0, 500),  # TAT 500
    (0, 5, Y, 0, 0, 1000),  # TAT 1000: the whole burst at one instant
    (0, 1, N, 0, 100, 1000),  # the 11th waits 100 ms
    (50, 1, N, 0, 50, 950),
    (100, 1, Y, 0, 0, 1000),  # edge: allow_at == now; TAT 1100
    (350, 3, N, 2, 50, 750),  # allow_at 1400 - 1000 = 400; remaining floor((350 - 100) / 100)
    (400, 3, Y, 0, 0, 1000),  # TAT 1400
    (1000, 2, Y, 4, 0, 600),  # TAT 1600; allow_at 600 -> remaining floor(400 / 100)
    (3000, 10, Y, 0, 0, 1000),  # TAT behind now: full burst again; TAT 4000
    (3000, 1, N, 0, 100, 1000),
]

# GCRA, 10 per 1000 ms, burst 2: interval 100, tolerance 200.
GCRA_BURST_2 = [
    (0, 2, Y, 0, 0, 200),  # TAT 200
    (0, 1, N, 0, 100, 200),  # allow_at 300 - 200 = 100
    (100, 1, Y, 0, 0, 200),  # TAT 300
    (150, 1, N, 0, 50, 150),  # allow_at 400 - 200 = 200
    (300, 1, Y, 1, 0, 100),  # TAT 400; allow_at 200 -> remaining floor(100 / 100)
    (1000, 1, Y, 1, 0, 100),  # TAT behind now: TAT 1100, allow_at 900 -> floor(100 / 100)
]

# Trace name -> (algorithm tag, limiter options, the hand-computed table).
TRACES = {
    "log": ("log", {"limit": 5}, SLIDING_LOG),
    "log_compact": ("log", {"limit": 5, "storage": "compact"}, SLIDING_LOG),
    "fw": ("fw", {"limit": 5}, FIXED_WINDOW),
    "fw_late": ("fw", {"limit": 5}, FIXED_WINDOW_LATE),
    "swc": ("swc", {"limit": 10}, SLIDING_WINDOW_COUNTER),
    "gcra": ("gcra", {"limit": 10}, GCRA),
    "gcra_burst_2": ("gcra", {"limit": 10, "burst": 2}, GCRA_BURST_2),
}
ALGORITHMS = [a.class_name for a in algorithms.ALGORITHMS]


def set_ms(clock: ManualClock, ms: int) -> None:
    """Set the virtual clock inside millisecond `ms` (its middle, safe from float rounding)."""
    clock.set((ms + 0.5) / 1000)


def at(clock: ManualClock, offset_ms: int) -> None:
    """Move the virtual clock to `offset_ms` after the fixture's start."""
    set_ms(clock, START_MS + offset_ms)


def row(at_ms: int, cost: int, d: ratelimit.Decision) -> tuple:
    return (at_ms, cost, d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms)


def check_fields(decisions: list[ratelimit.Decision], limit: int) -> None:
    """The fields the tables do not list: the limit, degraded, and Retry-After in seconds."""
    for d in decisions:
        assert d.limit == limit and d.degraded is False
        assert d.retry_after == (0 if d.allowed else max(1, -(-d.retry_after_ms // 1000)))


# 1. Hand-computed traces ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("name", TRACES)
async def test_trace(name, kind, client, sync_client, prefix, clock):
    """Each limiter, asyncio and sync, reproduces the hand-computed table, on both
    backends."""
    tag, options, table = TRACES[name]
    redis = client if kind == "async" else sync_client
    limiter = algorithms.get(tag).build(kind, redis, 1, prefix=prefix, clock=clock, **options)
    got, decisions = [], []
    for at_ms, cost, *_ in table:
        at(clock, at_ms)
        d = limiter.check("alice", cost=cost)
        d = await d if kind == "async" else d
        got.append(row(at_ms, cost, d))
        decisions.append(d)
    assert got == table
    check_fields(decisions, options["limit"])


# 2. The boundary burst --------------------------------------------------------------

# 10 per 1 s; 10 requests at 990..999 ms past a boundary, 10 more at 1000..1009 ms.
# - Fixed window: two windows, 10 each -> all 20 pass within 20 ms (2x the limit).
# - Sliding log: the first 10 are all still in the window at 1000..1009 -> 10.
# - Counter: at 1000 + k the previous window (10) weighs (1000 - k) / 1000, so the
#   estimate is 10 - k / 100 > 9 for k < 100 -> only the first 10 pass.
# - GCRA: the i-th request (i = 0..9, at 990 + i) sees TAT 990 + 100 i and passes while
#   90 + 100 i <= 990 + i, i.e. i <= 9; TAT is then 1990, and at 1000 + k a request
#   needs 1090 <= 1000 + k -> only the first 10 pass.
BOUNDARY_BURST_ADMITS = {
    "FixedWindowLimiter": 20,
    "SlidingWindowLimiter": 10,
    "SlidingWindowCounterLimiter": 10,
    "TokenBucketLimiter": 10,
}


@pytest.mark.parametrize("cls_name", ALGORITHMS)
async def test_boundary_burst(cls_name, client, prefix, clock):
    """Only the fixed window lets 2x the limit through across a window boundary."""
    limiter = getattr(ratelimit, cls_name)(client, 1, 10, prefix=prefix, clock=clock)
    admitted_at = []
    for ms in range(990, 1010):
        at(clock, ms)
        if (await limiter.check("mallory")).allowed:
            admitted_at.append(ms)
    expected = BOUNDARY_BURST_ADMITS[cls_name]
    assert admitted_at == list(range(990, 990 + expected))
    assert admitted_at[-1] - admitted_at[0] < 20  # all of them inside ~20 ms


# 3. The spec's verification -----------------------------------------------------------


@pytest.mark.parametrize("cls_name", ALGORITHMS)
async def test_twelve_at_ten_per_second(cls_name, client, prefix, clock):
    """12 checks in one instant at 10/s: exactly 10 allowed, then 2 rejected, Retry-After >= 1."""
    limiter = getattr(ratelimit, cls_name)(client, 1, 10, prefix=prefix, clock=clock)
    decisions = [await limiter.check("alice") for _ in range(12)]
    assert [d.allowed for d in decisions] == [True] * 10 + [False] * 2
    assert [d.remaining for d in decisions[:10]] == list(range(9, -1, -1))
    for d in decisions[10:]:
        assert d.retry_after >= 1 and d.retry_after_ms > 0 and d.remaining == 0


async def test_twelve_at_ten_per_second_log_key(client, prefix):
    """After the 12 checks the log holds at most 10 members and expires within the window.

    On the host's clock, as the spec's check runs: a key TTL only means something when the
    limiter's clock and Redis's agree (see test_virtual_clock_state_survives_real_time).
    """
    limiter = ratelimit.SlidingWindowLimiter(client, 1, 10, prefix=prefix, storage="sorted-set")
    for _ in range(12):
        await limiter.check("alice")
    key = limiter.key_for("alice")
    assert await client.zcard(key) <= 10
    assert 0 < await client.pttl(key) <= 1000


# 4. Retry-After honesty ------------------------------------------------------------------


@pytest.mark.parametrize("cls_name", ALGORITHMS)
@settings(max_examples=50, deadline=None)
@given(
    window_ms=st.sampled_from([1, 3, 100, 1000]) | st.integers(1, 3000),
    limit=st.integers(1, 12),
    burst=st.integers(1, 12),
    start_ms=st.integers(0, 10_000),
    history=st.lists(st.tuples(st.integers(0, 1500), st.integers(1, 12)), max_size=12),
    probe_cost=st.integers(1, 12),
)
def test_retry_after_is_honest(cls_name, window_ms, limit, burst, start_ms, history, probe_cost):
    """Rejected with retry_after_ms R at t: still rejected at t + R - 1, admitted at t + R."""
    gcra = cls_name == "TokenBucketLimiter"
    options = {"burst": burst} if gcra else {}
    max_cost = min(limit, burst) if gcra else limit
    clock = ManualClock()
    set_ms(clock, START_MS + start_ms)
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    limiter = getattr(ratelimit.sync, cls_name)(
        client, None, limit, window_ms=window_ms, clock=clock, **options
    )
    for gap_ms, cost in history:
        clock.advance(gap_ms / 1000)
        limiter.check("alice", cost=min(cost, max_cost))
    cost = min(probe_cost, max_cost)
    for _ in range(100):  # the same request, at the same instant, until it is rejected
        rejected = limiter.check("alice", cost=cost)
        if not rejected.allowed:
            break
    assert not rejected.allowed
    t_ms, wait = to_ms(clock()), rejected.retry_after_ms
    assert wait >= 1
    if wait > 1:
        set_ms(clock, t_ms + wait - 1)
        assert not limiter.check("alice", cost=cost).allowed, f"admitted 1 ms before R={wait}"
    set_ms(clock, t_ms + wait)
    assert limiter.check("alice", cost=cost).allowed, f"still rejected at R={wait}"


# 5. Virtual time and real TTLs --------------------------------------------------------


@pytest.mark.parametrize("cls_name", ALGORITHMS)
async def test_virtual_clock_state_survives_real_time(cls_name, client, prefix, clock):
    """Virtual time standing still while real time passes loses no in-window state.

    Redis expires keys in real time; a TTL of one virtual window would drop them here.
    """
    limiter = getattr(ratelimit, cls_name)(
        client, None, 1, prefix=prefix, window_ms=20, clock=clock
    )
    assert (await limiter.check("alice")).allowed
    await asyncio.sleep(0.06)  # real time passes (3 windows); virtual time stands still
    assert not (await limiter.check("alice")).allowed


@pytest.mark.parametrize("limit", [3, 7, 999])
async def test_gcra_admits_a_full_burst_when_the_interval_is_not_whole(
    limit, client, prefix, clock
):
    """Regression: 1000 / 3 ms is not a whole number; float rounding of the TAT at
    ~1e12 ms made the third of three requests look early and rejected it."""
    clock.set(1_796_000_000.123)
    limiter = ratelimit.TokenBucketLimiter(client, 1, limit, prefix=prefix, clock=clock)
    decisions = [await limiter.check("alice") for _ in range(limit + 1)]
    assert [d.allowed for d in decisions] == [True] * limit + [False]
    assert [d.remaining for d in decisions[:limit]] == list(range(limit - 1, -1, -1))


def test_gcra_retry_after_is_not_a_ms_late_from_float_noise(sync_client, prefix, clock):
    """limit 3 per 1000 ms (a 333.33 ms interval), burst 2: after 1 + 1 at t0 and 1 at
    t0 + 334, a request of cost 2 fits again at t0 + 1000. The TAT is ~1e12 ms plus
    float noise; Retry-After is the first ms that admits, 666, not 667."""
    limiter = ratelimit.sync.TokenBucketLimiter(
        sync_client, None, 3, window_ms=1000, burst=2, prefix=prefix, clock=clock
    )
    for offset_ms in (0, 0, 334):
        at(clock, offset_ms)
        assert limiter.check("alice").allowed
    rejected = limiter.check("alice", cost=2)
    assert not rejected.allowed and rejected.retry_after_ms == 666
    at(clock, 334 + 665)
    assert not limiter.check("alice", cost=2).allowed
    at(clock, 334 + 666)
    assert limiter.check("alice", cost=2).allowed
