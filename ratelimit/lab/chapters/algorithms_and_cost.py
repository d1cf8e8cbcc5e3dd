"""Chapter 5: the four algorithms side by side, each against its own contract and against
the exact log, what a check costs Redis (the log as it ships, compact, and in a sorted
set), the sliding-window counter at scale (Cloudflare's metric, and divergence from a
real log), and cost-weighted limits. Capacity planning is chapter 6 (`capacity_planning`).

    from ratelimit.lab.chapters import algorithms_and_cost as chapter
    traces = chapter.traces(limit=10, window_s=1, seed=0)       # section 1's five traces
    replayed = chapter.replay_all(traces, 10, 1)
    chapter.contracts(replayed, 10, 1)                          # each by its own promise
    chapter.exactness(replayed, 10, 1)                          # each against the exact log
    chapter.exact_rate_errors(traces["Poisson 1x"], 10, 1)      # Cloudflare's metric

Decisions come from the in-memory reference models (`ratelimit.lab.reference`), which
decide exactly like the Lua scripts, replayed in virtual time; `script_check` runs the
real scripts on the embedded Redis to show that. Bytes per key come from chapter 3's
stored table, Redis commands per check from the registry (`ratelimit.algorithms`).
Every function takes the chapter's parameters; the defaults are the chapter's values.
`TITLE`, `SUMMARY` and `HEADLINE` are the README's texts for the chapter, filled from
its records (`ratelimit.lab.records`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

import ratelimit
from ratelimit import algorithms, validation
from ratelimit.costs import GEOFENCE_FREE_RADIUS_M, GEOFENCE_MAX_COST, geofence_cost

from .. import capacity, memory, metrics, traffic
from ..plotting import COLORS, parameters_of
from ..simulation import replay
from ..timebase import seconds_to_ms

if TYPE_CHECKING:
    import matplotlib.figure

__all__ = [
    "ADMITTED_NOT_LOG",
    "CLOUDFLARE",
    "CONTRACTS",
    "COSTED",
    "COST_LABELS",
    "GEO_PROFILES",
    "GeoPolicies",
    "REFUSED_NOT_LOG",
    "HEADLINE",
    "LABELS",
    "SUMMARY",
    "TITLE",
    "CounterOnFleet",
    "DIVERGED",
    "Published",
    "WRONG_VS_RATE",
    "Finding",
    "busiest_window",
    "cap_caveat",
    "cap_radius_m",
    "contracts",
    "counter_figure",
    "counter_on_fleet",
    "counter_per_rate",
    "decision_matrix",
    "exact_rate_errors",
    "exactness",
    "geo_explore",
    "geo_figure",
    "geo_policies",
    "geo_profiles",
    "geo_table",
    "geofence_traffic",
    "key_bytes",
    "matrix_figure",
    "peak_records",
    "peaks",
    "per_rate_findings",
    "per_rate_records",
    "predicted_commands",
    "replay_all",
    "replay_with",
    "script_check",
    "stored_table",
    "trace_table",
    "traces",
]

TITLE = "Algorithms and their cost"
SUMMARY = (
    "all four algorithms on the same traces, each judged against its own contract "
    "({contracts_kept} of 4 kept it on every trace) and, separately, against the exact log "
    "(peak in any rolling second); bytes per key and Redis commands per check, for the log "
    "as it ships (compact, {compact_bytes_1000} bytes a full key at limit 1,000) and in a "
    "sorted set ({sorted_bytes_1000}); the sliding-window counter on {fleet_requests_m}M "
    "synthetic requests, with clients placed near their limit on purpose, by Cloudflare's "
    "metric ({fleet_cloudflare_pct}% wrongly allowed or limited against the exact rate on "
    "the same history; Cloudflare published {cloudflare_pct}% for their own traffic, which "
    "this traffic does not resemble) and, a separate finding, {fleet_diverged_pct}% decided "
    "differently once it and a real log drift apart; cost-weighted geofence limits"
)
HEADLINE = (
    "Five traces at {limit} requests per {window_s} s. Each algorithm keeps its own "
    "contract ({contracts_kept} of 4); against the exact log's rolling window the fixed "
    "window lets {peak_fw}x the limit through, the sliding-window counter {peak_swc}x, GCRA "
    "{peak_gcra}x. By Cloudflare's metric the counter errs on {fleet_cloudflare_pct}% of "
    "{fleet_requests_m}M synthetic requests, much of them from clients near their limit "
    "(Cloudflare's {cloudflare_pct}% describes their traffic, not this), and on up to "
    "{single_cloudflare_max_pct}% of one client's requests near its limit."
)

LABELS: Mapping[str, str] = {a.name: a.label for a in algorithms.ALGORITHMS}
"""Each algorithm's label by its tag, in the registry's order."""
_LOG = algorithms.get("log")
COSTED: tuple[str, ...] = (algorithms.COMPACT_LOG.name, *algorithms.NAMES)
"""The algorithms whose cost section 3 weighs: the log as `SlidingWindowLimiter` ships
it (compact), the log in a sorted set, then the O(1) algorithms."""
COST_LABELS: Mapping[str, str] = {
    **{a: algorithms.get(a).label for a in COSTED},
    "log": "sliding log (sorted set)",
}
"""How the cost tables name each algorithm: the two logs by their storage."""
# Chapter 3's table keeps both logs under "log", told apart by their member format.
_TABLE_ROWS: Mapping[str, tuple[str, str]] = {"logc": ("log", "compact"), "log": ("log", "script")}
# Against the exact log: the same requests, each limiter on its own state.
ADMITTED_NOT_LOG = "vs exact log: admitted, log refused (%)"
REFUSED_NOT_LOG = "vs exact log: refused, log admitted (%)"
Finding = tuple[str, Any, str, str]
"""A number the chapter records: (record name, value, format, what it is)."""

# --- sections 1 and 2: five traces, and how exact each algorithm is on them -------------


def traces(
    limit: int = 10,
    window_s: int = 1,
    seed: int = 0,
    *,
    duration_s: float = 3_600,
    attack_cycles: int = 100,
    burst_multiple: float = 5,
    burst_on_s: float = 1.0,
    burst_off_s: float = 1.5,
    fleet_clients: int = 1_000,
    fleet_rate: float = 200,
    fleet_duration_s: float = 600,
    zipf_exponent: float = 1.1,
) -> dict[str, pd.DataFrame]:
    """Section 1's five traces by name, seeded from `seed` (seed + 0 to seed + 3).

    The single clients send for `duration_s`; the on/off client at `burst_multiple`
    times the limit for `burst_on_s`, then pauses `burst_off_s`; the Zipf fleet is
    `fleet_clients` clients sharing `fleet_rate` requests per second."""
    rate = limit / window_s
    return {
        "boundary attacker": traffic.boundary_attack(limit, window_s, cycles=attack_cycles),
        "Poisson 1x": traffic.poisson(rate, duration_s, seed=seed),
        "Poisson 2x": traffic.poisson(2 * rate, duration_s, seed=seed + 1),
        "on/off bursts": traffic.on_off(
            burst_multiple * rate, burst_on_s, burst_off_s, duration_s, seed=seed + 2
        ),
        "Zipf fleet": traffic.zipf_fleet(
            fleet_clients, fleet_rate, fleet_duration_s, exponent=zipf_exponent, seed=seed + 3
        ),
    }


def busiest_window(trace: pd.DataFrame, window_s: int = 1) -> int:
    """The most cost any one client sent (or was admitted, for a replay) in a rolling
    window of `window_s` seconds."""
    if "allowed" not in trace:
        trace = trace.assign(allowed=True)
    return int(metrics.per_identity(trace, window_s).max_admitted_in_window.max())


def trace_table(
    named_traces: Mapping[str, pd.DataFrame], limit: int = 10, window_s: int = 1
) -> pd.DataFrame:
    """Requests, clients, and the busiest client's mean rate and busiest window, per trace."""
    rate = limit / window_s

    def describe(name: str, trace: pd.DataFrame) -> dict[str, Any]:
        seconds = seconds_to_ms(trace.time).max() / 1000
        per_client = trace.groupby("identity").size()
        return {
            "trace": name,
            "requests": len(trace),
            "clients": len(per_client),
            "busiest client, mean rate (x limit)": round(per_client.max() / seconds / rate, 2),
            "busiest client, busiest second": busiest_window(trace, window_s),
        }

    rows = [describe(name, trace) for name, trace in named_traces.items()]
    return pd.DataFrame(rows).set_index("trace")


def replay_with(
    algorithm: str, trace: pd.DataFrame, limit: int = 10, window_s: int = 1
) -> pd.DataFrame:
    """Decide every request of `trace` with a fresh reference model of `algorithm`."""
    model = algorithms.get(algorithm).build("reference", window_s, limit)
    return replay(trace, model, progress=False)


def replay_all(
    named_traces: Mapping[str, pd.DataFrame], limit: int = 10, window_s: int = 1
) -> dict[str, dict[str, pd.DataFrame]]:
    """Every trace replayed by every algorithm: {trace: {tag: decisions}}."""
    return {
        name: {a: replay_with(a, trace, limit, window_s) for a in algorithms.NAMES}
        for name, trace in named_traces.items()
    }


def exactness(
    replayed: Mapping[str, Mapping[str, pd.DataFrame]], limit: int = 10, window_s: int = 1
) -> pd.DataFrame:
    """Per trace and algorithm: admitted, peak / limit, and the decisions that differ
    from the exact sliding log's on the same trace (% of all requests): admitted where
    the log refused, refused where the log admitted. These judge every algorithm by the
    log's promise; `contracts` judges each by its own."""
    rows = []
    for name, by_algorithm in replayed.items():
        exact = by_algorithm[_LOG.name]
        for a, decided in by_algorithm.items():
            wrong = metrics.false_decisions(decided, exact)
            rows.append(
                {
                    "trace": name,
                    "algorithm": LABELS[a],
                    "admitted": int(decided.allowed.sum()),
                    "peak / limit": metrics.overshoot(decided, limit, window_s),
                    ADMITTED_NOT_LOG: round(100 * wrong["false_admit_rate"], 3),
                    REFUSED_NOT_LOG: round(100 * wrong["false_reject_rate"], 3),
                }
            )
    return pd.DataFrame(rows).set_index(["trace", "algorithm"])


def peaks(table: pd.DataFrame) -> pd.DataFrame:
    """An `exactness` table's peak / limit, one row per trace, one column per algorithm."""
    traces_in_order = list(dict.fromkeys(table.index.get_level_values("trace")))
    return table["peak / limit"].unstack("algorithm").loc[traces_in_order, list(LABELS.values())]


def peak_records(worst_peak: pd.Series) -> list[Finding]:
    """The worst peak / limit against the exact log of the three algorithms that are not
    the log (`worst_peak` indexed by tag), as `Finding`s to record."""
    return [
        (f"peak_{a}", worst_peak[a], ".1f", f"{LABELS[a]}: worst rolling-second peak / limit")
        for a in algorithms.NAMES
        if a != _LOG.name
    ]


# --- each algorithm against its own contract ---------------------------------------------

CONTRACTS: Mapping[str, str] = {
    "log": "at most limit in any rolling window",
    "fw": "at most limit in each calendar window [kW, (k+1)W)",
    "swc": "at each admission, previous window x unexpired share + current window <= limit",
    "gcra": "in any interval of d seconds at most burst + d x limit / W (burst = limit here)",
}
"""What each algorithm promises, in words: what `contracts` checks its decisions against."""


def _sorted_admitted(decided: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Admitted rows as (identity code, ms, cost), sorted by identity then time (stable)."""
    ok = decided[decided.allowed.to_numpy(dtype=bool)]
    codes = pd.factorize(ok.identity)[0].astype(np.int64)
    ms = seconds_to_ms(ok.time.to_numpy())
    cost = ok.cost.to_numpy(dtype=np.int64) if "cost" in ok else np.ones(len(ok), np.int64)
    order = np.lexsort((ms, codes))
    return codes[order], ms[order], cost[order]


def _window_sums(
    codes: np.ndarray, ms: np.ndarray, cost: np.ndarray, start: np.ndarray
) -> np.ndarray:
    """Per row i: the cost of rows of the same identity at or after `start[i]` ms, up to
    and including row i (rows sorted by identity, then time)."""
    key = codes * 2**42 + ms
    total = np.concatenate([[0], np.cumsum(cost)])
    first = np.searchsorted(key, codes * 2**42 + start, side="left")
    return total[np.arange(len(ms)) + 1] - total[first]


def contract_measure(algorithm: str, decided: pd.DataFrame, limit: int, window_s: int) -> float:
    """The most an algorithm's admissions reach of its own contract's bound (1.0 = at
    the bound; above it = broken), over every identity of a replay (`CONTRACTS`)."""
    measure = _CONTRACT_MEASURES[algorithms.get(algorithm)]
    codes, ms, cost = _sorted_admitted(decided)
    if not len(ms):
        return 0.0
    return measure(codes, ms, cost, limit, int(seconds_to_ms(window_s)[0]))


def _log_contract(
    codes: np.ndarray, ms: np.ndarray, cost: np.ndarray, limit: int, window: int
) -> float:
    # rolling window (t - W, t]
    return float(_window_sums(codes, ms, cost, ms - window + 1).max()) / limit


def _fixed_window_contract(
    codes: np.ndarray, ms: np.ndarray, cost: np.ndarray, limit: int, window: int
) -> float:
    return float(_window_sums(codes, ms, cost, (ms // window) * window).max()) / limit


def _counter_contract(
    codes: np.ndarray, ms: np.ndarray, cost: np.ndarray, limit: int, window: int
) -> float:
    start = (ms // window) * window
    current = _window_sums(codes, ms, cost, start)
    both = _window_sums(codes, ms, cost, start - window)
    previous = both - current
    estimate = previous * ((window - (ms - start)) / window) + current
    return float(estimate.max()) / limit


def _gcra_contract(
    codes: np.ndarray, ms: np.ndarray, cost: np.ndarray, limit: int, window: int
) -> float:
    # admitted cost from row j to row i <= burst + (t_i - t_j) / interval
    interval, burst = window / limit, limit
    total = np.concatenate([[0], np.cumsum(cost)])
    before = total[:-1] - ms / interval  # S_{j-1} - t_j / T
    lowest = pd.Series(before).groupby(codes).cummin().to_numpy()
    excess = total[1:] - ms / interval - lowest
    return float(excess.max()) / burst


# Each algorithm's contract (`CONTRACTS`) as a measure of its admissions.
_CONTRACT_MEASURES: Mapping[algorithms.Algorithm, Callable[..., float]] = {
    algorithms.SLIDING_LOG: _log_contract,
    algorithms.COMPACT_LOG: _log_contract,
    algorithms.FIXED_WINDOW: _fixed_window_contract,
    algorithms.SLIDING_WINDOW_COUNTER: _counter_contract,
    algorithms.GCRA: _gcra_contract,
}


def contracts(
    replayed: Mapping[str, Mapping[str, pd.DataFrame]], limit: int = 10, window_s: int = 1
) -> pd.DataFrame:
    """Each algorithm judged by its own contract (`CONTRACTS`, GCRA at its default
    burst = limit) on every trace: the contract, the worst share of its bound any
    identity reached, and whether any admission broke it (beyond float rounding)."""
    rows = []
    for a in algorithms.NAMES:
        worst = max(contract_measure(a, by[a], limit, window_s) for by in replayed.values())
        rows.append(
            {
                "algorithm": LABELS[a],
                "own contract": CONTRACTS[a],
                "own contract: worst / bound": round(worst, 3),
                "own contract: kept": bool(worst <= 1 + 1e-9),
            }
        )
    return pd.DataFrame(rows).set_index("algorithm")


# --- section 3: what one check costs Redis ----------------------------------------------


@lru_cache(maxsize=4)
def stored_table(path: str | Path = memory.STORED_TABLE) -> memory.MeasuredOrStored:
    """Chapter 3's stored memory table (another at `path`), read once per path and never
    measured here: `.table`, `.source` ("stored")."""
    return memory.measured_or_stored(None, path, [1])


def full_key_bytes(table: pd.DataFrame, algorithm: str, limit: int) -> float:
    """Bytes of one full key of `algorithm` (one of `COSTED`) at `limit`, from chapter
    3's table (the compact log's rows for "logc", the sorted set's for "log")."""
    name, member_format = _TABLE_ROWS.get(algorithm, (algorithm, "script"))
    return capacity.bytes_per_key(table, name, limit, member_format=member_format)


def key_bytes(table: pd.DataFrame, limits: Iterable[int] = (10, 100, 1_000)) -> pd.DataFrame:
    """Bytes of one full key per `COSTED` algorithm (rows) at each of `limits` (columns)."""
    return (
        pd.DataFrame(
            {f"limit {n:,}": [full_key_bytes(table, a, n) for a in COSTED] for n in limits},
            index=pd.Index([COST_LABELS[a] for a in COSTED], name="bytes per full key"),
        )
        .round()
        .astype(int)
    )


def predicted_commands(algorithm: str, decided: pd.DataFrame) -> int:
    """Script commands for every decision of a replay, from the registry's per-path counts."""
    paths = decided.groupby(["allowed", "cost"]).size()
    return sum(
        n * capacity.script_commands(algorithm, bool(allowed), int(cost))
        for (allowed, cost), n in paths.items()
    )


def script_check(
    limit: int = 10, window_s: int = 1, seed: int = 0, duration_s: float = 30
) -> pd.DataFrame:
    """Each real Lua script on the embedded Redis against its reference model, on
    `duration_s` of geofence look-ups at twice the limit (seed + 4; costs 1 to 10, so
    both paths and multi-unit costs occur), with the commands the registry predicts:
    admitted x admit + (units admitted - admitted) x extra unit + rejected x reject."""
    trace = traffic.geofence_mix(2 * (limit / window_s), duration_s, seed=seed + 4)
    rows = []
    for a in map(algorithms.get, COSTED):
        script = a.build("sync", ratelimit.connect_sync(embedded=True), window_s, limit)
        decided = replay(trace, script, progress=False)
        model = replay_with(a.name, trace, limit, window_s)
        ok = decided[decided.allowed]
        per_path = a.commands
        rows.append(
            {
                "algorithm": COST_LABELS[a.name],
                "checks": len(decided),
                "admitted": len(ok),
                "units admitted": int(ok.cost.sum()),
                "same decisions as the model": bool((decided.allowed == model.allowed).all()),
                "commands per check: admit / extra unit / reject": (
                    f"{per_path.admit} / {per_path.per_extra_unit} / {per_path.reject}"
                ),
                "commands predicted": predicted_commands(a.name, decided),
            }
        )
    return pd.DataFrame(rows).set_index("algorithm")


# --- section 4: the decision matrix -----------------------------------------------------


def decision_matrix(
    table: pd.DataFrame,
    bytes_table: pd.DataFrame,
    replayed: Mapping[str, Mapping[str, pd.DataFrame]],
    limit: int = 10,
    window_s: int = 1,
) -> pd.DataFrame:
    """One row per `COSTED` algorithm: whether it kept its own contract on every trace
    (from `contracts`); separately, against the exact log, its worst rolling-window peak
    and the worst share of decisions that differ from the log's (from `exactness`); bytes
    per key at `limit` and 1,000 (from `key_bytes`); and script commands per check per
    path and on average over every replayed check. The compact log decides exactly as
    the sorted set (`script_check` runs both scripts), so it is judged on the log's
    decisions: the same contract and exactness, its own bytes and commands."""
    total_checks = sum(len(next(iter(by.values()))) for by in replayed.values())
    decides = {a: _LOG.name if algorithms.get(a).state_per_unit else a for a in COSTED}
    by_algorithm = table.groupby(level="algorithm", sort=False)
    kept = contracts(replayed, limit, window_s)["own contract: kept"]

    def judged(column: pd.Series) -> list[Any]:
        return [column[LABELS[decides[a]]] for a in COSTED]

    matrix = pd.DataFrame(
        {
            "own contract: kept": judged(kept),
            "vs exact log: worst peak / limit": judged(by_algorithm["peak / limit"].max()),
            f"{ADMITTED_NOT_LOG[:-4]}, worst trace (%)": judged(
                by_algorithm[ADMITTED_NOT_LOG].max()
            ),
            f"{REFUSED_NOT_LOG[:-4]}, worst trace (%)": judged(by_algorithm[REFUSED_NOT_LOG].max()),
            f"bytes per key, limit {limit:,}": bytes_table[f"limit {limit:,}"].to_list(),
            "bytes per key, limit 1,000": bytes_table["limit 1,000"].to_list(),
            "commands per check, admit / reject": [
                f"{capacity.script_commands(a, True)} / {capacity.script_commands(a, False)}"
                for a in COSTED
            ],
            "commands per check, mean": [
                round(
                    sum(predicted_commands(a, by[decides[a]]) for by in replayed.values())
                    / total_checks,
                    2,
                )
                for a in COSTED
            ],
        },
        index=pd.Index([COST_LABELS[a] for a in COSTED], name="algorithm"),
    )
    return matrix


# The cost panels draw both logs in the log's colour: the shipped compact log solid, the
# sorted set dashed (lines) or lighter (bars).
_COST_STYLE: Mapping[str, dict[str, Any]] = {
    **{a: {"color": COLORS[a]} for a in algorithms.NAMES},
    "logc": {"color": COLORS[_LOG.name], "linewidth": 2.2},
    _LOG.name: {"color": COLORS[_LOG.name], "linestyle": "--"},
}


def _peak_panel(ax: Any, table: pd.DataFrame) -> None:
    peak = peaks(table)
    x, width = np.arange(len(peak)), 0.2
    for i, a in enumerate(algorithms.NAMES):
        ax.bar(x + (i - 1.5) * width, peak[LABELS[a]], width, color=COLORS[a], label=LABELS[a])
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    ax.set_xticks(x, list(peak.index), fontsize=8)
    ax.set_ylabel("busiest rolling second / limit")
    ax.set_title("Most admitted in any rolling second (the log's promise: 1.0)")
    ax.set_ylim(0, 2.3)
    ax.legend(fontsize=8, ncol=2, loc="upper left")


def _false_decision_panel(ax: Any, table: pd.DataFrame) -> None:
    names = list(dict.fromkeys(table.index.get_level_values("trace")))
    x, width = np.arange(len(names)), 0.2
    others = [a for a in algorithms.NAMES if a != _LOG.name]  # the log is the yardstick
    for i, a in enumerate(others):
        rows = table.xs(LABELS[a], level="algorithm")
        ax.bar(x + (i - 1) * width, rows[ADMITTED_NOT_LOG], width, color=COLORS[a], label=LABELS[a])
        ax.bar(
            x + (i - 1) * width,
            rows[REFUSED_NOT_LOG],
            width,
            bottom=rows[ADMITTED_NOT_LOG],
            color=COLORS[a],
            alpha=0.45,
            hatch="//",
            edgecolor="white",
        )
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylim(0, 55)
    ax.set_ylabel("share of all requests (%)")
    ax.set_title(
        "Against the exact log, each on its own state\n"
        "(solid: admitted, log refused; hatched: refused, log admitted)"
    )
    ax.legend(fontsize=8)


def _memory_panel(ax: Any, memory_table: pd.DataFrame, limit: int) -> None:
    for a in COSTED:
        name, fmt = _TABLE_ROWS.get(a, (a, ""))
        rows = memory_table[(memory_table.algorithm == name) & (memory_table.member_format == fmt)]
        rows = rows.sort_values("limit")
        ax.plot(
            rows["limit"], rows["bytes_per_key"], label=COST_LABELS[a], **_COST_STYLE.get(a, {})
        )
    ax.axvline(limit, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("limit (requests per window; a full key)")
    ax.set_ylabel("MEMORY USAGE of one key (bytes)")
    ax.set_title(f"Memory per key (Redis {memory_table.redis_version.iloc[0]}, chapter 3)")
    ax.legend(fontsize=8)


def _commands_panel(ax: Any) -> None:
    import matplotlib.pyplot as plt

    n = len(COSTED)
    for j, allowed in enumerate([True, False]):
        bars = ax.bar(
            np.arange(n) + (j - 0.5) * 0.35,
            [capacity.script_commands(a, allowed) for a in COSTED],
            0.35,
            color=[_COST_STYLE.get(a, {}).get("color", COLORS.get(a)) for a in COSTED],
            alpha=1.0 if allowed else 0.45,
            hatch="" if allowed else "//",
            edgecolor="white",
        )
        ax.bar_label(bars, fontsize=8)
    rejected = {"facecolor": "0.75", "hatch": "//", "edgecolor": "white"}
    ax.legend(
        handles=[
            plt.Rectangle((0, 0), 1, 1, color="0.4", label="admitted (cost 1)"),
            plt.Rectangle((0, 0), 1, 1, label="rejected", **rejected),
        ],
        fontsize=8,
    )
    ticks = [COST_LABELS[a].replace(" (", "\n(").replace("-window ", "-window\n") for a in COSTED]
    ax.set_xticks(np.arange(n), ticks, fontsize=8)
    ax.set_ylabel("redis.call's per check (besides the EVALSHA)")
    ax.set_title("Redis commands inside one check")


def matrix_figure(
    table: pd.DataFrame, memory_table: pd.DataFrame, limit: int = 10, window_s: int = 1
) -> matplotlib.figure.Figure:
    """Section 4's four panels: peaks and false decisions per trace (an `exactness`
    table), bytes per key (chapter 3's table), and commands per check per path."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    _peak_panel(axes[0, 0], table)
    _false_decision_panel(axes[0, 1], table)
    _memory_panel(axes[1, 0], memory_table, limit)
    _commands_panel(axes[1, 1])
    fig.suptitle(f"Four algorithms on the same traces, limit {limit} per {window_s} s", fontsize=12)
    fig.tight_layout()
    return fig


# --- section 5: the sliding-window counter at scale -------------------------------------

_SWC = algorithms.get("swc")


@dataclass(frozen=True)
class Published:
    """A published figure, with where it was published."""

    title: str
    date: str
    url: str
    percent: float
    requests: str
    sources: str


CLOUDFLARE = Published(
    title="How we built rate limiting capable of scaling to millions of domains",
    date="2017-06-07",
    url="https://blog.cloudflare.com/counting-things-a-lot-of-different-things/",
    percent=0.003,  # of the requests, wrongly allowed or wrongly rate limited
    requests="400 million",
    sources="270,000",
)
"""Cloudflare's post on the two-counter approximation, and the error it reported."""
WRONG_VS_RATE = "wrong vs exact rate, same history (%)"  # Cloudflare's metric
DIVERGED = "diverged from a real log (%)"  # two greedy limiters, each on its own state
# Clients grouped by their mean rate, as multiples of the limit.
_RATE_EDGES = [0, 0.1, 0.25, 0.5, 1, 2, 5, np.inf]
_RATE_CLASSES = ["under 0.1x", "0.1-0.25x", "0.25-0.5x", "0.5-1x", "1-2x", "2-5x", "5x and more"]


def exact_rate_errors(trace: pd.DataFrame, limit: int = 10, window_s: int = 1) -> pd.DataFrame:
    """Cloudflare's metric, request by request: every request of `trace` counts (as
    Cloudflare's counters count every request, admitted or not), and at each request
    two rates are taken over that same history, this request included: the exact one,
    the cost in the rolling window (t - W, t], and the approximation's, the previous
    calendar window's cost x its unexpired share plus the current window's. A request
    is wrongly allowed when the approximation is within the limit and the exact rate
    is not, wrongly limited the other way round. No limiter state enters, so the two
    rates can never drift apart. Returns `identity`, `exact`, `approx`,
    `wrongly_allowed`, `wrongly_limited`, in the trace's row order."""
    limit = validation.count("limit", limit)
    window = int(seconds_to_ms(window_s)[0])
    codes = pd.factorize(trace.identity)[0].astype(np.int64)
    ms = seconds_to_ms(trace.time.to_numpy())
    cost = trace.cost.to_numpy(dtype=np.int64) if "cost" in trace else np.ones(len(ms), np.int64)
    order = np.lexsort((np.arange(len(ms)), ms, codes))
    c, t, w = codes[order], ms[order], cost[order]
    start = (t // window) * window
    exact = _window_sums(c, t, w, t - window + 1)
    current = _window_sums(c, t, w, start)
    previous = _window_sums(c, t, w, start - window) - current
    approx = previous * ((window - (t - start)) / window) + current
    out = pd.DataFrame(
        {"exact": exact, "approx": approx}, index=pd.Index(order, name="row")
    ).sort_index()
    out.insert(0, "identity", trace.identity.to_numpy())
    out["wrongly_allowed"] = (out.approx <= limit) & (out.exact > limit)
    out["wrongly_limited"] = (out.approx > limit) & (out.exact <= limit)
    return out.reset_index(drop=True)


def counter_per_rate(
    rate_multiples: Iterable[float] = (0.1, 0.2, 0.3, 0.5, 0.8, 1, 1.25, 1.5, 2, 3, 5, 10),
    requests_per_rate: int = 100_000,
    limit: int = 10,
    window_s: int = 1,
    seed: int = 0,
) -> pd.DataFrame:
    """One Poisson client at each multiple of the limit (seed + 10), measured two ways:
    Cloudflare's metric (`exact_rate_errors`: the approximation against the exact rate,
    on the same history), and, a separate finding, how often the counter limiter
    decides differently from a real sliding log once each runs on its own state; with
    what the counter admits in total and its peak."""
    rows = []
    for multiple in rate_multiples:
        validation.positive("rate multiple", multiple)
        rate = multiple * (limit / window_s)
        trace = traffic.poisson(rate, requests_per_rate / rate, seed=seed + 10)
        errors = exact_rate_errors(trace, limit, window_s)
        exact = replay_with(_LOG.name, trace, limit, window_s)
        approx = replay_with(_SWC.name, trace, limit, window_s)
        wrong = metrics.false_decisions(approx, exact)
        rows.append(
            {
                "rate (x limit)": multiple,
                "requests": wrong["requests"],
                "wrongly allowed (%)": 100 * errors.wrongly_allowed.mean(),
                "wrongly limited (%)": 100 * errors.wrongly_limited.mean(),
                WRONG_VS_RATE: 100 * (errors.wrongly_allowed | errors.wrongly_limited).mean(),
                DIVERGED: 100 * (wrong["false_admit_rate"] + wrong["false_reject_rate"]),
                "admitted, counter / log": approx.allowed.sum() / exact.allowed.sum(),
                "peak / limit": metrics.overshoot(approx, limit, window_s),
            }
        )
    return pd.DataFrame(rows).set_index("rate (x limit)").round(4)


@dataclass(frozen=True)
class CounterOnFleet:
    """The sliding-window counter on one Zipf fleet, by Cloudflare's metric and against
    a real log."""

    requests: int
    clients: int
    busiest: float  # the busiest client's mean rate, x limit
    wrong: dict[str, Any]  # `metrics.false_decisions` over the whole fleet (divergence)
    by_rate: pd.DataFrame  # clients grouped by their rate, plus "all clients"
    class_rate: pd.Series  # each class's request-weighted mean rate, x limit

    def summary(self) -> str:
        """One line: the fleet's size and its busiest client."""
        return (
            f"{self.requests:,} requests from {self.clients:,} clients; "
            f"the busiest sends {self.busiest:.1f}x its limit."
        )

    def findings(self) -> str:
        """Both measures over the whole fleet, and where Cloudflare's metric errs."""
        total = self.by_rate.loc["all clients"]
        near = self.by_rate.loc[["0.5-1x", "1-2x"]]
        wrong = near[WRONG_VS_RATE]
        return (
            f"Cloudflare's metric: {total[WRONG_VS_RATE]:.2f}% of all {self.requests / 1e6:.1f}M "
            f"requests; {wrong.min():.1f}-{wrong.max():.1f}% of the requests of clients at "
            f"0.5-2x their limit ({near['share of requests (%)'].sum():.0f}% of all requests). "
            f"Published by Cloudflare for their traffic: {CLOUDFLARE.percent}%.\n"
            f"Divergence from a real log: {total[DIVERGED]:.1f}% of all requests."
        )

    def records(self) -> list[Finding]:
        """The fleet's numbers the chapter records, as `Finding`s: its size in millions,
        both measures over all clients, and Cloudflare's published figure."""
        total = self.by_rate.loc["all clients"]
        return [
            ("fleet_requests_m", self.requests / 1e6, ".1f",
             "requests in the Zipf fleet, millions"),
            ("fleet_cloudflare_pct", total[WRONG_VS_RATE], ".2f",
             "Cloudflare's metric on the fleet, %"),
            ("fleet_diverged_pct", total[DIVERGED], ".1f", "divergence from a real log, fleet, %"),
            ("cloudflare_pct", CLOUDFLARE.percent, "g", "Cloudflare's published figure"),
        ]  # fmt: skip


def _per_client(
    fleet: pd.DataFrame, exact: pd.DataFrame, approx: pd.DataFrame, errors: pd.DataFrame
) -> pd.DataFrame:
    """Per client: requests, admitted by each limiter, their divergent decisions, and
    Cloudflare's wrongly allowed and limited requests."""
    decisions = pd.DataFrame(
        {
            "identity": fleet.identity.to_numpy(),
            "log": exact.allowed.to_numpy(),
            "counter": approx.allowed.to_numpy(),
            "wrongly_allowed": errors.wrongly_allowed.to_numpy(),
            "wrongly_limited": errors.wrongly_limited.to_numpy(),
        }
    )
    decisions["diverged"] = decisions["counter"] != decisions["log"]
    return decisions.groupby("identity").agg(
        requests=("log", "size"),
        log=("log", "sum"),
        counter=("counter", "sum"),
        diverged=("diverged", "sum"),
        wrongly_allowed=("wrongly_allowed", "sum"),
        wrongly_limited=("wrongly_limited", "sum"),
    )


def per_rate_findings(per_rate: pd.DataFrame) -> str:
    """Two lines from `counter_per_rate`: where each measure peaks, and the admitted total."""
    cf, diverged = per_rate[WRONG_VS_RATE], per_rate[DIVERGED]
    ratio = per_rate["admitted, counter / log"]
    low, high = per_rate.index.min(), per_rate.index.max()
    return (
        f"Cloudflare's metric: at most {cf.max():.1f}% of a client's requests, at "
        f"{cf.idxmax():g}x its limit; {cf[low]:g}% at {low:g}x and {cf[high]:g}% at {high:g}x.\n"
        f"Divergence: up to {diverged.max():.1f}%, at {diverged.idxmax():g}x; {diverged[high]:.1f}%"
        f" at {high:g}x. The counter admits {100 * ratio.min():.0f}-{100 * ratio.max():.0f}% of "
        "what the log admits."
    )


def per_rate_records(per_rate: pd.DataFrame) -> list[Finding]:
    """The single client's worst figure by each measure, as `Finding`s to record."""
    return [
        ("single_cloudflare_max_pct", per_rate[WRONG_VS_RATE].max(), ".1f",
         "Cloudflare's metric, worst single client"),
        ("single_diverged_max_pct", per_rate[DIVERGED].max(), ".1f",
         "divergence, worst single client"),
    ]  # fmt: skip


def counter_on_fleet(
    clients: int = 10_000,
    rate: float = 1_000,
    duration_s: float = 2_500,
    limit: int = 10,
    window_s: int = 1,
    zipf_exponent: float = 1.1,
    seed: int = 0,
) -> CounterOnFleet:
    """A Zipf fleet (seed + 20), its clients grouped by their mean rate relative to the
    limit: Cloudflare's metric on it, and the counter replayed beside the exact log."""
    fleet = traffic.zipf_fleet(clients, rate, duration_s, exponent=zipf_exponent, seed=seed + 20)
    errors = exact_rate_errors(fleet, limit, window_s)
    exact = replay_with(_LOG.name, fleet, limit, window_s)
    approx = replay_with(_SWC.name, fleet, limit, window_s)
    per_client = _per_client(fleet, exact, approx, errors)
    per_client["rate (x limit)"] = per_client.requests / duration_s / (limit / window_s)
    per_client["class"] = pd.cut(
        per_client["rate (x limit)"], _RATE_EDGES, right=False, labels=_RATE_CLASSES
    )
    grouped = per_client.groupby("class", observed=False)
    columns = ["requests", "log", "counter", "diverged", "wrongly_allowed", "wrongly_limited"]
    sums = grouped[columns].sum()
    sums.loc["all clients"] = sums.sum()
    wrong = sums.wrongly_allowed + sums.wrongly_limited
    by_rate = pd.DataFrame(
        {
            "clients": [*grouped.size(), len(per_client)],
            "share of requests (%)": 100 * sums.requests / len(fleet),
            "wrongly allowed (%)": 100 * sums.wrongly_allowed / sums.requests,
            "wrongly limited (%)": 100 * sums.wrongly_limited / sums.requests,
            WRONG_VS_RATE: 100 * wrong / sums.requests,
            DIVERGED: 100 * sums.diverged / sums.requests,
            "admitted, counter / log": sums.counter / sums.log,
        },
        index=pd.Index(sums.index, name="client's rate"),
    ).round(4)
    class_rate = grouped.apply(  # NaN for a class without clients
        lambda c: np.average(c["rate (x limit)"], weights=c.requests) if len(c) else np.nan,
        include_groups=False,
    )
    return CounterOnFleet(
        requests=len(fleet),
        clients=fleet.identity.nunique(),
        busiest=float(per_client["rate (x limit)"].max()),
        wrong=metrics.false_decisions(approx, exact),
        by_rate=by_rate,
        class_rate=class_rate,
    )


def counter_figure(
    per_rate: pd.DataFrame, fleet: CounterOnFleet, limit: int = 10, window_s: int = 1
) -> matplotlib.figure.Figure:
    """Section 5's figure: left, Cloudflare's metric against the client's rate (single
    clients, the fleet's classes, the published figure); right, the separate finding,
    the share decided differently once the counter and a real log run on their own."""
    import matplotlib.pyplot as plt

    color = COLORS[_SWC.name]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    classes = fleet.by_rate.drop("all clients")
    for ax, column in [(left, WRONG_VS_RATE), (right, DIVERGED)]:
        ax.plot(
            per_rate.index,
            per_rate[column],
            marker="o",
            color=color,
            label="one client at a fixed Poisson rate",
        )
        ax.scatter(
            fleet.class_rate,
            classes[column],
            marker="s",
            color="black",
            zorder=3,
            label="fleet, clients grouped by rate",
        )
        ax.axhline(
            fleet.by_rate.loc["all clients", column],
            color="grey",
            linestyle=":",
            label=f"this fleet, all {fleet.requests / 1e6:.1f}M requests",
        )
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_ylim(0, 100)
        ax.set_xlabel("client's mean rate (multiple of the limit)")
    published = f"Cloudflare ({CLOUDFLARE.date[:4]}): {CLOUDFLARE.percent}%, their traffic"
    left.axhline(CLOUDFLARE.percent, color="tab:red", linestyle="--", linewidth=1, label=published)
    left.set_ylabel("share of requests (%)")
    left.set_title(
        "Cloudflare's metric: wrongly allowed or limited\nvs the exact rate, same history"
    )
    right.set_title(
        "A separate finding: decided differently\nfrom a real log, each on its own state"
    )
    left.legend(fontsize=7, loc="lower right")
    right.legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"Sliding-window counter, limit {limit} per {window_s} s, Poisson clients", fontsize=11
    )
    fig.tight_layout()
    return fig


# --- section 6: cost-weighted limits on geofence look-ups -------------------------------

GEO_PROFILES: Mapping[str, Mapping[str, float]] = {
    "point look-ups": {"median_radius_m": 100, "radius_sigma": 0.5},
    "typical": {},  # the generator's default: median 150 m, a long tail
    "wide-area": {"median_radius_m": 800, "radius_sigma": 0.5},
}
"""Section 6's clients: `traffic.geofence_mix` arguments by client name."""


def cap_radius_m(
    free_radius_m: float = GEOFENCE_FREE_RADIUS_M, max_cost: int = GEOFENCE_MAX_COST
) -> float:
    """The radius above which `geofence_cost` charges the cap: r with (r / free)^2 =
    max_cost - 1, checked against the function itself on both sides."""
    radius = free_radius_m * float(np.sqrt(max_cost - 1))
    below = geofence_cost(radius, max_cost)
    above = geofence_cost(float(np.nextafter(radius, np.inf)), max_cost)
    if not below < max_cost == above:
        raise AssertionError(f"geofence_cost does not reach its cap just above {radius} m")
    return radius


def cap_caveat(cap_km: float, wide_m: float = 3_000) -> str:
    """One line on the cap: where it starts, as quoted (`cap_km`, rounded: checked on
    `geofence_cost` at that radius and just above it), and what a look-up of `wide_m`
    searches, in 500 m discs, against what it is charged."""
    radius_m = 1000 * cap_km
    if not geofence_cost(radius_m) < GEOFENCE_MAX_COST == geofence_cost(radius_m + 1):
        raise AssertionError(f"the cap does not start just above {cap_km} km")
    discs = (wide_m / GEOFENCE_FREE_RADIUS_M) ** 2
    return (
        f"Charged the cap of {GEOFENCE_MAX_COST} units above {cap_km:.1f} km; a "
        f"{wide_m / 1000:g} km look-up searches {discs:.0f} discs and is charged "
        f"{geofence_cost(wide_m)} units."
    )


def geofence_traffic(
    rate: float = 6,
    duration_s: float = 600,
    seed: int = 0,
    profiles: Mapping[str, Mapping[str, float]] = GEO_PROFILES,
) -> pd.DataFrame:
    """One geofence client per profile (seed + 30 onwards), merged, with each look-up's
    database load `area`: the area searched in units of the free 500 m disc."""
    geo = traffic.merge(
        *[
            traffic.geofence_mix(rate, duration_s, seed=seed + 30 + i, identity=name, **kw)
            for i, (name, kw) in enumerate(profiles.items())
        ]
    )
    geo["area"] = (geo.radius_m / GEOFENCE_FREE_RADIUS_M) ** 2
    return geo


def geo_profiles(geo: pd.DataFrame, clients: Iterable[str] = tuple(GEO_PROFILES)) -> pd.DataFrame:
    """Per client, in the order of `clients`: requests, median radius, mean cost, mean DB
    load, and the share charged at the cost cap."""
    profiles = (
        geo.groupby("identity", sort=False)
        .agg(
            requests=("cost", "size"),
            median_radius_m=("radius_m", "median"),
            mean_cost=("cost", "mean"),
            mean_area=("area", "mean"),
        )
        .rename(
            columns={
                "median_radius_m": "median radius (m)",
                "mean_cost": "mean cost (units)",
                "mean_area": "mean DB load (discs)",
            }
        )
    )
    at_cap = geo.cost == GEOFENCE_MAX_COST
    profiles["charged at the cap (%)"] = 100 * at_cap.groupby(geo.identity, sort=False).mean()
    profiles = profiles.reindex(list(clients))
    profiles.index.name = "client"
    return profiles


def geo_policies(
    geo: pd.DataFrame, flat_limit: int = 10, cost_limit: int = 20, window_s: int = 1
) -> dict[str, pd.DataFrame]:
    """The look-ups decided by a sliding log per client: a flat count of `flat_limit`
    requests, and a weighted budget of `cost_limit` units, per window."""
    return {
        f"flat: {flat_limit} requests/s": replay_with(
            _LOG.name, geo.assign(cost=1), flat_limit, window_s
        ),
        f"weighted: {cost_limit} units/s": replay_with(_LOG.name, geo, cost_limit, window_s),
    }


def _db_load_per_second(decided: pd.DataFrame, duration_s: int) -> np.ndarray:
    """DB load (area searched) of the admitted look-ups in each whole second."""
    ok = decided[decided.allowed]
    seconds = np.floor(ok.time).astype(int)
    return np.bincount(seconds, weights=ok.area, minlength=duration_s)


def geo_table(
    policies: Mapping[str, pd.DataFrame],
    duration_s: int = 600,
    clients: Iterable[str] = tuple(GEO_PROFILES),
) -> pd.DataFrame:
    """Per client (in the order of `clients`, then all together) and policy: admitted,
    and the DB load per second."""
    rows = []
    for policy, decided in policies.items():
        by_client = [(name, decided[decided.identity == name]) for name in clients]
        for client, d in [*by_client, ("all three", decided)]:
            load = _db_load_per_second(d, duration_s)
            rows.append(
                {
                    "client": client,
                    "policy": policy,
                    "admitted (%)": 100 * d.allowed.mean(),
                    "admitted per second": d.allowed.sum() / duration_s,
                    "DB load per second, mean": load.mean(),
                    "DB load per second, 99th percentile": np.percentile(load, 99),
                }
            )
    return pd.DataFrame(rows).set_index(["client", "policy"]).round(2)


def geo_figure(table: pd.DataFrame, rate: float = 6) -> matplotlib.figure.Figure:
    """Section 6's figure: admitted look-ups and DB load per client, one bar per policy."""
    import matplotlib.pyplot as plt

    clients = [c for c in dict.fromkeys(table.index.get_level_values("client")) if c != "all three"]
    policies = list(dict.fromkeys(table.index.get_level_values("policy")))
    x = np.arange(len(clients))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for j, (policy, hatch) in enumerate(zip(policies, ["", "//"], strict=True)):
        style = {"hatch": hatch, "alpha": 0.5 + 0.4 * j, "edgecolor": "white", "label": policy}
        for ax, column, color in [
            (left, "admitted per second", "tab:blue"),
            (right, "DB load per second, mean", "tab:brown"),
        ]:
            values = [table.loc[(c, policy), column] for c in clients]
            bars = ax.bar(x + (j - 0.5) * 0.38, values, 0.38, color=color, **style)
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
    left.axhline(rate, color="black", linestyle=":", linewidth=1, label=f"sent ({rate}/s)")
    left.set_xticks(x, clients)
    left.set_ylabel("admitted look-ups per second")
    left.set_title("Who gets through")
    left.legend(fontsize=8, loc="lower left")
    right.set_xticks(x, clients)
    right.set_ylabel("DB load: area searched per second\n(500 m discs per second)")
    right.set_title("What reaches the database")
    right.legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f"Geofence look-ups, {rate} per second per client: flat count vs cost by area", fontsize=11
    )
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class GeoPolicies:
    """The Explore section's question: section 6's three clients at `rate` look-ups per
    second for `duration_s`, under a flat and a weighted limit per `window_s`. The
    limits may come from a slider as floats."""

    rate: float = 6
    duration_s: int = 600
    flat_limit: float = 10
    cost_limit: float = 20
    window_s: int = 1
    seed: int = 0


@parameters_of(GeoPolicies)
def geo_explore(**options: Any) -> matplotlib.figure.Figure:
    """Section 6's figure for other limits or rates (`GeoPolicies`' options): the same
    traffic, policies and table as the section, drawn again."""
    g = GeoPolicies(**options)
    geo = geofence_traffic(g.rate, g.duration_s, g.seed)
    flat, cost = int(round(g.flat_limit)), int(round(g.cost_limit))
    table = geo_table(geo_policies(geo, flat, cost, g.window_s), g.duration_s)
    return geo_figure(table, g.rate)
