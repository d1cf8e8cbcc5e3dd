"""Chapter 2, clock skew: the most requests admitted in any true rolling window as the
replicas' clocks drift apart, on the application clock and on the Redis clock.

    from ratelimit.lab.chapters import clock_skew
    from ratelimit.lab.plotting import explorer
    clock_skew.figure()                                   # the chapter's figure
    explorer(clock_skew.figure, replicas=(1, 8), max_skew_ms=(0, 2000, 50))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

APP_LABEL = "sliding log, app clock"
REDIS_LABEL = "sliding log, Redis clock"


def figure(
    *,
    replicas: int = 3,
    max_skew_ms: int = 2000,
    rate: float = 30.0,
    limit: int = 10,
    window_ms: int = 1000,
    skew_step_ms: int = 50,
    duration_s: float = 120.0,
    seed: int = 7,
) -> Figure:
    """Most admitted in any true window vs the clock skew S, app clock and Redis clock.

    One client sends Poisson requests (`rate` per second for `duration_s` seconds,
    `seed`) to `replicas` replicas in turn, limited to `limit` per `window_ms` by the
    exact sliding log (`ratelimit.lab.reference.SlidingWindowLimiter`). The replicas'
    clocks are offset evenly over [-S, +S] (`traffic.replica_clocks`) for S from 0 to
    `max_skew_ms` in steps of `skew_step_ms`. For every S the trace is replayed with
    each replica stamping its own clock, and the figure plots the most requests
    admitted in any true rolling window (`metrics.max_in_window` on the true times).

    The Redis clock line (`clock="redis"`) is replayed once: the replay drives such a
    limiter with the true `time` alone, and the true arrival times are the same at
    every S (the same seed), so its decisions do not depend on S; the chapter checks
    this at every skew.

    The defaults are the chapter's parameters. Returns the figure (not shown).
    """
    import matplotlib.pyplot as plt
    import numpy as np

    from ratelimit.lab import metrics, reference, traffic
    from ratelimit.lab.simulation import replay

    if skew_step_ms < 1:
        raise ValueError(f"skew_step_ms must be >= 1, got {skew_step_ms}")
    window_s = window_ms / 1000  # the metrics take seconds
    skews_ms = np.arange(0, max_skew_ms + 1, skew_step_ms)
    # The same true arrival times at every skew: only the replicas' clocks move.
    trace = traffic.skewed_replicas(rate, duration_s, replicas=replicas, max_offset=0.0, seed=seed)

    def peak(replayed) -> int:
        return metrics.max_in_window(replayed.time[replayed.allowed], window_s)

    app_peaks = []
    for skew_ms in skews_ms:
        clocks = traffic.replica_clocks(replicas, skew_ms / 1000)
        offsets = dict(zip(clocks.replica.tolist(), clocks.offset.tolist(), strict=True))
        limiter = reference.SlidingWindowLimiter(window_ms=window_ms, limit=limit)
        app_peaks.append(peak(replay(trace, limiter, offsets=offsets)))
    one_clock = reference.SlidingWindowLimiter(window_ms=window_ms, limit=limit, clock="redis")
    redis_peaks = [peak(replay(trace, one_clock))] * len(skews_ms)
    offered = metrics.max_in_window(trace.time, window_s)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(skews_ms, app_peaks, marker="o", markersize=3, label=APP_LABEL)
    ax.plot(skews_ms, redis_peaks, marker="s", markersize=3, label=REDIS_LABEL)
    right = max(int(skews_ms[-1]), 1)
    for level, text, color in (
        (limit, "limit", "black"),
        (replicas * limit, f"{replicas} x limit", "black"),
        (offered, "everything offered", "grey"),
    ):
        ax.axhline(level, color=color, linewidth=0.8, linestyle=":")
        ax.text(right, level, text, ha="right", va="bottom")
    # Neighbouring replicas' clocks are 2S / (N - 1) apart: a whole window from here on.
    apart_ms = window_ms * (replicas - 1) / 2
    if replicas > 1 and apart_ms <= right:
        ax.axvline(
            apart_ms, color="grey", linewidth=0.8, label="neighbouring replicas a window apart"
        )
    ax.set_xlim(-right * 0.02, right * 1.02)
    ax.set_ylim(0, max(offered, replicas * limit) * 1.1)
    ax.set_title(
        f"Most admitted in any true {window_ms} ms window vs clock skew ({replicas} replicas)"
    )
    ax.set_xlabel("clock skew S (ms): replica clocks offset evenly over [-S, +S]")
    ax.set_ylabel("admitted in one true window (requests)")
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 0.22))
    fig.tight_layout()
    return fig
