"""Chapter 2, clock skew: one client's requests, served in turn by replicas whose clocks
are offset evenly over [-S, +S], limited by the exact sliding log on the application
clock (each replica stamps with its own) or on the Redis clock (one clock for all).

Everything is measured against the true time of each request: the most admitted in any
true rolling window, and how wrong the Retry-After advice is. `Setup` holds the
chapter's parameters and builds its traces, limiters and replays (reference models in
virtual time, so every number is reproducible); the functions below turn them into the
chapter's tables and figures.

    from ratelimit.lab.chapters import clock_skew
    from ratelimit.lab.plotting import explorer
    setup = clock_skew.Setup()                            # the chapter's parameters
    table, decisions = clock_skew.sweep(setup)            # every skew, three limiters
    clock_skew.figure()                                   # the Explore figure
    explorer(clock_skew.figure, **clock_skew.SLIDERS)     # sliders, in JupyterLab
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ratelimit import algorithms
from ratelimit.decision import Decision
from ratelimit.lab import metrics, traffic
from ratelimit.lab.plotting import COLORS, parameters_of
from ratelimit.lab.simulation import replay
from ratelimit.lab.timebase import seconds_to_ms

LOG, FIXED = algorithms.get("log"), algorithms.get("fw")
APP_LABEL = f"{LOG.label}, app clock"
REDIS_LABEL = f"{LOG.label}, Redis clock"
FIXED_LABEL = f"{FIXED.label}, app clock (section 7)"

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
    rate: float = 30.0  # the client's mean requests per second (Poisson)
    duration_s: float = 120.0  # length of the trace, seconds
    seed: int = 7  # seed of the trace

    def __post_init__(self) -> None:
        if self.skew_step_ms < 1:
            raise ValueError(f"skew_step_ms must be >= 1, got {self.skew_step_ms}")
        if self.max_skew_ms < 0:
            raise ValueError(f"max_skew_ms must be >= 0, got {self.max_skew_ms}")

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
        """The sweep's skews S: 0 to `max_skew_ms` in steps of `skew_step_ms`."""
        return list(range(0, self.max_skew_ms + 1, self.skew_step_ms))

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

    def peak(self, replayed: pd.DataFrame) -> int:
        """The most admitted in any true rolling window (t - W, t]."""
        return metrics.max_in_window(replayed.time[replayed.allowed], self.window_s)

    def errors(self, replayed: pd.DataFrame) -> pd.Series:
        """Each rejection's Retry-After error, ms (`metrics.retry_after_error`)."""
        return metrics.retry_after_error(replayed, self.limit, self.window_s)

    def offered(self) -> int:
        """The most requests offered in any true rolling window."""
        return metrics.max_in_window(self.trace(0).time, self.window_s)


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


def _row(setup: Setup, skew_ms: int, app, one_clock, fixed) -> dict:
    """One skew's row of `sweep`."""
    app_error = setup.errors(app)
    advice_ms = app.retry_after_ms[app_error.index]
    header_error = app_error - advice_ms + header_seconds(advice_ms) * 1000
    return {
        "S (ms)": skew_ms,
        "app peak": setup.peak(app),
        "Redis peak": setup.peak(one_clock),
        "fixed peak": setup.peak(fixed),
        "app rejected": int((~app.allowed).sum()),
        "Redis rejected": int((~one_clock.allowed).sum()),
        "fixed rejected": int((~fixed.allowed).sum()),
        "app mean |error| (ms)": round(float(app_error.abs().mean()), 1),
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
    clock and on the Redis clock, and by the fixed window on the app clock.

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
        rows.append(_row(setup, skew_ms, app, one_clock, fixed))
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
    """The most admitted in any true window vs the skew S (`sweep`'s peaks): app clock,
    Redis clock and fixed window, against the limit, one limit per replica and all
    that was offered."""
    s = table.index.to_numpy()
    offered = setup.offered()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(s, table["app peak"].to_numpy(), marker="o", markersize=3, label=APP_LABEL)
    ax.plot(s, table["Redis peak"].to_numpy(), marker="s", markersize=3, label=REDIS_LABEL)
    ax.plot(s, table["fixed peak"].to_numpy(), color="grey", linestyle="--", label=FIXED_LABEL)
    right = max(int(s.max()), 1)
    upper = setup.replicas * setup.limit
    for level, text, color in (
        (setup.limit, "limit", "black"),
        (upper, f"{setup.replicas} x limit", "black"),
        (offered, "everything offered", "grey"),
    ):
        ax.axhline(level, color=color, linewidth=0.8, linestyle=":")
        # The limit's label goes under its line: the app clock's curve runs just above it.
        ax.text(right, level, text, ha="right", va="top" if level == setup.limit else "bottom")
    if setup.replicas > 1 and setup.apart_ms <= right:
        ax.axvline(setup.apart_ms, color="grey", linewidth=0.8)
        text = " neighbouring replicas\n a window apart"
        ax.text(setup.apart_ms, (upper + offered) / 2, text, va="center", fontsize=8)
    if s.max() == 0:  # a single skew: matplotlib would zoom onto it
        ax.set_xlim(-0.05 * right, 1.05 * right)
    ax.set_title(
        f"Most admitted in any true {setup.window_ms} ms window vs clock skew "
        f"({setup.replicas} replicas)"
    )
    ax.set_xlabel("clock skew S (ms): replica clocks offset evenly over [-S, +S]")
    ax.set_ylabel("admitted in one true window (requests)")
    ax.set_ylim(0, max(offered, upper) * 1.1)
    # Upper left, under the highest dotted line: clear of the curves and the right-hand labels.
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, 0.88))
    fig.tight_layout()
    return fig


def errors_figure(setup: Setup, table: pd.DataFrame) -> Figure:
    """The app clock's Retry-After errors vs the skew S (`sweep`'s summary): full range,
    5th to 95th percentile and mean size, beside the Redis clock's largest error."""
    s = table.index.to_numpy()
    color = COLORS[LOG.name]
    fig, ax = plt.subplots(figsize=(8, 4.5))
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
    ax.set_title(
        f"Retry-After error vs clock skew (sliding log, {setup.limit} per {setup.window_ms} ms)"
    )
    ax.set_xlabel("clock skew S (ms): replica clocks offset evenly over [-S, +S]")
    ax.set_ylabel("advised minus true earliest retry (ms)")
    ax.set_ylim(-1.5 * setup.window_ms, 2.1 * max(s.max(), 1))
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


@parameters_of(Setup)
def figure(**params: Any) -> Figure:
    """The Explore figure: `peaks_figure` of a fresh `sweep` with these parameters (the
    defaults are the chapter's). Returns the figure (not shown)."""
    setup = Setup(**params)
    return peaks_figure(setup, sweep(setup)[0])
