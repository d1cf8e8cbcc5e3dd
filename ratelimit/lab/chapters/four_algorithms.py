"""Chapter 0, the four algorithms on one page: one short trace through each algorithm's
reference model, what each one stores over time, its Lua script, and what it costs.

The trace is one client's burst followed by a steady trickle at the limit's own rate
(`trace`). `decisions` steps a fresh reference model (`ratelimit.lab.reference`)
through it one request at a time, in virtual time, keeping a copy of the model's state
after each request; `stored` reads that state on a grid of whole ms, as the script
would see it at each moment. `figure` draws all four side by side.

    from ratelimit.lab.chapters import four_algorithms
    four_algorithms.admitted_table()            # admitted per algorithm on the trace
    four_algorithms.figure()                    # one timeline panel per algorithm
    four_algorithms.show_script("gcra")         # ratelimit/lua/gcra.lua, as Markdown
    four_algorithms.costs_table()               # bytes per key and Redis commands
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

import ratelimit
from ratelimit import algorithms, keys
from ratelimit.lab import memory, metrics
from ratelimit.lab.chapters import memory_per_key
from ratelimit.lab.plotting import COLORS
from ratelimit.lab.simulation import replay

# The README's chapter-table cell and gallery text, filled from the chapter's records
# (notebooks/data/records/00_four_algorithms.json) by `ratelimit.lab.records`.
TITLE = "The four algorithms on one page"
SUMMARY = (
    "what each algorithm stores and when it admits, on one trace (a burst of "
    "{burst_requests}, then one request every {trickle_every_ms} ms, limit {limit} per "
    "{window_s} s); each rule as a formula, each Lua script with its key lines explained, "
    "bytes per key and Redis commands per check, and a cheat-sheet from a need to an "
    "algorithm, a clock, an `on_error` policy and a cost function"
)
HEADLINE = (
    "A burst of {burst_requests} then one request every {trickle_every_ms} ms, at "
    "{limit} per {window_s} s: the sliding log admits {log_admitted} of {trace_requests} "
    "and never more than {log_peak} in a rolling second, the fixed window {fw_admitted} "
    "({fw_peak} in one rolling second), the counter {swc_admitted} ({swc_peak}), GCRA "
    "{gcra_admitted} ({gcra_peak}). At limit {quoted_limit} a full key takes "
    "{compact_bytes} bytes as the default compact log ({log_bytes} as a sorted set) and "
    "{o1_min_bytes}-{o1_max_bytes} for the others; counted by running the scripts, an "
    "admitted check runs {compact_admit_commands} Redis commands in the compact log's "
    "({log_admit_commands} in the sorted set's) and {o1_admit_commands} in the others', a "
    "rejection {compact_reject_commands} ({log_reject_commands}) and {o1_reject_commands}."
)

# The chapter's parameters (notebooks/00_four_algorithms.ipynb, its "parameters" cell).
LIMIT = 5  # requests admitted per window
WINDOW_S = 1  # window width, whole seconds
BURST_AT_MS = 800  # the burst's first request
BURST_REQUESTS = 8  # requests in the burst, one every BURST_SPACING_MS
BURST_SPACING_MS = 10
TRICKLE_EVERY_MS = 200  # then one request every this many ms (the limit's own rate)...
TRICKLE_UNTIL_MS = 3000  # ...from the next window's start up to this time
QUOTED_LIMIT = 1_000  # the limit at which the costs table is quoted
COST_LIMITS = (10, QUOTED_LIMIT)  # the costs table's columns

ORDER = algorithms.ALGORITHMS  # log, fixed window, counter, GCRA: the registry's order
IDENTITY = "api-key-123"
SCRIPTS = ("prelude", "epilogue", *(a.script for a in ORDER), algorithms.COMPACT_LOG.script)


def trace(
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    *,
    burst_at_ms: int = BURST_AT_MS,
    burst_requests: int = BURST_REQUESTS,
    trickle_every_ms: int = TRICKLE_EVERY_MS,
    trickle_until_ms: int = TRICKLE_UNTIL_MS,
) -> pd.DataFrame:
    """One client's requests (the `ratelimit.lab.traffic` columns): `burst_requests` from
    `burst_at_ms`, one every `BURST_SPACING_MS`, then one every `trickle_every_ms` from
    the first window boundary after the burst up to `trickle_until_ms`. `limit` is
    unused: every function of the chapter takes the same first two parameters."""
    del limit
    if burst_requests < 1 or trickle_every_ms < 1 or burst_at_ms < 0:
        raise ValueError("burst_requests and trickle_every_ms must be >= 1, burst_at_ms >= 0")
    burst = burst_at_ms + BURST_SPACING_MS * np.arange(burst_requests)
    window_ms = window_s * 1000
    start = (burst[-1] // window_ms + 1) * window_ms
    ms = np.concatenate([burst, np.arange(start, trickle_until_ms + 1, trickle_every_ms)])
    n = len(ms)
    return pd.DataFrame(
        {
            "time": ms / 1000,
            "identity": [IDENTITY] * n,
            "cost": np.ones(n, dtype=np.int64),
            "replica": np.zeros(n, dtype=np.int64),
        }
    )


def _model(tag: str, limit: int, window_s: int, burst: int | None) -> Any:
    algorithm = algorithms.get(tag)
    options = {"burst": burst} if "burst" in algorithm.extra_options else {}
    return algorithm.build("reference", window_s, limit, **options)


def decisions(
    tag: str,
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    *,
    burst: int | None = None,
    **trace_options: Any,
) -> pd.DataFrame:
    """The trace decided by a fresh reference model of `tag` (GCRA with `burst`, default
    the limit), one request at a time: `ms`, `allowed`, and `state`, a copy of what the
    model keeps for the client after the request (what the script's key holds)."""
    model = _model(tag, limit, window_s, burst)
    who = keys.identity_bytes(IDENTITY)
    rows = []
    for ms in (trace(limit, window_s, **trace_options).time * 1000).round().astype(int):
        (allowed,), *_ = model.run(who, [int(ms)], [1])
        rows.append({"ms": int(ms), "allowed": allowed, "state": copy.deepcopy(model.state[who])})
    return pd.DataFrame(rows)


# What each algorithm's key holds, read at time t (ms) if nothing more is admitted: one
# function per algorithm, (state, t, limit, window_ms, burst) -> the figure's columns.


def _read_log(state: Any, t: int, limit: int, window_ms: int, burst: int) -> dict:
    return {"in the window": sum(1 for s in state if s > t - window_ms)}  # stamps in (t - W, t]


def _read_fixed_window(state: Any, t: int, limit: int, window_ms: int, burst: int) -> dict:
    # (window number, count): the count is this window's only
    return {"count": state[1] if state[0] == math.floor(t / window_ms) else 0}


def _read_counter(state: Any, t: int, limit: int, window_ms: int, burst: int) -> dict:
    number = math.floor(t / window_ms)
    w, c, p = state
    cur, prev = (c, p) if w == number else (0, c) if w == number - 1 else (0, 0)
    estimate = prev * ((window_ms - (t - number * window_ms)) / window_ms) + cur
    return {"previous": prev, "current": cur, "estimate": estimate}


def _read_gcra(state: Any, t: int, limit: int, window_ms: int, burst: int) -> dict:
    interval = window_ms / limit  # the TAT, a float
    return {"TAT - t (ms)": max(state - t, 0.0), "tau - T (ms)": interval * (burst - 1)}


@dataclass(frozen=True)
class _Reading:
    """How the chapter reads and draws what one algorithm's key holds."""

    read: Callable[[Any, int, int, int, int], dict]
    empty: Any  # the model's state for a client it has not seen
    main: str  # the column drawn in the algorithm's colour, against the ceiling
    ceiling: str | None = None  # the column holding the ceiling (None: the limit)
    unit: str = "units"


_READINGS: Mapping[algorithms.Algorithm, _Reading] = {
    algorithms.SLIDING_LOG: _Reading(_read_log, [], "in the window"),
    algorithms.FIXED_WINDOW: _Reading(_read_fixed_window, (None, 0), "count"),
    algorithms.SLIDING_WINDOW_COUNTER: _Reading(_read_counter, (None, 0, 0), "estimate"),
    algorithms.GCRA: _Reading(_read_gcra, -math.inf, "TAT - t (ms)", "tau - T (ms)", "ms"),
}


def stored(
    tag: str,
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    *,
    burst: int | None = None,
    **trace_options: Any,
) -> pd.DataFrame:
    """What `tag`'s key holds, read at every whole ms from 0 to the end of the trace's
    last window (index `t (ms)`), from the state after the last request at or before t."""
    decided = decisions(tag, limit, window_s, burst=burst, **trace_options)
    window_ms = window_s * 1000
    end = (decided.ms.iloc[-1] // window_ms + 1) * window_ms
    grid = np.arange(0, end + 1)
    after = np.searchsorted(decided.ms.to_numpy(), grid, side="right") - 1
    burst = limit if burst is None else burst
    reading = _READINGS[algorithms.get(tag)]
    rows = [
        reading.read(
            decided.state.iloc[i] if i >= 0 else reading.empty, int(t), limit, window_ms, burst
        )
        for t, i in zip(grid, after, strict=True)
    ]
    return pd.DataFrame(rows, index=pd.Index(grid, name="t (ms)"))


def admitted_table(
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    *,
    burst: int | None = None,
    **trace_options: Any,
) -> pd.DataFrame:
    """Per algorithm: the trace's requests admitted, of the burst and in all, and the
    most admitted in any rolling window (`metrics.max_in_window`)."""
    sent = trace(limit, window_s, **trace_options)
    in_burst = trace_options.get("burst_requests", BURST_REQUESTS)
    rows = []
    for algorithm in ORDER:
        ok = decisions(algorithm.name, limit, window_s, burst=burst, **trace_options).allowed
        rows.append(
            {
                "algorithm": algorithm.label,
                f"admitted of the burst ({in_burst})": int(ok.iloc[:in_burst].sum()),
                f"admitted in all ({len(sent)})": int(ok.sum()),
                "max in any rolling window": metrics.max_in_window(
                    sent.time[ok.to_numpy()], window_s
                ),
            }
        )
    return pd.DataFrame(rows).set_index("algorithm")


def replayed_alike(limit: int = LIMIT, window_s: int = WINDOW_S) -> bool:
    """Whether stepping a model one request at a time decides as `replay` does."""
    sent = trace(limit, window_s)
    return all(
        decisions(a.name, limit, window_s).allowed.tolist()
        == replay(sent, _model(a.name, limit, window_s, None), progress=False).allowed.tolist()
        for a in ORDER
    )


# --- the scripts ------------------------------------------------------------------------


def script_source(name: str) -> str:
    """The text of `ratelimit/lua/<name>.lua` in the installed package, as Redis loads it
    between the shared prelude and epilogue (`ratelimit.scripts.source` joins them)."""
    if name not in SCRIPTS:
        raise ValueError(f"no script {name!r}: give one of {', '.join(SCRIPTS)}")
    return resources.files("ratelimit").joinpath("lua", f"{name}.lua").read_text("utf-8")


def show_script(name: str) -> Any:
    """`script_source(name)` as a Markdown Lua code block, for a notebook to display."""
    from IPython.display import Markdown

    return Markdown(f"`ratelimit/lua/{name}.lua`\n\n```lua\n{script_source(name).rstrip()}\n```")


# --- the commands, counted by running the scripts ---------------------------------------

# Written in front of a limiter's script to log every `redis.call` (and `redis.pcall`)
# it makes: the command
# and its upper-case options (NX, GET, PX, WITHSCORES...), pushed onto a list key of
# their own through the real `redis.call`; the script runs otherwise unchanged.
_COUNTING = """
local counted_redis = redis
local function counted_words(name, ...)
  local words = {string.upper(name)}
  for i = 2, select('#', ...) do
    local word = select(i, ...)
    if type(word) == 'string' and string.match(word, '^%u+$') then words[#words + 1] = word end
  end
  return table.concat(words, ' ')
end
local redis = {
  call = function(...)
    counted_redis.call('RPUSH', KEYS[2], counted_words(...))
    return counted_redis.call(...)
  end,
  pcall = function(...)
    counted_redis.call('RPUSH', KEYS[2], counted_words(...))
    return counted_redis.pcall(...)
  end,
}
"""
# The paths a check can take, each as (cost, whether the key already holds a request),
# in the order `script_commands` runs them on one key, with a limit of PATHS_LIMIT.
PATHS = {
    "opening (empty key)": 1,
    "admitted": 1,
    "admitted, cost 2": 2,
    "rejected": 2,
}
PATHS_LIMIT = 4  # 1 + 1 + 2 fills it: the last check of cost 2 is rejected
# Chapter 0's log storages, in the order the chapter shows them: the default first.
LOG_STORAGES = (algorithms.COMPACT_LOG, algorithms.SLIDING_LOG)


def script_commands(algorithm: algorithms.Algorithm) -> dict[str, list[str]]:
    """The Redis commands `algorithm`'s Lua script issues on each path of `PATHS`
    (besides the EVALSHA that runs it), found by running the real script on the
    embedded Redis and logging every `redis.call`: path -> the commands, in order."""
    from ratelimit.clock import ManualClock

    client = ratelimit.connect_sync(embedded=True)
    clock = ManualClock(1_000.0)
    limiter = algorithm.build("sync", client, WINDOW_S, PATHS_LIMIT, clock=clock)
    script = _COUNTING + limiter.script
    key, log = limiter.key_for(IDENTITY), f"commands-of:{algorithm.name}"
    found = {}
    for path, cost in PATHS.items():
        clock.advance(0.001)
        client.delete(log)
        client.eval(script, 2, key, log, *limiter.script_args(int(clock() * 1000), cost))
        found[path] = [c.decode() for c in client.lrange(log, 0, -1)]
    after = limiter.peek(IDENTITY, 1)  # the rejected check changed nothing
    if after.remaining != 0 or len(found) != len(PATHS):
        raise RuntimeError(f"{algorithm.name}: the paths did not fill the limit as planned")
    client.close()
    return found


def commands_table(entries: tuple[algorithms.Algorithm, ...] | None = None) -> pd.DataFrame:
    """Per algorithm (the log in both storages, the default first): how many commands
    its script issues on each path and which (`script_commands`), as text."""
    entries = entries or (*LOG_STORAGES, *ORDER[1:])
    rows = []
    for algorithm in entries:
        found = script_commands(algorithm)
        row: dict[str, Any] = {"algorithm": storage_label(algorithm)}
        row.update({path: f"{len(c)}: {', '.join(c)}" for path, c in found.items()})
        rows.append(row)
    return pd.DataFrame(rows).set_index("algorithm")


def storage_label(algorithm: algorithms.Algorithm) -> str:
    """How the chapter names an algorithm: the log with its storage, the default marked."""
    if algorithm.storage is None:
        return algorithm.label
    default = " (default)" if algorithm.storage == algorithms.DEFAULT_LOG_STORAGE else ""
    return f"sliding log, {algorithm.storage} storage{default}"


# --- the costs --------------------------------------------------------------------------


def memory_table() -> pd.DataFrame:
    """Chapter 3's stored measurements (`memory.STORED_TABLE`)."""
    return memory.load_table(memory.STORED_TABLE)


def costs_table(limits: tuple[int, ...] = COST_LIMITS) -> pd.DataFrame:
    """Per algorithm (the log in both storages, the default first): bytes per full key
    at each of `limits` (chapter 3's table) and the Redis commands its script issues per
    check (the registry's counts, which `script_commands` finds by running the scripts;
    `clock="redis"` adds a TIME to each)."""
    table = memory_table()
    log = algorithms.SLIDING_LOG.name
    entries = [(algorithms.COMPACT_LOG, log, "compact"), (algorithms.SLIDING_LOG, log, "script")]
    entries += [(a, a.name, "") for a in ORDER[1:]]
    rows = []
    for algorithm, tag, member_format in entries:
        sizes = memory_per_key.series(table, tag, member_format).bytes_per_key
        row = {"algorithm": storage_label(algorithm), "exact": algorithm.exact}
        row.update({f"bytes per key at limit {n:,}": int(sizes[n]) for n in limits})
        commands = algorithm.commands
        row.update(
            {
                "commands, admitted": commands.admit,
                "more per extra unit of cost": commands.per_extra_unit,
                "commands, rejected": commands.reject,
            }
        )
        rows.append(row)
    return pd.DataFrame(rows).set_index("algorithm")


# --- the figure -------------------------------------------------------------------------


def figure(
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    *,
    burst: int | None = None,
    **trace_options: Any,
) -> Figure:
    """One panel per algorithm: the trace's requests (dots admitted, crosses rejected)
    above what the key holds over time, against the line a request must stay under."""
    fig, axes = plt.subplots(len(ORDER), 1, figsize=(12, 11), sharex=True)
    window_ms = window_s * 1000
    for ax, algorithm in zip(axes, ORDER, strict=True):
        tag, color, reading = algorithm.name, COLORS[algorithm.name], _READINGS[algorithm]
        held = stored(tag, limit, window_s, burst=burst, **trace_options)
        decided = decisions(tag, limit, window_s, burst=burst, **trace_options)
        if reading.ceiling is not None:
            ceiling = held[reading.ceiling].iloc[0]
            name = reading.ceiling.removesuffix(" (ms)")
            label = f"{name} ({ceiling:g} ms): cost 1 is rejected above it"
        else:
            ceiling, label = limit, f"limit ({limit}): cost 1 is rejected at or above it"
        for column in held:
            if column == reading.ceiling:
                continue
            main = column == reading.main
            style = {"linewidth": 2} if main else {"linewidth": 1, "alpha": 0.6}
            ax.plot(
                held.index,
                held[column],
                color=color if main else None,
                label=column,
                **style,
            )
        ax.axhline(ceiling, color="black", linestyle=":", linewidth=1, label=label)
        top = ceiling * 1.35
        ok = decided.allowed.to_numpy()
        ax.scatter(decided.ms[ok], np.full(ok.sum(), top), color=color, s=25, label="admitted")
        ax.scatter(
            decided.ms[~ok],
            np.full((~ok).sum(), top),
            color="tab:red",
            marker="x",
            s=30,
            label="rejected",
        )
        for b in range(0, int(held.index[-1]) + 1, window_ms):
            ax.axvline(b, color="0.75", linestyle="--", linewidth=0.8)
        ax.set_ylim(0, top * 1.15)
        ax.set_ylabel(reading.unit)
        ax.set_title(f"{algorithm.label}: {int(ok.sum())} of {len(ok)} admitted", fontsize=10)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    axes[-1].set_xlim(max(int(decided.ms.iloc[0]) - 200, 0), held.index[-1])
    axes[-1].set_xlabel("time (ms); dashed: window boundaries")
    fig.suptitle(f"What each algorithm stores, and what it admits: limit {limit} per {window_s} s")
    fig.tight_layout()
    return fig
