"""Chapter 6: how much Redis a fleet needs, from one traffic scenario and a measured
server time per check, for the sliding log as it ships (compact), the sorted-set log
beside it, and the three O(1) algorithms.

    from ratelimit.lab.chapters import capacity_planning as planning
    server = planning.bench_server_time()                  # what `make bench` recorded
    fleets = planning.scenarios(10**6, 0.05, 1_000, 3_600)  # steady state, every key full
    plans = planning.plans(table, fleets, 1_000, 3_600, server, planning.Shard())
    planning.plan_table(plans)
    planning.figure()                                       # the chapter's figure

A scenario (`capacity.Scenario`: keys, per-key rates, peak factor) is the one traffic
assumption both the memory and the operations come from: a sliding-log key holds what
that traffic puts in one window, and the same traffic makes the checks. Server time per
check is never typed in: it is what the latest `make bench` recorded
(`bench/record.json`), or what `capacity.measure_server_time` measures on the reader's
Redis. Bytes per key come from chapter 3's stored table: the compact log's rows for
"logc" (`SlidingWindowLimiter`'s default, `storage="compact"`), the sorted set's for
"log". Paths are relative to the notebooks' folder. `TITLE`, `SUMMARY` and `HEADLINE`
are the README's texts for the chapter, filled from its records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ratelimit import algorithms

from .. import capacity, memory
from ..capacity import Shard
from ..memory import format_bytes
from ..plotting import COLORS, parameters_of

if TYPE_CHECKING:
    import matplotlib.figure

__all__ = [
    "BENCH_RECORD",
    "FULL",
    "HEADLINE",
    "KEYS_AXIS",
    "LABELS",
    "PLANNED",
    "POLICY_SWEEP",
    "STEADY",
    "SUMMARY",
    "TITLE",
    "Fleet",
    "Shard",
    "bench_server_time",
    "describe",
    "expected_legends",
    "findings",
    "inputs",
    "key_bytes",
    "legends",
    "measure_and_replan",
    "figure",
    "plan_table",
    "plans",
    "policy_sweep",
    "scenarios",
    "shards_by_algorithm",
    "shards_label",
    "span",
    "stored_table",
    "summary",
    "sweep_column",
]

TITLE = "Capacity planning"
SUMMARY = (
    "Redis memory, checks per second and shards for {cap_keys} keys under {cap_policy}, "
    "from one traffic scenario and the server time per check `make bench` measured, for "
    "the sliding log as it ships (compact, {us_logc} us a check) with the sorted-set log "
    "({us_log} us) beside it: every key full, {full_logc_shards} shards for the compact log "
    "against {full_log_shards} in a sorted set and {full_o1_shards} for the O(1) algorithms; "
    "the same fleet under four policies"
)
HEADLINE = (
    "{cap_keys} keys under {cap_policy}, planned from one traffic scenario with the Redis "
    "time per check the latest `make bench` measured ({bench_date}: {us_logc} us for the "
    "sliding log as it ships, compact; {us_log} us in a sorted set; {us_o1} us for the "
    "others). Steady state, every key at {steady_per_minute} requests a minute "
    "({steady_checks} checks/s): {steady_logc_shards} shards of {shard_gib} GiB for the "
    "compact log, {steady_log_shards} in a sorted set, {steady_o1_shards} for the fixed "
    "window, counter or GCRA. Every key full, each sending its whole budget ({full_checks} "
    "checks/s): {full_logc_shards} for the compact log ({full_logc_memory}, sized by "
    "{full_logc_bound}), {full_log_shards} in a sorted set (its {full_log_memory} alone "
    "would need {full_log_memory_shards}), {full_o1_shards} for the others."
)

PLANNED: tuple[str, ...] = (algorithms.COMPACT_LOG.name, *algorithms.NAMES)
"""The algorithms the chapter plans: the sliding log as `SlidingWindowLimiter` ships it
(compact), the seed's sorted-set log, then the O(1) algorithms."""
LABELS: Mapping[str, str] = {
    **{a: algorithms.get(a).label for a in PLANNED},
    "log": "sliding log (sorted set)",
}
"""How the chapter names each planned algorithm: the two logs by their storage."""
# Chapter 3's table keeps both logs under "log", told apart by their member format.
_TABLE_ROWS: Mapping[str, tuple[str, str]] = {"logc": ("log", "compact"), "log": ("log", "script")}
_LOGS = ("logc", "log")
BENCH_RECORD = "../bench/record.json"
"""The record the latest `make bench` wrote, relative to the notebooks' folder."""
STEADY, FULL = "steady state", "every key full"
POLICY_SWEEP: Mapping[str, tuple[int, int]] = {
    "10 per second": (10, 1),
    "100 per minute": (100, 60),
    "1,000 per hour": (1_000, 3_600),
    "10,000 per day": (10_000, 86_400),
}
"""Policies swept at a fixed fleet: name -> (limit, window in seconds)."""
# The figure's x axis: 121 fleet sizes, log-spaced from 10**3 to 10**8.
KEYS_AXIS = np.unique(np.geomspace(1e3, 1e8, 121).round().astype(int))


@lru_cache(maxsize=4)
def bench_server_time(path: str | Path = BENCH_RECORD) -> capacity.ServerTime:
    """Server time per check of every `PLANNED` algorithm from the record of the latest
    `make bench` (read once)."""
    return capacity.server_time_from_bench(path, PLANNED)


def bytes_per_key(
    table: pd.DataFrame, algorithm: str, scenario: capacity.Scenario, limit: int, window_s: float
) -> float:
    """`MEMORY USAGE` of one key of `algorithm` at `scenario`'s peak, from chapter 3's
    `table` (the compact log's rows for "logc", the sorted set's for "log")."""
    name, member_format = _TABLE_ROWS.get(algorithm, (algorithm, "script"))
    return capacity.scenario_bytes_per_key(
        table, name, scenario, limit, window_s, member_format=member_format
    )


def key_bytes(table: pd.DataFrame, limits: Iterable[int] = (10, 1_000, 10_000)) -> pd.DataFrame:
    """Bytes of one full key of every `PLANNED` algorithm (rows) at each of `limits`."""
    full = {n: capacity.Scenario.every_key_full("full", 1, n, 1) for n in limits}
    return (
        pd.DataFrame(
            {
                f"limit {n:,}": [bytes_per_key(table, a, s, n, 1) for a in PLANNED]
                for n, s in full.items()
            },
            index=pd.Index([LABELS[a] for a in PLANNED], name="bytes per full key"),
        )
        .round()
        .astype(int)
    )


def scenarios(
    active_keys: float,
    rate_per_key: float,
    limit: float,
    window_s: float,
    peak_factor: float = 1.0,
) -> dict[str, capacity.Scenario]:
    """The two scenarios the chapter plans for, by name: the steady state (every key at
    `rate_per_key` mean, times `peak_factor`) and every key full (every key at the
    least rate that fills its log, `limit` per `window_s`)."""
    keys, whole_limit = int(round(active_keys)), int(round(limit))
    return {
        STEADY: capacity.Scenario.uniform(STEADY, keys, rate_per_key, peak_factor),
        FULL: capacity.Scenario.every_key_full(FULL, keys, whole_limit, window_s),
    }


def inputs(
    server_time: capacity.ServerTime,
    named: Mapping[str, capacity.Scenario],
    limit: int,
    window_s: float,
) -> str:
    """What the plans start from, in lines: the server time per check and its source,
    then each scenario (`describe`)."""
    us = ", ".join(f"{LABELS[a]} {u:.1f} us" for a, u in server_time.us_per_check.items())
    lines = [f"Server time per check, from {server_time.source}:", f"  {us}"]
    return "\n".join([*lines, *(describe(s, limit, window_s) for s in named.values())])


def describe(scenario: capacity.Scenario, limit: int, window_s: float) -> str:
    """One line: the scenario's keys, rates, peak, checks and log members."""
    classes = ", ".join(
        f"{share:.0%} at {rate:.4g}/s ({rate * 60:,.3g} a minute, {rate * 3_600:,.0f} an hour)"
        for share, rate in scenario.rates
    )
    return (
        f"{scenario.name}: {scenario.active_keys:,} keys, {classes}, peak x{scenario.peak_factor:g}"
        f" -> {scenario.checks_per_second():,.0f} checks/s, a log key holds "
        f"{scenario.mean_log_members(limit, window_s):,.0f} of {limit:,} members"
    )


def plans(
    table: pd.DataFrame,
    named: Mapping[str, capacity.Scenario] | Iterable[capacity.Scenario],
    limit: int,
    window_s: float,
    server_time: capacity.ServerTime,
    shard: Shard = capacity.DEFAULT_SHARD,
) -> dict[tuple[str, str], capacity.CapacityPlan]:
    """A plan per scenario and `PLANNED` algorithm: {(scenario name, tag): CapacityPlan}."""
    listed = named.values() if isinstance(named, Mapping) else named
    whole = int(round(limit))
    return {
        (scenario.name, a): capacity.plan_fleet(
            a,
            active_keys=scenario.active_keys,
            rate_per_key=scenario.peak_rate_per_key,
            bytes_per_key=bytes_per_key(table, a, scenario, whole, window_s),
            us_per_check=server_time.us_per_check[a],
            **shard.plan_options(),
        )
        for scenario in listed
        for a in PLANNED
    }


def plan_table(planned: Mapping[tuple[str, str], capacity.CapacityPlan]) -> pd.DataFrame:
    """Memory, checks, Redis time and shards per scenario and algorithm."""
    rows = []
    for (scenario, a), p in planned.items():
        rows.append(
            {
                "scenario": scenario,
                "algorithm": LABELS[a],
                "bytes per key": round(p.bytes_per_key),
                "memory": format_bytes(p.memory_bytes),
                "checks/s": round(p.checks_per_s),
                "Redis time (cores)": round(p.redis_cpu_cores, 2),
                "checks/s one shard serves": round(p.shard_checks_per_s),
                "shards for memory": p.shards_for_memory,
                "shards for checks": p.shards_for_checks,
                "shards": p.shards,
            }
        )
    return pd.DataFrame(rows).set_index(["scenario", "algorithm"])


def shards_by_algorithm(
    planned: Mapping[tuple[str, str], capacity.CapacityPlan], scenario: str
) -> dict[str, int]:
    """{tag: shards} of one scenario's plans."""
    return {a: p.shards for (name, a), p in planned.items() if name == scenario}


def shards_label(algorithm: str, shards: int) -> str:
    """The figure's legend entry for one line: the algorithm and its shards at the
    marked fleet size."""
    return f"{LABELS[algorithm]}: {shards:,} shard{'s' if shards > 1 else ''}"


def expected_legends(
    planned: Mapping[tuple[str, str], capacity.CapacityPlan], named: Iterable[str]
) -> list[list[str]]:
    """The legend each panel of `figure` should show for these plans, one list per
    scenario name in `named`."""
    return [[shards_label(a, n) for a, n in shards_by_algorithm(planned, s).items()] for s in named]


def legends(fig: matplotlib.figure.Figure) -> list[list[str]]:
    """What each panel of a figure lists in its legend (lines labelled `_...` are
    matplotlib's unlabelled ones, left out)."""
    return [
        [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
        for ax in fig.axes
    ]


def span(values: Iterable[float], fmt: str = ",") -> str:
    """ "a-b" from the smallest to the largest of `values`, or "a" when they agree."""
    low, high = format(min(values), fmt), format(max(values), fmt)
    return low if low == high else f"{low}-{high}"


Finding = tuple[str, Any, str, str]  # (record name, value, format, what it is)
_O1 = tuple(a.name for a in algorithms.ALGORITHMS if not a.state_per_unit)


def findings(
    planned: Mapping[tuple[str, str], capacity.CapacityPlan],
    named: Mapping[str, capacity.Scenario],
    server_time: capacity.ServerTime,
    limit: int,
    window_s: float,
    shard: Shard = capacity.DEFAULT_SHARD,
) -> list[Finding]:
    """The numbers the chapter and the README quote, from the plans of the two scenarios
    (`scenarios`): (record name, value, format, what), in the order they are quoted.
    "logc" names the compact log, "log" the sorted set."""
    steady, full = named[STEADY], named[FULL]
    shards = {name: shards_by_algorithm(planned, name) for name in (STEADY, FULL)}
    per = "hour" if window_s == 3_600 else f"{window_s:,} s"
    us = server_time.us_per_check
    found: list[Finding] = [
        ("cap_keys", steady.active_keys, ",", "active keys of the chapter's plans"),
        ("cap_policy", f"{int(limit):,} per {per}", "", "the chapter's policy"),
        ("bench_date", server_time.date, "", "the make bench run whose server time is used"),
        ("us_logc", us["logc"], ".1f", "server time per check, compact log, us"),
        ("us_log", us["log"], ".1f", "server time per check, sorted-set log, us"),
        ("us_o1", span([us[a] for a in _O1], ".1f"), "", "server time per check, O(1), us"),
        ("shard_gib", shard.memory_gib, "g", "data memory of one shard, GiB"),
        ("steady_per_minute", steady.peak_rate_per_key * 60, "g", "steady: requests a minute"),
        ("steady_checks", steady.checks_per_second(), ",.0f", "steady: checks per second"),
        ("full_checks", full.checks_per_second(), ",.0f", "every key full: checks per second"),
        ("full_check_ratio", full.checks_per_second() / steady.checks_per_second(), ".1f",
         "every key full over steady: checks"),
    ]  # fmt: skip
    for name, scenario in [("steady", STEADY), ("full", FULL)]:
        found.append(
            (f"{name}_o1_shards", span([shards[scenario][a] for a in _O1]), "",
             f"{scenario}: shards, O(1) algorithms")
        )  # fmt: skip
        for a in _LOGS:
            plan = planned[(scenario, a)]
            what = f"{scenario}, {LABELS[a]}"
            found += [
                (f"{name}_{a}_shards", plan.shards, "d", f"{what}: shards"),
                (f"{name}_{a}_memory", format_bytes(plan.memory_bytes), "", f"{what}: memory"),
                (f"{name}_{a}_memory_shards", plan.shards_for_memory, "d",
                 f"{what}: shards for memory"),
                (f"{name}_{a}_check_shards", plan.shards_for_checks, "d",
                 f"{what}: shards for checks"),
                (f"{name}_{a}_bound", _bound(plan), "", f"{what}: what sizes it"),
            ]  # fmt: skip
    for a in _LOGS:
        grown = planned[(FULL, a)].memory_bytes / planned[(STEADY, a)].memory_bytes
        found.append((f"{a}_memory_growth", grown, ".1f", f"{LABELS[a]}: memory, full over steady"))
    return found


def _bound(plan: capacity.CapacityPlan) -> str:
    """What decides a plan's shards: "its checks", "its memory", or both alike."""
    if plan.shards_for_checks == plan.shards_for_memory:
        return "checks and memory alike"
    return "its checks" if plan.shards_for_checks > plan.shards_for_memory else "its memory"


def summary(found: Iterable[Finding]) -> str:
    """Two lines from `findings`: shards per scenario, for both logs and the others."""
    q = {name: format(value, fmt) for name, value, fmt, _ in found}
    return (
        f"Steady state ({q['steady_checks']} checks/s): {q['steady_logc_shards']} shards for the "
        f"compact log, {q['steady_log_shards']} in a sorted set, {q['steady_o1_shards']} for "
        "the others.\n"
        f"Every key full ({q['full_checks']} checks/s): {q['full_logc_shards']} for the compact "
        f"log ({q['full_logc_memory']}, sized by {q['full_logc_bound']}), "
        f"{q['full_log_shards']} in a sorted set ({q['full_log_memory']}, "
        f"{q['full_log_memory_shards']} shards for its memory, {q['full_log_check_shards']} for "
        f"its checks), {q['full_o1_shards']} for the others."
    )


def measure_and_replan(
    table: pd.DataFrame,
    named: Mapping[str, capacity.Scenario],
    limit: int,
    window_s: float,
    shard: Shard,
    planned: Mapping[tuple[str, str], capacity.CapacityPlan],
    checks: int = 2_000,
) -> str:
    """Measure the server time per check on the reader's Redis (`backend.choose()`:
    REDIS_URL, else a private redis-server; never the embedded fake), plan `named`
    again with it, and say, per scenario and algorithm, the shards with it and (in
    brackets) with `planned`'s figures."""
    from .. import backend

    with backend.choose() as target:
        if not target.real:
            return "No real Redis here: the plans keep the server time `make bench` recorded."
        client = target.sync_client(socket_timeout=30)
        try:
            measured = capacity.measure_server_time(
                client, PLANNED, checks=checks, where=target.description
            )
        finally:
            client.close()
    again = plans(table, named, limit, window_s, measured, shard)
    lines = [
        f"Server time per check, {measured.source}:",
        "  " + ", ".join(f"{LABELS[a]} {us:.1f} us" for a, us in measured.us_per_check.items()),
        "Shards with these figures (in brackets, with the figures of the plans above):",
    ]
    for name in named:
        mine, before = shards_by_algorithm(again, name), shards_by_algorithm(planned, name)
        shown = ", ".join(f"{LABELS[a]} {mine[a]} ({before[a]})" for a in mine)
        lines.append(f"  {name}: {shown}")
    return "\n".join(lines)


# The policy sweep's column names, short enough for a table eight columns wide.
_SHORT: Mapping[str, str] = {"logc": "compact log", "log": "sorted-set log", "swc": "counter"}


def sweep_column(scenario: str, algorithm: str) -> str:
    """The `policy_sweep` column of one scenario's shards for "logc", "log" or "swc"."""
    return f"{scenario}: {_SHORT[algorithm]} shards"


def policy_sweep(
    table: pd.DataFrame,
    active_keys: int,
    rate_per_key: float,
    server_time: capacity.ServerTime,
    shard: Shard = capacity.DEFAULT_SHARD,
    policies: Mapping[str, tuple[int, int]] = POLICY_SWEEP,
    peak_factor: float = 1.0,
) -> pd.DataFrame:
    """Shards of both logs and the counter under each policy, for the same keys, in
    both scenarios (every key full means a different rate under each policy)."""
    rows = []
    for policy, (limit, window_s) in policies.items():
        named = scenarios(active_keys, rate_per_key, limit, window_s, peak_factor)
        planned = plans(table, named, limit, window_s, server_time, shard)
        row: dict[str, Any] = {"policy": policy}
        for name in named:
            row[f"{name}: checks/s"] = round(named[name].checks_per_second())
            for a in (*_LOGS, "swc"):
                row[sweep_column(name, a)] = planned[(name, a)].shards
        rows.append(row)
    return pd.DataFrame(rows).set_index("policy")


@dataclass(frozen=True)
class Fleet:
    """The figure's question: a fleet under one policy, planned in both scenarios on
    shards of one size. `active_keys` and `limit` may come from a slider as floats."""

    active_keys: float = 1_000_000  # keys holding limiter state (a request within a window)
    rate_per_key: float = 0.05  # mean requests per second per key, the steady state
    limit: float = 1_000  # requests ...
    window_s: int = 3_600  # ... per window of this many seconds
    peak_factor: float = 1.0  # the steady state's peak over its mean
    shard_memory_gib: float = 14
    headroom: float = 0.5
    key_overhead_bytes: float = 64


# Both logs in the log's colour, drawn bolder (their keys grow with the limit); the
# shipped default solid, the sorted set dashed.
_COLORS: Mapping[str, str] = {**COLORS, "logc": COLORS["log"]}
_STYLES: Mapping[str, Mapping[str, Any]] = {
    "logc": {"linewidth": 2.5},
    "log": {"linewidth": 2.0, "linestyle": "--"},
}


@lru_cache(maxsize=4)
def stored_table(path: str | Path = memory.STORED_TABLE) -> pd.DataFrame:
    """Chapter 3's stored memory table (another at `path`), read once and never measured."""
    return memory.measured_or_stored(None, path, [1]).table


@parameters_of(
    Fleet,
    table=None,
    table_path=memory.STORED_TABLE,
    server_time=None,
    bench_path=BENCH_RECORD,
)
def figure(
    *,
    table: pd.DataFrame | None,
    table_path: str | Path,
    server_time: capacity.ServerTime | None,
    bench_path: str | Path,
    **fleet_options: Any,
) -> matplotlib.figure.Figure:
    """Shards against fleet size, one panel per scenario, one step line per algorithm.

    Takes `Fleet`'s options; `active_keys` places the dotted marker, and the legend
    gives each line's shards there. Without `table` chapter 3's table at `table_path`
    is read; without `server_time`, the `make bench` record at `bench_path`.
    """
    import matplotlib.pyplot as plt

    fleet = Fleet(**fleet_options)
    if table is None:
        table = stored_table(str(table_path))
    if server_time is None:
        server_time = bench_server_time(str(bench_path))
    limit, window_s = int(round(fleet.limit)), fleet.window_s
    shard = Shard(fleet.shard_memory_gib, fleet.headroom, fleet.key_overhead_bytes)
    named = scenarios(fleet.active_keys, fleet.rate_per_key, limit, window_s, fleet.peak_factor)
    keys = next(iter(named.values())).active_keys
    fig, axes = plt.subplots(1, len(named), figsize=(12, 4.8), sharey=True)
    for ax, scenario in zip(axes, named.values(), strict=True):
        for a in PLANNED:
            per_key = bytes_per_key(table, a, scenario, limit, window_s)

            def shards_at(
                n: int,
                a: str = a,
                per_key: float = per_key,
                rate: float = scenario.peak_rate_per_key,
            ) -> int:
                return capacity.plan_fleet(
                    a,
                    active_keys=n,
                    rate_per_key=rate,
                    bytes_per_key=per_key,
                    us_per_check=server_time.us_per_check[a],
                    **shard.plan_options(),
                ).shards

            here = shards_at(keys)
            ax.step(
                KEYS_AXIS,
                [shards_at(int(n)) for n in KEYS_AXIS],
                where="post",
                color=_COLORS[a],
                label=shards_label(a, here),
                **_STYLES.get(a, {"linewidth": 1.5, "alpha": 0.85}),
            )
        ax.axvline(keys, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(KEYS_AXIS[0], KEYS_AXIS[-1])
        rate = scenario.peak_rate_per_key
        ax.set_xlabel(f"active keys (each {rate:.3g} requests/s, {rate * 3_600:,.0f} an hour)")
        members = scenario.mean_log_members(limit, window_s)
        ax.set_title(
            f"{scenario.name}: a log key holds {members:,.0f} of {limit:,}\n"
            f"legend: shards at {keys:,} keys",
            fontsize=10,
        )
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("Redis shards needed")
    us = ", ".join(f"{LABELS[a]} {u:.1f}" for a, u in server_time.us_per_check.items())
    fig.suptitle(
        f"Shards for a limit of {limit:,} per {window_s:,} s ({fleet.shard_memory_gib:g} GiB "
        f"per shard, {fleet.headroom:.0%} kept free)\nserver time per check (us): {us}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
