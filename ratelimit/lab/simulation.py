"""Replaying traffic through a limiter in virtual time: `replay` and `replay_async`.

Data flows one way: a traffic table (see `ratelimit.lab.traffic`) goes in, the same
table with the decisions added comes out, ready for `ratelimit.lab.metrics`.

Time. Each request is decided at its own `time` (seconds), plus its replica's clock
error: a `clock_offset` column (seconds) when the table has one, plus `offsets[replica]`
when given. A limiter built with `clock="redis"` stands for replicas that all read
one true clock, so it is driven by `time` alone. A Redis limiter is never changed by a
replay: the replay drives a copy of it (`limiter.with_options(clock=..., ...)`) that
talks to the same Redis, so keys and state are shared, options are not.

Expiry. Redis expires keys in real time, while a replay runs in virtual time, faster
or slower. A key whose TTL ran out in real time before the virtual window closed
would silently drop in-window entries, and decisions would then depend on how fast
the machine is. So the copy that replays adds `ttl_slack_ms` (default one hour of
real time) to every TTL: a key outlives its virtual expiry, which never changes a
decision, because each script already ignores state that has aged out of its window.
Unless `keep_state=True`, the replayed identities' keys (or the model's state) are
deleted afterwards, so a replay leaves nothing behind.

Speed. A reference model's replay runs compiled (`ratelimit.lab.fastreplay`): the
same decisions and the same `model.state` afterwards as the model's own `run`, which
property tests hold them to, tens of times faster. `compiled=False` (or
`simulation.COMPILED = False`) replays through the model's `run` instead.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ratelimit import keys
from ratelimit.clock import REDIS, ManualClock

from .reference.base import ReferenceLimiter
from .timebase import seconds_to_ms

INPUT_COLUMNS = ("time", "identity", "cost", "replica")
DECISION_COLUMNS = ("allowed", "remaining", "retry_after_ms", "degraded")
_DTYPES = (bool, np.int64, np.int64, bool)
Columns = tuple[list, list, list, list]
REPLAY_TTL_SLACK_MS = 3_600_000
PROGRESS_MIN_ROWS = 100_000
# A reference model replays compiled unless a replay says otherwise (`compiled=`).
COMPILED = True
# Rows per compiled call: the progress bar moves between calls.
_COMPILED_CHUNK = 1 << 20


@dataclass
class _Plan:
    """The trace in decision order: row positions, whole-ms times, costs, identities."""

    order: np.ndarray | slice  # slice(None): the table is already in decision order
    now_ms: np.ndarray
    costs: np.ndarray
    identities: np.ndarray  # object array, one entry per row, in decision order
    codes: np.ndarray  # identity codes 0..k-1 per row, in order of first appearance
    uniques: np.ndarray  # the identity of each code
    identity_keys: list[bytes]  # and as the model keys its state (`keys.identity_bytes`)


def _plan(traffic: pd.DataFrame, limiter: Any, offsets: Mapping[int, float] | None) -> _Plan:
    missing = [c for c in INPUT_COLUMNS if c not in traffic.columns]
    if missing:
        raise ValueError(f"traffic is missing column(s) {missing}; it needs {list(INPUT_COLUMNS)}")
    times = traffic["time"].to_numpy(dtype=float, copy=True)
    if limiter.clock != REDIS:
        if "clock_offset" in traffic.columns:
            times = times + traffic["clock_offset"].to_numpy(dtype=float)
        if offsets:
            replica = traffic["replica"].to_numpy()
            times = times + np.array([offsets.get(int(r), 0.0) for r in replica], dtype=float)
    costs = traffic["cost"].to_numpy()
    if not np.issubdtype(costs.dtype, np.integer):
        raise ValueError(f"traffic 'cost' must be integers, got dtype {costs.dtype}")
    if len(costs) and (costs.min() < 1 or costs.max() > limiter.limit):
        raise ValueError(f"traffic 'cost' must be between 1 and the limit ({limiter.limit})")
    if len(costs) and hasattr(limiter, "burst") and costs.max() > limiter.burst:
        raise ValueError(f"traffic 'cost' must be <= burst ({limiter.burst})")
    # Decide in the order of the true time; ties keep the table's order.
    order: np.ndarray | slice = np.argsort(traffic["time"].to_numpy(dtype=float), kind="stable")
    if (order[1:] > order[:-1]).all():
        order = slice(None)  # already in order (as generated traces are): no reshuffling
    now_ms = seconds_to_ms(times)  # as clock.to_ms does, row by row
    identities = traffic["identity"].to_numpy(dtype=object)[order]
    codes, uniques = pd.factorize(identities)
    # ValueError for an empty or non-text identity (None or NaN too, which have no code).
    identity_keys = [keys.identity_bytes(who) for who in uniques]
    if (codes < 0).any():
        keys.identity_bytes(identities[codes < 0][0])
    return _Plan(
        order, now_ms[order], costs[order].astype(np.int64), identities, codes, uniques,
        identity_keys,
    )  # fmt: skip


def _result(traffic: pd.DataFrame, plan: _Plan, columns: Columns) -> pd.DataFrame:
    # Copy-on-write: the result shares the traffic's columns until either is written,
    # and the decision columns are new arrays, so the traffic is never changed.
    out = traffic.copy(deep=False)
    for name, values, dtype in zip(DECISION_COLUMNS, columns, _DTYPES, strict=True):
        column = np.empty(len(traffic), dtype=dtype)
        column[plan.order] = np.asarray(values, dtype=dtype)
        out[name] = column
    return out


def _progress(total: int, progress: bool | None, **units: Any):
    """A tqdm bar for long replays, silent under pytest/nbval or RATELIMIT_PROGRESS=0;
    `units` are tqdm's (`unit="B", unit_scale=True` for bytes; requests by default)."""
    if progress is None:
        progress = (
            total >= PROGRESS_MIN_ROWS
            and os.environ.get("RATELIMIT_PROGRESS", "1") != "0"
            and "PYTEST_CURRENT_TEST" not in os.environ
        )
    if not progress:
        # tqdm.auto warns (with a file path) when ipywidgets is missing: in a notebook
        # that warning would land in the compared output, so a silent bar uses tqdm.std.
        from tqdm.std import tqdm as silent

        return silent(total=total, disable=True)
    from tqdm.auto import tqdm

    return tqdm(total=total, leave=False, **({"unit": "req"} | units))


def _driven(limiter: Any, ttl_slack_ms: int) -> tuple[Any, ManualClock]:
    """A copy of a Redis limiter on a virtual clock, with the replay's TTL slack (the
    limiter itself is left as it was), and that clock."""
    clock = ManualClock()
    slack = max(ttl_slack_ms, limiter.ttl_slack_ms)
    return limiter.with_options(clock=clock, ttl_slack_ms=slack), clock


def _replay_model(limiter: ReferenceLimiter, plan: _Plan, bar) -> Columns:
    """Each identity's requests in one tight loop of the model's `run`."""
    n = len(plan.now_ms)
    codes = plan.codes
    by_identity = np.argsort(codes, kind="stable")
    bounds = [0, *(np.flatnonzero(np.diff(codes[by_identity])) + 1).tolist(), n]
    times, costs = plan.now_ms[by_identity].tolist(), plan.costs[by_identity].tolist()
    allowed: list[bool] = []
    remaining: list[int] = []
    retry: list[int] = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        if lo == hi:
            continue
        who = plan.identity_keys[codes[by_identity[lo]]]
        a, r, w, _ = limiter.run(who, times[lo:hi], costs[lo:hi])
        allowed += a
        remaining += r
        retry += w
        bar.update(hi - lo)
    # Back from identity order to decision order, in one vectorized step each.
    columns = []
    for values in (allowed, remaining, retry):
        column = np.empty(n, dtype=bool if values is allowed else np.int64)
        column[by_identity] = values
        columns.append(column)
    return columns[0], columns[1], columns[2], np.zeros(n, dtype=bool)  # a model never degrades


def _replay_compiled(
    limiter: ReferenceLimiter, plan: _Plan, bar, keep_state: bool
) -> Columns | None:
    """The model's decisions, compiled (`fastreplay`), with the identities' state taken
    from `limiter.state` and, when kept, put back in its format. None where the
    compiled arithmetic could not be exact (see `fastreplay`): the model decides."""
    from . import fastreplay  # numba loads on first use, not with the lab

    if type(limiter).run is not limiter.algorithm.limiter_class("reference").run:
        return None  # a model with its own `run`: only it knows its decisions
    who = plan.identity_keys
    if len(set(who)) < len(who):
        return None  # str and bytes spellings of one identity: the model's own order
    if len(plan.now_ms) and np.abs(plan.now_ms).max() >= fastreplay.MAX_EXACT_MS:
        return None
    try:
        replayer = fastreplay.Replayer.for_model(limiter)
    except ValueError:
        return None
    state = limiter.state
    if state:
        for code, key in enumerate(who):
            if key in state:
                replayer.set_state(code, state[key])
    n = len(plan.now_ms)
    codes = plan.codes.astype(np.int64, copy=False)
    columns = (np.empty(n, dtype=bool), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64))
    for lo in range(0, n, _COMPILED_CHUNK):
        hi = min(lo + _COMPILED_CHUNK, n)
        decided = replayer.decide(codes[lo:hi], plan.now_ms[lo:hi], plan.costs[lo:hi])
        for column, values in zip(columns, decided, strict=True):
            column[lo:hi] = values
        bar.update(hi - lo)
    if keep_state:
        for code in replayer.seen():
            value, key = replayer.state(code), who[code]
            if value is None:
                continue
            if isinstance(value, list) and isinstance(state.get(key), list):
                state[key][:] = value  # the log's list is changed in place, as `run` does
            else:
                state[key] = value
    return columns[0], columns[1], columns[2], np.zeros(n, dtype=bool)


def _forget(limiter: Any, plan: _Plan) -> list[list[str]]:
    """Drop a model's state for the replayed identities, or list a Redis limiter's keys
    to delete, in batches."""
    if isinstance(limiter, ReferenceLimiter):
        state = limiter.state
        if state:  # the plan already holds each identity as the model keys it
            for key in plan.identity_keys:
                state.pop(key, None)
        return []
    stale = [limiter.key_for(who) for who in plan.uniques]
    return [stale[i : i + 1000] for i in range(0, len(stale), 1000)]


def _rows(plan: _Plan):
    """(now_ms, cost, identity) per request, in decision order."""
    return zip(plan.now_ms.tolist(), plan.costs.tolist(), plan.identities, strict=True)


def replay(
    traffic: pd.DataFrame,
    limiter: Any,
    *,
    offsets: Mapping[int, float] | None = None,
    keep_state: bool = False,
    ttl_slack_ms: int = REPLAY_TTL_SLACK_MS,
    progress: bool | None = None,
    compiled: bool | None = None,
) -> pd.DataFrame:
    """Decide every request of `traffic` with `limiter`; return the table with
    `allowed`, `remaining`, `retry_after_ms` and `degraded` (the failure policy
    decided, Redis could not be asked) added: same rows, same order.

    `limiter` is a reference model (`ratelimit.lab.reference`, fast) or a synchronous
    Redis limiter (`ratelimit.sync`); use `replay_async` for the asyncio ones. A model
    replays compiled (`compiled=None` follows `COMPILED`) or, `compiled=False`,
    through its own `run`: the same decisions and state either way.
    """
    if not isinstance(limiter, ReferenceLimiter) and _is_async(limiter):
        raise TypeError("an asyncio limiter needs `await replay_async(traffic, limiter)`")
    plan = _plan(traffic, limiter, offsets)
    with _progress(len(plan.now_ms), progress) as bar:
        if isinstance(limiter, ReferenceLimiter):
            columns = None
            if COMPILED if compiled is None else compiled:
                columns = _replay_compiled(limiter, plan, bar, keep_state)
            if columns is None:
                columns = _replay_model(limiter, plan, bar)
        else:
            driven, clock = _driven(limiter, ttl_slack_ms)
            columns = ([], [], [], [])
            for now, cost, who in _rows(plan):
                clock.set_ms(now)
                _append(columns, driven.check(who, cost))
                bar.update()
    if not keep_state:
        for batch in _forget(limiter, plan):
            limiter.redis.delete(*batch)
    return _result(traffic, plan, columns)


async def replay_async(
    traffic: pd.DataFrame,
    limiter: Any,
    *,
    offsets: Mapping[int, float] | None = None,
    keep_state: bool = False,
    ttl_slack_ms: int = REPLAY_TTL_SLACK_MS,
    progress: bool | None = None,
    compiled: bool | None = None,
) -> pd.DataFrame:
    """`replay` for an asyncio Redis limiter (`ratelimit.SlidingWindowLimiter` etc.)."""
    if isinstance(limiter, ReferenceLimiter) or not _is_async(limiter):
        return replay(
            traffic,
            limiter,
            offsets=offsets,
            keep_state=keep_state,
            ttl_slack_ms=ttl_slack_ms,
            progress=progress,
            compiled=compiled,
        )
    plan = _plan(traffic, limiter, offsets)
    driven, clock = _driven(limiter, ttl_slack_ms)
    with _progress(len(plan.now_ms), progress) as bar:
        columns: Columns = ([], [], [], [])
        for now, cost, who in _rows(plan):
            clock.set_ms(now)
            _append(columns, await driven.check(who, cost))
            bar.update()
    if not keep_state:
        for batch in _forget(limiter, plan):
            await limiter.redis.delete(*batch)
    return _result(traffic, plan, columns)


def _append(columns: Columns, decision: Any) -> None:
    columns[0].append(decision.allowed)
    columns[1].append(decision.remaining)
    columns[2].append(decision.retry_after_ms)
    columns[3].append(decision.degraded)


def _is_async(limiter: Any) -> bool:
    return inspect.iscoroutinefunction(limiter.check)
