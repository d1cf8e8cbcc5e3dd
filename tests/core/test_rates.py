"""Rates as people write them: one grammar (`ratelimit.parse_rate`) for every limiter,
sync and async, and for the lab's planner."""

from __future__ import annotations

import fakeredis
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ratelimit
import ratelimit.sync
from ratelimit import Rate, algorithms, parse_rate, parse_rates, validation

S, MIN, H, D = 1_000, 60_000, 3_600_000, 86_400_000


@pytest.mark.parametrize(
    ("text", "limit", "window_ms"),
    [
        ("100/min", 100, MIN),
        ("10/s", 10, S),
        ("10/sec", 10, S),
        ("10/second", 10, S),
        ("10/seconds", 10, S),
        ("5/minute", 5, MIN),
        ("5/minutes", 5, MIN),
        ("1000/h", 1000, H),
        ("1000/hour", 1000, H),
        ("10000/d", 10000, D),
        ("10000/days", 10000, D),
        ("1000/10s", 1000, 10 * S),
        ("5/10s", 5, 10 * S),
        ("50/5min", 50, 5 * MIN),
        ("1/1.5h", 1, 90 * MIN),
        ("3/500ms", 3, 500),
        (" 7 / 2h ", 7, 2 * H),
        ("100/MIN", 100, MIN),
        ("1,000/h", 1000, H),
        ("1_000_000/d", 10**6, D),
        ("1/365d", 1, 365 * D),
        ("1000000000/s", 10**9, S),
        # The `limits` library's spelling, as slowapi users write it.
        ("10 per second", 10, S),
        ("10 per minute", 10, MIN),
        ("100/2 hours", 100, 2 * H),
        ("1 per 10 seconds", 1, 10 * S),
        ("1000 PER day", 1000, D),
        ("5/month", 5, 30 * D),
        ("5 per year", 5, 360 * D),
    ],
)
def test_parse_rate_reads_what_people_write(text, limit, window_ms):
    rate = parse_rate(text)
    assert (rate.limit, rate.window_ms) == (limit, window_ms)
    assert parse_rate(str(rate)) == rate  # written back, read again


@pytest.mark.parametrize(
    "text",
    [
        "10/fortnight",
        "0/s",
        "-5/min",
        "abc",
        "10/0s",
        "",
        "10",
        "/s",
        "10/",
        "1.5/s",
        "10/s/s",
        "1e3/min",
        "10/0.0005s",  # half a millisecond
        "2000000000/s",  # above any limiter's largest limit
        "1/400d",  # longer than a year
        "2/2 years",
        "1,0/s",  # not a thousands separator
        "10 pers second",
        "10per second",
        "10/m",  # minute or month: refused rather than guessed
    ],
)
def test_parse_rate_refuses_anything_else_naming_it_and_what_is_accepted(text):
    with pytest.raises(ValueError) as caught:
        parse_rate(text)
    message = str(caught.value)
    assert repr(text) in message
    assert "100/min" in message or "a year" in message


@pytest.mark.parametrize("value", [100, 1.5, None, b"10/s", ("10", "s")])
def test_parse_rate_refuses_what_is_not_text(value):
    with pytest.raises(ValueError, match="100/min"):
        parse_rate(value)


@pytest.mark.parametrize(
    ("rate", "text"),
    [
        (Rate(100, MIN), "100/min"),
        (Rate(10, S), "10/s"),
        (Rate(5, 2 * H), "5/2h"),
        (Rate(3, 500), "3/500ms"),
        (Rate(1, D), "1/d"),
        (Rate(7, 1_500), "7/1500ms"),
    ],
)
def test_a_rate_writes_itself_as_people_do(rate, text):
    assert str(rate) == text
    assert rate.window_seconds == rate.window_ms / 1000


@given(
    st.integers(1, validation.MAX_LIMIT),
    st.integers(1, validation.MAX_WINDOW_MS),
)
def test_every_rate_reads_back_from_its_text(limit, window_ms):
    rate = Rate(limit, window_ms)
    assert parse_rate(str(rate)) == rate


@pytest.mark.parametrize(
    ("limit", "window_ms"),
    [(0, 1000), (10, 0), (True, 1000), (10, 1.5), ("10", 1000), (10, validation.MAX_WINDOW_MS + 1)],
)
def test_a_rate_refuses_bad_parts(limit, window_ms):
    with pytest.raises(ValueError):
        Rate(limit, window_ms)


def test_parse_rates_reads_lists_and_semicolons():
    both = [Rate(10, S), Rate(1000, H)]
    assert parse_rates("10/s; 1000/h") == both
    assert parse_rates(["10/s", Rate(1000, H)]) == both
    assert parse_rates("10 per second") == [Rate(10, S)]
    for bad in ([], "10/s;", 5):
        with pytest.raises(ValueError):
            parse_rates(bad)


KINDS = ("async", "sync")


def limiter_of(algorithm: algorithms.Algorithm, kind: str, *args, **options):
    client = fakeredis.FakeAsyncRedis() if kind == "async" else fakeredis.FakeRedis()
    return algorithm.limiter_class(kind)(client, *args, **options)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", algorithms.ALGORITHMS, ids=algorithms.NAMES)
@pytest.mark.parametrize("rate", ["5/10s", "5 per 10 seconds", Rate(5, 10 * S)])
def test_every_limiter_takes_a_rate_in_place_of_window_and_limit(algorithm, kind, rate):
    limiter = limiter_of(algorithm, kind, rate)
    twin = limiter_of(algorithm, kind, 10, 5)
    assert (limiter.limit, limiter.window_ms) == (twin.limit, twin.window_ms) == (5, 10_000)
    assert limiter.rate == Rate(5, 10_000) and str(limiter.rate) == "5/10s"
    assert limiter.key_for("a") == twin.key_for("a")  # the same policy, the same key
    changed = limiter.with_options(window_seconds="2/s")
    assert (changed.limit, changed.window_ms) == (2, 1000)
    assert (limiter.limit, limiter.window_ms) == (5, 10_000)


@pytest.mark.parametrize("kind", KINDS)
def test_a_rate_and_a_limit_together_are_refused(kind):
    for args, options in [(("10/s", 5), {}), (("10/s",), {"window_ms": 1000})]:
        with pytest.raises(ValueError, match="window_seconds must be an integer.*not both"):
            limiter_of(algorithms.SLIDING_LOG, kind, *args, **options)
    with pytest.raises(ValueError, match="cannot read the rate '10/fortnight'"):
        limiter_of(algorithms.SLIDING_LOG, kind, "10/fortnight")


async def test_a_limiter_built_from_a_rate_decides_by_it(client, prefix):
    limiter = ratelimit.SlidingWindowLimiter(client, "3/min", prefix=prefix)
    decisions = [await limiter.check("a") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert decisions[-1].limit == 3 and decisions[-1].retry_after_ms > 50_000


def test_a_sync_limiter_built_from_a_rate_decides_by_it(sync_client, prefix):
    limiter = ratelimit.sync.TokenBucketLimiter(sync_client, "2 per hour", prefix=prefix)
    assert [limiter.check("a").allowed for _ in range(3)] == [True, True, False]
