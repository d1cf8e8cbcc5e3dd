"""Chapter 5: the four algorithms side by side, what a check costs Redis, the
sliding-window counter at scale, cost-weighted limits, and Redis capacity for a fleet.

    from ratelimit.lab.chapters import algorithms_and_capacity as chapter
    traces = chapter.traces(limit=10, window_s=1, seed=0)       # section 1's five traces
    chapter.exactness(chapter.replay_all(traces, 10, 1), 10, 1)  # section 2's table
    chapter.figure()                         # section 7's figure at the chapter's parameters
    chapter.figure(limit=100, headroom=0.3)  # another policy (what the sliders redraw)

Decisions come from the in-memory reference models (`ratelimit.lab.reference`), which
decide exactly like the Lua scripts, replayed in virtual time; `script_check` runs the
real scripts on the embedded Redis to show that. Bytes per key come from chapter 3's
stored table, Redis commands per check from the registry (`ratelimit.algorithms`).
Every function takes the chapter's parameters; the defaults are the chapter's values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

import ratelimit
from ratelimit import algorithms, validation
from ratelimit.costs import GEOFENCE_FREE_RADIUS_M, GEOFENCE_MAX_COST

from .. import capacity, memory, metrics, traffic
from ..memory import format_bytes
from ..plotting import COLORS, parameters_of
from ..simulation import replay
from ..timebase import seconds_to_ms

if TYPE_CHECKING:
    import matplotlib.figure

__all__ = [
    "CLOUDFLARE_PERCENT",
    "FULL",
    "Fleet",
    "GEO_PROFILES",
    "LABELS",
    "POLICY_SWEEP",
    "STEADY",
    "US_PER_CHECK",
    "CounterOnFleet",
    "busiest_window",
    "counter_figure",
    "counter_on_fleet",
    "counter_per_rate",
    "decision_matrix",
    "exactness",
    "figure",
    "fleet_plans",
    "fleet_summary",
    "geo_figure",
    "geo_policies",
    "geo_profiles",
    "geo_table",
    "geofence_traffic",
    "key_bytes",
    "key_sizes",
    "matrix_figure",
    "peaks",
    "plan",
    "plan_table",
    "policy_sweep",
    "predicted_commands",
    "replay_all",
    "replay_with",
    "script_check",
    "stored_table",
    "trace_table",
    "traces",
]

LABELS: Mapping[str, str] = {a.name: a.label for a in algorithms.ALGORITHMS}
"""Each algorithm's label by its tag, in the registry's order."""
_LOG = algorithms.get("log")

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
    model = algorithms.get(algorithm).limiter_class("reference")(window_s, limit)
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
    """Per trace and algorithm: admitted, peak / limit, and the false admits and rejects
    (% of all requests) against the exact sliding log on the same trace."""
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
                    "false admits (%)": round(100 * wrong["false_admit_rate"], 3),
                    "false rejects (%)": round(100 * wrong["false_reject_rate"], 3),
                }
            )
    return pd.DataFrame(rows).set_index(["trace", "algorithm"])


def peaks(table: pd.DataFrame) -> pd.DataFrame:
    """An `exactness` table's peak / limit, one row per trace, one column per algorithm."""
    traces_in_order = list(dict.fromkeys(table.index.get_level_values("trace")))
    return table["peak / limit"].unstack("algorithm").loc[traces_in_order, list(LABELS.values())]


# --- section 3: what one check costs Redis ----------------------------------------------


@lru_cache(maxsize=4)
def stored_table(path: str | Path = "data/memory_per_key.csv") -> memory.MeasuredOrStored:
    """Chapter 3's stored memory table at `path` (relative to the notebooks' folder),
    read once per path and never measured here: `.table`, `.source` ("stored")."""
    return memory.measured_or_stored(None, path, [1])


def key_bytes(table: pd.DataFrame, limits: Iterable[int] = (10, 100, 1_000)) -> pd.DataFrame:
    """Bytes of one full key per algorithm (rows) at each of `limits` (columns)."""
    return pd.DataFrame(
        {
            f"limit {n:,}": [capacity.bytes_per_key(table, a, n) for a in algorithms.NAMES]
            for n in limits
        },
        index=pd.Index(list(LABELS.values()), name="bytes per full key"),
    ).astype(int)


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
    for a in algorithms.ALGORITHMS:
        script = a.limiter_class("sync")(ratelimit.connect_sync(embedded=True), window_s, limit)
        decided = replay(trace, script, progress=False)
        model = replay_with(a.name, trace, limit, window_s)
        ok = decided[decided.allowed]
        per_path = a.commands
        rows.append(
            {
                "algorithm": a.label,
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
) -> pd.DataFrame:
    """One row per algorithm: worst peak, worst false admits and rejects over the traces
    (from `exactness`), bytes per key at `limit` and 1,000 (from `key_bytes`), and
    script commands per check per path and on average over every replayed check."""
    total_checks = sum(len(next(iter(by.values()))) for by in replayed.values())
    by_algorithm = table.groupby(level="algorithm", sort=False)
    matrix = pd.DataFrame(
        {
            "worst peak / limit": by_algorithm["peak / limit"].max(),
            "false admits, worst trace (%)": by_algorithm["false admits (%)"].max(),
            "false rejects, worst trace (%)": by_algorithm["false rejects (%)"].max(),
            f"bytes per key, limit {limit:,}": bytes_table[f"limit {limit:,}"],
            "bytes per key, limit 1,000": bytes_table["limit 1,000"],
            "commands per check, admit / reject": [
                f"{capacity.script_commands(a, True)} / {capacity.script_commands(a, False)}"
                for a in algorithms.NAMES
            ],
            "commands per check, mean": [
                round(
                    sum(predicted_commands(a, by[a]) for by in replayed.values()) / total_checks, 2
                )
                for a in algorithms.NAMES
            ],
        }
    )
    matrix.index.name = "algorithm"
    return matrix


def _peak_panel(ax: Any, table: pd.DataFrame) -> None:
    peak = peaks(table)
    x, width = np.arange(len(peak)), 0.2
    for i, a in enumerate(algorithms.NAMES):
        ax.bar(x + (i - 1.5) * width, peak[LABELS[a]], width, color=COLORS[a], label=LABELS[a])
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    ax.set_xticks(x, list(peak.index), fontsize=8)
    ax.set_ylabel("busiest rolling second / limit")
    ax.set_title("Most admitted in any rolling second (1.0 = exact)")
    ax.set_ylim(0, 2.3)
    ax.legend(fontsize=8, ncol=2, loc="upper left")


def _false_decision_panel(ax: Any, table: pd.DataFrame) -> None:
    names = list(dict.fromkeys(table.index.get_level_values("trace")))
    x, width = np.arange(len(names)), 0.2
    others = [a for a in algorithms.NAMES if a != _LOG.name]  # the log is the yardstick
    for i, a in enumerate(others):
        rows = table.xs(LABELS[a], level="algorithm")
        ax.bar(
            x + (i - 1) * width, rows["false admits (%)"], width, color=COLORS[a], label=LABELS[a]
        )
        ax.bar(
            x + (i - 1) * width,
            rows["false rejects (%)"],
            width,
            bottom=rows["false admits (%)"],
            color=COLORS[a],
            alpha=0.45,
            hatch="//",
            edgecolor="white",
        )
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylim(0, 55)
    ax.set_ylabel("share of all requests (%)")
    ax.set_title(
        "Decided differently from the exact log\n(solid: false admits, hatched: false rejects)"
    )
    ax.legend(fontsize=8)


def _memory_panel(ax: Any, memory_table: pd.DataFrame, limit: int) -> None:
    for a in algorithms.NAMES:
        fmt = "script" if a == _LOG.name else ""
        rows = memory_table[(memory_table.algorithm == a) & (memory_table.member_format == fmt)]
        rows = rows.sort_values("limit")
        ax.plot(rows["limit"], rows["bytes_per_key"], color=COLORS[a], label=LABELS[a])
    ax.axvline(limit, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("limit (requests per window; a full key)")
    ax.set_ylabel("MEMORY USAGE of one key (bytes)")
    ax.set_title(f"Memory per key (Redis {memory_table.redis_version.iloc[0]}, chapter 3)")
    ax.legend(fontsize=8)


def _commands_panel(ax: Any) -> None:
    import matplotlib.pyplot as plt

    n = len(algorithms.NAMES)
    for j, allowed in enumerate([True, False]):
        bars = ax.bar(
            np.arange(n) + (j - 0.5) * 0.35,
            [capacity.script_commands(a, allowed) for a in algorithms.NAMES],
            0.35,
            color=[COLORS[a] for a in algorithms.NAMES],
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
    ticks = [
        label.replace(" (", "\n(").replace("-window ", "-window\n") for label in LABELS.values()
    ]
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
CLOUDFLARE_PERCENT = 0.003  # of 400 million requests, wrongly allowed or limited (2017)
# Clients grouped by their mean rate, as multiples of the limit.
_RATE_EDGES = [0, 0.1, 0.25, 0.5, 1, 2, 5, np.inf]
_RATE_CLASSES = ["under 0.1x", "0.1-0.25x", "0.25-0.5x", "0.5-1x", "1-2x", "2-5x", "5x and more"]


def counter_per_rate(
    rate_multiples: Iterable[float] = (0.1, 0.2, 0.3, 0.5, 0.8, 1, 1.25, 1.5, 2, 3, 5, 10),
    requests_per_rate: int = 100_000,
    limit: int = 10,
    window_s: int = 1,
    seed: int = 0,
) -> pd.DataFrame:
    """One Poisson client at each multiple of the limit (seed + 10): how often the counter
    decides differently from the exact log, what it admits in total, and its peak."""
    rows = []
    for multiple in rate_multiples:
        validation.positive("rate multiple", multiple)
        rate = multiple * (limit / window_s)
        trace = traffic.poisson(rate, requests_per_rate / rate, seed=seed + 10)
        exact = replay_with(_LOG.name, trace, limit, window_s)
        approx = replay_with(_SWC.name, trace, limit, window_s)
        wrong = metrics.false_decisions(approx, exact)
        rows.append(
            {
                "rate (x limit)": multiple,
                "requests": wrong["requests"],
                "false admits (%)": 100 * wrong["false_admit_rate"],
                "false rejects (%)": 100 * wrong["false_reject_rate"],
                "decided differently (%)": 100
                * (wrong["false_admit_rate"] + wrong["false_reject_rate"]),
                "admitted, counter / log": approx.allowed.sum() / exact.allowed.sum(),
                "peak / limit": metrics.overshoot(approx, limit, window_s),
            }
        )
    return pd.DataFrame(rows).set_index("rate (x limit)").round(4)


@dataclass(frozen=True)
class CounterOnFleet:
    """The sliding-window counter against the exact log on one Zipf fleet."""

    requests: int
    clients: int
    busiest: float  # the busiest client's mean rate, x limit
    wrong: dict[str, Any]  # `metrics.false_decisions` over the whole fleet
    by_rate: pd.DataFrame  # clients grouped by their rate, plus "all clients"
    class_rate: pd.Series  # each class's request-weighted mean rate, x limit

    def summary(self) -> str:
        """One line: the fleet's size and its busiest client."""
        return (
            f"{self.requests:,} requests from {self.clients:,} clients; "
            f"the busiest sends {self.busiest:.1f}x its limit."
        )


def _per_client(fleet: pd.DataFrame, exact: pd.DataFrame, approx: pd.DataFrame) -> pd.DataFrame:
    """Per client: requests, admitted by each, and the counter's false admits and rejects."""
    decisions = pd.DataFrame(
        {
            "identity": fleet.identity.to_numpy(),
            "log": exact.allowed.to_numpy(),
            "counter": approx.allowed.to_numpy(),
        }
    )
    decisions["false admit"] = decisions["counter"] & ~decisions["log"]
    decisions["false reject"] = ~decisions["counter"] & decisions["log"]
    return decisions.groupby("identity").agg(
        requests=("log", "size"),
        log=("log", "sum"),
        counter=("counter", "sum"),
        false_admits=("false admit", "sum"),
        false_rejects=("false reject", "sum"),
    )


def counter_on_fleet(
    clients: int = 10_000,
    rate: float = 1_000,
    duration_s: float = 2_500,
    limit: int = 10,
    window_s: int = 1,
    zipf_exponent: float = 1.1,
    seed: int = 0,
) -> CounterOnFleet:
    """A Zipf fleet (seed + 20) replayed by the counter and the exact log, its clients
    grouped by their mean rate relative to the limit."""
    fleet = traffic.zipf_fleet(clients, rate, duration_s, exponent=zipf_exponent, seed=seed + 20)
    exact = replay_with(_LOG.name, fleet, limit, window_s)
    approx = replay_with(_SWC.name, fleet, limit, window_s)
    per_client = _per_client(fleet, exact, approx)
    per_client["rate (x limit)"] = per_client.requests / duration_s / (limit / window_s)
    per_client["class"] = pd.cut(
        per_client["rate (x limit)"], _RATE_EDGES, right=False, labels=_RATE_CLASSES
    )
    grouped = per_client.groupby("class", observed=False)
    sums = grouped[["requests", "log", "counter", "false_admits", "false_rejects"]].sum()
    sums.loc["all clients"] = sums.sum()
    wrong = sums.false_admits + sums.false_rejects
    by_rate = pd.DataFrame(
        {
            "clients": [*grouped.size(), len(per_client)],
            "share of requests (%)": 100 * sums.requests / len(fleet),
            "false admits (%)": 100 * sums.false_admits / sums.requests,
            "false rejects (%)": 100 * sums.false_rejects / sums.requests,
            "decided differently (%)": 100 * wrong / sums.requests,
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
    """Section 5's figure: share decided differently against the client's rate (single
    clients, the fleet's classes, Cloudflare's figure), and the counter's admitted total."""
    import matplotlib.pyplot as plt

    color = COLORS[_SWC.name]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    label = "one client at a fixed Poisson rate"
    left.plot(
        per_rate.index, per_rate["decided differently (%)"], marker="o", color=color, label=label
    )
    left.scatter(
        fleet.class_rate,
        fleet.by_rate["decided differently (%)"].drop("all clients"),
        marker="s",
        color="black",
        zorder=3,
        label="fleet, clients grouped by rate",
    )
    cloudflare = f"Cloudflare (2017): {CLOUDFLARE_PERCENT}% of 400M requests"
    left.axhline(CLOUDFLARE_PERCENT, color="tab:red", linestyle="--", linewidth=1, label=cloudflare)
    left.axhline(
        fleet.by_rate.loc["all clients", "decided differently (%)"],
        color="grey",
        linestyle=":",
        label=f"this fleet, all {fleet.requests / 1e6:.1f}M requests",
    )
    left.set_xscale("log")
    left.set_yscale("symlog", linthresh=1e-3)
    left.set_ylim(0, 100)
    left.set_xlabel("client's mean rate (multiple of the limit)")
    left.set_ylabel("requests decided differently\nfrom the exact log (%)")
    left.set_title("Sliding-window counter vs exact log")
    left.legend(fontsize=7, loc="lower right")

    right.plot(per_rate.index, 100 * per_rate["admitted, counter / log"], marker="o", color=color)
    right.axhline(100, color="black", linestyle=":", linewidth=1)
    right.set_xscale("log")
    right.set_xlabel("client's mean rate (multiple of the limit)")
    right.set_ylabel("admitted by the counter\n(% of what the log admits)")
    right.set_title("...but in total it admits about as many")
    fig.suptitle(
        f"Sliding-window counter, limit {limit} per {window_s} s, Poisson traffic", fontsize=11
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


# --- section 7: capacity planning -------------------------------------------------------

US_PER_CHECK: Mapping[str, float] = {"log": 21.0, "fw": 7.0, "swc": 8.0, "gcra": 7.0}
"""The chapter's REDIS_US_PER_CHECK: Redis CPU per script call, microseconds, by tag."""
POLICY_SWEEP: Mapping[str, tuple[int, int]] = {
    "10 per second": (10, 1),
    "100 per minute": (100, 60),
    "1,000 per hour": (1_000, 3_600),
    "10,000 per day": (10_000, 86_400),
}
"""Section 7's policies swept at a fixed fleet: name -> (limit, window in seconds)."""
FULL, STEADY = f"{_LOG.label}, keys full", f"{_LOG.label}, steady state"
# Line styles of section 7's figure, by sizing label.
_STYLES: Mapping[str, Mapping[str, Any]] = {
    FULL: {"linewidth": 2.5},
    STEADY: {"linestyle": "--"},
    LABELS["fw"]: {"linewidth": 3, "alpha": 0.6},
    LABELS["swc"]: {"linewidth": 1.5},
    LABELS["gcra"]: {"linestyle": ":", "linewidth": 2},
}
# The figure's x axis: 241 fleet sizes, log-spaced from 10**3 to 10**8.
_KEYS_AXIS = np.unique(np.geomspace(1e3, 1e8, 241).round().astype(int))


def _sizings(limit: int, window_s: int, rate_per_key: float) -> dict[str, tuple[str, float]]:
    """Entries per key, per way of sizing: {label: (algorithm, entries)}. The log is
    sized twice, for full keys and for its steady state; the others hold O(1) state."""
    steady = max(1.0, capacity.log_members(limit, rate_per_key, window_s))
    sizings = {FULL: (_LOG.name, capacity.log_members(limit)), STEADY: (_LOG.name, steady)}
    others = [a for a in algorithms.ALGORITHMS if a is not _LOG]
    return sizings | {a.label: (a.name, float(limit)) for a in others}


@dataclass(frozen=True)
class Fleet:
    """Section 7's question: a fleet of API keys under one limit policy, and the Redis
    shard that serves it. The defaults are the chapter's. `active_keys` and `limit` may
    come from a slider as floats: they are rounded to whole numbers."""

    active_keys: float = 1_000_000  # keys holding limiter state (a request within a window)
    rate_per_key: float = 0.05  # mean requests per second per active key
    limit: float = 1_000  # requests ...
    window_s: int = 3_600  # ... per window of this many seconds
    us_per_check: Mapping[str, float] = field(default_factory=lambda: dict(US_PER_CHECK))
    shard_memory_gib: float = 14  # data memory of one Redis
    shard_checks_per_s: float = 50_000  # checks per second one Redis serves end to end
    headroom: float = 0.5  # share of each shard's memory and throughput kept free
    key_overhead_bytes: float = 64  # per-key bookkeeping MEMORY USAGE leaves out

    @property
    def keys(self) -> int:
        return int(round(self.active_keys))

    @property
    def whole_limit(self) -> int:
        return int(round(self.limit))


def key_sizes(table: pd.DataFrame, fleet: Fleet) -> dict[str, tuple[str, float]]:
    """Bytes of one key per way of sizing, from chapter 3's table: {label: (algorithm, bytes)}."""
    return {
        label: (a, capacity.bytes_per_key(table, a, entries))
        for label, (a, entries) in _sizings(
            fleet.whole_limit, fleet.window_s, fleet.rate_per_key
        ).items()
    }


def plan(
    algorithm: str, key_bytes: float, fleet: Fleet, active_keys: int | None = None
) -> capacity.CapacityPlan:
    """`capacity.plan_fleet` for one algorithm on `fleet`'s shards (for `active_keys`
    keys instead of the fleet's own, when given)."""
    return capacity.plan_fleet(
        algorithm,
        active_keys=fleet.keys if active_keys is None else active_keys,
        rate_per_key=fleet.rate_per_key,
        bytes_per_key=key_bytes,
        us_per_check=fleet.us_per_check[algorithm],
        shard_memory_bytes=fleet.shard_memory_gib * 2**30,
        shard_checks_per_s=fleet.shard_checks_per_s,
        headroom=fleet.headroom,
        key_overhead_bytes=fleet.key_overhead_bytes,
    )


def fleet_plans(table: pd.DataFrame, fleet: Fleet) -> dict[str, capacity.CapacityPlan]:
    """A `capacity.CapacityPlan` per way of sizing the keys of `fleet`."""
    return {label: plan(a, size, fleet) for label, (a, size) in key_sizes(table, fleet).items()}


def fleet_summary(fleet: Fleet) -> str:
    """Two lines: the fleet's checks per second and its log keys, and one shard's size."""
    limit = fleet.whole_limit
    steady = _sizings(limit, fleet.window_s, fleet.rate_per_key)[STEADY][1]
    checks = capacity.checks_per_second(fleet.keys, fleet.rate_per_key)
    return (
        f"{fleet.keys:,} active keys x {fleet.rate_per_key:g} requests/s = "
        f"{checks:,.0f} checks/s; limit {limit:,} per {fleet.window_s:,} s; a steady-state "
        f"log key holds {steady:,.0f} members, a full one {limit:,}.\n"
        f"One shard: {fleet.shard_memory_gib} GiB, {fleet.shard_checks_per_s:,} checks/s, "
        f"{fleet.headroom:.0%} kept free."
    )


def plan_table(plans: Mapping[str, capacity.CapacityPlan]) -> pd.DataFrame:
    """Section 7's table: memory, checks, commands, CPU and shards per way of sizing."""
    rows = plans.values()
    return pd.DataFrame(
        {
            "bytes per key": [round(p.bytes_per_key) for p in rows],
            "memory": [format_bytes(p.memory_bytes) for p in rows],
            "checks/s": [round(p.checks_per_s) for p in rows],
            "script commands/s": [round(p.commands_per_s) for p in rows],
            "Redis CPU (cores)": [round(p.redis_cpu_cores, 2) for p in rows],
            "shards for memory": [p.shards_for_memory for p in rows],
            "shards for checks": [p.shards_for_checks for p in rows],
            "shards": [p.shards for p in rows],
            "keys one Redis carries": [p.keys_per_shard for p in rows],
        },
        index=pd.Index(list(plans), name="sizing"),
    )


def policy_sweep(
    table: pd.DataFrame,
    fleet: Fleet,
    policies: Mapping[str, tuple[int, int]] = POLICY_SWEEP,
    shown: Iterable[str] = (FULL, STEADY, LABELS["swc"]),
) -> pd.DataFrame:
    """Memory and shards of the `shown` sizings under each policy, for the same fleet
    (each policy replaces its `limit` and `window_s`)."""
    rows = []
    for policy, (limit, window_s) in policies.items():
        plans = fleet_plans(table, replace(fleet, limit=limit, window_s=window_s))
        row: dict[str, Any] = {"policy": policy}
        for label in shown:
            row[f"{label}: memory"] = format_bytes(plans[label].memory_bytes)
            row[f"{label}: shards"] = plans[label].shards
        rows.append(row)
    return pd.DataFrame(rows).set_index("policy")


@parameters_of(Fleet, table=None, table_path="data/memory_per_key.csv")
def figure(
    *, table: pd.DataFrame | None, table_path: str | Path, **fleet_options: Any
) -> matplotlib.figure.Figure:
    """Redis shards needed against fleet size, one step line per algorithm and sizing.

    Takes `Fleet`'s options: `active_keys` places the dotted marker, and the legend
    gives each line's shards there. Each line's dot is the most keys one Redis
    carries. `table` is a `memory.memory_table`; without it the table stored at
    `table_path` (relative to the notebooks' folder) is read, once.
    """
    import matplotlib.pyplot as plt

    fleet = Fleet(**fleet_options)
    if table is None:
        table = stored_table(str(table_path)).table
    keys, limit, window_s = fleet.keys, fleet.whole_limit, fleet.window_s
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for label, (a, size) in key_sizes(table, fleet).items():
        shards = [plan(a, size, fleet, int(n)).shards for n in _KEYS_AXIS]
        here = plan(a, size, fleet)
        legend = f"{label}: {here.shards:,} shard{'s' if here.shards > 1 else ''}"
        ax.step(_KEYS_AXIS, shards, where="post", color=COLORS[a], label=legend, **_STYLES[label])
        ax.plot([here.keys_per_shard], [1], marker="o", color=COLORS[a])
    ax.axvline(keys, color="grey", linestyle=":", linewidth=1)
    ax.text(
        keys / 1.15,
        0.97,
        f"{keys:,} keys\n(the legend's shards)",
        transform=ax.get_xaxis_transform(),
        fontsize=8,
        color="grey",
        ha="right",
        va="top",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(_KEYS_AXIS[0], _KEYS_AXIS[-1])
    ax.set_xlabel(f"active keys (each {fleet.rate_per_key:g} requests/s)")
    ax.set_ylabel("Redis shards needed")
    ax.set_title(
        f"Shards for a limit of {limit:,} per {window_s:,} s "
        f"({fleet.shard_memory_gib:g} GiB, {fleet.shard_checks_per_s:,.0f} checks/s per shard, "
        f"{fleet.headroom:.0%} free)\ndots: the most keys one Redis carries",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig
