"""Measures of what a limiter did on a trace: rolling-window peaks, per-identity counts,
overshoot, false decisions against the exact log, and rejection rate over time.

Everything here is vectorized numpy/pandas and runs in O(n log n) on millions of rows.

A *replayed table* is a DataFrame with one row per request: `time` (float seconds),
`identity`, `cost` (int), `replica` (int), and the decision columns `allowed` (bool),
`remaining` (int), `retry_after_ms` (int). Each function checks for the columns it
uses and raises ValueError naming any that are missing.

Time precision: the limiters never see float seconds. They stamp a request with
`floor(seconds * 1000)` (`ratelimit.clock.to_ms`) and keep an entry stamped `s` in
the window at `t` while `s > t - window_ms`, in integers. The functions here do the
same: `timebase.seconds_to_ms` floors `seconds * 1000` in float64, which gives bit for bit the
integer `to_ms` gives, and every window comparison is then exact integer arithmetic.
So a request at 0.0 s and one at 1.0 s are exactly 1000 ms apart and never both in
a 1 s window, whatever rounding `1.0 - 1.0` or `0.3 / 0.1` would do in floats.
Windows and bins must therefore be whole milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ratelimit import validation

from .timebase import MAX_ABS_MS as _MAX_ABS_MS
from .timebase import seconds_to_ms

__all__ = [
    "false_decisions",
    "max_in_window",
    "max_in_window_ms",
    "overshoot",
    "per_identity",
    "rejection_rate",
    "retry_after_error",
    "seconds_to_ms",
]

def _window_ms(width_seconds: Any, name: str = "width_seconds") -> int:
    """A positive duration in seconds as whole ms; ValueError for anything else."""
    if isinstance(width_seconds, bool) or not isinstance(width_seconds, int | float | np.number):
        raise ValueError(f"{name} must be a number of seconds, got {width_seconds!r}")
    value = float(width_seconds)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be > 0, got {width_seconds!r}")
    ms = round(value * 1000)
    # 1e-6 ms of slack absorbs the float error of e.g. 0.1 * 1000; anything more is a
    # genuinely fractional millisecond, which no limiter can have.
    if ms < 1 or abs(value * 1000 - ms) > 1e-6:
        raise ValueError(f"{name} must be a whole number of milliseconds, got {width_seconds!r}")
    if ms >= _MAX_ABS_MS:
        raise ValueError(f"{name} is out of range: {width_seconds!r}")
    return ms


# ---------------------------------------------------------------- rolling-window peaks


def _int_ms(timestamps_ms: Any) -> np.ndarray:
    """Whole-ms timestamps as int64 (integer dtype, or floats holding whole numbers)."""
    values = np.asarray(timestamps_ms).ravel()
    if values.size == 0:
        return values.astype(np.int64)
    if values.dtype.kind == "f":
        if not np.isfinite(values).all() or (values != np.floor(values)).any():
            raise ValueError("timestamps_ms must be whole numbers of milliseconds")
    elif values.dtype.kind not in "iu":
        raise ValueError(f"timestamps_ms must be integers, got dtype {values.dtype}")
    if values.max() >= _MAX_ABS_MS or values.min() <= -_MAX_ABS_MS:
        raise ValueError("timestamps_ms are out of range")
    return values.astype(np.int64)


def _weights(weights: Any, n: int) -> np.ndarray:
    """Non-negative integer weights as int64 (all ones when None)."""
    if weights is None:
        return np.ones(n, dtype=np.int64)
    values = np.asarray(weights).ravel()
    if values.shape != (n,):
        raise ValueError(f"weights must have one value per timestamp ({n}), got {values.size}")
    if n == 0:
        return values.astype(np.int64)
    if values.dtype == bool:
        values = values.astype(np.int64)
    if values.dtype.kind == "f":
        if not np.isfinite(values).all() or (values != np.floor(values)).any():
            raise ValueError("weights must be whole numbers (request costs)")
    elif values.dtype.kind not in "iu":
        raise ValueError(f"weights must be integers, got dtype {values.dtype}")
    values = values.astype(np.int64)
    # A negative weight leaving the window would raise the total between timestamps,
    # so the peak would no longer sit at a timestamp: costs are never negative anyway.
    if (values < 0).any():
        raise ValueError("weights must be >= 0")
    return values


def _window_peaks(groups: np.ndarray, ms: np.ndarray, weights: np.ndarray, window_ms: int):
    """Per group, the largest total weight in any window (t - W, t].

    `groups` are integer codes 0..g-1. Returns (codes present, their peaks), codes sorted.

    The total in (t - W, t] only rises when t reaches a timestamp, so the peak is
    attained with t at one of them. Rows are sorted by (group, ms); a composite key
    `group * span + offset` makes one searchsorted answer every row at once, and each
    window's lower bound is clipped to its own group's first row.
    """
    if ms.size == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    order = np.lexsort((ms, groups))
    g, t, w = groups[order], ms[order], weights[order]
    offset = t - t.min()
    span = int(offset.max()) + 1
    n_groups = int(g.max()) + 1
    cumulative = np.concatenate(([0], np.cumsum(w, dtype=np.int64)))
    starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
    if n_groups * span + window_ms < _MAX_ABS_MS:
        key = g.astype(np.int64) * span + offset
        hi = np.searchsorted(key, key, side="right")
        lo = np.searchsorted(key, key - window_ms, side="right")
        group_start = np.repeat(starts, np.diff(np.append(starts, len(g))))
        lo = np.maximum(lo, group_start)
        totals = cumulative[hi] - cumulative[lo]
        peaks = np.maximum.reduceat(totals, starts)
    else:  # keys would overflow int64: one searchsorted per group instead
        ends = np.append(starts[1:], len(g))
        peaks = np.empty(len(starts), dtype=np.int64)
        for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
            seg = t[a:b]
            hi = np.searchsorted(seg, seg, side="right") + a
            lo = np.searchsorted(seg, seg - window_ms, side="right") + a
            peaks[i] = (cumulative[hi] - cumulative[lo]).max()
    return g[starts], peaks


def max_in_window_ms(timestamps_ms: Any, width_ms: int, weights: Any = None) -> int:
    """Exact largest count (or total weight) of integer-ms timestamps in any window
    (t - width_ms, t]: an entry stamped s is in the window at t while s > t - width_ms.

    Timestamps may be unsorted and tied. O(n log n). Empty input gives 0.
    """
    width = validation.count("width_ms", width_ms)
    if width >= _MAX_ABS_MS:
        raise ValueError(f"width_ms is out of range: {width_ms!r}")
    ms = _int_ms(timestamps_ms)
    w = _weights(weights, ms.size)
    if ms.size == 0:
        return 0
    _, peaks = _window_peaks(np.zeros(ms.size, dtype=np.int64), ms, w, width)
    return int(peaks[0])


def max_in_window(timestamps_seconds: Any, width_seconds: float, weights: Any = None) -> int:
    """Exact largest count (or total weight) of timestamps in any window (t - W, t].

    Times are float seconds and are floored to whole ms first, exactly as the limiters
    stamp requests (see the module docstring); the width must be a whole number of ms.
    So the answer is what a sliding log with this window would have counted at its
    fullest. Unsorted input and ties are fine; weights are non-negative integers
    (request costs). Empty input gives 0.
    """
    window = _window_ms(width_seconds)
    ms = seconds_to_ms(timestamps_seconds)
    return max_in_window_ms(ms, window, weights)


# ---------------------------------------------------------------- replayed tables


def _require(table: Any, columns: Iterable[str], name: str = "replayed") -> pd.DataFrame:
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"{name} must be a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(
            f"{name} is missing column(s) {', '.join(missing)}; it has {list(table.columns)}"
        )
    return table


def _allowed(table: pd.DataFrame, name: str = "replayed") -> np.ndarray:
    column = table["allowed"]
    if column.isna().any():
        raise ValueError(f"{name}['allowed'] has missing values")
    values = column.to_numpy()
    if values.dtype == bool:
        return values
    if values.dtype.kind in "iuf" and np.isin(values, (0, 1)).all():
        return values.astype(bool)
    if values.dtype == object and all(isinstance(v, bool | np.bool_) for v in values):
        return values.astype(bool)
    raise ValueError(f"{name}['allowed'] must be booleans, got dtype {column.dtype}")


def _costs(table: pd.DataFrame, name: str = "replayed") -> np.ndarray:
    column = table["cost"]
    if column.isna().any():
        raise ValueError(f"{name}['cost'] has missing values")
    try:
        costs = _weights(column.to_numpy(), len(column))
    except ValueError as exc:
        raise ValueError(f"{name}['cost']: {exc}") from None
    return costs


_PER_IDENTITY_COLUMNS = ["requests", "admitted", "rejected", "admitted_cost", "rejected_cost"]


def per_identity(replayed: pd.DataFrame, window_seconds: float | None = None) -> pd.DataFrame:
    """Per identity: requests, admitted and rejected counts, admitted and rejected cost.

    With `window_seconds`, also `max_admitted_in_window`: the largest admitted cost
    in any rolling window (t - W, t] of that identity's `time` (trace time, floored
    to ms as the limiters do). One row per identity, sorted by identity.
    """
    needed = ["identity", "cost", "allowed"] + ([] if window_seconds is None else ["time"])
    _require(replayed, needed)
    window = None if window_seconds is None else _window_ms(window_seconds, "window_seconds")
    if replayed["identity"].isna().any():
        raise ValueError("replayed['identity'] has missing values")
    allowed = _allowed(replayed)
    costs = _costs(replayed)
    frame = pd.DataFrame(
        {
            "identity": replayed["identity"].to_numpy(),
            "requests": 1,
            "admitted": allowed.astype(np.int64),
            "rejected": (~allowed).astype(np.int64),
            "admitted_cost": np.where(allowed, costs, 0),
            "rejected_cost": np.where(allowed, 0, costs),
        }
    )
    out = frame.groupby("identity", sort=True)[_PER_IDENTITY_COLUMNS].sum()
    out = out.astype(np.int64)
    if window is not None:
        out["max_admitted_in_window"] = _admitted_peaks(replayed, allowed, costs, window).reindex(
            out.index, fill_value=0
        )
    return out


def _admitted_peaks(
    replayed: pd.DataFrame, allowed: np.ndarray, costs: np.ndarray, window_ms: int
) -> pd.Series:
    """Per identity with admissions, the largest admitted cost in any rolling window."""
    admitted = replayed.loc[allowed]
    if admitted.empty:
        return pd.Series(dtype=np.int64)
    codes, uniques = pd.factorize(admitted["identity"], sort=False)
    if (codes < 0).any():
        raise ValueError("replayed['identity'] has missing values")
    ms = seconds_to_ms(admitted["time"].to_numpy())
    present, peaks = _window_peaks(codes.astype(np.int64), ms, costs[allowed], window_ms)
    return pd.Series(peaks, index=pd.Index(uniques[present], name="identity"))


def overshoot(replayed: pd.DataFrame, limit: int, window_seconds: float) -> float:
    """Worst identity's largest admitted cost in any rolling window, divided by `limit`.

    1.0 means some identity got exactly its budget in some window; 2.0 means twice
    its budget (a fixed window at a boundary). Windows are (t - W, t] in trace time,
    floored to ms. A table with no admissions gives 0.0.
    """
    _require(replayed, ["time", "identity", "cost", "allowed"])
    limit = validation.count("limit", limit)
    window = _window_ms(window_seconds, "window_seconds")
    allowed = _allowed(replayed)
    peaks = _admitted_peaks(replayed, allowed, _costs(replayed), window)
    return float(peaks.max()) / limit if len(peaks) else 0.0


# ---------------------------------------------------------------- Retry-After advice


def _whole_ms(table: pd.DataFrame, column: str, rows: np.ndarray) -> np.ndarray:
    """`table[column]` at `rows` as int64, or ValueError (missing or fractional values)."""
    values = table[column]
    if values.isna().any():
        raise ValueError(f"replayed[{column!r}] has missing values")
    array = values.to_numpy()
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if array.dtype.kind == "f":
        if not np.isfinite(array).all() or (array != np.floor(array)).any():
            raise ValueError(f"replayed[{column!r}] must be whole milliseconds")
    elif array.dtype.kind not in "iu":
        raise ValueError(f"replayed[{column!r}] must be integers, got dtype {values.dtype}")
    return array[rows].astype(np.int64)


def retry_after_error(replayed: pd.DataFrame, limit: int, window_seconds: float) -> pd.Series:
    """How far each rejection's Retry-After advice is from the truth, in ms.

    One value per rejected row, indexed by the row labels of `replayed` (in table
    order), int64, named `retry_after_error_ms`. For a rejected request of identity
    i at true time t (`floor(time * 1000)` ms) with cost c and advice
    R = `retry_after_ms`:

    - the *true history* is i's admitted requests decided before it, i.e. earlier in
      the replay's decision order (ascending `time`, ties in table order), each at its
      own true ms with its cost: what existed when the advice was given. Requests
      admitted later are left out, even in the same ms;
    - T* is the earliest whole ms T >= t at which that history leaves room for c more
      within `limit` in the half-open window (T - W, T], W = `window_seconds` in ms;
    - the error is (t + R) - T*. Positive: told to wait longer than needed. Negative:
      told to come back too early (retrying at t + R would, in truth, overshoot the
      limit). Zero: exact advice.

    In closed form: with n the history's total cost and u_j the true stamp of its j-th
    oldest unit of cost (a request of cost k is k units), T* = max(t, u_j + W) for
    j = n + c - limit >= 1, and T* = t when j <= 0 (there was room all along). The
    exact sliding log on a true clock gives its advice from the same history by the same
    rule, so its error is 0 for every rejection; a limiter whose replicas stamp with
    skewed clocks, or an approximate algorithm, is off by the amounts this measures.

    Every cost must be between 1 and `limit` (a larger one never fits: no T* exists).
    Vectorized, O(n log n).
    """
    _require(replayed, ["time", "identity", "cost", "allowed", "retry_after_ms"])
    limit = validation.count("limit", limit)
    window = _window_ms(window_seconds, "window_seconds")
    if replayed["identity"].isna().any():
        raise ValueError("replayed['identity'] has missing values")
    allowed = _allowed(replayed)
    costs = _costs(replayed)
    if costs.size and (costs.min() < 1 or costs.max() > limit):
        raise ValueError(f"replayed['cost'] must be between 1 and the limit ({limit})")
    ms = seconds_to_ms(replayed["time"].to_numpy())
    rejected = np.flatnonzero(~allowed)
    advice = _whole_ms(replayed, "retry_after_ms", rejected)
    index = replayed.index[rejected]
    name = "retry_after_error_ms"
    if rejected.size == 0:
        return pd.Series(np.empty(0, dtype=np.int64), index=index, name=name)

    # Decision order within each identity: rows grouped by identity, then by `time`
    # (stable, so ties keep table order), as `ratelimit.lab.replay` decides them.
    codes, _ = pd.factorize(replayed["identity"], sort=False)
    time_order = np.argsort(replayed["time"].to_numpy(dtype=np.float64), kind="stable")
    order = time_order[np.argsort(codes[time_order], kind="stable")]
    group = codes[order]
    admitted_cost = np.where(allowed[order], costs[order], 0)
    # Running admitted cost over the whole grouped table (inclusive), and each row's
    # group base: the running total just before its group starts.
    running = np.cumsum(admitted_cost, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate(([True], group[1:] != group[:-1])))
    before_group = (running - admitted_cost)[starts]
    base = np.repeat(before_group, np.diff(np.append(starts, len(order))))

    # The rejected rows, at their positions in the grouped order.
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    at = position[rejected]
    t = ms[rejected]
    history = running[at] - base[at]  # n: admitted cost of i decided before this row
    j = history + costs[rejected] - limit  # which unit must leave the window first
    needs_wait = j >= 1
    # The j-th unit is on the first row whose running total reaches base + j; that row
    # admitted something (the total only rises on admissions) and lies in i's group,
    # before the rejected row, since 1 <= j <= n.
    unit_row = np.searchsorted(running, base[at] + j, side="left")
    unit_row = np.minimum(unit_row, len(order) - 1)  # rows with j <= 0 are not used
    oldest = ms[order[unit_row]]
    earliest = np.where(needs_wait, np.maximum(t, oldest + window), t)
    return pd.Series(t + advice - earliest, index=index, name=name)


# ---------------------------------------------------------------- approximate vs exact


_SAME_TRACE_COLUMNS: Sequence[str] = ("time", "identity", "cost")


def false_decisions(approx: pd.DataFrame, exact: pd.DataFrame) -> dict[str, float | int]:
    """How an approximate limiter's decisions differ from the exact sliding log's
    on the same trace (the same requests, row by row, each replayed on its own state).

    Returns a dict of

    - `requests`, `exact_admitted`, `exact_rejected`;
    - `false_admits`: admitted by `approx`, rejected by `exact` (over the limit);
    - `false_rejects`: rejected by `approx`, admitted by `exact` (lost good traffic);
    - `false_admit_rate`, `false_reject_rate`: those counts over all requests (0.0
      for an empty trace); divide by `exact_rejected` / `exact_admitted` instead for
      the share of the requests that should have been rejected / admitted.

    Rows are compared by position. Where both tables carry `time`, `identity` and
    `cost`, they must agree, or this is not the same trace and ValueError says so.
    """
    _require(approx, ["allowed"], "approx")
    _require(exact, ["allowed"], "exact")
    if len(approx) != len(exact):
        raise ValueError(
            f"approx and exact must be the same trace: {len(approx)} rows vs {len(exact)}"
        )
    for column in _SAME_TRACE_COLUMNS:
        if column in approx.columns and column in exact.columns:
            differs = approx[column].to_numpy() != exact[column].to_numpy()
            if np.any(differs):
                row = int(np.flatnonzero(differs)[0])
                raise ValueError(
                    f"approx and exact must be the same trace: column {column!r} differs "
                    f"(first at row {row})"
                )
    a = _allowed(approx, "approx")
    e = _allowed(exact, "exact")
    n = len(a)
    false_admits = int(np.count_nonzero(a & ~e))
    false_rejects = int(np.count_nonzero(~a & e))
    return {
        "requests": n,
        "exact_admitted": int(np.count_nonzero(e)),
        "exact_rejected": int(n - np.count_nonzero(e)),
        "false_admits": false_admits,
        "false_rejects": false_rejects,
        "false_admit_rate": false_admits / n if n else 0.0,
        "false_reject_rate": false_rejects / n if n else 0.0,
    }


# ---------------------------------------------------------------- over time


def rejection_rate(replayed: pd.DataFrame, bin_seconds: float) -> pd.DataFrame:
    """Requests, rejections and the rejected share per time bin.

    Bins are [k * bin, (k + 1) * bin) on the ms-floored `time` (aligned to multiples
    of the bin, like fixed windows), from the first request's bin to the last's;
    bins without requests have `rate` NaN. Indexed by the bin's start in seconds.
    Columns: `requests`, `rejected`, `rate`, `rejected_cost`.
    """
    _require(replayed, ["time", "allowed", "cost"])
    bin_ms = _window_ms(bin_seconds, "bin_seconds")
    allowed = _allowed(replayed)
    costs = _costs(replayed)
    columns = ["requests", "rejected", "rate", "rejected_cost"]
    if len(replayed) == 0:
        return pd.DataFrame(
            {c: pd.Series(dtype=float if c == "rate" else np.int64) for c in columns},
            index=pd.Index([], dtype=float, name="start"),
        )
    bins = np.floor_divide(seconds_to_ms(replayed["time"].to_numpy()), bin_ms)
    first = int(bins.min())
    slot = bins - first
    size = int(slot.max()) + 1
    requests = np.bincount(slot, minlength=size).astype(np.int64)
    rejected = np.bincount(slot[~allowed], minlength=size).astype(np.int64)
    rejected_cost = np.zeros(size, dtype=np.int64)
    np.add.at(rejected_cost, slot[~allowed], costs[~allowed])
    rate = np.full(size, np.nan)
    np.divide(rejected, requests, out=rate, where=requests > 0)
    starts = (np.arange(first, first + size, dtype=np.int64) * bin_ms) / 1000.0
    return pd.DataFrame(
        {
            "requests": requests,
            "rejected": rejected,
            "rate": rate,
            "rejected_cost": rejected_cost,
        },
        index=pd.Index(starts, name="start"),
    )
