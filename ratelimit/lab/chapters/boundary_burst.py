"""Chapter 1, boundary burst: what each algorithm admits around a fixed window's boundary
and under Poisson traffic, measured as the most requests admitted in any rolling window.

Every function takes the chapter's parameters (defaults: 10 requests per 1 s window,
Poisson traffic for 60 s with seed 0) and replays fresh reference models
(`ratelimit.lab.reference`) in virtual time, so every number is reproducible;
`real_script` runs the real Lua script on the embedded Redis instead.

    from ratelimit.lab.chapters import boundary_burst
    from ratelimit.lab.plotting import explorer
    boundary_burst.attack_table()                                # the attack, per algorithm
    boundary_burst.figure()                                      # the Explore figure
    explorer(boundary_burst.figure, **boundary_burst.SLIDERS)    # sliders, in JupyterLab
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

import ratelimit
from ratelimit import algorithms
from ratelimit.lab import metrics, traffic
from ratelimit.lab.plotting import COLORS, parameters_of
from ratelimit.lab.simulation import replay
from ratelimit.lab.timebase import seconds_to_ms

# The README's chapter-table cell and gallery text, filled from the chapter's records
# (notebooks/data/records/01_boundary_burst.json) by `ratelimit.lab.records`.
TITLE = "Boundary burst"
SUMMARY = (
    "a fixed window of {limit}/s lets a boundary attacker through with {attack_requests} "
    "requests in {attack_span_ms} ms; the sliding log admits at most {log_attack_peak} in any "
    "rolling second, and exactly {log_poisson_peak} at the busiest under Poisson traffic at "
    "{rate_min}x-{rate_max}x the limit, where the fixed window reaches {fixed_poisson_peak}"
)
HEADLINE = (
    "A client that sends {attack_burst} requests just before a {window_s} s window boundary "
    "and {attack_burst} just after gets {fixed_attack_peak} through a fixed window of "
    "{limit}/s ({fixed_attack_ratio}x the limit) within one rolling second; the sliding log, "
    "the counter and GCRA admit {others_attack_peak}."
)

# The chapter's parameters (notebooks/01_boundary_burst.ipynb, its "parameters" cell).
LIMIT = 10  # requests admitted per window
WINDOW_S = 1  # window width, whole seconds
RATE_MULTIPLES = (0.5, 1, 2, 5)  # Poisson rates, as multiples of LIMIT per WINDOW_S
RATE_MULTIPLE = 2  # the Poisson rate of the Explore figure, one of RATE_MULTIPLES
SEED = 0  # seed of the Poisson traffic
DURATION_S = 60  # seconds of Poisson traffic per rate

# Slider abbreviations for `explorer` (ipywidgets: (min, max) or (min, max, step)).
SLIDERS: dict[str, Any] = {
    "limit": (1, 50),
    "window_s": (1, 5),
    "rate_multiple": (0.25, 10.0, 0.25),
    "seed": (0, 100),
}

# The fixed window comes first in every table and figure: it is the one under attack.
ORDER = (
    algorithms.FIXED_WINDOW,
    *(a for a in algorithms.ALGORITHMS if a is not algorithms.FIXED_WINDOW),
)
FIXED, LOG = ORDER[0], ORDER[1]
ATTACK = "boundary attack"
PEAK = "max admitted in any rolling second"
IDENTITY = "api-key-123"  # the client of the real script's checks


def attack(limit: int = LIMIT, window_s: int = WINDOW_S) -> pd.DataFrame:
    """The attacker's trace (`traffic.boundary_attack`): `limit` requests in the 10 ms
    before the boundary at `window_s`, `limit` more in the 10 ms from it."""
    return traffic.boundary_attack(limit, window_s, boundary=window_s)


def decide(tag: str, trace: pd.DataFrame, limit: int, window_s: int) -> pd.DataFrame:
    """`trace` decided by a fresh reference model of algorithm `tag`, so no state carries
    over between experiments."""
    model = algorithms.get(tag).limiter_class("reference")
    return replay(trace, model(window_s, limit), progress=False)


def peak(replayed: pd.DataFrame, window_s: int) -> int:
    """The most requests `replayed` admitted in any rolling window (t - window_s, t]."""
    return metrics.max_in_window(replayed.time[replayed.allowed], window_s)


def bursts(limit: int = LIMIT, window_s: int = WINDOW_S) -> pd.DataFrame:
    """The attack's two bursts: requests, first and last ms, before and after the boundary."""
    ms = seconds_to_ms(attack(limit, window_s).time)
    before, after = ms[ms < window_s * 1000], ms[ms >= window_s * 1000]
    return pd.DataFrame(
        {
            "requests": [len(before), len(after)],
            "first (ms)": [before.min(), after.min()],
            "last (ms)": [before.max(), after.max()],
        },
        index=pd.Index(["before the boundary", "after the boundary"], name="burst"),
    )


def admitted_by_burst(limit: int = LIMIT, window_s: int = WINDOW_S) -> pd.DataFrame:
    """Per algorithm (fixed window, sliding log): the attack's requests admitted before
    the boundary, admitted from it on, and rejected."""
    boundary_ms = window_s * 1000
    rows = {}
    for algorithm in (FIXED, LOG):
        replayed = decide(algorithm.name, attack(limit, window_s), limit, window_s)
        ms, ok = seconds_to_ms(replayed.time), replayed.allowed.to_numpy()
        rows[algorithm.label] = {
            f"admitted before {boundary_ms} ms": int(ok[ms < boundary_ms].sum()),
            f"admitted from {boundary_ms} ms on": int(ok[ms >= boundary_ms].sum()),
            "rejected": int((~ok).sum()),
        }
    return pd.DataFrame(rows).T


def attack_table(limit: int = LIMIT, window_s: int = WINDOW_S) -> pd.DataFrame:
    """Per algorithm (table order): the attack's requests admitted, and the most admitted
    in any rolling window."""
    trace = attack(limit, window_s)
    rows = []
    for algorithm in ORDER:
        replayed = decide(algorithm.name, trace, limit, window_s)
        rows.append(
            {
                "algorithm": algorithm.label,
                f"admitted of {len(trace)}": int(replayed.allowed.sum()),
                PEAK: peak(replayed, window_s),
            }
        )
    return pd.DataFrame(rows).set_index("algorithm")


def rolling_counts(limit: int = LIMIT, window_s: int = WINDOW_S) -> pd.DataFrame:
    """Requests the fixed window and the sliding log admitted from the attack in the
    window (t - window_s, t], for every whole ms t from 100 ms before the boundary to
    100 ms after the next one (index `t (ms)`, one column per algorithm)."""
    boundary_ms = window_s * 1000
    t_ms = np.arange(boundary_ms - 100, 2 * boundary_ms + 101)
    counts = {}
    for algorithm in (FIXED, LOG):
        replayed = decide(algorithm.name, attack(limit, window_s), limit, window_s)
        stamps = np.sort(seconds_to_ms(replayed.time[replayed.allowed]))
        inside = np.searchsorted(stamps, t_ms, side="right")
        counts[algorithm.label] = inside - np.searchsorted(stamps, t_ms - boundary_ms, side="right")
    return pd.DataFrame(counts, index=pd.Index(t_ms, name="t (ms)"))


def poisson_table(
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    *,
    rate_multiples: Sequence[float] = RATE_MULTIPLES,
    duration_s: float = DURATION_S,
    seed: int = SEED,
) -> pd.DataFrame:
    """Per Poisson rate (`rate_multiples` x the limit, `duration_s` seconds, `seed`): the
    requests sent, the offered traffic's busiest window, and the most each algorithm
    admitted in any rolling window (one column per algorithm label, table order)."""
    rows = []
    for multiple in rate_multiples:
        rate = multiple * limit / window_s
        trace = traffic.poisson(rate, duration_s, seed=seed)
        row = {
            "rate": f"{multiple:g}x",
            "requests per second": rate,
            "requests sent": len(trace),
            "offered, busiest second": metrics.max_in_window(trace.time, window_s),
        }
        for algorithm in ORDER:
            row[algorithm.label] = peak(decide(algorithm.name, trace, limit, window_s), window_s)
        rows.append(row)
    return pd.DataFrame(rows).set_index("rate")


def real_script(
    limit: int = LIMIT, window_s: int = WINDOW_S, *, extra: int = 2, identity: str = IDENTITY
) -> tuple[pd.DataFrame, dict[str, int]]:
    """`limit + extra` checks in a row by the sliding log's Lua script on the embedded
    Redis (fakeredis, whatever REDIS_URL says), on the wall clock.

    Returns the decisions (`allowed`, `remaining`, `retry_after (s)`, indexed by request
    from 1) and the client's key afterwards: `members` (ZCARD) and `ttl_ms` (PTTL).
    """
    client = ratelimit.connect_sync(embedded=True)
    limiter = LOG.build("sync", client, window_s, limit)
    decisions = [limiter.check(identity) for _ in range(limit + extra)]
    table = pd.DataFrame(
        {
            "allowed": [d.allowed for d in decisions],
            "remaining": [d.remaining for d in decisions],
            "retry_after (s)": [d.retry_after for d in decisions],
        },
        index=pd.RangeIndex(1, len(decisions) + 1, name="request"),
    )
    key = limiter.key_for(identity)
    return table, {"members": client.zcard(key), "ttl_ms": client.pttl(key)}


def key_facts(
    table: pd.DataFrame, key: dict[str, int], limit: int = LIMIT, window_s: int = WINDOW_S
) -> dict[str, bool]:
    """What `real_script` must show, each fact named for the chapter's printout (the TTL
    depends on how long the checks took, so only the facts are printed)."""
    rejected = table[~table.allowed]
    return {
        f"admitted == {limit}": int(table.allowed.sum()) == limit,
        f"rejected == {len(table) - limit}": len(rejected) == len(table) - limit,
        "every rejection has retry_after >= 1 s": bool((rejected["retry_after (s)"] >= 1).all()),
        "ZCARD <= limit": key["members"] <= limit,
        "0 < PTTL <= window (ms)": 0 < key["ttl_ms"] <= window_s * 1000,
    }


def poisson_label(rate_multiple: float, limit: int, window_s: int) -> str:
    """The name of the Poisson group in `peaks` and on the Explore figure's x axis."""
    return f"Poisson at {rate_multiple:g}x the limit\n({rate_multiple * limit / window_s:g} req/s)"


def peaks(
    *,
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    rate_multiple: float = RATE_MULTIPLE,
    seed: int = SEED,
    duration_s: float = DURATION_S,
) -> dict[str, dict[str, int]]:
    """``{traffic: {algorithm label: most admitted in any rolling window}}`` for the
    attack (`attack_table`) and one Poisson rate (`poisson_table`): the Explore figure's
    bars, in table order."""
    attacked = attack_table(limit, window_s)[PEAK]
    poisson = poisson_table(
        limit, window_s, rate_multiples=[rate_multiple], duration_s=duration_s, seed=seed
    ).iloc[0]
    labels = [a.label for a in ORDER]
    return {
        ATTACK: {label: int(attacked[label]) for label in labels},
        poisson_label(rate_multiple, limit, window_s): {
            label: int(poisson[label]) for label in labels
        },
    }


def attack_figure(limit: int = LIMIT, window_s: int = WINDOW_S) -> Figure:
    """Section 2: each attack request on a time line, admitted or rejected, for the
    fixed window (top) and the sliding log (bottom), 20 ms either side of the boundary."""
    boundary_ms = window_s * 1000
    fig, ax = plt.subplots(figsize=(9, 3.5))
    left, right = boundary_ms - 20, boundary_ms + 20
    ax.axvspan(left, boundary_ms, color="0.93")
    ax.axvspan(boundary_ms, right, color="0.85")
    ax.axvline(boundary_ms, color="black", linestyle="--", linewidth=1)
    ax.text(left + 1, 1.45, f"fixed window 0 (0-{boundary_ms} ms)", fontsize=9)
    ax.text(
        boundary_ms + 1, 1.45, f"fixed window 1 ({boundary_ms}-{2 * boundary_ms} ms)", fontsize=9
    )
    for row, algorithm in ((1, FIXED), (0, LOG)):
        replayed = decide(algorithm.name, attack(limit, window_s), limit, window_s)
        ms, ok = seconds_to_ms(replayed.time), replayed.allowed.to_numpy()
        color = COLORS[algorithm.name]
        label = f"{algorithm.label}: admitted"
        ax.scatter(ms[ok], np.full(ok.sum(), row), marker="o", color=color, s=40, label=label)
        rejected = "rejected" if (~ok).any() else None
        ax.scatter(
            ms[~ok], np.full((~ok).sum(), row), marker="x", color="tab:red", s=40, label=rejected
        )
    ax.set_yticks([0, 1], [LOG.label, FIXED.label])
    ax.set_ylim(-0.6, 1.7)
    ax.set_xlim(left, right)
    ax.set_xlabel("request time (ms)")
    ax.set_title(
        f"Boundary attack: {2 * limit} requests around the {boundary_ms} ms window boundary, "
        f"limit {limit} per {window_s} s"
    )
    ax.legend(loc="lower right", fontsize=8, ncol=3)
    fig.tight_layout()
    return fig


def rolling_figure(limit: int = LIMIT, window_s: int = WINDOW_S) -> Figure:
    """Section 3: `rolling_counts` as steps against the end of the window, with the limit
    and the fixed window's boundaries."""
    boundary_ms = window_s * 1000
    counts = rolling_counts(limit, window_s)
    fig, ax = plt.subplots(figsize=(9, 3.5))
    for algorithm in (FIXED, LOG):
        color = COLORS[algorithm.name]
        ax.step(
            counts.index,
            counts[algorithm.label],
            where="post",
            color=color,
            linewidth=2,
            label=algorithm.label,
        )
    ax.axhline(limit, color="black", linestyle=":", linewidth=1, label=f"limit ({limit})")
    for b in (boundary_ms, 2 * boundary_ms):
        ax.axvline(b, color="0.5", linestyle="--", linewidth=1)
    ax.set_ylim(0, 2 * limit + 3)
    ax.set_xlabel("end of the rolling window t (ms)")
    ax.set_ylabel(f"admitted in (t - {window_s} s, t]\n(requests)")
    ax.set_title(
        f"Requests admitted in the {window_s} s window ending at t "
        "(dashed: fixed-window boundaries)"
    )
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


@parameters_of(poisson_table)
def poisson_figure(**params: Any) -> Figure:
    """Section 4: `poisson_table`'s peaks as bars, per rate and algorithm, with the limit."""
    table = poisson_table(**params)
    limit, window_s, rate_multiples = params["limit"], params["window_s"], params["rate_multiples"]
    duration_s, seed = params["duration_s"], params["seed"]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    x = np.arange(len(table))
    width = 0.2
    for i, algorithm in enumerate(ORDER):
        heights, color = table[algorithm.label], COLORS[algorithm.name]
        bars = ax.bar(x + (i - 1.5) * width, heights, width, color=color, label=algorithm.label)
        ax.bar_label(bars, fontsize=8)
    ax.axhline(limit, color="black", linestyle=":", linewidth=1, label=f"limit ({limit})")
    ax.set_xticks(x, [f"{m:g}x ({m * limit / window_s:g}/s)" for m in rate_multiples])
    ax.set_ylim(0, 2 * limit + 4)
    ax.set_xlabel("offered Poisson rate (multiple of the limit, requests per second)")
    ax.set_ylabel("max admitted in any\nrolling second (requests)")
    ax.set_title(
        f"Busiest rolling second under Poisson traffic ({duration_s} s per rate, seed {seed})"
    )
    ax.legend(loc="upper left", fontsize=8, ncol=5)
    fig.tight_layout()
    return fig


@parameters_of(peaks)
def figure(**params: Any) -> Figure:
    """The Explore figure: `peaks(**params)` as bars, per traffic and algorithm, against
    the limit and twice the limit. Returns the figure (not shown)."""
    data = peaks(**params)
    limit, window_s = params["limit"], params["window_s"]
    duration_s, seed = params["duration_s"], params["seed"]
    groups = list(data)
    x = np.arange(len(groups))
    width = 0.2
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, algorithm in enumerate(ORDER):
        heights = [data[group][algorithm.label] for group in groups]
        color = COLORS[algorithm.name]
        bars = ax.bar(x + (i - 1.5) * width, heights, width, color=color, label=algorithm.label)
        ax.bar_label(bars, fontsize=8)
    ax.axhline(limit, color="black", linestyle=":", linewidth=1, label=f"limit ({limit})")
    ax.axhline(
        2 * limit, color="tab:red", linestyle="--", linewidth=1, label=f"2x the limit ({2 * limit})"
    )
    ax.set_xticks(x, [f"{ATTACK}\n({2 * limit} requests in 20 ms)", groups[1]])
    ax.set(
        ylim=(0, 2.45 * limit + 1),
        xlabel=f"traffic (Poisson: {duration_s:g} s, seed {seed})",
        ylabel=f"max admitted in any rolling\n{window_s} s window (requests)",
        title=f"Busiest rolling window per algorithm, limit {limit} per {window_s} s: "
        f"the fixed window admits {data[ATTACK][FIXED.label]} at the boundary",
    )
    ax.legend(loc="upper right", fontsize=8, ncol=3)
    fig.tight_layout()
    return fig
