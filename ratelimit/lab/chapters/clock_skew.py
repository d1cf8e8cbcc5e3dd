"""Chapter 2, clock skew: one client's requests, served in turn by replicas whose clocks
are offset evenly over [-S, +S] (so two replicas' clocks are up to 2S apart), limited by
the exact sliding log on the application clock (each replica stamps with its own) or on
the Redis clock (one clock for all); beside them, two fixed windows on the application
clock: ours (one key per client) and the classic key per window (INCR + EXPIRE).

S means the same everywhere in the chapter, its tables, figures and README text: the
largest offset of a replica's clock from the true time, the offsets spread evenly over
[-S, +S].

Everything is measured against the true time of each request: the most admitted in any
true rolling window, and how wrong the Retry-After advice is. `Setup` holds the
chapter's parameters and builds its traces, limiters and replays (reference models in
virtual time, so every number is reproducible); the functions below turn them into the
chapter's tables and figures.

    from ratelimit.lab.chapters import clock_skew
    from ratelimit.lab.plotting import explorer
    setup = clock_skew.Setup()                            # the chapter's parameters
    table, decisions = clock_skew.sweep(setup)            # every skew, four limiters
    clock_skew.figure()                                   # the Explore figure
    explorer(clock_skew.figure, **clock_skew.SLIDERS)     # sliders, in JupyterLab
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from ratelimit import algorithms
from ratelimit.decision import Decision
from ratelimit.lab import metrics, traffic
from ratelimit.lab.plotting import COLORS, parameters_of
from ratelimit.lab.simulation import replay
from ratelimit.lab.timebase import seconds_to_ms

LOG, FIXED = algorithms.get("log"), algorithms.get("fw")
APP_LABEL = f"{LOG.label}, app clock"
REDIS_LABEL = f"{LOG.label}, Redis clock"
FIXED_LABEL = f"{FIXED.label} (ours), app clock"
CLASSIC_LABEL = f"{FIXED.label}, classic key per window (TTL {{ttl}} windows), app clock"
SKEW_AXIS = "clock skew S (ms): replica clocks offset evenly over [-S, +S], up to 2S apart"

# The README's texts for this chapter (`ratelimit.lab.records`): each field is a record
# the notebook puts. Every peak is stated with the trace it was measured on (replicas,
# rate, length, seed) beside it; the sentence that holds across replicas, rates and
# seeds comes from the chapter's wider sweep (`generality`).
TITLE = "Clock skew"
SUMMARY = (
    "{replicas} replicas taking one client's Poisson traffic ({rate} requests/s for "
    "{duration_s} s, seed {seed}), their clocks offset over [-S, +S] (up to 2S apart), let "
    "{peak_first_level} of a limit of {limit} into a true second at S = "
    "{small_skew_from_ms}-{first_level_to_ms} ms and {peak_large} from "
    "{large_skew_from_ms} ms to {largest_skew_s} s; over {grid_replicas_min}-"
    "{grid_replicas_max} replicas, {grid_rate_min}-{grid_rate_max} requests/s and "
    "{grid_seeds} seeds, {grid_ntp_peak_min}-{grid_ntp_peak_max} within NTP's "
    "{small_skew_to_ms} ms and never more than the limit plus one per replica behind the "
    "one ahead; Retry-After off by {ratio_small_min}-{ratio_small_max} x S on average up "
    "to {small_skew_to_ms} ms (late by up to {most_late_per_s}S); the Redis clock holds "
    "exactly {peak_redis} at every S; fixed windows keep rejecting under skew, ours "
    "peaking at {fixed_peak_max} and the classic key per window at {classic_peak_max}"
)
HEADLINE = (
    "{replicas} replicas whose clocks are offset evenly over [-S, +S] (up to 2S apart) take "
    "one client's Poisson traffic, {rate} requests/s for {duration_s} s (seed {seed}), "
    "limit {limit} per {window_ms} ms. On their own clocks, {peak_first_level} requests get "
    "into one true second at S = {small_skew_from_ms}-{first_level_to_ms} ms and "
    "{peak_large} from {large_skew_from_ms} ms to {largest_skew_s} s; over "
    "{grid_replicas_min}-{grid_replicas_max} replicas, {grid_rate_min}-{grid_rate_max} "
    "requests/s and {grid_seeds} seeds the peak is {grid_ntp_peak_min}-{grid_ntp_peak_max} "
    "within NTP's {small_skew_to_ms} ms and at most the limit plus one per replica behind the "
    "one ahead at any S. Retry-After is off by {ratio_small_min}-{ratio_small_max} x S on "
    "average up to {small_skew_to_ms} ms and by at most {ratio_max} x S on average at any S, "
    "single answers late by up to {most_late_per_s}S. On Redis's clock: exactly "
    "{peak_redis} and exact advice at every S. Fixed windows keep limiting under "
    "skew: ours peaks at {fixed_peak_min}-{fixed_peak_max} in a true second (the boundary "
    "burst is {burst_2x}), the classic key per window at {classic_peak_min}-"
    "{classic_peak_max} while its keys outlive a window plus 2S; with a one-window TTL it "
    "admits {classic_short_admitted} of all requests at S = {largest_skew_s} s."
)

# What the chapter records of `regimes`' curve (each a number its prose and the README
# quote): name -> (format, what it is).
CURVE_RECORDS = {
    "small_skew_from_ms": ("d", "smallest S > 0 swept (ms)"),
    "small_skew_to_ms": ("d", "largest S of NTP's range (ms)"),
    "peak_small_min": ("d", "fewest admitted in a true second, app clock, S in NTP's range"),
    "peak_small_max": ("d", "most admitted in a true second, app clock, S in NTP's range"),
    "peak_first_level": ("d", "most admitted in a true second, app clock, smallest S > 0"),
    "first_level_to_ms": ("d", "largest S whose peak is still the smallest S's (ms)"),
    "peak_large": ("d", "most admitted in a true second, app clock, any S"),
    "large_skew_from_ms": ("d", "smallest S at which the app clock's peak is its largest (ms)"),
    "ratio_small_min": (".2f", "smallest mean |Retry-After error| / S, app clock, NTP's range"),
    "ratio_small_max": (".2f", "largest mean |Retry-After error| / S, app clock, NTP's range"),
    "ratio_max": (".2f", "largest mean |Retry-After error| / S, any S"),
    "most_late_per_s": ("g", "largest late Retry-After error / S, any S"),
}

# Slider abbreviations for `explorer` (ipywidgets: (min, max) or (min, max, step)).
SLIDERS = {
    "replicas": (1, 8),
    "max_skew_ms": (0, 2000, 50),
    "rate": (5.0, 60.0, 5.0),
    "limit": (1, 30),
}

# The sweep's error columns, and their short names in the chapter's table.
ERROR_COLUMNS = {
    "app mean |error| (ms)": "mean |error|",
    "app mean |error| / S": "mean |error| / S",
    "app error p5 (ms)": "p5",
    "app error p95 (ms)": "p95",
    "app most too early (ms)": "most early",
    "app most too late (ms)": "most late",
    "app share too early": "share early",
    "app header smallest error (ms)": "header min",
    "Redis largest |error| (ms)": "Redis max |error|",
}


@dataclass(frozen=True)
class Setup:
    """The chapter's parameters (defaults: its own), and what is built from them."""

    limit: int = 10  # requests per window
    window_ms: int = 1000  # window, whole ms
    replicas: int = 3  # replicas taking the client's requests in turn
    max_skew_ms: int = 2000  # the sweep's largest S
    skew_step_ms: int = 50  # the sweep's step in S
    # Skews below the step, swept too: the range NTP keeps clocks in.
    small_skews_ms: tuple[int, ...] = (1, 2, 5, 10, 15, 20, 25, 30, 40)
    rate: float = 30.0  # the client's mean requests per second (Poisson)
    duration_s: float = 120.0  # length of the trace, seconds
    seed: int = 7  # seed of the trace
    classic_ttl_windows: int = 10  # the classic fixed window's key TTL, in windows

    def __post_init__(self) -> None:
        if self.skew_step_ms < 1:
            raise ValueError(f"skew_step_ms must be >= 1, got {self.skew_step_ms}")
        if self.max_skew_ms < 0:
            raise ValueError(f"max_skew_ms must be >= 0, got {self.max_skew_ms}")
        if any(int(s) != s or s < 0 for s in self.small_skews_ms):
            raise ValueError(f"small_skews_ms must be whole ms >= 0, got {self.small_skews_ms}")
        if self.classic_ttl_windows < 1:
            raise ValueError(f"classic_ttl_windows must be >= 1, got {self.classic_ttl_windows}")

    @property
    def window_s(self) -> float:
        """The window in seconds, as the metrics take it."""
        return self.window_ms / 1000

    @property
    def apart_ms(self) -> float:
        """The skew from which neighbouring replicas' clocks, 2S / (N - 1) apart, are a
        whole window apart."""
        return self.window_ms * (self.replicas - 1) / 2

    @property
    def skews_ms(self) -> list[int]:
        """The sweep's skews S: 0 to `max_skew_ms` in steps of `skew_step_ms`, plus the
        `small_skews_ms` up to `max_skew_ms`, ascending."""
        stepped = range(0, self.max_skew_ms + 1, self.skew_step_ms)
        small = (int(s) for s in self.small_skews_ms if s <= self.max_skew_ms)
        return sorted({*stepped, *small})

    def clocks(self, skew_ms: float) -> pd.DataFrame:
        """The replicas' clocks at skew S (`traffic.replica_clocks`): `replica`, `offset` (s)."""
        return traffic.replica_clocks(self.replicas, skew_ms / 1000)

    def trace(self, skew_ms: float) -> pd.DataFrame:
        """The client's requests at skew S: the same seed gives the same true arrival
        times at every skew, only the replicas' `clock_offset` moves."""
        return traffic.skewed_replicas(
            self.rate,
            self.duration_s,
            replicas=self.replicas,
            max_offset=skew_ms / 1000,
            seed=self.seed,
        )

    def limiter(self, tag: str = "log", clock: str | None = None):
        """A fresh reference model of algorithm `tag`; `clock="redis"` for the Redis clock."""
        options = {} if clock is None else {"clock": clock}
        model = algorithms.get(tag).limiter_class("reference")
        return model(window_ms=self.window_ms, limit=self.limit, **options)

    def replay(self, skew_ms: float, tag: str = "log", clock: str | None = None) -> pd.DataFrame:
        """The trace at skew S decided by `limiter(tag, clock)`: on the app clock each
        request is stamped at `time + clock_offset`, on the Redis clock at `time`."""
        return replay(self.trace(skew_ms), self.limiter(tag, clock), progress=False)

    def replay_classic(self, skew_ms: float, ttl_windows: int | None = None) -> pd.DataFrame:
        """The trace at skew S decided by `classic_fixed_window`, its keys living
        `ttl_windows` windows (default `classic_ttl_windows`)."""
        ttl = self.classic_ttl_windows if ttl_windows is None else ttl_windows
        return classic_fixed_window(
            self.trace(skew_ms), self.window_ms, self.limit, ttl * self.window_ms
        )

    def peak(self, replayed: pd.DataFrame) -> int:
        """The most admitted in any true rolling window (t - W, t]."""
        return metrics.max_in_window(replayed.time[replayed.allowed], self.window_s)

    def errors(self, replayed: pd.DataFrame) -> pd.Series:
        """Each rejection's Retry-After error, ms (`metrics.retry_after_error`)."""
        return metrics.retry_after_error(replayed, self.limit, self.window_s)

    def offered(self) -> int:
        """The most requests offered in any true rolling window."""
        return metrics.max_in_window(self.trace(0).time, self.window_s)


def classic_fixed_window(
    trace: pd.DataFrame, window_ms: int, limit: int, ttl_ms: int
) -> pd.DataFrame:
    """The classic fixed window, one Redis key per client and window, in virtual time;
    returns `trace` with `allowed` added.

    Each request's replica names the key of the window its own clock is in,
    `floor((time + clock_offset) * 1000 / window_ms)`, INCRBYs it by the request's `cost`
    and, when that created the key, sets its TTL to `ttl_ms`; the request is admitted
    while the count is within `limit` (rejected requests count too, as INCR-then-compare
    counts them: a key over the limit stays over it). Redis expires keys on its own
    clock, the true `time`: a key whose TTL ran out is gone, and the next INCRBY starts
    it again. Requests are decided in true-time order, as `replay` decides them.
    """
    if ttl_ms < 1 or window_ms < 1:
        raise ValueError(f"window_ms and ttl_ms must be >= 1, got {window_ms} and {ttl_ms}")
    order = np.argsort(trace.time.to_numpy(dtype=float), kind="stable")
    true_ms = seconds_to_ms(trace.time.to_numpy())[order].tolist()
    stamps = trace.time + trace.get("clock_offset", 0.0)
    numbers = (seconds_to_ms(stamps.to_numpy()) // window_ms)[order].tolist()
    who = trace.identity.to_numpy(dtype=object)[order].tolist()
    costs = trace.cost.to_numpy()[order].tolist()
    keys: dict[tuple[Any, int], tuple[int, int]] = {}  # (identity, window) -> (count, expiry)
    allowed = np.empty(len(trace), dtype=bool)
    rows = zip(order.tolist(), true_ms, numbers, who, costs, strict=True)
    for row, now, number, identity, cost in rows:
        key = (identity, number)
        count, expires = keys.get(key, (0, 0))
        if count and expires <= now:  # expired: INCRBY starts a fresh key
            count = 0
        if count == 0:
            expires = now + ttl_ms
        keys[key] = (count + cost, expires)
        allowed[row] = count + cost <= limit
    return trace.assign(allowed=allowed)


def clock_table(setup: Setup, skew_ms: float) -> pd.DataFrame:
    """Each replica's clock offset at skew S, whole ms."""
    clocks = setup.clocks(skew_ms)
    return clocks.assign(offset_ms=(clocks.offset * 1000).round().astype(int))[
        ["replica", "offset_ms"]
    ]


def stamped(trace: pd.DataFrame) -> pd.DataFrame:
    """Per request: its replica, its true ms, and the ms its replica stamps on the app clock."""
    return pd.DataFrame(
        {
            "replica": trace.replica,
            "true ms": seconds_to_ms(trace.time),
            "stamped ms (app clock)": seconds_to_ms(trace.time + trace.clock_offset),
        }
    )


def by_replica(setup: Setup, skew_ms: float) -> pd.DataFrame:
    """Per replica, on the app clock at skew S: requests, admitted, rejected, and the
    mean, most negative and most positive Retry-After error (ms)."""
    app = setup.replay(skew_ms)
    errors = setup.errors(app)
    by = errors.groupby(app.replica[errors.index])
    return pd.DataFrame(
        {
            "requests": app.groupby("replica").size(),
            "admitted": app.groupby("replica").allowed.sum(),
            "rejected": (~app.allowed).groupby(app.replica).sum(),
            "mean error": by.mean().round(1),
            "most early": by.min(),
            "most late": by.max(),
        }
    ).rename_axis("replica")


def header_seconds(retry_after_ms: pd.Series) -> np.ndarray:
    """The HTTP Retry-After header for each rejection's advice, as `Decision.retry_after`
    gives it (whole seconds)."""
    return np.array([Decision(False, 1, 0, int(ms), 0).retry_after for ms in retry_after_ms])


def _row(setup: Setup, skew_ms: int, app, one_clock, fixed, classic) -> dict:
    """One skew's row of `sweep`."""
    app_error = setup.errors(app)
    advice_ms = app.retry_after_ms[app_error.index]
    header_error = app_error - advice_ms + header_seconds(advice_ms) * 1000
    return {
        "S (ms)": skew_ms,
        "app peak": setup.peak(app),
        "Redis peak": setup.peak(one_clock),
        "fixed peak": setup.peak(fixed),
        "classic peak": setup.peak(classic),
        "app rejected": int((~app.allowed).sum()),
        "Redis rejected": int((~one_clock.allowed).sum()),
        "fixed rejected": int((~fixed.allowed).sum()),
        "classic rejected": int((~classic.allowed).sum()),
        "app mean |error| (ms)": round(float(app_error.abs().mean()), 1),
        # The error's size per ms of skew (undefined without skew).
        "app mean |error| / S": (
            round(float(app_error.abs().mean()) / skew_ms, 3) if skew_ms else np.nan
        ),
        "app error p5 (ms)": int(app_error.quantile(0.05, interpolation="nearest")),
        "app error p95 (ms)": int(app_error.quantile(0.95, interpolation="nearest")),
        "app most too early (ms)": int(app_error.min()),
        "app most too late (ms)": int(app_error.max()),
        "app share too early": round(float((app_error < 0).mean()), 3),
        "app header smallest error (ms)": int(header_error.min()),
        "Redis largest |error| (ms)": int(setup.errors(one_clock).abs().max()),
    }


def sweep(setup: Setup) -> tuple[pd.DataFrame, dict[str, dict[int, pd.DataFrame]]]:
    """The trace replayed at every skew of `setup.skews_ms` by the sliding log on the app
    clock and on the Redis clock, and by two fixed windows on the app clock: ours
    ("fixed") and the classic key per window ("classic", `Setup.replay_classic`).

    Returns the table (one row per S: peaks, rejections, Retry-After error summary) and
    the sliding log's decisions (`allowed`, `retry_after_ms`) per clock ("app",
    "redis"), then per S.
    """
    rows = []
    decisions: dict[str, dict[int, pd.DataFrame]] = {"app": {}, "redis": {}}
    for skew_ms in setup.skews_ms:
        app = setup.replay(skew_ms)
        one_clock = setup.replay(skew_ms, clock="redis")
        fixed = setup.replay(skew_ms, tag="fw")
        classic = setup.replay_classic(skew_ms)
        rows.append(_row(setup, skew_ms, app, one_clock, fixed, classic))
        decisions["app"][skew_ms] = app[["allowed", "retry_after_ms"]]
        decisions["redis"][skew_ms] = one_clock[["allowed", "retry_after_ms"]]
    return pd.DataFrame(rows).set_index("S (ms)"), decisions


def settled_from(decisions: dict[int, pd.DataFrame]) -> int:
    """The smallest skew from which no decision (admitted or not) changes any more."""
    skews = sorted(decisions)
    last = decisions[skews[-1]].allowed
    settled = skews[-1]
    for skew_ms in reversed(skews):
        if not decisions[skew_ms].allowed.equals(last):
            break
        settled = skew_ms
    return settled


def error_table(table: pd.DataFrame) -> pd.DataFrame:
    """The sweep's Retry-After error columns, under their short names."""
    return table[list(ERROR_COLUMNS)].rename(columns=ERROR_COLUMNS)


def regimes(table: pd.DataFrame, small_to_ms: int) -> dict[str, float]:
    """The app clock's curve in `sweep`'s table, in numbers: the peaks and the mean
    Retry-After error per ms of skew over the small skews (0, `small_to_ms`], the
    largest peak and the smallest S that reaches it, the peak at the smallest S > 0
    and the largest S (below the largest peak's) still at that level, and over every
    S > 0 the range of the mean error per ms of skew and the largest late error per ms
    of skew."""
    skewed = table[table.index > 0]
    small = skewed[skewed.index <= small_to_ms]
    if small.empty or small_to_ms not in table.index:
        raise ValueError(f"the sweep has no skew in (0, {small_to_ms}] ms ending at {small_to_ms}")
    app_peak = table["app peak"]
    ratio = skewed["app mean |error| / S"]
    large_from = app_peak.index[app_peak == app_peak.max()].min()
    level = skewed["app peak"].iloc[0]
    first_level = skewed[skewed.index < large_from]
    first_level = first_level[first_level["app peak"] == level]
    if first_level.empty:  # the smallest skew already reaches the largest peak
        first_level = skewed.iloc[:1]
    small_ratio = small["app mean |error| / S"]
    return {
        "small_skew_from_ms": int(small.index.min()),
        "small_skew_to_ms": int(small_to_ms),
        "peak_small_min": int(small["app peak"].min()),
        "peak_small_max": int(small["app peak"].max()),
        "ratio_small_min": float(small_ratio.min()),
        "ratio_small_max": float(small_ratio.max()),
        "peak_large": int(app_peak.max()),
        "large_skew_from_ms": int(large_from),
        # The step below the largest peak: its level, and the last S before the step.
        "peak_first_level": int(skewed["app peak"].iloc[0]),
        "first_level_to_ms": int(first_level.index.max()),
        "ratio_min": float(ratio.min()),
        "ratio_max": float(ratio.max()),
        "most_late_per_s": float((skewed["app most too late (ms)"] / skewed.index).max()),
    }


def generality(
    setup: Setup,
    replicas: Iterable[int],
    rates: Iterable[float],
    seeds: Iterable[int],
) -> pd.DataFrame:
    """The app clock's peak in a true window at every S of `setup.skews_ms`, for each
    number of replicas, rate and seed (everything else as in `setup`): one row per
    (`replicas`, `rate`, `seed`, `S (ms)`) with its `peak`."""
    rows = []
    for n in replicas:
        for rate in rates:
            for seed in seeds:
                other = replace(setup, replicas=n, rate=rate, seed=seed)
                for skew_ms in other.skews_ms:
                    peak = other.peak(other.replay(skew_ms))
                    rows.append((n, rate, seed, skew_ms, peak))
    return pd.DataFrame(rows, columns=["replicas", "rate", "seed", "S (ms)", "peak"])


def generality_table(
    peaks: pd.DataFrame, limit: int, ntp_ms: int, shown_ms: Iterable[int]
) -> pd.DataFrame:
    """`generality`'s peaks, the most over the seeds, per number of replicas and rate:
    at each S of `shown_ms`, over S in (0, `ntp_ms`] and over every S, beside the limit
    plus one per replica behind the one ahead (limit + N - 1)."""
    by = ["replicas", "rate"]
    skewed = peaks[peaks["S (ms)"] > 0]
    wide = skewed.pivot_table(index=by, columns="S (ms)", values="peak", aggfunc="max")
    table = wide[list(shown_ms)].rename(columns=lambda s: f"S = {s} ms")
    table[f"fewest, 0 < S <= {ntp_ms} ms"] = (
        skewed[skewed["S (ms)"] <= ntp_ms].groupby(by).peak.min()
    )
    table[f"most, S <= {ntp_ms} ms"] = skewed[skewed["S (ms)"] <= ntp_ms].groupby(by).peak.max()
    table["most, any S"] = skewed.groupby(by).peak.max()
    table["limit + N - 1"] = limit + table.index.get_level_values("replicas") - 1
    table.columns.name = None
    return table.rename_axis(["replicas", "requests/s"])


def generality_records(
    peaks: pd.DataFrame, table: pd.DataFrame, ntp_ms: int
) -> dict[str, tuple[Any, str]]:
    """What the chapter quotes of its wider sweep (`generality`, `generality_table`):
    name -> (value, format)."""
    ntp = peaks[(peaks["S (ms)"] > 0) & (peaks["S (ms)"] <= ntp_ms)].peak
    replicas, rates = peaks.replicas, peaks.rate
    return {
        "grid_replays": (len(peaks), ",d"),
        "grid_cells": (len(table), "d"),
        "grid_bound_reached": (int((table["most, any S"] == table["limit + N - 1"]).sum()), "d"),
        "grid_replicas_min": (int(replicas.min()), "d"),
        "grid_replicas_max": (int(replicas.max()), "d"),
        "grid_rate_min": (float(rates.min()), "g"),
        "grid_rate_max": (float(rates.max()), "g"),
        "grid_seeds": (peaks.seed.nunique(), "d"),
        "grid_ntp_peak_min": (int(ntp.min()), "d"),
        "grid_ntp_peak_max": (int(ntp.max()), "d"),
    }


def expiry_table(
    setup: Setup, skews_ms: Iterable[int], ttl_windows: Iterable[int] = (1, 2, 10)
) -> pd.DataFrame:
    """The classic fixed window's rejections at each skew S for keys living each of
    `ttl_windows` windows, beside W + 2S: from the first replica that opens a window to
    the last one that leaves it (its clock 2S behind) takes up to a window plus 2S."""
    skews = list(skews_ms)
    table = pd.DataFrame(index=pd.Index(skews, name="S (ms)"))
    table["W + 2S (ms)"] = [setup.window_ms + 2 * s for s in skews]
    for n in ttl_windows:
        rejected = [int((~setup.replay_classic(s, n).allowed).sum()) for s in skews]
        table[f"rejected, TTL {n * setup.window_ms} ms"] = rejected
    return table


def _skew_axis(ax: Axes, skews: np.ndarray, steps: tuple[int, ...] = (1, 2, 5)) -> None:
    """An x axis for S that shows the few ms NTP keeps clocks within as clearly as whole
    seconds: linear up to 1 ms, logarithmic above, ticks at `steps` x powers of ten."""
    right = max(int(skews.max()), 1)
    ax.set_xscale("symlog", linthresh=1, linscale=0.5)
    ticks = [m * 10**e for e in range(8) for m in steps]
    ax.xaxis.set_major_locator(FixedLocator([0, *(t for t in ticks if t <= right)]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(0, right * 1.15)
    ax.set_xlabel(f"{SKEW_AXIS}\n(linear up to 1 ms, logarithmic above)")


def error_histogram(setup: Setup, skew_ms: float) -> Figure:
    """Each replica's Retry-After errors at skew S on the app clock, side by side."""
    app = setup.replay(skew_ms)
    errors = setup.errors(app)
    offsets = setup.clocks(skew_ms).offset
    fig, ax = plt.subplots(figsize=(8, 4.2))
    bins = np.arange(-2 * skew_ms, 2 * skew_ms + 51, 50)
    for replica, group in errors.groupby(app.replica[errors.index]):
        label = f"replica {replica} (clock {round(offsets[replica] * 1000):+d} ms)"
        ax.hist(group, bins=bins, alpha=0.55, label=label)
    ax.axvline(0, color="black", linewidth=1)
    ax.set_title(f"Retry-After error per replica at S = {skew_ms} ms (application clock)")
    ax.set_xlabel("advised retry time minus earliest true fit (ms); < 0 = too early")
    ax.set_ylabel("rejected requests")
    ax.legend()
    fig.tight_layout()
    return fig


def peaks_figure(setup: Setup, table: pd.DataFrame) -> Figure:
    """The most admitted in any true window vs the skew S (`sweep`'s peaks): the sliding
    log on the app clock and on the Redis clock, and the two fixed windows, against the
    limit, twice the limit (a fixed window's boundary burst), one limit per replica and
    all that was offered."""
    s = table.index.to_numpy()
    offered = setup.offered()
    fig, ax = plt.subplots(figsize=(8.5, 5))
    ax.plot(s, table["app peak"].to_numpy(), marker="o", markersize=3, label=APP_LABEL)
    ax.plot(s, table["Redis peak"].to_numpy(), marker="s", markersize=3, label=REDIS_LABEL)
    ax.plot(s, table["fixed peak"].to_numpy(), color="grey", linestyle="--", label=FIXED_LABEL)
    ax.plot(
        s,
        table["classic peak"].to_numpy(),
        color="tab:brown",
        linestyle="-.",
        label=CLASSIC_LABEL.format(ttl=setup.classic_ttl_windows),
    )
    right = max(int(s.max()), 1)
    upper = setup.replicas * setup.limit
    levels = [
        (setup.limit, "limit", "top"),
        (2 * setup.limit, "2 x limit (boundary burst)", "bottom"),
        (upper, f"{setup.replicas} x limit", "bottom"),
        (offered, "everything offered", "bottom"),
    ]
    for level, text, va in levels:
        color = "grey" if level == offered else "black"
        ax.axhline(level, color=color, linewidth=0.8, linestyle=":")
        # Labelled at a fifth of the width, where no curve crosses these lines; the
        # limit's label goes under its line, which the app clock's curve runs just above.
        where = ax.get_yaxis_transform()
        ax.text(0.2, level, text, transform=where, ha="left", va=va, fontsize=8)
    if setup.replicas > 1 and setup.apart_ms <= right:
        ax.axvline(setup.apart_ms, color="grey", linewidth=0.8)
        text = "neighbouring\nreplicas a\nwindow apart "
        ax.text(setup.apart_ms, 0.25 * setup.limit, text, ha="right", va="bottom", fontsize=8)
    _skew_axis(ax, s)
    ax.set_title(
        f"Most admitted in any true {setup.window_ms} ms window vs clock skew "
        f"({setup.replicas} replicas)"
    )
    ax.set_ylabel("admitted in one true window (requests)")
    ax.set_ylim(0, max(offered, upper) * 1.1)
    # Upper right, under the highest dotted line: clear of the curves and the labels.
    ax.legend(loc="upper right", bbox_to_anchor=(1.0, 0.88), fontsize=8)
    fig.tight_layout()
    return fig


def errors_figure(setup: Setup, table: pd.DataFrame) -> Figure:
    """The app clock's Retry-After errors vs the skew S (`sweep`'s summary). Left: full
    range, 5th to 95th percentile and mean size, beside the Redis clock's largest error
    and +-2S. Right: the mean size per ms of skew, and the largest late error per ms."""
    s = table.index.to_numpy()
    color = COLORS[LOG.name]
    fig, (ax, per_ms) = plt.subplots(1, 2, figsize=(11, 4.8), width_ratios=(3, 2))
    bands = [
        ("app most too early (ms)", "app most too late (ms)", 0.15, "full range"),
        ("app error p5 (ms)", "app error p95 (ms)", 0.35, "5th to 95th percentile"),
    ]
    for low, high, alpha, what in bands:
        label = f"app clock: {what}"
        ax.fill_between(s, table[low], table[high], color=color, alpha=alpha, label=label)
    ax.plot(s, table["app mean |error| (ms)"], color="navy", label="app clock: mean |error|")
    ax.plot(
        s,
        table["Redis largest |error| (ms)"],
        color="C1",
        linewidth=2,
        label="Redis clock: largest |error|",
    )
    ax.plot(s, 2 * s, color="grey", linestyle=":", linewidth=1, label="± 2S (clock spread)")
    ax.plot(s, -2 * s, color="grey", linestyle=":", linewidth=1)
    ax.axhline(
        -setup.window_ms, color="black", linestyle="--", linewidth=0.8, label="one window too early"
    )
    # Symmetric log on both axes: errors of 1 ms and of 4 s both show.
    ax.set_yscale("symlog", linthresh=1, linscale=0.5)
    top = 30 * max(s.max(), 1)
    powers = [10**e for e in range(int(np.log10(top)) + 1)]
    ax.yaxis.set_major_locator(FixedLocator([-p for p in powers[::-1]] + [0] + powers))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(-3 * setup.window_ms, top)
    _skew_axis(ax, s)
    ax.set_title(f"Retry-After error (sliding log, {setup.limit} per {setup.window_ms} ms)")
    ax.set_ylabel("advised minus true earliest retry (ms)")
    ax.legend(loc="upper left", fontsize=7)

    skewed = table[table.index > 0]
    ms = skewed.index.to_numpy()
    per_ms.plot(
        ms,
        skewed["app mean |error| / S"],
        color="navy",
        marker="o",
        markersize=3,
        label="mean |error| / S",
    )
    per_ms.plot(
        ms,
        skewed["app most too late (ms)"] / ms,
        color=color,
        linestyle="--",
        label="most late / S",
    )
    per_ms.axhline(1, color="grey", linestyle=":", linewidth=1)
    _skew_axis(per_ms, s, steps=(1,))
    per_ms.set_xlabel("clock skew S (ms), as on the left")
    per_ms.set_ylim(0, 2.4)
    per_ms.set_title("App clock's error per ms of skew")
    per_ms.set_ylabel("error / S")
    per_ms.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


@parameters_of(Setup)
def figure(**params: Any) -> Figure:
    """The Explore figure: `peaks_figure` of a fresh `sweep` with these parameters (the
    defaults are the chapter's). Returns the figure (not shown)."""
    setup = Setup(**params)
    return peaks_figure(setup, sweep(setup)[0])
