"""Chapter 3 (memory per key): what each algorithm's key costs in Redis, the exact
log's two storages side by side, and the leak when no TTL is set.

The chapter measures one full key per algorithm and limit on a real Redis
(`ratelimit.lab.memory`), or shows the table it stored the last time it did
(`ratelimit/lab/data/memory_per_key.csv`); the functions here turn that table into the
chapter's tables and figures. The sliding log is measured three ways: a sorted set
with the members our script picks ("script"), a sorted set with the classic recipe's
members ("classic"), and `storage="compact"` ("compact"). `same_decisions` is
section 5's check that both storages decide alike; `leak` is section 8's experiment:
one-shot clients written the classic way with the EXPIRE forgotten, and through our
limiter, then counted while real time passes.

    from ratelimit.lab.chapters import memory_per_key
    from ratelimit.lab.plotting import explorer
    memory_per_key.figure()                               # 10 million keys at limit 1,000
    memory_per_key.figure(active_keys=10**5, limit=128)   # another fleet and limit
    explorer(memory_per_key.figure, **memory_per_key.SLIDERS)

`figure` (the Explore section) reads the stored table: no Redis is needed, and the
figure is the same on every machine.

The numbers the chapter's text and the README quote (`quotes`) are read from the stored
table too, so a run on another server cannot change them; they come from the server
the table names in its `redis_version` column. `TITLE`, `SUMMARY`, `HEADLINE` and
`README_BLOCKS` are the README's parts, filled from those records by
`ratelimit.lab.records`.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ratelimit import algorithms

from .. import memory
from ..classic import ClassicSlidingLog

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "CONCLUSION",
    "HEADLINE",
    "O1",
    "README_BLOCKS",
    "SERIES",
    "SUMMARY",
    "TITLE",
    "Quote",
    "SLIDERS",
    "STORAGES",
    "STORED_TABLE",
    "Leak",
    "Measurement",
    "compare_trace",
    "encodings_table",
    "figure",
    "fleet_table",
    "fleet_totals",
    "headline",
    "headline_table",
    "key_size_figure",
    "leak",
    "leak_figure",
    "limits_to_measure",
    "measure",
    "member_format_figure",
    "o1_table",
    "quotes",
    "same_decisions",
    "series",
    "series_name",
    "storage_figure",
    "storage_table",
    "table_version",
    "threshold_figure",
]

# The chapter's parameters (notebooks/03_memory_per_key.ipynb, its "parameters" cell).
MAX_LIMIT = 100_000  # the largest limit measured (= members in one full sliding-log key)
POINTS_PER_DECADE = 5  # limits measured per factor of ten, evenly spaced on a log scale
HEADLINE_LIMITS = [10, 1_000, 100_000]  # table rows, plus the listpack threshold and one above
FLEET_LIMITS = [10, 100, 1_000]  # limits in the fleet table
STORAGE_LIMITS = [10, 128, 129, 1_000, 10_000, 100_000]  # section 5's table rows
LEAK_CLIENTS = 300  # one-shot clients in section 8
LEAK_WINDOW_MS = 200  # our limiter's window in section 8 (the TTL it sets)
LEAK_WAIT_S = 0.6  # real time to wait before counting what is left

# What the text and the README quote: a fleet of this many full keys at this limit,
# and bytes per member at a small limit, the listpack threshold and one above, the
# fleet's limit and the largest limit.
QUOTED_FLEET_KEYS = 10**7
QUOTED_FLEET_LIMIT = 1_000
QUOTED_SMALL_LIMIT = 10
PER_MEMBER_FMT = ".1f"  # bytes per member or per admitted unit, wherever they are shown

# The README's parts (`ratelimit.lab.records`): format strings whose fields are the
# chapter's records, the numbers `quotes` returns plus section 5's `compare_requests`.
TITLE = "Memory per key"
SUMMARY = (
    "`MEMORY USAGE` per key from limit {min_limit} to {max_limit} on Redis {redis_version}, "
    "the listpack step at {listpack_threshold} (one member more: {step_factor} times the "
    'bytes), our members vs the classic format, the compact log (`storage="compact"`), a '
    "fleet table, and the leak without a TTL"
)
HEADLINE = (
    "{fleet_keys} active keys, each full at limit {fleet_limit} (Redis {redis_version}): "
    "{fleet_ours} as a sliding log in a sorted set ({fleet_classic} with classic members), "
    '{fleet_compact} as the compact log (`storage="compact"`, {compact_per_unit_fleet} '
    "bytes per admitted unit, the same decisions on all {compare_requests} requests of a "
    "replayed trace), and {fleet_o1_min} to {fleet_o1_max} for the fixed window, counter or "
    "GCRA."
)
# The chapter's conclusion (rendered in the notebook from its records, like the README's
# parts, so that a refresh on noisy measurements cannot leave the text behind).
CONCLUSION = """\
On Redis {redis_version}, the server the stored table was measured on:

- **The sliding log costs memory in proportion to the limit.** Each admitted unit in the
  window is one entry. As a sorted set past the listpack threshold that measured
  {skiplist_min_per_member} to {skiplist_max_per_member} bytes per member from
  {twice_threshold} members up, so one full key at a limit of {fleet_limit} holds
  {key_ours_fleet} bytes, and at {max_limit} {key_ours_max} bytes.
- **The compact log holds the same log in a few bytes per entry:**
  {compact_per_unit_fleet} per admitted unit at {fleet_limit} entries and
  {compact_per_unit_max} at {max_limit}, at most {compact_max_per_unit} from
  {listpack_threshold} up. It keeps 6-byte entries in chunks of 63, one hash per key,
  instead of a skiplist node, a hash-table entry and a string per member. That is at
  least {compact_min_ratio} times less than the sorted set at every measured size past
  the listpack threshold ({key_compact_max} bytes for a full key at {max_limit}), with
  the very same decisions. For {fleet_keys} active keys at limit {fleet_limit} it is
  {fleet_compact} instead of {fleet_ours}. Below {compact_smaller_from} entries neither
  wins throughout: at {compact_larger_at} the sorted set's listpack is smaller
  (section 5).
- **Limits up to the threshold are cheap for the sorted set.** Up to
  `zset-max-listpack-entries` members ({listpack_threshold} on that server) the set is a
  listpack, {ours_per_member_threshold} bytes per member at {listpack_threshold} with
  our members. Going from {listpack_threshold} to {above_threshold} makes the key
  {step_factor} times larger. If a limit near the threshold will do, keep it at or
  below it (or raise the setting knowingly: listpack operations are linear in the
  set's size), or use the compact log.
- **The member format matters most inside a listpack.** Our 3-byte members take less
  than half the space of `"<ms>:<counter>"` strings up to the threshold
  ({ours_per_member_threshold} against {classic_per_member_threshold} bytes per member
  at {listpack_threshold}); in a skiplist they save {skiplist_saving} of the bytes per
  member (the median over the measured skiplists; {ours_per_member_fleet} against
  {classic_per_member_fleet} at {fleet_limit}).
- **The O(1) algorithms cost {o1_min_bytes} to {o1_max_bytes} bytes per client at any
  limit.** For {fleet_keys} active keys that is {fleet_o1_min} to {fleet_o1_max},
  against {fleet_ours_small} for the sorted-set log at limit {small_limit} and
  {fleet_ours} (sorted set) or {fleet_compact} (compact) at limit {fleet_limit}. Where
  exactness at high limits is not needed, the sliding-window counter or GCRA is the
  affordable choice.
- **Set a TTL.** Without one, every client that ever sent a request keeps its key
  forever. Our script refreshes the TTL to the window on every admitted request, so
  memory follows the *active* clients, which is what the fleet table assumes.
- **Measure on your server.** The byte counts are that one server's; section 1 lists
  what to check on Redis before 7.0, Redis 8 or Valkey, and `make refresh` re-measures.
"""
README_BLOCKS = {
    "member-sizes": """\
| entries in one key | encoding | ours, bytes per member | classic `"<ms>:<perf_counter_ns>"` |
| --- | --- | --- | --- |
| {small_limit} | {encoding_small} | {ours_per_member_small} | {classic_per_member_small} |
| {listpack_threshold} | {encoding_threshold} | {ours_per_member_threshold} \
| {classic_per_member_threshold} |
| {above_threshold} | {encoding_above} | {ours_per_member_above} | {classic_per_member_above} |
| {fleet_limit} | {encoding_fleet} | {ours_per_member_fleet} | {classic_per_member_fleet} |
| {max_limit} | {encoding_max} | {ours_per_member_max} | {classic_per_member_max} |

Measured on Redis {redis_version}, whose `zset-max-listpack-entries` is {listpack_threshold}
(chapter 3's stored table; chapter 3 says what to check on other versions and servers).
At {above_threshold} entries the set has just become a skiplist, whose fixed cost (a hash
table and the skiplist's header, about {skiplist_overhead} bytes: {ours_key_above} bytes minus \
{above_threshold} x {ours_per_member_max})
is still spread over few members; from {twice_threshold} entries up it measured between \
{skiplist_min_per_member} and
{skiplist_max_per_member} bytes per member.

The O(1) algorithms hold one small key whatever the limit, as chapter 3 measures it:
{fw_bytes} bytes (fixed window), {swc_bytes} (sliding-window counter, as its counts grow),
{gcra_bytes} (GCRA).

These figures and chapter 3's text come from one measurement, chapter 3's stored table.
The book's Benchmarks page measures the same keys again in each `make bench` run
(`bench/record.json`), on another day: a skiplist draws each node's height at random,
so its bytes per member there can differ from these in the first decimal.
""",
    "compact-sizes": """\
`SlidingWindowLimiter(..., storage="compact")` keeps the same exact log, with the same
decisions, in one hash of 6-byte entries (`ratelimit/lua/compact_log.lua`) instead of a
sorted set: {compact_per_unit_threshold} bytes per admitted unit at {listpack_threshold} \
entries, {compact_per_unit_fleet} at {fleet_limit} and
{compact_per_unit_max} at {max_limit}, against {ours_per_member_threshold}, \
{ours_per_member_fleet} and {ours_per_member_max} for the sorted set (chapter 3's stored
measurements, Redis {redis_version}).
""",
}

# The chapter's stored table, shipped with the lab.
STORED_TABLE = memory.STORED_TABLE

_LOG = algorithms.SLIDING_LOG
# How the log holds its entries (the table's `member_format`): two sorted sets, and the
# compact log.
_MEMBER_FORMATS = {"script": "our members", "classic": "classic members", "compact": "compact"}
_SORTED_SET = ["script", "classic"]
O1 = [a.name for a in algorithms.ALGORITHMS if a is not _LOG]
"""The algorithms whose key holds a few numbers, whatever the limit."""

STORAGES = {"sorted-set": "script", "compact": "compact"}
"""`SlidingWindowLimiter(storage=...)` -> the table's `member_format` of its keys."""


def series_name(algorithm: str, member_format: str = "") -> str:
    """How tables and figures name a measured series: the algorithm's label, and for
    the sliding log how it holds its entries ("sliding log, our members": a sorted set
    of the members our script picks; "sliding log, compact": `storage="compact"`)."""
    label = algorithms.get(algorithm).label
    return f"{label}, {_MEMBER_FORMATS[member_format]}" if member_format else label


SERIES = {
    (a.name, f): series_name(a.name, f)
    for a in algorithms.ALGORITHMS
    for f in (_MEMBER_FORMATS if a is _LOG else [""])
}
"""(algorithm, member format) -> series name, for every series the chapter measures."""

# The explore section's controls (ipywidgets abbreviations; a dict is a drop-down).
SLIDERS: dict[str, Any] = {
    "active_keys": {f"{10**e:,}": 10**e for e in range(3, 9)},
    "limit": [10, 100, 128, 129, 1_000, 10_000],
}

_LOG_COLOR, _COMPACT_COLOR, _O1_COLOR = "tab:red", "tab:orange", "tab:blue"


# --- measuring ----------------------------------------------------------------------------


def limits_to_measure(
    threshold: int,
    *,
    max_limit: int = MAX_LIMIT,
    points_per_decade: int = POINTS_PER_DECADE,
    extra: Iterable[int] = (*HEADLINE_LIMITS, *FLEET_LIMITS, *STORAGE_LIMITS),
) -> list[int]:
    """Limits 1 .. `max_limit` evenly spaced on a log scale, every 8 entries up to twice
    the server's listpack `threshold`, the threshold and one above, and `extra`."""
    if max_limit < 1 or points_per_decade < 1:
        raise ValueError("max_limit and points_per_decade must be at least 1")
    sweep = np.geomspace(1, max_limit, round(np.log10(max_limit) * points_per_decade) + 1)
    near = [*range(8, 2 * threshold + 1, 8), threshold // 2, threshold + 1, 2 * threshold]
    return sorted({*sweep.round().astype(int).tolist(), *near, *extra})


@dataclass(frozen=True)
class Measurement:
    """The chapter's table, and where it came from."""

    table: pd.DataFrame
    source: str  # "measured" or "stored"
    reason: str  # why the stored table is shown; "" when measured
    saved_to: Path | None  # where a measured table was saved, if it was

    @property
    def threshold(self) -> int:
        """The server's zset-max-listpack-entries."""
        return int(self.table.listpack_threshold.iloc[0])

    @property
    def version(self) -> str:
        return table_version(self.table)

    def report(self, where: str) -> str:
        """What was measured on which server (`where`, e.g. a backend's description)."""
        if self.source == "measured":
            lines = [f"Measured {len(self.table)} keys on {where} (Redis {self.version})."]
            lines += [f"Saved to {self.saved_to}."] if self.saved_to else []
        else:
            lines = [
                f"Cannot measure here: {self.reason.rstrip('.')}.",
                f"Showing the stored table, measured on Redis {self.version}.",
            ]
        return "\n".join([*lines, f"zset-max-listpack-entries: {self.threshold}"])


def measure(
    client: Any,
    stored: str | Path = STORED_TABLE,
    *,
    max_limit: int = MAX_LIMIT,
    points_per_decade: int = POINTS_PER_DECADE,
    extra_limits: Iterable[int] = (*HEADLINE_LIMITS, *FLEET_LIMITS, *STORAGE_LIMITS),
    save: bool | None = None,
) -> Measurement:
    """One full key per series at `limits_to_measure(...)` on `client` when it is a real
    Redis, else the table stored at `stored` (`memory.measured_or_stored`).

    `save=None` saves a measured table only when RATELIMIT_SAVE_MEASUREMENTS=1 (set by
    `make refresh`), so test runs and `make run` never rewrite the stored table.
    """
    if save is None:
        save = os.environ.get("RATELIMIT_SAVE_MEASUREMENTS") == "1"
    extra = list(extra_limits)

    def limits(threshold: int) -> list[int]:
        return limits_to_measure(
            threshold, max_limit=max_limit, points_per_decade=points_per_decade, extra=extra
        )

    result = memory.measured_or_stored(client, stored, limits, save=save)
    saved = Path(stored) if save and result.source == "measured" else None
    return Measurement(result.table, result.source, result.reason, saved)


def series(table: pd.DataFrame, algorithm: str, member_format: str = "") -> pd.DataFrame:
    """One series of the measured table, indexed by limit."""
    rows = table[(table.algorithm == algorithm) & (table.member_format == member_format)]
    if rows.empty:
        raise ValueError(f"the table has no series {algorithm!r} {member_format!r}")
    return rows.set_index("limit").sort_index()


def _threshold(table: pd.DataFrame) -> int:
    return int(table.listpack_threshold.iloc[0])


def table_version(table: pd.DataFrame) -> str:
    """The Redis version a measured table comes from (its `redis_version` column)."""
    versions = sorted(set(table.redis_version))
    if len(versions) != 1:
        raise ValueError(f"the table mixes Redis versions {versions}")
    return str(versions[0])


def _per_member(values: pd.Series) -> pd.Series:
    """Bytes per member (or per unit, or a ratio) as text, rounded as the README has it."""
    return values.map(lambda v: format(float(v), PER_MEMBER_FMT))


# --- tables -------------------------------------------------------------------------------


def headline_table(table: pd.DataFrame, limits: Iterable[int] = HEADLINE_LIMITS) -> pd.DataFrame:
    """The sorted-set log's encoding and bytes per key and per member, ours and classic,
    at `limits` plus the listpack threshold and one above (the rows, by limit). Bytes
    per member are shown as the README quotes them (`PER_MEMBER_FMT`)."""
    threshold = _threshold(table)
    rows = sorted({*limits, threshold, threshold + 1})
    ours, classic = series(table, "log", "script"), series(table, "log", "classic")
    summary = pd.DataFrame(
        {
            "encoding": ours.encoding,
            "ours: bytes per key": ours.bytes_per_key,
            "ours: bytes per member": _per_member(ours.bytes_per_entry),
            "classic: bytes per key": classic.bytes_per_key,
            "classic: bytes per member": _per_member(classic.bytes_per_entry),
        }
    ).loc[rows]
    summary.index.name = "limit"
    return summary


def encodings_table(table: pd.DataFrame) -> pd.DataFrame:
    """The encoding Redis reports for both member formats at four sizes relative to
    the listpack threshold."""
    threshold = _threshold(table)
    sizes = {
        "half the threshold": threshold // 2,
        "at the threshold": threshold,
        "one above": threshold + 1,
        "twice the threshold": 2 * threshold,
    }
    ours, classic = series(table, "log", "script"), series(table, "log", "classic")
    return pd.DataFrame(
        {
            "ours": [ours.encoding[n] for n in sizes.values()],
            "classic": [classic.encoding[n] for n in sizes.values()],
        },
        index=pd.Index(list(sizes), name="members"),
    )


def storage_table(table: pd.DataFrame, limits: Iterable[int] = STORAGE_LIMITS) -> pd.DataFrame:
    """The exact log's two storages at `limits` (entries in one full key): each one's
    encoding and MEMORY USAGE per admitted unit, and how many times smaller the
    compact log is (all three as text, the way the README quotes them)."""
    rows = list(limits)
    sorted_set, compact = series(table, "log", "script"), series(table, "log", "compact")
    summary = pd.DataFrame(
        {
            "sorted set: encoding": sorted_set.encoding,
            "sorted set: bytes per unit": _per_member(sorted_set.bytes_per_entry),
            "compact: encoding": compact.encoding,
            "compact: bytes per unit": _per_member(compact.bytes_per_entry),
            "sorted set / compact": _per_member(
                sorted_set.bytes_per_entry / compact.bytes_per_entry
            ),
        }
    ).loc[rows]
    summary.index.name = "entries"
    return summary


def o1_table(table: pd.DataFrame, limits: Sequence[int]) -> pd.DataFrame:
    """Each O(1) algorithm's encoding and bytes per key at `limits`."""
    o1 = pd.DataFrame({SERIES[a, ""]: series(table, a).bytes_per_key[list(limits)] for a in O1}).T
    o1.columns = [f"bytes at limit {n:,}" for n in limits]
    o1.insert(0, "encoding", [series(table, a).encoding.iloc[0] for a in O1])
    o1.index.name = "algorithm"
    return o1


def fleet_table(fleet: pd.DataFrame) -> pd.DataFrame:
    """A `memory.fleet_memory` table for people: one row per series and limit, one
    column per fleet size, in binary units."""
    names = [series_name(a, f) for a, f in zip(fleet.algorithm, fleet.member_format, strict=True)]
    wide = fleet.assign(series=names).pivot_table(
        index=["series", "limit"], columns="active_keys", values="total_bytes", sort=False
    )
    wide = wide.map(memory.format_bytes)
    wide.columns = [f"{n:,} keys" for n in wide.columns]
    return wide


# --- figures ------------------------------------------------------------------------------


def key_size_figure(table: pd.DataFrame) -> Figure:
    """Every series' bytes per full key against the limit, both axes logarithmic, with
    the listpack threshold marked."""
    import matplotlib.pyplot as plt

    threshold = _threshold(table)
    fig, ax = plt.subplots(figsize=(8, 5))
    for (algorithm, member_format), name in SERIES.items():
        rows = series(table, algorithm, member_format)
        ax.plot(rows.index, rows.bytes_per_key, marker=".", markersize=4, label=name)
    ax.axvline(threshold, color="grey", linestyle=":", linewidth=1)
    ax.annotate(
        f"zset-max-listpack-entries = {threshold}",
        xy=(threshold, 1e6),
        xytext=(-6, 0),
        textcoords="offset points",
        ha="right",
        fontsize=8,
        color="grey",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("limit (entries per key; the log holds one entry per admitted unit)")
    ax.set_ylabel("MEMORY USAGE of one full key (bytes)")
    ax.set_title(f"Memory of one full key against its limit (Redis {table_version(table)})")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def threshold_figure(table: pd.DataFrame) -> Figure:
    """The sorted-set log's bytes per member up to twice the listpack threshold, both
    member formats."""
    import matplotlib.pyplot as plt

    threshold = _threshold(table)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    near = 2 * threshold
    for member_format in _SORTED_SET:
        rows = series(table, "log", member_format)
        rows = rows[rows.index <= near]
        ax.plot(rows.index, rows.bytes_per_entry, marker=".", label=SERIES["log", member_format])
    ax.axvline(threshold + 0.5, color="grey", linestyle=":", linewidth=1)
    ax.text(threshold, 5, "  listpack | skiplist", fontsize=8, color="grey", ha="center")
    ax.set_xlim(0, near)
    ax.set_ylim(0, None)
    ax.set_xlabel("members in the key (entries)")
    ax.set_ylabel("MEMORY USAGE per member (bytes)")
    ax.set_title("Bytes per member around the listpack threshold")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def member_format_figure(table: pd.DataFrame, limits: Sequence[int]) -> Figure:
    """Bars of bytes per member at `limits`, our members beside the classic ones."""
    import matplotlib.pyplot as plt

    limits = list(limits)
    x = np.arange(len(limits))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for offset, member_format in zip((-0.2, 0.2), _SORTED_SET, strict=True):
        values = series(table, "log", member_format).bytes_per_entry[limits]
        bars = ax.bar(x + offset, values, width=0.4, label=SERIES["log", member_format])
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks(x, [f"{n:,}" for n in limits])
    ax.set_xlabel("members in the key (limit)")
    ax.set_ylabel("MEMORY USAGE per member (bytes)")
    ax.set_title("Bytes per member: 3-byte members picked by the script vs classic strings")
    ax.legend()
    return fig


def storage_figure(table: pd.DataFrame) -> Figure:
    """MEMORY USAGE per admitted unit against the entries in one key, the exact log's
    two storages (and the classic members), both axes logarithmic."""
    import matplotlib.pyplot as plt

    threshold = _threshold(table)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for member_format, color, style in (
        ("script", _LOG_COLOR, "-"),
        ("classic", _LOG_COLOR, ":"),
        ("compact", _COMPACT_COLOR, "-"),
    ):
        rows = series(table, "log", member_format)
        name = SERIES["log", member_format]
        ax.plot(rows.index, rows.bytes_per_entry, style, color=color, marker=".", label=name)
    ax.axvline(threshold + 0.5, color="grey", linestyle=":", linewidth=1)
    ax.text(threshold, 3, "listpack | skiplist  ", fontsize=8, color="grey", ha="right")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(2, None)
    ax.set_xlabel("entries in one key (admitted units in the window; a full key: the limit)")
    ax.set_ylabel("MEMORY USAGE per admitted unit (bytes)")
    ax.set_title(f"The exact log's two storages (Redis {table_version(table)})")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def compare_trace(seed: int = 3, seconds: float = 8.0) -> pd.DataFrame:
    """Section 5's trace: two clients over `seconds`, a bursty one (Poisson at 300/s
    for 2 s, then 1.5 s quiet, so its log fills, drains and starts again) and a
    geofence client at 90 look-ups/s costing 1 to 10 each."""
    from ..traffic import geofence_mix, merge, on_off

    return merge(
        on_off(300, 2.0, 1.5, seconds, identity="bursty", seed=seed),
        geofence_mix(90, seconds, identity="geofence", seed=seed + 1),
    )


def same_decisions(
    client: Any, trace: pd.DataFrame, limit: int = 100, window_ms: int = 1000
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`trace` replayed (`ratelimit.lab.replay`, virtual time) by the sync
    `SlidingWindowLimiter` on `client` in each storage, and by its reference model.

    Returns the decisions (one column per storage and field: allowed, remaining,
    retry_after_ms) and a summary, one row per limiter: requests, admitted,
    rejected, and decisions that differ from the sorted set's in any field. The
    replays' keys are deleted afterwards.
    """
    from ratelimit import sync

    from ..reference import SlidingWindowLimiter as Model
    from ..simulation import replay

    run = f"nb03-storage:{uuid.uuid4().hex[:12]}"  # this run's own keys
    limiters = {
        storage: sync.SlidingWindowLimiter(
            client, None, limit, window_ms=window_ms, storage=storage, prefix=run
        )
        for storage in STORAGES
    }
    limiters["reference model"] = Model(window_ms=window_ms, limit=limit)
    fields = ["allowed", "remaining", "retry_after_ms"]
    decided = {name: replay(trace, lim, progress=False)[fields] for name, lim in limiters.items()}
    first = decided["sorted-set"]
    summary = pd.DataFrame(
        {
            "requests": [len(d) for d in decided.values()],
            "admitted": [int(d.allowed.sum()) for d in decided.values()],
            "rejected": [int((~d.allowed).sum()) for d in decided.values()],
            "differ from the sorted set": [
                int((d != first).any(axis=1).sum()) for d in decided.values()
            ],
        },
        index=pd.Index(list(decided), name="limiter"),
    )
    return pd.concat(decided, axis=1), summary


# --- the leak -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Leak:
    """Section 8's run: keys still there over time, and what was left at the end."""

    samples: pd.DataFrame  # ms since the last request; keys left, "classic" and "ours"
    table: pd.DataFrame  # per recipe: keys written, keys left after the wait, TTL
    cleaned_up: bool  # every key of the run was deleted afterwards


def _ours(client: Any, prefix: str, clients: int, window_ms: int, keys: list[str]) -> None:
    """One request per client through our limiter, whose script sets the key's TTL to
    the window; each key written is appended to `keys`."""
    limiter = _LOG.build("sync", client, None, 10, window_ms=window_ms, prefix=prefix)
    for i in range(clients):
        keys.append(limiter.key_for(f"client-{i}"))
        if not limiter.check(f"client-{i}").allowed:
            raise RuntimeError(f"our limiter refused one-shot client {i}")


def leak(
    client: Any,
    clients: int = LEAK_CLIENTS,
    *,
    window_ms: int = LEAK_WINDOW_MS,
    wait_s: float = LEAK_WAIT_S,
    poll_s: float = 0.02,
) -> Leak:
    """`clients` one-shot clients send one request each, the classic way without EXPIRE
    and through our limiter; then count the keys left (EXISTS, as any client sees
    them) every `poll_s` of real time for `wait_s`. The run's keys are deleted
    afterwards. Works on a real Redis and on fakeredis alike (both expire in real time).
    """
    if clients < 1 or window_ms < 1 or wait_s < 0:
        raise ValueError("clients and window_ms must be positive and wait_s non-negative")
    run = f"nb03-leak:{uuid.uuid4().hex[:12]}"  # this run's own keys
    # The classic recipe with its EXPIRE forgotten, one request per client.
    recipe = ClassicSlidingLog(client, window_ms / 1000, 10, prefix=f"{run}:classic", expire=False)
    classic_keys = [recipe.key_for(f"client-{i}") for i in range(clients)]
    our_keys: list[str] = []
    try:
        for i in range(clients):
            recipe.check_sync(f"client-{i}")
        _ours(client, f"{run}:ours", clients, window_ms, our_keys)
        written, rows = time.monotonic(), []
        while True:
            elapsed = time.monotonic() - written
            rows.append((elapsed * 1000, client.exists(*classic_keys), client.exists(*our_keys)))
            if elapsed >= wait_s:
                break
            time.sleep(poll_s)
        table = pd.DataFrame(
            {
                "keys written": [len(classic_keys), len(our_keys)],
                f"keys left after {wait_s} s": [rows[-1][1], rows[-1][2]],
                "TTL": [
                    "none" if client.ttl(classic_keys[0]) == -1 else "set",
                    f"{window_ms} ms after each request",
                ],
            },
            index=pd.Index(["classic, EXPIRE forgotten", "ours"], name="recipe"),
        )
    finally:
        client.delete(*classic_keys, *our_keys)  # the classic keys would stay forever
    cleaned_up = client.exists(*classic_keys, *our_keys) == 0
    samples = pd.DataFrame(rows, columns=["ms", "classic", "ours"])
    return Leak(samples, table, cleaned_up)


def leak_figure(samples: pd.DataFrame, *, clients: int, window_ms: int) -> Figure:
    """Keys still in Redis against the time since the last request, per recipe."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.step(
        samples.ms, samples.classic, where="post", linewidth=3, label="classic: ZADD, no EXPIRE"
    )
    ax.step(samples.ms, samples.ours, where="post", label=f"ours: TTL = window ({window_ms} ms)")
    ax.axvline(window_ms, color="grey", linestyle=":", linewidth=1)
    ax.set_ylim(0, clients * 1.1)
    ax.set_xlabel("time since the last request (ms)")
    ax.set_ylabel("keys still in Redis (keys)")
    ax.set_title(f"Keys left behind by {clients} one-shot clients")
    ax.legend(loc="center right")
    return fig


# --- Explore ------------------------------------------------------------------------------


def fleet_totals(
    table: pd.DataFrame, active_keys: int = QUOTED_FLEET_KEYS, limit: int = QUOTED_FLEET_LIMIT
) -> dict[tuple[str, str], int]:
    """Each series' memory for `active_keys` full keys at `limit`, in bytes, in `SERIES`
    order: what the Explore figure draws and the records quote (`memory.fleet_memory`)."""
    fleet = memory.fleet_memory(table, [active_keys], [limit])
    totals = fleet.set_index(["algorithm", "member_format"]).total_bytes
    return {key: int(totals[key]) for key in SERIES}


def headline(
    table: pd.DataFrame,
    *,
    active_keys: int = QUOTED_FLEET_KEYS,
    limit: int = QUOTED_FLEET_LIMIT,
    per_unit_at: Sequence[int] = (128, 1_000, 100_000),
) -> str:
    """The figures the gallery and the README quote, from `table` (the stored one in
    the chapter): each series' memory for `active_keys` full keys at `limit`, and the
    exact log's bytes per admitted unit in each storage at `per_unit_at` entries."""
    totals = fleet_totals(table, active_keys, limit)
    lines = [
        f"{active_keys:,} active keys, each full at limit {limit:,} (Redis {table_version(table)}):"
    ]
    lines += [f"  {name}: {memory.format_bytes(totals[k])}" for k, name in SERIES.items()]
    lines.append(
        "Bytes per admitted unit, " + ", ".join(f"{n:,}" for n in per_unit_at) + " entries:"
    )
    for storage, member_format in STORAGES.items():
        values = series(table, "log", member_format).bytes_per_entry[list(per_unit_at)]
        lines.append(f"  {storage}: " + ", ".join(_per_member(values)))
    return "\n".join(lines)


# --- the numbers the chapter quotes -------------------------------------------------------


@dataclass(frozen=True)
class Quote:
    """One number the chapter's text or the README quotes: `records.Chapter.put`'s
    arguments (`name`, `value`, quoted as `format(value, fmt)`, and what it is)."""

    name: str
    value: int | float | str
    fmt: str
    what: str


def _and_list(numbers: Sequence[int]) -> str:
    """ "1, 8 and 10" (with thousands separators); "none" for no numbers."""
    texts = [f"{n:,}" for n in numbers]
    if len(texts) < 2:
        return texts[0] if texts else "none"
    return ", ".join(texts[:-1]) + " and " + texts[-1]


def _bytes_range(sizes: pd.Series) -> str:
    """ "72" when every key measured the same, else "104 to 120"."""
    low, high = int(sizes.min()), int(sizes.max())
    return f"{low}" if low == high else f"{low} to {high}"


def quotes(table: pd.DataFrame) -> list[Quote]:
    """Every number chapter 3's text and the README quote, from `table` (in the chapter
    the stored one, so that every backend quotes the same): the server, the sweep and
    the listpack step, bytes per member of both sorted sets at a few sizes, the
    skiplist's fixed cost and range, the compact log's bytes per unit, the O(1) key
    sizes, the fleet of `QUOTED_FLEET_KEYS` full keys at `QUOTED_FLEET_LIMIT`, and a
    one-member classic key (section 8's leak)."""
    threshold = _threshold(table)
    ours, classic = series(table, "log", "script"), series(table, "log", "classic")
    compact = series(table, "log", "compact")
    max_limit = int(ours.index.max())
    out = [
        Quote(
            "redis_version",
            table_version(table),
            "",
            "Redis version the stored table was measured on",
        ),
        Quote("listpack_threshold", threshold, "d", "zset-max-listpack-entries of that server"),
        Quote("above_threshold", threshold + 1, "d", "one member past the listpack threshold"),
        Quote("twice_threshold", 2 * threshold, "d", "twice the listpack threshold"),
        Quote("min_limit", int(ours.index.min()), ",d", "smallest limit measured"),
        Quote("max_limit", max_limit, ",d", "largest limit measured"),
        Quote("small_limit", QUOTED_SMALL_LIMIT, ",d", "the small limit quoted"),
        Quote("fleet_limit", QUOTED_FLEET_LIMIT, ",d", "the limit of the quoted fleet"),
        Quote("fleet_keys", QUOTED_FLEET_KEYS, ",d", "full keys in the quoted fleet"),
        Quote(
            "step_factor",
            ours.bytes_per_key[threshold + 1] / ours.bytes_per_key[threshold],
            ".1f",
            "our sorted set's bytes one member past the threshold / at the threshold",
        ),
    ]
    rows = {
        "small": QUOTED_SMALL_LIMIT,
        "threshold": threshold,
        "above": threshold + 1,
        "fleet": QUOTED_FLEET_LIMIT,
        "max": max_limit,
    }
    for role, n in rows.items():
        out += [
            Quote(
                f"encoding_{role}",
                str(ours.encoding[n]),
                "",
                f"sorted-set encoding at {n:,} members",
            ),
            Quote(
                f"ours_per_member_{role}",
                float(ours.bytes_per_entry[n]),
                PER_MEMBER_FMT,
                f"bytes per member, our members, {n:,} members",
            ),
            Quote(
                f"classic_per_member_{role}",
                float(classic.bytes_per_entry[n]),
                PER_MEMBER_FMT,
                f"bytes per member, classic members, {n:,} members",
            ),
        ]
    # The skiplist's fixed cost: the key one past the threshold, less its members at the
    # largest key's per-member cost (rounded to 100 bytes: it is an estimate).
    overhead = ours.bytes_per_key[threshold + 1] - (threshold + 1) * ours.bytes_per_entry[max_limit]
    big = ours.bytes_per_entry[ours.index >= 2 * threshold]
    out += [
        Quote(
            "ours_key_above",
            int(ours.bytes_per_key[threshold + 1]),
            ",d",
            "our sorted set's bytes one past the threshold",
        ),
        Quote(
            "skiplist_overhead",
            int(round(overhead, -2)),
            ",d",
            "the skiplist's fixed cost, estimated",
        ),
        Quote(
            "skiplist_min_per_member",
            float(big.min()),
            PER_MEMBER_FMT,
            "least bytes per member, our skiplists from twice the threshold up",
        ),
        Quote(
            "skiplist_max_per_member",
            float(big.max()),
            PER_MEMBER_FMT,
            "most bytes per member, our skiplists from twice the threshold up",
        ),
    ]
    for role in ("threshold", "fleet", "max"):
        n = rows[role]
        out.append(
            Quote(
                f"compact_per_unit_{role}",
                float(compact.bytes_per_entry[n]),
                PER_MEMBER_FMT,
                f"bytes per admitted unit, compact log, {n:,} entries",
            )
        )
    from_threshold = compact.bytes_per_entry[compact.index >= threshold]
    skiplists = ours.index[ours.encoding == "skiplist"]
    ratio = ours.bytes_per_entry[skiplists] / compact.bytes_per_entry[skiplists]
    saving = 1 - ours.bytes_per_entry[skiplists] / classic.bytes_per_entry[skiplists]
    # Where the compact log holds more than the sorted set (a few small sizes), and the
    # size from which it is the smaller one at every measured size.
    larger = compact.index[compact.bytes_per_entry > ours.bytes_per_entry].tolist()
    smaller_from = compact.index[compact.index > max(larger, default=0)].min()
    hashtable = compact.index[compact.encoding == "hashtable"]
    out += [
        Quote(
            "compact_max_per_unit",
            float(from_threshold.max()),
            PER_MEMBER_FMT,
            "most bytes per unit, compact log, from the threshold up",
        ),
        Quote(
            "compact_min_ratio",
            float(ratio.min()),
            PER_MEMBER_FMT,
            "least sorted set / compact bytes, where the set is a skiplist",
        ),
        Quote(
            "skiplist_saving",
            float(saving.median()),
            ".0%",
            "our members' saving on classic members per member, median over skiplists",
        ),
        Quote(
            "compact_larger_at",
            _and_list(larger),
            "",
            "entries at which the compact log holds more than the sorted set",
        ),
        Quote(
            "compact_smaller_from",
            int(smaller_from),
            ",d",
            "entries from which the compact log is smaller at every measured size",
        ),
        Quote(
            "compact_hashtable_from",
            int(hashtable.min()),
            ",d",
            "fewest entries whose compact log is a hash table (not a listpack)",
        ),
    ]
    o1_sizes = {a: series(table, a).bytes_per_key for a in O1}
    out += [
        Quote(f"{a}_bytes", _bytes_range(v), "", f"bytes per key, {SERIES[a, '']}")
        for a, v in o1_sizes.items()
    ]
    out += [
        Quote(
            "o1_min_bytes", min(int(v.min()) for v in o1_sizes.values()), "d", "smallest O(1) key"
        ),
        Quote(
            "o1_max_bytes", max(int(v.max()) for v in o1_sizes.values()), "d", "largest O(1) key"
        ),
    ]
    totals = fleet_totals(table)
    fleet_names = {
        ("log", "script"): "ours",
        ("log", "classic"): "classic",
        ("log", "compact"): "compact",
    }
    out += [
        Quote(
            f"fleet_{role}",
            memory.format_bytes(totals[key]),
            "",
            f"memory of the quoted fleet, {SERIES[key]}",
        )
        for key, role in fleet_names.items()
    ]
    o1_totals = [totals[a, ""] for a in O1]
    out += [
        Quote(
            "fleet_o1_min",
            memory.format_bytes(min(o1_totals)),
            "",
            "memory of the quoted fleet, smallest O(1)",
        ),
        Quote(
            "fleet_o1_max",
            memory.format_bytes(max(o1_totals)),
            "",
            "memory of the quoted fleet, largest O(1)",
        ),
        Quote(
            "classic_key_one",
            int(classic.bytes_per_key[1]),
            "d",
            "bytes of a one-member classic key",
        ),
        Quote(
            "classic_key_one_million",
            memory.format_bytes(10**6 * int(classic.bytes_per_key[1])),
            "",
            "a million one-member classic keys",
        ),
    ]
    for role in ("fleet", "max"):
        n = rows[role]
        out += [
            Quote(
                f"key_{name}_{role}",
                int(log.bytes_per_key[n]),
                ",d",
                f"bytes of one full key at limit {n:,}, {SERIES['log', member_format]}",
            )
            for name, member_format, log in (
                ("ours", "script", ours),
                ("compact", "compact", compact),
            )
        ]
    small = fleet_totals(table, QUOTED_FLEET_KEYS, QUOTED_SMALL_LIMIT)
    out.append(
        Quote(
            "fleet_ours_small",
            memory.format_bytes(small["log", "script"]),
            "",
            f"memory of the quoted fleet at limit {QUOTED_SMALL_LIMIT}, {SERIES['log', 'script']}",
        )
    )
    return out


@cache
def _load(path: Path, mtime_ns: int) -> pd.DataFrame:
    """The stored table, read once per file version (redraws must stay fast)."""
    return memory.load_table(path)


def _table(table: str | Path | pd.DataFrame | None) -> pd.DataFrame:
    if table is not None and not isinstance(table, str | Path):
        return table
    path = (STORED_TABLE if table is None else Path(table)).resolve()
    return _load(path, path.stat().st_mtime_ns)


def _binary_tick(value: float, _position: Any) -> str:
    """A tick label such as "32 KiB" or "1 TiB" (ticks are powers of two)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    power = 0
    while power < len(units) - 1 and value >= 1024 ** (power + 1):
        power += 1
    return f"{value / 1024**power:g} {units[power]}"


def _bar_label(name: str) -> str:
    """A series name on two lines under its bar: at its comma, else its first space."""
    if len(name) <= len("fixed window"):
        return name
    head, sep, tail = name.partition(", ")
    return f"{head},\n{tail}" if sep else name.replace(" ", "\n", 1)


def figure(
    *,
    active_keys: int = 10**7,
    limit: int = 1_000,
    table: str | Path | pd.DataFrame | None = None,
) -> Figure:
    """Bars of a fleet's Redis memory per algorithm, from the measured bytes per key.

    - `active_keys`: API keys holding a key right now, each full (at its limit): the
      worst case the chapter sizes for (its largest fleet, 10 million, by default).
    - `limit`: the per-key limit; it must be one the table measured (the chapter's
      largest fleet limit, 1,000, by default).
    - `table`: a `ratelimit.lab.memory` table, or the path of a stored one; by default the
      chapter's stored one (`STORED_TABLE`).

    Total = `active_keys` x MEMORY USAGE of one full key (`memory.fleet_memory`), a
    lower bound (the server's own bookkeeping comes on top). The y axis is logarithmic:
    the sliding log and the O(1) algorithms differ by up to a factor of 10,000.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    data = _table(table)
    totals = fleet_totals(data, active_keys, limit)
    version = table_version(data)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    names, heights, colors = [], [], []
    for (algorithm, member_format), name in SERIES.items():
        names.append(_bar_label(name))
        heights.append(totals[algorithm, member_format])
        colors.append(
            _O1_COLOR
            if algorithm != _LOG.name
            else _COMPACT_COLOR
            if member_format == "compact"
            else _LOG_COLOR
        )
    bars = ax.bar(names, heights, color=colors)
    ax.bar_label(bars, labels=[memory.format_bytes(h) for h in heights], fontsize=8)
    # Legend entries for the three families (one handle each).
    series_names = list(SERIES)
    bars[0].set_label("sliding log, sorted set: grows with the limit")
    bars[series_names.index(("log", "compact"))].set_label(
        "sliding log, compact: grows with the limit"
    )
    bars[len(series_names) - len(O1)].set_label("O(1): the same at every limit")
    ax.set_yscale("log")
    ax.set_ylim(min(heights) / 3, max(heights) * 6)
    # Ticks at 1 KiB, 32 KiB, 1 MiB, 32 MiB, ...: powers of 32, in binary units.
    ax.yaxis.set_major_locator(LogLocator(base=32))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(_binary_tick))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel("algorithm (Redis data structure per API key)")
    ax.set_ylabel("fleet memory, sum of MEMORY USAGE (bytes, log scale)")
    ax.set_title(f"{active_keys:,} active API keys, each full at limit {limit:,} (Redis {version})")
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    return fig
