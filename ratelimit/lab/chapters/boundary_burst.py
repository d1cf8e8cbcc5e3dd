"""Chapter 1 (boundary burst), explored: the most requests each algorithm admits in any
rolling window, for the boundary attacker and for Poisson traffic.

The defaults are the chapter's parameters (limit 10 per 1 s window, Poisson at 2x the
limit for 60 s, seed 0), so `figure()` is the chapter's story: the fixed window lets 20
requests (twice the limit) through around the boundary, the other three exactly 10.

    from ratelimit.lab.chapters import boundary_burst
    from ratelimit.lab.plotting import explorer
    boundary_burst.figure()                               # the default figure
    explorer(boundary_burst.figure, **boundary_burst.SLIDERS)   # sliders, in JupyterLab
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The chapter's parameters (notebooks/01_boundary_burst.ipynb, its "parameters" cell).
LIMIT = 10  # requests admitted per window
WINDOW_S = 1  # window width, whole seconds
RATE_MULTIPLE = 2.0  # Poisson rate as a multiple of LIMIT per WINDOW_S (one of the chapter's)
SEED = 0  # seed of the Poisson traffic
DURATION_S = 60  # seconds of Poisson traffic

# Slider abbreviations for `explorer` (ipywidgets: (min, max) or (min, max, step)).
SLIDERS: dict[str, Any] = {
    "limit": (1, 50),
    "window_s": (1, 5),
    "rate_multiple": (0.25, 10.0, 0.25),
    "seed": (0, 100),
}

ATTACK = "boundary attack"
# Same names and colours as the chapter.
COLORS = {
    "fixed window": "tab:orange",
    "sliding log": "tab:blue",
    "sliding-window counter": "tab:green",
    "GCRA (token bucket)": "tab:purple",
}


def _algorithms() -> dict[str, Any]:
    from ratelimit.lab import reference

    return {
        "fixed window": reference.FixedWindowLimiter,
        "sliding log": reference.SlidingWindowLimiter,
        "sliding-window counter": reference.SlidingWindowCounterLimiter,
        "GCRA (token bucket)": reference.TokenBucketLimiter,
    }


def poisson_label(rate_multiple: float, limit: int, window_s: int) -> str:
    """The name of the Poisson group in `peaks` and on the figure's x axis."""
    return f"Poisson at {rate_multiple:g}x the limit\n({rate_multiple * limit / window_s:g} req/s)"


def peaks(
    *,
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    rate_multiple: float = RATE_MULTIPLE,
    seed: int = SEED,
    duration_s: float = DURATION_S,
) -> dict[str, dict[str, int]]:
    """The most requests each algorithm admits in any rolling window (t - window_s, t].

    Returns ``{traffic: {algorithm: peak}}`` for two traces, each replayed through a
    fresh reference model (`ratelimit.lab.reference`) per algorithm with `ratelimit.lab.replay`:
    ``"boundary attack"`` (`traffic.boundary_attack` around the boundary at ``window_s``)
    and ``poisson_label(...)`` (`traffic.poisson` at ``rate_multiple * limit / window_s``
    requests per second for ``duration_s`` seconds, seeded).
    """
    from ratelimit.lab import metrics, traffic
    from ratelimit.lab.simulation import replay

    rate = rate_multiple * limit / window_s
    traces = {
        ATTACK: traffic.boundary_attack(limit, window_s, boundary=window_s),
        poisson_label(rate_multiple, limit, window_s): traffic.poisson(rate, duration_s, seed=seed),
    }
    result: dict[str, dict[str, int]] = {}
    for name, trace in traces.items():
        result[name] = {}
        for algorithm, model in _algorithms().items():
            replayed = replay(trace, model(window_s, limit), progress=False)
            admitted = replayed.time[replayed.allowed]
            result[name][algorithm] = metrics.max_in_window(admitted, window_s)
    return result


def figure(
    *,
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    rate_multiple: float = RATE_MULTIPLE,
    seed: int = SEED,
    duration_s: float = DURATION_S,
) -> Figure:
    """Bar chart of `peaks(...)`: per traffic, the most each algorithm admitted in any
    rolling window, against the limit and twice the limit. Returns the figure (not shown).
    """
    import matplotlib.pyplot as plt
    import numpy as np

    data = peaks(
        limit=limit,
        window_s=window_s,
        rate_multiple=rate_multiple,
        seed=seed,
        duration_s=duration_s,
    )
    groups = list(data)
    x = np.arange(len(groups))
    width = 0.2
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, (algorithm, color) in enumerate(COLORS.items()):
        heights = [data[group][algorithm] for group in groups]
        bars = ax.bar(x + (i - 1.5) * width, heights, width, color=color, label=algorithm)
        ax.bar_label(bars, fontsize=8)
    ax.axhline(limit, color="black", linestyle=":", linewidth=1, label=f"limit ({limit})")
    ax.axhline(
        2 * limit, color="tab:red", linestyle="--", linewidth=1, label=f"2x the limit ({2 * limit})"
    )
    ax.set_xticks(x, [f"{ATTACK}\n({2 * limit} requests in 20 ms)", groups[1]])
    ax.set_ylim(0, 2.45 * limit + 1)
    ax.set_xlabel(f"traffic (Poisson: {duration_s:g} s, seed {seed})")
    ax.set_ylabel(f"max admitted in any rolling\n{window_s} s window (requests)")
    ax.set_title(
        f"Busiest rolling window per algorithm, limit {limit} per {window_s} s: "
        f"the fixed window admits {data[ATTACK]['fixed window']} at the boundary"
    )
    ax.legend(loc="upper right", fontsize=8, ncol=3)
    fig.tight_layout()
    return fig
