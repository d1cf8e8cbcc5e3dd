"""Chapter 8, your traffic: an access log in, a limit policy and a Redis plan out.

The chapter is the `plan` command (`ratelimit.lab.planner`) with pictures. It reads a
log with `ratelimit.lab.accesslog` (the lab's own example log unless it is given
another), shows how fast each identity sends, sweeps candidate limits through the four
algorithms, sizes Redis for the chosen limit and asks how that plan moves when the
traffic grows, and estimates what the rejection near-cache and `check_many` would save.

    from ratelimit.lab.chapters import your_traffic
    trace, problems = your_traffic.load(your_traffic.example_log())
    your_traffic.demand(trace, window_s=60)          # per identity: requests, peak per window
    your_traffic.near_cache(replayed)                # Redis calls a near-cache would answer
    your_traffic.batching(trace, batch_ms=1)         # round trips check_many would save
    your_traffic.shard_crossings(plan, "100/min")    # the growth that needs a second shard
    your_traffic.remove_example_logs()               # the example's temporary folder, gone

`make plan LOG=access.log LIMIT=100/min` runs the notebook on another log into build/plan/
(tools/plan_page.py). Its clients are then counted by address unless `IDENTITY=` names a
field (the example log alone counts its API keys, the user field), and the prose about
the log (`describe`, `what_fills`) is computed from the log read: only what is true of it.
A log with no request to plan stops `load` with one line saying why.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ratelimit import algorithms, validation
from ratelimit.identity import address_identity
from ratelimit.lab import accesslog, capacity, metrics, planner, reference, samplelog
from ratelimit.lab.memory import format_bytes
from ratelimit.lab.plotting import COLORS
from ratelimit.lab.simulation import replay
from ratelimit.lab.timebase import seconds_to_ms

# The README's chapter-table cell and gallery text, filled from the chapter's records
# (notebooks/data/records/08_your_traffic.json) by `ratelimit.lab.records`.
TITLE = "Your traffic"
SUMMARY = (
    "an access log in, a limit policy and a Redis plan out: on the lab's example log "
    "({lines} lines, {bad_lines} bad ones reported by number) each identity's peak rate, "
    "candidate limits through the four algorithms, shards against traffic growth, and what "
    "the near-cache and `check_many` save; `make plan LOG=...` runs it on your log"
)
HEADLINE = (
    "On the example log ({requests} requests from {identities} API keys), {over} keys "
    "({over_share}) exceed {limit} at their peak and send {over_requests_share} of the "
    "requests: the exact log rejects {log_rejected_share} of all requests, from "
    "{log_identities} keys, and the four algorithms' shares lie within {spread_points} points, "
    "but in one rolling window a key gets {fw_peak_ratio}x the limit through a fixed window "
    "and {gcra_peak_ratio}x through GCRA. One shard carries it up to {log_second_shard}x the "
    "traffic under the sliding log and {others_second_shard_min}-{others_second_shard_max}x "
    "under the others (each then short of checks, not memory); the near-cache answers "
    "{near_cache_share} of the log's checks without Redis."
)

README_BLOCKS = {
    "real-log": """\
A real log, planned as a user would plan it: {real_source}, {real_lines} lines in
{real_format} format from {real_clients} client addresses, planned by `tools/real_log.py`,
which keeps its plans in `notebooks/data/real_log/` for chapter 8 to show.

- At {real_limit}, the sliding log rejects {real_log_rejected} requests
  ({real_log_rejected_share}) from {real_log_clients} clients; the fixed window rejects
  {real_fw_rejected}, the sliding-window counter {real_swc_rejected} and GCRA
  {real_gcra_rejected}.
- The smallest limit that affects at most {real_affect} of the clients:
  {real_log_recommended} for the sliding log ({real_log_recommended_rejected} of the
  requests rejected), {real_fw_recommended} for the fixed window,
  {real_swc_recommended} for the counter and {real_gcra_recommended} for GCRA.
- One limit per route, GET requests only: {real_routes_text}; {real_unplanned} requests
  match no route.

![The real log's plan: per-client peaks, rejections by hour, throttled stretches](\
notebooks/figures/08_real_log.png)""",
}

__all__ = [
    "GROWTH",
    "README_BLOCKS",
    "REAL_LOG_DIR",
    "batching",
    "demand",
    "demand_figure",
    "describe",
    "example_log",
    "example_offsets",
    "finer_sweep",
    "load",
    "near_cache",
    "real_log",
    "real_log_tables",
    "overview",
    "redis_table",
    "remove_example_logs",
    "sensitivity",
    "sensitivity_figure",
    "shard_crossings",
    "split_networks",
    "sweep_figure",
    "sweep_table",
    "what_fills",
]

GROWTH = tuple(float(10 ** (k / 40)) for k in range(0, 201))
"""Traffic multipliers of the sensitivity plot: 1x to 100,000x, forty per decade (the
plot's steps; `shard_crossings` finds where each one is, exactly)."""

# The example logs written into temporary folders of their own, removed by
# `remove_example_logs` (or, failing that, when the process exits).
_EXAMPLE_FOLDERS: list[tempfile.TemporaryDirectory[str]] = []


def example_log(directory: str | Path | None = None, seed: int = 7) -> Path:
    """The lab's example access log (`samplelog.write_example`), written into
    `directory`, or by default into a temporary folder of its own that
    `remove_example_logs` removes (and the end of the process, if nothing did), so that
    nothing tracked changes and nothing is left behind."""
    if directory is None:
        folder = tempfile.TemporaryDirectory(prefix="rl-example-log-")
        _EXAMPLE_FOLDERS.append(folder)
        directory = folder.name
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    return samplelog.write_example(path / "access.log", seed=seed)


def remove_example_logs() -> list[Path]:
    """Remove the temporary folders `example_log` made; returns the folders removed."""
    removed = []
    while _EXAMPLE_FOLDERS:
        folder = _EXAMPLE_FOLDERS.pop()
        folder.cleanup()
        removed.append(Path(folder.name))
    return removed


def example_offsets() -> list[str]:
    """The UTC offsets the example log's two servers write their times in: "UTC+01:00"."""
    texts = []
    for seconds in samplelog.SERVER_OFFSETS_S:
        sign, minutes = ("+" if seconds >= 0 else "-"), abs(seconds) // 60
        texts.append(f"UTC{sign}{minutes // 60:02d}:{minutes % 60:02d}")
    return texts


def load(
    log: str | Path,
    *,
    format: str | None = None,
    identity: str | None = None,
    cost: Any = None,
    ipv6_prefix: int = 64,
    fields: Sequence[str] = (),
) -> tuple[pd.DataFrame, accesslog.Problems]:
    """The log as a trace table (sorted by time) and the report of its bad lines; IPv6
    client addresses count per `ipv6_prefix` network (128: each address on its own).
    A log without a single request raises `accesslog.LogFormatError` saying why its lines
    were skipped."""
    trace, problems = accesslog.read(
        log, format=format, identity=identity, cost=cost, ipv6_prefix=ipv6_prefix, fields=fields
    )
    if trace.empty:  # nothing to plan: say why in one line rather than fail further on
        why = problems.summary().splitlines()[0] if problems.lines else "it is empty"
        raise accesslog.LogFormatError(f"no requests to plan in {Path(log).name}: {why}")
    return trace, problems


def describe(
    log: str | Path,
    trace: pd.DataFrame,
    problems: accesslog.Problems,
    *,
    example: bool,
    identity: str | None,
) -> tuple[str, str, str]:
    """Three pieces of the chapter's prose about the log it read, true of that log: its
    name, a sentence on where its requests come from, and the clause after "N are bad"
    (empty when none is)."""
    if example:
        offsets = example_offsets()
        origin = (
            "The example holds two servers' logs merged in the order requests finished, one "
            f"server writing its times at {offsets[0]} and the other at {offsets[1]}: the "
            "reader puts them back in time order."
        )
        kinds = (
            ", of the kinds real logs have: a line cut short by another writer, a date that "
            "does not exist, a proxy's error message in the middle of the log, and a last "
            "line cut off mid-way"
        )
        return "the lab's example log", origin, kinds
    name = Path(log).name
    first, last = (
        pd.Timestamp(float(t), unit="s").strftime("%Y-%m-%d %H:%M:%S")
        for t in (trace["time"].min(), trace["time"].max())
    )
    who = f"the field {identity!r}" if identity else "client address"
    origin = (
        f"{name} holds requests from {first} to {last} UTC, from "
        f"{trace['identity'].nunique():,} clients counted by {who}."
    )
    kinds = "" if not problems.skipped else ", each skipped and counted by reason above"
    return name, origin, kinds


def overview(trace: pd.DataFrame, problems: accesslog.Problems) -> pd.Series:
    """What the log holds: lines, requests, identities, bad lines, first and last time."""
    start, end = float(trace["time"].min()), float(trace["time"].max())
    return pd.Series(
        {
            "lines read": f"{problems.lines:,}",
            "requests": f"{len(trace):,}",
            "identities": f"{trace['identity'].nunique():,}",
            "bad lines (skipped)": f"{problems.skipped:,}",
            "out of order beyond the reorder window": f"{problems.late:,}",
            "total cost": f"{int(trace['cost'].sum()):,}",
            "first request (UTC)": pd.Timestamp(start, unit="s").strftime("%Y-%m-%d %H:%M:%S"),
            "last request (UTC)": pd.Timestamp(end, unit="s").strftime("%Y-%m-%d %H:%M:%S"),
        },
        name="the log",
    )


def demand(trace: pd.DataFrame, window_s: float) -> pd.DataFrame:
    """Per identity, what it asks for: `requests`, `cost` (their total), `peak` (the most
    cost it sent in any rolling window (t - W, t], the demand a limit is compared
    with), and `mean` (its cost per window averaged over the whole log). Sorted by
    peak, busiest first."""
    window_s = validation.positive("window_s", window_s)
    if trace.empty:
        raise ValueError("the trace holds no requests")
    asked = trace.assign(allowed=True)  # every request counted: demand, not admissions
    table = metrics.per_identity(asked, window_seconds=window_s)
    span_s = max(float(trace["time"].max() - trace["time"].min()), window_s)
    out = pd.DataFrame(
        {
            "requests": table["requests"],
            "cost": table["admitted_cost"],
            "peak": table["max_admitted_in_window"],
            "mean": table["admitted_cost"] * window_s / span_s,
        }
    )
    return out.sort_values(["peak", "requests"], ascending=False, kind="stable")


def demand_figure(table: pd.DataFrame, limits: Sequence[int], window_s: float) -> Figure:
    """Left: the share of identities whose peak per window reaches x (each candidate
    limit marked). Right: the share of all requests sent by the busiest identities."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    peaks = np.sort(table["peak"].to_numpy())
    share = 1.0 - np.arange(len(peaks)) / len(peaks)  # share with a peak >= peaks[i]
    left.step(peaks, share, where="post", color="black")
    for limit in limits:
        above = float((peaks > limit).mean())
        left.axvline(limit, color="tab:red", alpha=0.4, linestyle="--")
        left.text(
            limit,
            0.03,
            f" {limit}: {above:.1%} above",
            transform=left.get_xaxis_transform(),  # x in data, y in axes fractions
            fontsize=8,
            rotation=90,
            va="bottom",
            ha="right",
            color="tab:red",
        )
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel(f"peak cost in one rolling {window_s:g} s window")
    left.set_ylabel("share of identities with at least that peak")
    left.set_title("How fast each identity sends")
    by_size = np.sort(table["requests"].to_numpy())[::-1]
    top = np.arange(1, len(by_size) + 1) / len(by_size)
    right.plot(top, np.cumsum(by_size) / by_size.sum(), color="black")
    right.set_xscale("log")
    right.set_xlabel("busiest share of identities")
    right.set_ylabel("share of all requests")
    right.set_title("Who sends the traffic")
    right.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def near_cache(replayed: pd.DataFrame) -> dict[str, Any]:
    """What the rejection near-cache (`near_cache=True`) would answer without Redis on
    a replayed log (a log or fixed-window replay, where the cache is exact): after
    Redis rejects an identity at cost c with retry T, every further request of that
    identity at cost c before T has passed is answered locally; an admission or a
    different cost goes to Redis. Returns the requests, the Redis calls left and the
    share saved."""
    needed = ["time", "identity", "cost", "allowed", "retry_after_ms"]
    missing = [c for c in needed if c not in replayed.columns]
    if missing:
        raise ValueError(f"replayed is missing column(s) {missing}")
    ms = seconds_to_ms(replayed["time"].to_numpy())
    order = np.lexsort((ms, pd.factorize(replayed["identity"])[0]))
    who = replayed["identity"].to_numpy()[order]
    t, cost = ms[order], replayed["cost"].to_numpy()[order]
    allowed, retry = (
        replayed["allowed"].to_numpy()[order],
        replayed["retry_after_ms"].to_numpy()[order],
    )
    saved = 0
    current, until, cached_cost = None, None, None
    for i in range(len(t)):
        if who[i] != current:
            current, until, cached_cost = who[i], None, None
        if until is not None and cost[i] == cached_cost and t[i] < until:
            if allowed[i]:  # the cache is exact: Redis cannot have admitted this one
                raise ValueError(
                    "a request the cache would reject was admitted: not an exact replay"
                )
            saved += 1
            continue
        until, cached_cost = (None, None) if allowed[i] else (t[i] + int(retry[i]), cost[i])
    requests = len(t)
    return {
        "requests": requests,
        "redis_calls": requests - saved,
        "saved": saved,
        "saved_share": saved / requests if requests else 0.0,
    }


def batching(peak_checks_per_s: float, batch_ms: float, growth: Sequence[float]) -> pd.DataFrame:
    """Round trips per second at the peak if one process gathered the checks that start
    within the same `batch_ms` into one `check_many` call, for the peak rate times each
    `growth`.

    A model, not a replay: access logs stamp whole seconds, too coarse to see which
    requests arrive within a millisecond of each other, so arrivals within the peak
    second are taken as Poisson. A slot of `batch_ms` then holds at least one check with
    probability 1 - exp(-rate * batch_ms / 1000), and each such slot is one round trip.
    """
    rate = validation.non_negative("peak_checks_per_s", peak_checks_per_s)
    batch = validation.positive("batch_ms", batch_ms)
    rows = []
    for g in growth:
        checks = rate * validation.positive("growth", g)
        slots = 1000.0 / batch
        trips = slots * -np.expm1(-checks / slots)
        rows.append(
            {
                "growth": g,
                "checks/s at the peak": checks,
                "round trips/s with check_many": trips,
                "round trips saved": 1 - trips / checks if checks else 0.0,
            }
        )
    return pd.DataFrame(rows).set_index("growth")


def split_networks(
    log: str | Path,
    limit_text: str,
    *,
    format: str | None = None,
    address: str = "host",
    cost: Any = None,
) -> pd.DataFrame:
    """What counting every IPv6 address on its own (`ipv6_prefix=128`) rather than per
    /64 changes under the sliding log at `limit_text`: one row per /64 network (an IPv4
    client as itself) whose rejected requests differ, with its addresses seen and the
    requests rejected each way; `escaped` is how many more get through per address.
    Counted from per-request decisions (the Python model's compiled replay), not from
    the planner, so the chapter can hold the planner's totals against it."""
    limit, window_s = planner.parse_limit(limit_text)
    rejected = {}
    for prefix in (64, 128):
        trace, _ = load(log, format=format, identity=address, cost=cost, ipv6_prefix=prefix)
        model = reference.SlidingWindowLimiter(limit=limit, window_ms=round(window_s * 1000))
        decided = replay(trace, model, progress=False)
        network = decided["identity"].map(_network)
        by = decided.assign(network=network, refused=~decided["allowed"])
        rejected[prefix] = by.groupby("network").agg(
            addresses=("identity", "nunique"), rejected=("refused", "sum")
        )
    table = pd.DataFrame(
        {
            "addresses": rejected[128]["addresses"],
            "rejected per /64": rejected[64]["rejected"],
            "rejected per address": rejected[128]["rejected"],
        }
    ).fillna(0)
    table = table.astype("int64")
    table["escaped"] = table["rejected per /64"] - table["rejected per address"]
    table.index.name = "client (/64 network or IPv4 address)"
    return table[table["escaped"] != 0].sort_values("escaped", ascending=False)


def _network(who: str) -> str:
    """The /64 network an identity of `split_networks` belongs to: a /64 identity is one
    already, an address maps to its own, and a host name (logged instead of an address)
    stays a client of its own."""
    if "/" in who:
        return who
    try:
        return address_identity(who)
    except ValueError:
        return who


# ---------------------------------------------------------------- the sweep and the plan


def sweep_table(plan: planner.LogPlan) -> pd.DataFrame:
    """One row per candidate limit and algorithm: the share of requests rejected, the
    share of identities rejected at least once, and the peak admitted to one identity
    in one rolling window against the limit."""
    rows = [
        {
            "limit": c.limit_text,
            "per window": c.limit,
            "algorithm": c.algorithm,
            "rejected": c.rejected,
            "rejected share": c.rejected / c.requests if c.requests else 0.0,
            "identities rejected": c.identities_rejected,
            "identities share": c.identities_rejected / c.identities if c.identities else 0.0,
            "peak admitted / limit": c.peak_admitted / c.limit,
            "refused (cost > limit)": c.refused,
        }
        for c in plan.candidates
    ]
    return pd.DataFrame(rows)


def recommendation_table(plan: planner.LogPlan) -> pd.DataFrame:
    """One row per window and algorithm planned: the spread of per-client peaks (each
    client's most requested cost in one rolling window) and the smallest limit that
    affects at most the plan's share of clients, with what it rejects."""
    return _recommended([r.to_dict() for r in plan.recommended])


def _recommended(documents: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """`recommendation_table` from the JSON's `recommended` entries."""
    rows = [
        {
            "window": f"{r['window_s']:g} s",
            "algorithm": r["algorithm"],
            **{f"peak {k.replace('_', '.')}": v for k, v in r["peaks"].items()},
            "limit": r["limit_text"],
            "clients affected": r["identities_affected"],
            "clients share": r["identities_affected_share"],
            "requests rejected": r["rejected_share"],
        }
        for r in documents
    ]
    return pd.DataFrame(rows)


def peaks_figure(plan: planner.LogPlan) -> Figure:
    """The spread of per-client peaks per window, each algorithm's recommended limit
    marked (`planner.plots.peaks_figure`)."""
    from ratelimit.lab.planner.plots import peaks_figure as drawn

    return drawn(plan)


EXAMPLE_ROUTES = ("/v1/tiles/*=100/min,name=tiles", "/v1/geofence/*=10/min,name=geofence")
"""The demo service's two routes (`ratelimit.demo`), each with its own limit per minute (the
example log is paced per minute), as `--route` takes them."""


def routes_for(trace: pd.DataFrame, example: bool, limit_text: str, busiest: int = 2) -> list[str]:
    """The routes to plan: the demo's for the example log; for another log, its
    `busiest` first path segments (`/SEGMENT/*`, by requests), each at `limit_text`."""
    if example:
        return list(EXAMPLE_ROUTES)
    first = trace["path"].str.split("?").str[0].str.split("/").str[1]
    top = first[first != ""].value_counts().head(busiest).index
    return [f"/{segment}/*={limit_text},name={segment}" for segment in top]


def route_table(routed: Any) -> pd.DataFrame:
    """One row per route and algorithm of a `planner.routes.RoutePlan`, and one for the
    requests no route matched: the columns a reader compares."""
    frame = routed.frame()
    shown = ["route", "pattern", "rate", "algorithm", "route_requests", "rejected",
             "rejected_share", "identities", "identities_rejected"]  # fmt: skip
    return frame[[c for c in shown if c in frame.columns]]


REAL_LOG_DIR = Path("data") / "real_log"
"""Where `tools/real_log.py` keeps its plans of a real log (from the notebooks' folder)."""


def real_log(directory: str | Path = REAL_LOG_DIR) -> dict[str, Any]:
    """The kept plans of a real log, as `tools/real_log.py` wrote them: `source` (where
    the log came from, its hash and the commands), `plan` (`plan --json` at one limit,
    with the recommendation) and `routes` (the per-route plan)."""
    folder = Path(directory)
    return {
        name: json.loads((folder / f"{name}.json").read_text())
        for name in ("source", "plan", "routes")
    }


def real_log_tables(kept: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """`real_log`'s documents as the chapter's tables: `candidates` (each algorithm at
    the limit), `recommended` (as `recommendation_table` shows a plan's) and
    `routes` (per route and algorithm, and the requests no route matched)."""
    plan, routed = kept["plan"], kept["routes"]
    candidates = pd.DataFrame(
        {"algorithm": c["label"], "limit": c["limit_text"], "rejected": c["rejected"],
         "rejected share": c["rejected_share"], "clients rejected": c["identities_rejected"],
         "peak admitted / limit": c["peak_admitted_ratio"]}
        for c in plan["candidates"]
    )  # fmt: skip
    recommended = _recommended(plan["recommended"])
    rows = [
        {"route": r["name"], "pattern": r["pattern"], "rate": r["rate"],
         "requests": r["requests"], "algorithm": c["label"], "rejected": c["rejected"],
         "rejected share": c["rejected_share"], "clients rejected": c["identities_rejected"]}
        for r in routed["routes"] for c in r["candidates"]
    ]  # fmt: skip
    rows.append({"route": "(no route)", "requests": routed["unplanned"]["requests"]})
    return {"candidates": candidates, "recommended": recommended, "routes": pd.DataFrame(rows)}


def finer_sweep(
    trace: pd.DataFrame,
    sweep: pd.DataFrame,
    plan: planner.LogPlan,
    *,
    share: float = 0.01,
    algorithm: str = "log",
    points: int = 7,
) -> pd.DataFrame:
    """The sweep again for `algorithm`, on `points` limits from the candidate below the
    first that rejects less than `share` of the requests up to that one (from 1 when it
    is the smallest): where between them the share drops below `share`. Empty when no
    candidate rejects less than `share`."""
    rows = sweep[sweep["algorithm"] == algorithm]
    under = rows[rows["rejected share"] < share]
    if under.empty:
        return sweep.iloc[:0]
    first = under.loc[under["per window"].idxmin()]
    below = rows[rows["per window"] < first["per window"]]["per window"]
    low = int(below.max()) if len(below) else 1
    per = first["limit"].split("/", 1)[1]
    limits = np.unique(np.linspace(low, int(first["per window"]), points).round().astype(int))
    finer = planner.plan_trace(trace, [f"{n}/{per}" for n in limits], [algorithm],
                               server_time=plan.server_time)  # fmt: skip
    return sweep_table(finer)


def sweep_figure(table: pd.DataFrame) -> Figure:
    """Share of requests (left) and of identities (right) rejected, per candidate
    limit, one line per algorithm."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for name, rows in table.groupby("algorithm", sort=False):
        rows = rows.sort_values("per window")
        label = algorithms.get(name).label
        for ax, column in zip(axes, ("rejected share", "identities share"), strict=True):
            ax.plot(
                rows["per window"], 100 * rows[column], marker="o", label=label, color=COLORS[name]
            )
    limits = sorted(table["per window"].unique())
    for ax, what in zip(axes, ("requests", "identities rejected at least once"), strict=True):
        ax.set_xscale("log")
        ax.set_xticks(limits, [f"{x:g}" for x in limits])
        ax.minorticks_off()
        ax.set_xlabel(f"candidate limit (per {_window_text(table)})")
        ax.set_ylabel(f"% of {what}")
        ax.grid(alpha=0.3)
    axes[0].set_title("Requests rejected")
    axes[1].set_title("Identities hurt")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def _window_text(table: pd.DataFrame) -> str:
    texts = table["limit"].str.split("/", n=1).str[1].unique()
    return texts[0] if len(texts) == 1 else "window"


def redis_table(plan: planner.LogPlan, limit_text: str) -> pd.DataFrame:
    """The Redis plan of each algorithm (a column) at candidate `limit_text`: keys alive
    at once, memory, checks per second at the peak, server time per check and shards."""
    rows = {}
    for c in plan.candidates:
        if c.limit_text != limit_text or c.redis is None:
            continue
        r = c.redis
        rows[c.label] = {
            "keys alive at once": r.keys,
            "bytes per key": round(r.bytes_per_key, 1),
            "memory": format_bytes(r.memory_bytes),
            "checks/s at the peak": r.peak_checks_per_s,
            "checks/s on average": round(r.mean_checks_per_s, 1),
            "us per check": None if r.us_per_check is None else round(r.us_per_check, 1),
            "Redis CPU (cores)": None if r.redis_cpu_cores is None else r.redis_cpu_cores,
            "shards for memory": r.shards_for_memory,
            "shards for checks": r.shards_for_checks,
            "shards": r.shards,
        }
    if not rows:
        raise ValueError(f"the plan has no candidate {limit_text!r} that reaches Redis")
    return pd.DataFrame(rows)


def _planned(plan: planner.LogPlan, limit_text: str) -> list[planner.CandidatePlan]:
    """The candidates at `limit_text` that reach Redis with a server time to plan with."""
    found = [
        c
        for c in plan.candidates
        if c.limit_text == limit_text and c.redis is not None and c.redis.us_per_check is not None
    ]
    if not found:
        raise ValueError(f"no candidate {limit_text!r} has a server time per check to plan with")
    return found


def _fleet(
    candidate: planner.CandidatePlan, growth: float, shard: dict[str, Any]
) -> capacity.CapacityPlan:
    """`candidate`'s Redis plan at `growth` times this log's traffic: as many more
    identities, each sending as it does here (keys, memory and peak checks all scale)."""
    r = candidate.redis
    assert r is not None and r.us_per_check is not None
    keys = max(1, round(r.keys * growth))
    return capacity.plan_fleet(
        candidate.algorithm,
        active_keys=keys,
        rate_per_key=r.peak_checks_per_s * growth / keys,
        bytes_per_key=r.bytes_per_key - shard["key_overhead_bytes"],
        us_per_check=r.us_per_check,
        **shard,
    )


def sensitivity(
    plan: planner.LogPlan, limit_text: str, growth: Sequence[float] = GROWTH
) -> pd.DataFrame:
    """Shards each algorithm needs at `limit_text` if the traffic were `growth` times
    this log's: as many more identities, each sending as it does here (keys, memory and
    peak checks all scale), on the plan's shard and server time. One row per growth."""
    shard = plan.shard.plan_options()
    rows = []
    for c in _planned(plan, limit_text):
        for g in growth:
            fleet = _fleet(c, g, shard)
            rows.append(
                {
                    "algorithm": c.algorithm,
                    "growth": g,
                    "keys": fleet.active_keys,
                    "memory_bytes": fleet.memory_bytes,
                    "checks_per_s": fleet.checks_per_s,
                    "shards_for_memory": fleet.shards_for_memory,
                    "shards_for_checks": fleet.shards_for_checks,
                    "shards": fleet.shards,
                }
            )
    return pd.DataFrame(rows)


def shard_crossings(
    plan: planner.LogPlan, limit_text: str, shards: int = 2, rel_tol: float = 1e-9
) -> pd.DataFrame:
    """Per algorithm at `limit_text`, the least growth of this log's traffic (as in
    `sensitivity`) at which it needs `shards` shards, found by bisection to `rel_tol`
    (the shards only grow with the traffic), and what needs them: its checks or its
    memory. One row per algorithm, the earliest first."""
    shards = validation.count("shards", shards, minimum=2)
    rel_tol = validation.positive("rel_tol", rel_tol)
    shard = plan.shard.plan_options()
    rows = []
    for c in _planned(plan, limit_text):
        low, high = 1.0, 2.0
        if _fleet(c, low, shard).shards >= shards:
            raise ValueError(f"{c.algorithm} needs {shards} shards at this log's traffic already")
        while _fleet(c, high, shard).shards < shards:
            low, high = high, high * 2
        while high / low > 1 + rel_tol:  # low: fewer shards, high: enough
            middle = math.sqrt(low * high)
            if _fleet(c, middle, shard).shards >= shards:
                high = middle
            else:
                low = middle
        fleet = _fleet(c, high, shard)
        rows.append(
            {
                "algorithm": c.algorithm,
                "label": c.label,
                "growth": high,
                "needed for": "checks" if fleet.shards_for_checks >= shards else "memory",
                "peak checks/s then": fleet.checks_per_s,
                "one shard's checks/s": fleet.shard_checks_per_s,
                "memory then": format_bytes(fleet.memory_bytes),
            }
        )
    return pd.DataFrame(rows).sort_values("growth", kind="stable").set_index("algorithm")


def what_fills(crossings: pd.DataFrame) -> str:
    """A clause for the chapter: what each algorithm of `shard_crossings` runs out of
    first, and the memory of the earliest at that point."""
    needs = crossings["needed for"]
    if needs.nunique() == 1:
        what = f"here every one of them runs out of {needs.iloc[0]} first"
    else:
        groups = crossings.groupby("needed for", sort=False)["label"].agg(", ".join)
        what = "here " + " and ".join(f"the {labels} run out of {need} first"
                                      for need, labels in groups.items())  # fmt: skip
    first = crossings.iloc[0]
    return f"{what}; the {first['label']}'s keys then hold {first['memory then']}"


def first_growth_needing(table: pd.DataFrame, shards: int) -> pd.Series:
    """Per algorithm, the smallest growth of `sensitivity` at which it needs at least
    `shards` shards (NaN if none in the table): the table's grid point, not the exact
    crossing (`shard_crossings`)."""
    over = table[table["shards"] >= shards]
    found = over.groupby("algorithm", sort=False)["growth"].min()
    return found.reindex(table["algorithm"].unique())


def sensitivity_figure(table: pd.DataFrame, limit_text: str) -> Figure:
    """Shards against traffic growth, one line per algorithm (left); memory and checks
    per second against growth (right), to show which of the two decides."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, rows in table.groupby("algorithm", sort=False):
        label = algorithms.get(name).label
        left.step(rows["growth"], rows["shards"], where="post", label=label, color=COLORS[name])
        right.plot(rows["growth"], rows["memory_bytes"] / 2**30, color=COLORS[name], label=label)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("traffic as a multiple of this log's")
    left.set_ylabel("Redis shards")
    left.set_title(f"Shards at {limit_text}")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("traffic as a multiple of this log's")
    right.set_ylabel("memory (GiB)")
    right.set_title("Memory of all keys")
    right.grid(alpha=0.3)
    fig.tight_layout()
    return fig
