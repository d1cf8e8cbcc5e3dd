"""`WindowPeaks` is held to `metrics.max_in_window_ms` on traces in any order, cut into
chunks, with stamps late by more or less than its reorder margin."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit.lab import metrics
from ratelimit.lab.windowpeaks import WindowPeaks

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def stamped(draw):
    """(window_ms, codes, times_ms, weights) in any order, with ties."""
    window_ms = draw(st.sampled_from([1, 10, 1000]) | st.integers(1, 3000))
    rows = draw(
        st.lists(
            st.tuples(st.integers(0, 3), st.integers(0, 6000), st.integers(0, 5)),
            min_size=0,
            max_size=150,
        )
    )
    if draw(st.booleans()):
        rows.sort(key=lambda r: r[1])  # in time order, as a sorted log's chunks are
    codes, times, weights = (np.array([r[i] for r in rows], dtype=np.int64) for i in range(3))
    return window_ms, codes, times, weights


def exact_peaks(window_ms, codes, times, weights, n):
    return [
        metrics.max_in_window_ms(times[codes == k], window_ms, weights[codes == k])
        for k in range(n)
    ]


@SETTINGS
@given(case=stamped(), data=st.data())
def test_window_peaks_equal_max_in_window_ms(case, data):
    window_ms, codes, times, weights = case
    cuts = sorted(data.draw(st.lists(st.integers(0, len(codes)), max_size=3)))
    # Late by at most the whole span: kept history covers it, so every peak is exact.
    for reorder_ms in (None, 6001):
        peaks = WindowPeaks(window_ms, reorder_ms=reorder_ms)
        for lo, hi in zip([0, *cuts], [*cuts, len(codes)], strict=True):
            peaks.add(codes[lo:hi], times[lo:hi], weights[lo:hi])
        n = int(codes.max()) + 1 if len(codes) else 0
        assert peaks.peaks.tolist() == exact_peaks(window_ms, codes, times, weights, n)
        assert peaks.late == 0


@SETTINGS
@given(case=stamped(), reorder_ms=st.integers(0, 3000))
def test_window_peaks_are_exact_within_reorder_and_say_when_not(case, reorder_ms):
    """Stamps later than `reorder_ms` are counted in `late`; without any, the peaks
    are exact, and with some they are never above the exact ones."""
    window_ms, codes, times, weights = case
    peaks = WindowPeaks(window_ms, reorder_ms=reorder_ms)
    peaks.add(codes, times, weights)
    n = int(codes.max()) + 1 if len(codes) else 0
    exact = exact_peaks(window_ms, codes, times, weights, n)
    got = peaks.peaks.tolist()
    newest: dict[int, int] = {}
    late = 0
    for k, t, w in zip(codes.tolist(), times.tolist(), weights.tolist(), strict=True):
        if w:
            late += k in newest and t < newest[k] - reorder_ms
            newest[k] = max(newest.get(k, t), t)
    assert peaks.late == late
    if late == 0:
        assert got == exact
    else:
        assert all(g <= e for g, e in zip(got, exact, strict=True))


@pytest.mark.parametrize(
    "times",
    [[5, 15, 8], [15, 5, 8], [15, 8, 5], [8, 15, 5, 25], [10, 0, 15], [30, 20, 10, 0, 10, 20, 30]],
)
def test_window_peaks_count_late_stamps_at_the_window_edges(times):
    """An entry stamped s - window is out of the window (s - window, s]: a late stamp
    between two held ones must not bridge them."""
    times = np.array(times)
    ones, zeros = np.ones(len(times), np.int64), np.zeros(len(times), np.int64)
    peaks = WindowPeaks(10, reorder_ms=None)
    peaks.add(zeros, times, ones)
    assert peaks.peaks.tolist() == [metrics.max_in_window_ms(times, 10)]


def test_a_stamp_exactly_reorder_ms_late_is_still_on_time():
    on_time, late = WindowPeaks(10, reorder_ms=10), WindowPeaks(10, reorder_ms=9)
    for peaks in (on_time, late):
        peaks.add([0, 0], [20, 10], [1, 1])
    assert (on_time.late, late.late) == (0, 1)
    assert on_time.peaks.tolist() == [1]


def test_window_peaks_hold_only_the_recent_history():
    """A million in-order stamps of one identity over 1,000 s: the pool keeps what the
    last window and reorder span hold, not the million."""
    times = np.arange(1_000_000, dtype=np.int64)
    peaks = WindowPeaks(1000, reorder_ms=1000)
    for lo in range(0, len(times), 100_000):
        chunk = times[lo : lo + 100_000]
        peaks.add(np.zeros(len(chunk), np.int64), chunk, np.ones(len(chunk), np.int64))
    assert peaks.peaks.tolist() == [1000]
    assert peaks.nbytes < 200_000  # a few thousand pairs of 16 bytes, not 16 MB


def test_window_peaks_bad_input():
    peaks = WindowPeaks(1000)
    with pytest.raises(ValueError, match="weights must be >= 0"):
        peaks.add([0], [0], [-1])
    with pytest.raises(ValueError, match="one value per request"):
        peaks.add([0, 1], [0, 1], [1])
    with pytest.raises(ValueError, match="window_ms must be >= 1"):
        WindowPeaks(0)
    peaks.add([2], [5], np.array([True]))
    assert peaks.peaks.tolist() == [0, 0, 1]
