"""Metrics on hand-computed tables, and max_in_window against brute force.

Every expected value below was worked out by hand from the rule the limiters use:
a request at t (seconds) is stamped floor(t * 1000) ms, and an entry stamped s is
in the window at t while s > t - W.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit.clock import to_ms
from ratelimit.lab import metrics, reference, replay, traffic

Y, N = True, False


def table(rows, columns=("time", "identity", "cost", "allowed")) -> pd.DataFrame:
    frame = pd.DataFrame(list(rows), columns=list(columns))
    frame["replica"] = 0
    frame["remaining"] = 0
    frame["retry_after_ms"] = 0
    return frame


# ---------------------------------------------------------------- max_in_window


@pytest.mark.parametrize(
    ("times", "width", "weights", "expected"),
    [
        ([], 1, None, 0),
        ([], 1, [], 0),
        ([5.0], 1, None, 1),
        # The entry at 0 leaves exactly when t reaches 1.0 (0 > 1000 - 1000 is false).
        ([0.0, 0.5, 1.0], 1, None, 2),
        ([0.0, 0.999, 1.0], 1, None, 2),
        ([0.0, 0.999, 0.999], 1, None, 3),
        # Ties all count at once; unsorted input is fine.
        ([5.0, 5.0, 5.0, 5.0, 5.5], 1, None, 5),
        ([1.0, 0.0, 0.5], 1, None, 2),
        ([3.0, 0.0, 1.0, 2.0], 1, None, 1),
        ([3.0, 0.0, 1.0, 2.0], 1.001, None, 2),
        # Weights: at 1.4 the window (0.4, 1.4] holds 2 + 3 + 4 (0.4 itself is out).
        ([0.0, 0.4, 0.9, 1.0, 1.4], 1, [5, 1, 2, 3, 4], 9),
        ([0.0, 0.4, 0.9, 1.0, 1.4], 0.5, [5, 1, 2, 3, 4], 7),
        ([2.0, 2.0, 2.0], 1, [1, 2, 3], 6),
        ([2.0, 2.0], 1, [0, 0], 0),
        # Sub-second windows: whole ms.
        ([0.0, 0.25, 0.5], 0.25, None, 1),
        ([0.0, 0.249, 0.5], 0.25, None, 2),
    ],
)
def test_max_in_window_by_hand(times, width, weights, expected):
    assert metrics.max_in_window(times, width, weights) == expected


def test_floats_are_compared_as_whole_milliseconds():
    # In floats 0.3 - 0.1 is 0.19999999999999998 < 0.2, so a float comparison would
    # keep 0.2 in the window ending at 0.3. In ms, 200 > 300 - 100 is false: one.
    assert 0.3 - 0.1 < 0.2
    assert metrics.max_in_window([0.2, 0.3], 0.1) == 1
    # Both stamped at the same ms (floor), as the limiter stamps them.
    assert metrics.max_in_window([1.0005, 1.0009], 0.001) == 2
    assert metrics.max_in_window([0.0004, 1.0004], 1) == 1
    # Epoch-sized times keep their ms exactly.
    base = 1_796_000_000.0
    assert metrics.max_in_window([base, base + 0.999, base + 1.0], 1) == 2


@pytest.mark.parametrize(
    ("times", "width", "expected"),
    [
        ([0, 1000], 1000, 1),
        ([0, 999], 1000, 2),
        ([7, 3, 7, 3, 5], 5, 5),  # (2, 7] at 7 holds all five
        ([7, 3, 7, 3, 5], 4, 3),  # (3, 7] at 7: 5, 7, 7 (the 3s are just out)
        ([7, 3, 7, 3, 5], 3, 3),  # (4, 7]: 5, 7, 7; (2, 5]: 3, 3, 5
        ([7, 3, 7, 3, 5], 2, 2),  # (5, 7]: 7, 7; (1, 3]: 3, 3
        (np.array([10.0, 10.0]), 1, 2),  # whole-number floats are accepted
    ],
)
def test_max_in_window_ms_by_hand(times, width, expected):
    assert metrics.max_in_window_ms(times, width) == expected


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: metrics.max_in_window([1.0], 0), "width_seconds must be > 0"),
        (lambda: metrics.max_in_window([1.0], -1), "width_seconds must be > 0"),
        (lambda: metrics.max_in_window([1.0], 0.0005), "whole number of milliseconds"),
        (lambda: metrics.max_in_window([1.0], "1"), "number of seconds"),
        (lambda: metrics.max_in_window([1.0, math.nan], 1), "finite"),
        (lambda: metrics.max_in_window([1.0, math.inf], 1), "finite"),
        (lambda: metrics.max_in_window([1.0], 1, [1, 2]), "one value per timestamp"),
        (lambda: metrics.max_in_window([1.0], 1, [-1]), "weights must be >= 0"),
        (lambda: metrics.max_in_window([1.0], 1, [0.5]), "whole numbers"),
        (lambda: metrics.max_in_window_ms([1.5], 1), "whole numbers of milliseconds"),
        (lambda: metrics.max_in_window_ms(["a"], 1), "must be integers"),
        (lambda: metrics.max_in_window_ms([1], 0), "width_ms must be (an integer|>= 1)"),
        (lambda: metrics.max_in_window_ms([1], 1.0), "width_ms must be (an integer|>= 1)"),
    ],
)
def test_max_in_window_rejects_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def _brute_force_ms(stamps: list[int], width: int, weights: list[int]) -> int:
    """Largest total weight in (t - W, t] over every integer ms t."""
    if not stamps:
        return 0
    return max(
        sum(w for s, w in zip(stamps, weights, strict=True) if t - width < s <= t)
        for t in range(min(stamps), max(stamps) + 1)
    )


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    stamps=st.lists(st.integers(-150, 150), max_size=30),
    width=st.integers(1, 350),
)
def test_max_in_window_ms_matches_brute_force(data, stamps, width):
    weights = data.draw(st.lists(st.integers(0, 5), min_size=len(stamps), max_size=len(stamps)))
    assert metrics.max_in_window_ms(stamps, width, weights) == _brute_force_ms(
        stamps, width, weights
    )
    assert metrics.max_in_window_ms(stamps, width) == _brute_force_ms(
        stamps, width, [1] * len(stamps)
    )


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(
        st.floats(0, 3, allow_nan=False) | st.sampled_from([0.1, 0.2, 0.3, 1.1, 2.3]),
        max_size=40,
    ),
    width_ms=st.integers(1, 3000),
    offset=st.sampled_from([0.0, 1_796_000_000.0]),
)
def test_max_in_window_matches_brute_force_on_seconds(times, width_ms, offset):
    times = [offset + t for t in times]
    stamps = [to_ms(t) for t in times]  # the limiter's own conversion
    expected = max((sum(1 for s in stamps if t - width_ms < s <= t) for t in stamps), default=0)
    assert metrics.max_in_window(times, width_ms / 1000) == expected


@given(st.lists(st.floats(-1e12, 1e12, allow_nan=False), max_size=50))
def test_seconds_to_ms_is_the_limiters_conversion(times):
    assert metrics.seconds_to_ms(times).tolist() == [to_ms(t) for t in times]


# ---------------------------------------------------------------- replayed tables

REPLAYED = table(
    [
        (0.0, "a", 1, Y),
        (0.1, "b", 2, Y),
        (0.5, "a", 3, Y),
        (0.9, "a", 1, N),
        (1.0, "a", 2, Y),
        (1.2, "b", 1, N),
        (1.5, "a", 1, Y),
    ]
)


def test_per_identity_by_hand():
    got = metrics.per_identity(REPLAYED)
    assert list(got.index) == ["a", "b"]
    assert got.loc["a"].to_dict() == {
        "requests": 5,
        "admitted": 4,
        "rejected": 1,
        "admitted_cost": 7,
        "rejected_cost": 1,
    }
    assert got.loc["b"].to_dict() == {
        "requests": 2,
        "admitted": 1,
        "rejected": 1,
        "admitted_cost": 2,
        "rejected_cost": 1,
    }
    assert "max_admitted_in_window" not in got


def test_per_identity_with_a_window():
    # a admitted 1 @ 0, 3 @ 500, 2 @ 1000, 1 @ 1500. At 1000 the window (0, 1000]
    # holds 3 + 2 (the entry at 0 has just left); at 1500, (500, 1500] holds 2 + 1.
    got = metrics.per_identity(REPLAYED, window_seconds=1)
    assert got["max_admitted_in_window"].to_dict() == {"a": 5, "b": 2}
    # With a 1.001 s window the entry at 0 is still in at 1000: 1 + 3 + 2.
    got = metrics.per_identity(REPLAYED, window_seconds=1.001)
    assert got["max_admitted_in_window"].to_dict() == {"a": 6, "b": 2}


def test_per_identity_counts_identities_with_no_admissions():
    rejected_only = table([(0.0, "z", 1, N), (0.1, "z", 1, N)])
    got = metrics.per_identity(rejected_only, window_seconds=1)
    assert got.loc["z"].to_dict() == {
        "requests": 2,
        "admitted": 0,
        "rejected": 2,
        "admitted_cost": 0,
        "rejected_cost": 2,
        "max_admitted_in_window": 0,
    }


def test_overshoot_by_hand():
    assert metrics.overshoot(REPLAYED, 5, 1) == 1.0
    assert metrics.overshoot(REPLAYED, 4, 1) == 1.25
    assert metrics.overshoot(REPLAYED, 2, 1.001) == 3.0
    assert metrics.overshoot(REPLAYED.iloc[0:0], 5, 1) == 0.0
    assert metrics.overshoot(table([(0.0, "a", 1, N)]), 5, 1) == 0.0


def test_overshoot_of_a_boundary_burst():
    # A fixed window of 10 per second lets 10 through at 0.990 and 10 more at 1.000.
    rows = [(0.990, "x", 1, Y)] * 10 + [(1.000, "x", 1, Y)] * 10 + [(1.001, "x", 1, N)]
    assert metrics.overshoot(table(rows), 10, 1) == 2.0


def test_per_identity_window_peaks_do_not_leak_between_identities():
    # b's entries sort right after a's: a window of b must not count a's tail.
    rows = [(0.9, "a", 4, Y), (1.0, "b", 1, Y), (1.05, "b", 1, Y)]
    got = metrics.per_identity(table(rows), window_seconds=1)
    assert got["max_admitted_in_window"].to_dict() == {"a": 4, "b": 2}


def test_window_peaks_on_times_too_far_apart_for_one_key():
    # group * span would overflow int64, so the per-group fallback runs.
    far = 4e15
    rows = [(0.0, "a", 1, Y), (0.5, "a", 1, Y), (far, "b", 2, Y), (far, "b", 3, Y)]
    got = metrics.per_identity(table(rows), window_seconds=1)
    assert got["max_admitted_in_window"].to_dict() == {"a": 2, "b": 5}
    assert metrics.overshoot(table(rows), 5, 1) == 1.0


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 400),
            st.sampled_from(["a", "b", "c", "d"]),
            st.integers(1, 3),
            st.booleans(),
        ),
        max_size=40,
    ),
    width_ms=st.integers(1, 300),
)
def test_per_identity_peaks_match_brute_force(rows, width_ms):
    frame = table([(ms / 1000, i, c, a) for ms, i, c, a in rows])
    got = metrics.per_identity(frame, window_seconds=width_ms / 1000)
    for identity in got.index:
        admitted = [(to_ms(ms / 1000), c) for ms, i, c, a in rows if i == identity and a]
        expected = _brute_force_ms([s for s, _ in admitted], width_ms, [c for _, c in admitted])
        assert got.loc[identity, "max_admitted_in_window"] == expected


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: metrics.per_identity(REPLAYED.drop(columns="allowed")), "allowed"),
        (lambda: metrics.per_identity(REPLAYED.drop(columns="time"), 1), "time"),
        (
            lambda: metrics.overshoot(REPLAYED.drop(columns=["cost", "identity"]), 5, 1),
            "identity, cost",
        ),
        (lambda: metrics.overshoot(REPLAYED, 0, 1), "limit must be (an integer|>= 1)"),
        (lambda: metrics.overshoot(REPLAYED, 5, 0), "window_seconds must be > 0"),
        (lambda: metrics.rejection_rate(REPLAYED.drop(columns="time"), 1), "time"),
        (lambda: metrics.rejection_rate(REPLAYED, 0.0001), "bin_seconds"),
        (lambda: metrics.per_identity(REPLAYED.assign(allowed="yes")), "booleans"),
        (lambda: metrics.per_identity(REPLAYED.assign(cost=-1)), "cost"),
        (lambda: metrics.per_identity([1, 2]), "DataFrame"),
        (lambda: metrics.per_identity(REPLAYED.assign(identity=None)), "identity'] has missing"),
        (lambda: metrics.max_in_window_ms([1], 2**62), "width_ms is out of range"),
    ],
)
def test_replayed_tables_are_validated(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---------------------------------------------------------------- false decisions


def test_false_decisions_by_hand():
    trace = [
        (0.0, "a", 1),
        (0.1, "a", 1),
        (0.2, "b", 1),
        (0.3, "a", 2),
        (0.4, "b", 1),
        (0.5, "a", 1),
    ]
    approx = table([(*r, a) for r, a in zip(trace, [Y, Y, N, Y, N, Y], strict=True)])
    exact = table([(*r, a) for r, a in zip(trace, [Y, N, N, Y, Y, N], strict=True)])
    got = metrics.false_decisions(approx, exact)
    assert got == {
        "requests": 6,
        "exact_admitted": 3,
        "exact_rejected": 3,
        "false_admits": 2,  # rows 1 and 5
        "false_rejects": 1,  # row 4
        "false_admit_rate": 2 / 6,
        "false_reject_rate": 1 / 6,
    }
    assert metrics.false_decisions(exact, exact)["false_admits"] == 0


def test_false_decisions_on_an_empty_trace():
    empty = REPLAYED.iloc[0:0]
    got = metrics.false_decisions(empty, empty)
    assert got["requests"] == 0 and got["false_admit_rate"] == 0.0


def test_false_decisions_need_the_same_trace():
    with pytest.raises(ValueError, match="3 rows vs 7"):
        metrics.false_decisions(REPLAYED.iloc[:3], REPLAYED)
    other = REPLAYED.assign(identity=["a", "b", "a", "a", "a", "b", "b"])
    with pytest.raises(ValueError, match="'identity' differs .first at row 6"):
        metrics.false_decisions(other, REPLAYED)
    with pytest.raises(ValueError, match="approx is missing column"):
        metrics.false_decisions(REPLAYED.drop(columns="allowed"), REPLAYED)


# ---------------------------------------------------------------- rejection rate


def test_rejection_rate_by_hand():
    frame = table(
        [
            (0.0, "a", 1, Y),
            (0.2, "a", 2, N),
            (0.999, "a", 1, Y),
            (1.0, "a", 3, N),  # first ms of the second bin
            (3.5, "a", 1, N),
            (3.999, "a", 1, Y),
        ]
    )
    got = metrics.rejection_rate(frame, 1)
    assert list(got.index) == [0.0, 1.0, 2.0, 3.0]
    assert got["requests"].tolist() == [3, 1, 0, 2]
    assert got["rejected"].tolist() == [1, 1, 0, 1]
    assert got["rejected_cost"].tolist() == [2, 3, 0, 1]
    rate = got["rate"].tolist()
    assert rate[0] == pytest.approx(1 / 3) and rate[1] == 1.0 and rate[3] == 0.5
    assert math.isnan(rate[2])  # no requests, no rate


def test_rejection_rate_bins_on_whole_milliseconds():
    # In floats 0.3 // 0.1 is 2.0, which would put 0.3 s in the bin starting at 0.2.
    assert 0.3 // 0.1 == 2.0
    got = metrics.rejection_rate(table([(0.3, "a", 1, N)]), 0.1)
    assert list(got.index) == [0.3]
    assert got["rate"].tolist() == [1.0]


def test_rejection_rate_of_an_empty_table():
    got = metrics.rejection_rate(REPLAYED.iloc[0:0], 1)
    assert got.empty
    assert list(got.columns) == ["requests", "rejected", "rate", "rejected_cost"]


def test_metrics_are_fast_on_a_million_rows():
    rng = np.random.default_rng(7)
    n = 1_000_000
    frame = pd.DataFrame(
        {
            "time": np.sort(rng.uniform(0, 600, n)),
            "identity": rng.integers(0, 10_000, n),
            "cost": rng.integers(1, 4, n),
            "replica": 0,
            "allowed": rng.random(n) < 0.9,
            "remaining": 0,
            "retry_after_ms": 0,
        }
    )
    assert metrics.max_in_window(frame["time"], 1) > 0
    assert metrics.overshoot(frame, 10, 1) > 0
    assert len(metrics.per_identity(frame, 1)) == 10_000
    assert metrics.rejection_rate(frame, 1)["requests"].sum() == n


# ---------------------------------------------------------------- Retry-After error


def advised(rows, index=None) -> pd.DataFrame:
    """A replayed table from (time, identity, cost, allowed, retry_after_ms) rows."""
    frame = pd.DataFrame(
        list(rows), columns=["time", "identity", "cost", "allowed", "retry_after_ms"], index=index
    )
    frame["replica"] = 0
    frame["remaining"] = 0
    return frame


# Limit 3 per 1 s. Worked by hand: t is the true ms, n the admitted cost of the identity
# decided before the row, j = n + c - 3, u_j the true stamp of its j-th oldest unit,
# T* = max(t, u_j + 1000) (t when j <= 0), error = t + R - T*.
ADVISED = advised(
    [
        (0.000, "a", 1, Y, 0),  # a: one unit at 0
        (0.200, "a", 2, Y, 0),  # a: units 0, 200, 200
        (0.500, "a", 1, N, 500),  # j=1, u=0: T*=1000; 500+500-1000 = 0 (exact)
        (0.500, "a", 2, N, 100),  # j=2, u=200: T*=1200; 600-1200 = -600 (too early)
        (0.300, "b", 1, N, 50),  # b has nothing: room at once, T*=300; +50 (too long)
        (1.100, "a", 1, N, 300),  # j=1, u=0 left at 1000 < 1100: T*=t; +300
        (1.100, "a", 1, Y, 0),  # a: units 0, 200, 200, 1100 (after the row above)
        (1.100, "a", 3, N, 1000),  # j=4+3-3=4, u=1100: T*=2100; 2100-2100 = 0
        (2.999, "a", 2, N, 1),  # (1999, 2999] holds 1100 only: room, T*=t; +1
    ],
    index=[f"r{k}" for k in range(9)],
)


def test_retry_after_error_by_hand():
    got = metrics.retry_after_error(ADVISED, 3, 1)
    assert got.name == "retry_after_error_ms"
    assert got.dtype == np.int64
    assert got.to_dict() == {
        "r2": 0,
        "r3": -600,
        "r4": 50,
        "r5": 300,
        "r7": 0,
        "r8": 1,
    }
    # A longer window keeps the unit at 0 in until 1500: r5 should have waited 400 ms,
    # was told 300 (100 too early); r3's unit at 200 leaves at 1700, advice 600: -1100.
    got = metrics.retry_after_error(ADVISED, 3, 1.5)
    assert got[["r2", "r3", "r5"]].tolist() == [1000 - 1500, 600 - 1700, 1400 - 1500]


def test_retry_after_error_uses_decision_order_not_table_order():
    # The same rows shuffled: each row keeps its label and its error. Ties in time keep
    # their relative table order (r5 before r6 before r7), as the replay decides them.
    shuffled = ADVISED.loc[["r8", "r4", "r5", "r3", "r6", "r0", "r7", "r2", "r1"]]
    got = metrics.retry_after_error(shuffled, 3, 1)
    assert list(got.index) == ["r8", "r4", "r5", "r3", "r7", "r2"]
    assert got.to_dict() == metrics.retry_after_error(ADVISED, 3, 1).to_dict()


def test_retry_after_error_counts_only_history_decided_before():
    # Two rejections in the same ms around an admission: the later admission is not in
    # the first rejection's history (it did not exist when the advice was given).
    rows = [
        (0.0, "a", 1, Y, 0),
        (0.0, "a", 1, Y, 0),
        (0.1, "a", 2, N, 900),  # j=2+2-3=1, u=0: T*=1000, exact
        (0.1, "a", 1, Y, 0),
        (0.1, "a", 2, N, 900),  # j=3+2-3=2, u=0: T*=1000, exact
        (0.1, "a", 3, N, 900),  # j=3+3-3=3, u=100: T*=1100, 100 too early
    ]
    got = metrics.retry_after_error(advised(rows), 3, 1)
    assert got.to_dict() == {2: 0, 4: 0, 5: -100}


def test_retry_after_error_without_rejections():
    got = metrics.retry_after_error(ADVISED[ADVISED.allowed], 3, 1)
    assert got.empty and got.dtype == np.int64 and got.name == "retry_after_error_ms"
    assert metrics.retry_after_error(ADVISED.iloc[0:0], 3, 1).empty


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: metrics.retry_after_error(ADVISED.drop(columns="retry_after_ms"), 3, 1), "retry"),
        (lambda: metrics.retry_after_error(ADVISED, 0, 1), "limit must be (an integer|>= 1)"),
        (lambda: metrics.retry_after_error(ADVISED, 3, 0.0005), "whole number of milliseconds"),
        (lambda: metrics.retry_after_error(ADVISED, 2, 1), r"between 1 and the limit \(2\)"),
        (lambda: metrics.retry_after_error(ADVISED.assign(cost=0), 3, 1), "between 1 and"),
        (
            lambda: metrics.retry_after_error(ADVISED.assign(retry_after_ms=0.5), 3, 1),
            "whole milliseconds",
        ),
        (
            lambda: metrics.retry_after_error(ADVISED.assign(retry_after_ms=None), 3, 1),
            "missing values",
        ),
        (lambda: metrics.retry_after_error(ADVISED.assign(identity=None), 3, 1), "identity"),
    ],
)
def test_retry_after_error_rejects_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def _brute_force_retry_errors(rows, limit, width_ms):
    """Per rejected row, (t + R) - T*, by trying every ms T from t upwards."""
    order = sorted(range(len(rows)), key=lambda k: rows[k][0])  # stable, like the replay
    errors = {}
    for position, k in enumerate(order):
        time, who, cost, allowed, advice = rows[k]
        if allowed:
            continue
        t = to_ms(time)
        history = [
            (to_ms(rows[m][0]), rows[m][2])
            for m in order[:position]
            if rows[m][1] == who and rows[m][3]
        ]
        earliest = t
        while sum(c for s, c in history if s > earliest - width_ms) + cost > limit:
            earliest += 1
        errors[k] = t + advice - earliest
    return errors


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 600).map(lambda ms: ms / 1000),
            st.sampled_from(["a", "b", "c"]),
            st.integers(1, 4),
            st.booleans(),
            st.integers(-50, 400),
        ),
        max_size=30,
    ),
    limit=st.integers(4, 6),
    width_ms=st.integers(1, 300),
)
def test_retry_after_error_matches_brute_force(rows, limit, width_ms):
    got = metrics.retry_after_error(advised(rows), limit, width_ms / 1000)
    assert got.to_dict() == _brute_force_retry_errors(rows, limit, width_ms)


@settings(max_examples=100, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.integers(0, 3000), st.sampled_from(["a", "b"]), st.integers(1, 3)),
        max_size=60,
    ),
    limit=st.integers(3, 8),
    window_ms=st.integers(1, 1500),
)
def test_the_exact_log_on_a_true_clock_advises_exactly(requests, limit, window_ms):
    # The control: the sliding log's Retry-After, given on the true clock, is never off.
    trace = pd.DataFrame(
        {
            "time": [ms / 1000 for ms, _, _ in requests],
            "identity": [who for _, who, _ in requests],
            "cost": np.array([c for _, _, c in requests], dtype=np.int64),
            "replica": np.zeros(len(requests), dtype=np.int64),
        }
    )
    limiter = reference.SlidingWindowLimiter(window_ms=window_ms, limit=limit)
    replayed = replay(trace, limiter)
    errors = metrics.retry_after_error(replayed, limit, window_ms / 1000)
    assert len(errors) == int((~replayed["allowed"]).sum())
    assert (errors == 0).all()


def test_retry_after_error_on_skewed_and_fixed_window_replays():
    # Costs above 1, several identities, clock skew: the exact log on the true (Redis)
    # clock is still exact; the same log stamped by skewed replicas, and the fixed
    # window, are not.
    trace = traffic.merge(
        traffic.geofence_mix(40, 30, identity="g", seed=1),
        traffic.skewed_replicas(50, 30, max_offset=0.3, seed=3, identity="s"),
    )
    on_redis_clock = replay(trace, reference.SlidingWindowLimiter(1, 10, clock="redis"))
    errors = metrics.retry_after_error(on_redis_clock, 10, 1)
    assert len(errors) > 1000 and (errors == 0).all()
    skewed = metrics.retry_after_error(replay(trace, reference.SlidingWindowLimiter(1, 10)), 10, 1)
    from_g = trace.identity[skewed.index] == "g"
    assert from_g.any() and (skewed[from_g] == 0).all()  # g's replica keeps true time
    assert (skewed < 0).any() and (skewed > 0).any()
    fixed = metrics.retry_after_error(replay(trace, reference.FixedWindowLimiter(1, 10)), 10, 1)
    assert (fixed < 0).any()


def test_retry_after_error_is_fast_on_ten_thousand_rejections():
    trace = traffic.poisson(200, 100, identity="hot", seed=5)  # ~20,000 requests
    replayed = replay(trace, reference.FixedWindowLimiter(1, 10))
    rejected = int((~replayed["allowed"]).sum())
    assert rejected > 10_000
    start = time.perf_counter()
    errors = metrics.retry_after_error(replayed, 10, 1)
    assert time.perf_counter() - start < 1.0
    assert len(errors) == rejected
