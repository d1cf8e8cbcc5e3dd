"""Planning: every request of a log or trace decided under every candidate, as it
streams by, and each candidate's figures and Redis plan (`plan_log`, `plan_trace`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ratelimit import algorithms as registry
from ratelimit import validation

from .. import capacity
from ..timebase import seconds_to_ms
from .kept import KeptTrace
from .limits import _candidate_limit
from .measures import _grown, _LiveKeys
from .recommend import Recommendation, recommend, replay
from .resolution import Resolution, Spread, Stamps, is_coarse
from .results import Affected, CandidatePlan, LogPlan, LogSummary, Offender, RedisPlan, Throttled
from .servertime import (
    DEFAULT_ALGORITHMS,
    ServerTimeChoice,
    _shown_path,
    choose_server_time,
    default_memory_table,
)
from .timeline import Agents, Stretches, hours_of

DEFAULT_SHARD = capacity.DEFAULT_SHARD
"""Chapter 6's shard: 14 GiB of data, half kept free, 64 bytes of per-key overhead."""
_CHECK_WINDOW_MS = 1_000  # checks per second: the most in any rolling second


class _NoRequests(ValueError):
    """The trace holds no request."""


@dataclass
class _Candidate:
    """One candidate's replay and counts while the log is read."""

    text: str
    limit: int
    window_ms: int
    algorithm: str
    lifetime_ms: int  # how long a key outlives its last write
    replayer: Any  # fastreplay.Replayer
    peaks: Any  # windowpeaks.WindowPeaks over admitted cost
    rejected: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    refused: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    hours: np.ndarray = field(default_factory=lambda: np.zeros(24, dtype=np.int64))
    stretches: Stretches | None = None  # made with the window in __post_init__

    def __post_init__(self) -> None:
        self.stretches = Stretches(self.window_ms)

    def add(
        self,
        codes: np.ndarray,
        times: np.ndarray,
        costs: np.ndarray,
        fits: np.ndarray | None,
        n: int,
    ) -> None:
        """Decide one chunk; `fits`: the requests whose cost the limit allows at all
        (None: every one)."""
        self.rejected = _grown(self.rejected, n)
        self.refused = _grown(self.refused, n)
        if fits is not None:
            _count_into(self.refused, codes[~fits])
            if not fits.any():
                return
            codes, times, costs = codes[fits], times[fits], costs[fits]
        allowed = self.replayer.decide(codes, times, costs)[0]
        _count_into(self.rejected, codes[~allowed])
        self.peaks.add(codes[allowed], times[allowed], costs[allowed])
        self.hours += np.bincount(hours_of(times[~allowed]), minlength=24)
        self.stretches.add(codes, times, allowed)  # type: ignore[union-attr]


def _count_into(values: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """`values[code] += occurrences of code`."""
    if len(codes) * 8 >= len(values):  # many: one pass, no sort
        counts = np.bincount(codes)
        values[: len(counts)] += counts
    elif len(codes):
        found, counts = np.unique(codes, return_counts=True)
        values[found] += counts
    return values


def _only(values: np.ndarray, fits: np.ndarray | None) -> np.ndarray:
    return values if fits is None else values[fits]


def plan_trace(
    chunks: pd.DataFrame | Iterable[pd.DataFrame],
    limits: Sequence[Any],
    algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
    *,
    redis_url: str | None = None,
    measure: bool = True,
    headroom: float = DEFAULT_SHARD.headroom,
    shard_memory_bytes: float = DEFAULT_SHARD.memory_gib * 2**30,
    top: int = 10,
    memory_table: str | Path | pd.DataFrame | None = None,
    bench_record: str | Path | None = None,
    server_time: ServerTimeChoice | None = None,
    describe: Callable[[], Mapping[str, Any]] | None = None,
    affect: float | None = 0.01,
    spread_coarse: bool = True,
) -> LogPlan:
    """`plan_log` on trace tables (`time`, `identity`, `cost`): one, or an iterable of
    chunks, each sorted by time, read once. `server_time` replaces the choice
    `choose_server_time` would make; `describe()`, called once the chunks are read,
    gives what the trace cannot tell (`path`, `example`, `format`, `identity_field`,
    `problems`). `affect`: the share of clients the recommended limits may affect
    (None: no recommendation). `spread_coarse`: replay each candidate whose window the
    stamps are too coarse for with the stamps spread (`resolution.spread`). Either
    keeps the requests (`kept.KeptTrace`: in a temporary file beyond a bound)."""
    from .. import fastreplay, windowpeaks

    candidates = _candidates(limits, algorithms)
    if affect is not None and not 0 <= affect < 1:
        raise ValueError(f"affect must be a share of clients from 0 to below 1, got {affect!r}")
    kept = KeptTrace() if affect is not None or spread_coarse else None
    resolution = Resolution()
    # Per window, each identity's most requested cost in one rolling window (demand):
    # what a recommendation starts from, so not followed without one.
    windows = [c.window_ms for c in candidates] if affect is not None else []
    demand = {window_ms: windowpeaks.WindowPeaks(window_ms) for window_ms in windows}
    top = validation.count("top", top, minimum=0)
    shard = dataclasses.replace(
        DEFAULT_SHARD,
        memory_gib=validation.positive("shard_memory_bytes", shard_memory_bytes) / 2**30,
        headroom=capacity.headroom_share(headroom),  # checked before the log is read
    )
    table, table_name = _memory_table(memory_table)
    fits_of = sorted({c.limit for c in candidates})
    live = {(c.lifetime_ms, c.limit): _LiveKeys(c.lifetime_ms) for c in candidates}
    checks = {limit: windowpeaks.WindowPeaks(_CHECK_WINDOW_MS) for limit in fits_of}

    codes_of = fastreplay.Codes()
    agents = Agents()
    requests = np.zeros(0, dtype=np.int64)
    total, start, end = 0, math.inf, -math.inf
    horizon = None  # the latest ms seen so far
    for chunk in [chunks] if isinstance(chunks, pd.DataFrame) else chunks:
        seconds, times, costs, identities = _columns_of(chunk)
        if len(times) == 0:
            continue
        codes = codes_of.encode(identities)
        total += len(times)
        start, end = min(start, float(seconds.min())), max(end, float(seconds.max()))
        requests = _count_into(_grown(requests, len(codes_of)), codes)
        # Keys are counted on a clock that never goes back: a line logged earlier than
        # one already read counts at the latest time seen.
        steady = times if horizon is None else np.maximum(times, horizon)
        horizon = int(steady.max())
        # Per limit, the requests it allows at all (None: every one, the usual case).
        fits = {limit: None if costs.max() <= limit else costs <= limit for limit in fits_of}
        for (_, limit), keys in live.items():
            keys.add(_only(codes, fits[limit]), _only(steady, fits[limit]))
        one_code, every = np.zeros(len(times), dtype=np.int64), np.ones(len(times), dtype=np.int64)
        for limit, peaks in checks.items():
            peaks.add(one_code, times, every if fits[limit] is None else fits[limit])
        for cand in candidates:
            cand.add(codes, times, costs, fits[cand.limit], len(codes_of))
        for peaks in demand.values():
            peaks.add(codes, times, costs)
        agents.add(codes, chunk)
        resolution.add(times)
        if kept is not None:
            kept.add(codes, times, costs)
    if total == 0:
        raise _NoRequests("there are no requests to plan on")

    found = dict(describe() if describe is not None else {})
    log = LogSummary(
        path=str(found.get("path", "(a trace in memory)")),
        example=bool(found.get("example", False)),
        format=str(found.get("format", "trace")),
        identity_field=str(found.get("identity_field", "identity")),
        cost=str(found.get("cost", "cost")),
        requests=total,
        identities=len(codes_of),
        start=start,
        end=end,
        problems=found.get("problems"),
        where=found.get("where"),
        resolution_ms=resolution.ms,
    )
    if server_time is None:
        names = list(dict.fromkeys(c.algorithm for c in candidates))
        server_time = choose_server_time(
            names, redis_url=redis_url, measure=measure, bench_record=bench_record
        )
    requests = requests[: len(codes_of)]
    agent_of = agents.most_frequent() if agents.seen else None
    planned = tuple(
        _finish(
            cand,
            codes_of,
            requests,
            live[(cand.lifetime_ms, cand.limit)].peak,
            int(_peaks(checks[cand.limit], 1)[0]),
            log,
            table,
            server_time,
            shard,
            top,
            agent_of,
        )  # fmt: skip
        for cand in candidates
    )
    planned = _spread_coarse(planned, kept if spread_coarse else None, resolution.ms, len(codes_of))
    client_peaks = {w: _peaks(peaks, len(codes_of)) for w, peaks in demand.items()}
    recommended: tuple[Recommendation, ...] = ()
    if kept is not None and affect is not None:
        pairs = dict.fromkeys((c.algorithm, c.window_ms) for c in candidates)
        recommended = tuple(
            recommend(kept, name, window_ms, client_peaks[window_ms], affect)
            for name, window_ms in pairs
        )
    if kept is not None:
        kept.close()  # its temporary file goes now, not when it is collected
    return LogPlan(
        log, server_time, shard, table_name, planned, top, affect, recommended, client_peaks
    )


def _spread_coarse(
    planned: tuple[CandidatePlan, ...], kept: KeptTrace | None, resolution_ms: int, n: int
) -> tuple[CandidatePlan, ...]:
    """Each candidate whose window the stamps are too coarse for, with `stamps`: its
    rejected counts as planned and replayed with the stamps spread (when kept)."""
    counted = None  # the stamps' requests, counted once for every candidate
    out = []
    for c in planned:
        window_ms = round(c.window_s * 1000)
        if not is_coarse(resolution_ms, window_ms):
            out.append(c)
            continue
        again = None
        if kept is not None:
            if counted is None:
                counted = Stamps((times for _, times, _ in kept.blocks()), resolution_ms)
            again = replay(kept, c.algorithm, c.limit, window_ms, n, counted)
        stamps = Spread(
            resolution_ms=resolution_ms,
            rejected=c.rejected,
            rejected_spread=None if again is None else again.rejected,
            identities_rejected=c.identities_rejected,
            identities_rejected_spread=(
                None if again is None else int(np.count_nonzero(again.rejected_by_code))
            ),
        )
        out.append(dataclasses.replace(c, stamps=stamps))
    return tuple(out)


def _candidates(limits: Sequence[Any], algorithms: Sequence[str]) -> list[_Candidate]:
    """One `_Candidate` per distinct limit and algorithm, in the order given."""
    from .. import fastreplay, windowpeaks

    names = list(dict.fromkeys(registry.get(a).name for a in algorithms))
    if not names:
        raise ValueError("give at least one algorithm")
    specs: dict[tuple[int, int], str] = {}
    for spec in limits:
        text, limit, window_ms = _candidate_limit(spec)
        specs.setdefault((limit, window_ms), text)  # "100/min" and "100/minute" are one
    if not specs:
        raise ValueError("give at least one limit, e.g. '100/min'")
    candidates = []
    for (limit, window_ms), text in specs.items():
        for name in names:
            # The reference model checks the options as every limiter does (the log's
            # largest limit, the fixed window's range), with the same messages.
            try:
                model = registry.get(name).build("reference", window_ms=window_ms, limit=limit)
                replayer = fastreplay.Replayer.for_model(model)
            except ValueError as exc:
                raise ValueError(f"limit {text!r} with algorithm {name!r}: {exc}") from None
            peaks = windowpeaks.WindowPeaks(window_ms)
            candidates.append(
                _Candidate(text, limit, window_ms, name, model.state_ttl_ms(), replayer, peaks)
            )
    return candidates


def _columns_of(chunk: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    """A chunk's seconds, whole-ms times, costs and identities (a categorical column as
    it is), checked."""
    needed = ("time", "identity", "cost")
    missing = [c for c in needed if c not in getattr(chunk, "columns", ())]
    if missing:
        raise ValueError(f"a trace chunk must be a DataFrame with {needed}; it lacks {missing}")
    seconds = chunk["time"].to_numpy(dtype=np.float64)
    times = seconds_to_ms(seconds)
    if len(times) > 1 and (times[1:] < times[:-1]).any():
        raise ValueError("a trace chunk must be sorted by time")
    costs = chunk["cost"].to_numpy()
    if costs.dtype.kind not in "iu":
        raise ValueError(f"cost must be integers, got dtype {costs.dtype}")
    if len(costs) and costs.min() < 1:
        raise ValueError("a request's cost must be >= 1")
    identities = chunk["identity"]
    if not isinstance(identities.dtype, pd.CategoricalDtype):
        identities = identities.to_numpy(dtype=object)
    return seconds, times, costs.astype(np.int64), identities


def _memory_table(given: Any) -> tuple[pd.DataFrame, str]:
    """The bytes-per-key table and where it comes from."""
    from .. import memory

    if isinstance(given, pd.DataFrame):
        return given, "(a table given in memory)"
    path = Path(given) if given is not None else default_memory_table()
    if not path.exists():
        raise ValueError(
            f"no measured bytes-per-key table at {path}: chapter 3 (`make refresh`) writes "
            "it; give another with memory_table="
        )
    return memory.load_table(path), _shown_path(path)


def _peaks(peaks: Any, size: int) -> np.ndarray:
    """A WindowPeaks' peaks for codes 0..size-1 (0 for codes it never saw)."""
    values = np.asarray(peaks.peaks, dtype=np.int64)[:size]
    return np.concatenate((values, np.zeros(size - len(values), dtype=np.int64)))


def _key_bytes(table: pd.DataFrame, algorithm: str, entries: np.ndarray) -> np.ndarray:
    """`capacity.bytes_per_key` of each key, holding `entries` (at least 1) each.

    It is asked only at the table's measured sizes and at the smallest and largest
    size wanted: between measured rows it interpolates linearly, and beyond the last it
    is linear too (proportional, or flat), so `np.interp` between those answers gives
    its answer at every size, without a table lookup per distinct size."""
    rows = table[table["algorithm"] == algorithm]
    sizes = np.maximum(np.asarray(entries, dtype=np.float64), 1.0)
    if sizes.size == 0:
        return sizes
    anchors = np.unique(np.concatenate((rows["entries"].to_numpy(dtype=np.float64),
                                        [sizes.min(), sizes.max()])))  # fmt: skip
    anchors = anchors[anchors >= 1]
    values = [capacity.bytes_per_key(rows, algorithm, float(x)) for x in anchors]
    return np.interp(sizes, anchors, values)


def _finish(
    cand: _Candidate,
    codes_of: Any,
    requests: np.ndarray,
    keys: int,
    peak_checks: int,
    log: LogSummary,
    table: pd.DataFrame,
    server_time: ServerTimeChoice,
    shard: capacity.Shard,
    top: int,
    agent_of: Mapping[int, str] | None,
) -> CandidatePlan:
    n = len(requests)
    rejected = cand.rejected[:n]
    refused = cand.refused[:n]
    peaks = _peaks(cand.peaks, n)
    affected = np.flatnonzero((rejected > 0) | (refused > 0))
    names = np.array([codes_of.identity(int(i)) for i in affected], dtype=object)
    ranked = affected[np.lexsort((names, -requests[affected]))] if len(affected) else affected
    busiest = tuple(
        Affected(
            str(codes_of.identity(int(i))),
            int(requests[i]),
            int(rejected[i]),
            int(refused[i]),
            int(peaks[i]),
        )
        for i in ranked[:top]
    )
    peak_at = int(np.argmax(peaks))
    checked = int(requests.sum() - refused.sum())
    redis_plan = None
    if checked:
        redis_plan = _redis_plan(
            cand, keys, peaks[requests - refused > 0], peak_checks, checked, log,
            table, server_time, shard,
        )  # fmt: skip
    return CandidatePlan(
        limit_text=cand.text,
        limit=cand.limit,
        window_s=cand.window_ms / 1000,
        algorithm=cand.algorithm,
        requests=int(requests.sum()),
        rejected=int(rejected.sum()),
        refused=int(refused.sum()),
        identities=n,
        identities_rejected=int(np.count_nonzero(rejected)),
        identities_refused=int(np.count_nonzero(refused)),
        peak_admitted=int(peaks[peak_at]),
        peak_identity=str(codes_of.identity(peak_at)) if peaks[peak_at] > 0 else None,
        busiest_affected=busiest,
        redis=redis_plan,
        rejected_by_hour=tuple(int(h) for h in cand.hours),
        **_when_and_who(cand, codes_of, requests, rejected, top, agent_of),
    )


def _when_and_who(
    cand: _Candidate,
    codes_of: Any,
    requests: np.ndarray,
    rejected: np.ndarray,
    top: int,
    agent_of: Mapping[int, str] | None,
) -> dict[str, Any]:
    """A candidate's longest throttled stretches and the identities it rejected most
    (ties: more requests first, then by name), each list `top` long."""
    longest, since, until = cand.stretches.longest(len(requests))  # type: ignore[union-attr]
    names = np.array([str(codes_of.identity(i)) for i in range(len(requests))], dtype=object)
    throttled = np.flatnonzero(since >= 0)
    ranked = throttled[np.lexsort((names[throttled], -longest[throttled]))][:top]
    stretches = tuple(
        Throttled(
            names[i], longest[i] / 1000, since[i] / 1000, until[i] / 1000, int(rejected[i]),
        )  # fmt: skip
        for i in ranked
    )
    hit = np.flatnonzero(rejected > 0)
    ranked = hit[np.lexsort((names[hit], -requests[hit], -rejected[hit]))][:top]
    offenders = tuple(
        Offender(
            names[i], None if agent_of is None else agent_of.get(int(i)), int(requests[i]),
            int(rejected[i]), longest[i] / 1000,
        )  # fmt: skip
        for i in ranked
    )
    return {"longest_throttled": stretches, "offenders": offenders}


def _redis_plan(
    cand: _Candidate,
    keys: int,
    peaks: np.ndarray,
    peak_checks: int,
    checked: int,
    log: LogSummary,
    table: pd.DataFrame,
    server_time: ServerTimeChoice,
    shard: capacity.Shard,
) -> RedisPlan:
    per_key = _key_bytes(table, cand.algorithm, peaks)
    heaviest = np.sort(per_key)[::-1][:keys]
    mean_bytes = float(heaviest.mean())
    options = shard.plan_options()
    mean_checks = checked / max(log.duration_s, 1.0)
    us = server_time.us_per_check(cand.algorithm)
    if us is not None:
        planned = capacity.plan_fleet(
            cand.algorithm,
            active_keys=keys,
            rate_per_key=peak_checks / keys,
            bytes_per_key=mean_bytes,
            us_per_check=us,
            **options,
        )
        return RedisPlan(
            keys=keys,
            key_lifetime_s=cand.lifetime_ms / 1000,
            bytes_per_key=planned.bytes_per_key,
            memory_bytes=planned.memory_bytes,
            peak_checks_per_s=peak_checks,
            mean_checks_per_s=mean_checks,
            us_per_check=us,
            redis_cpu_cores=planned.redis_cpu_cores,
            commands_per_s=planned.commands_per_s,
            shard_checks_per_s=planned.shard_checks_per_s,
            shards_for_memory=planned.shards_for_memory,
            shards_for_checks=planned.shards_for_checks,
            shards=planned.shards,
            keys_per_shard=planned.keys_per_shard,
        )
    overhead = options["key_overhead_bytes"]
    memory_bytes = capacity.fleet_memory_bytes(keys, mean_bytes, key_overhead_bytes=overhead)
    return RedisPlan(
        keys=keys,
        key_lifetime_s=cand.lifetime_ms / 1000,
        bytes_per_key=memory_bytes / keys,
        memory_bytes=memory_bytes,
        peak_checks_per_s=peak_checks,
        mean_checks_per_s=mean_checks,
        us_per_check=None,
        redis_cpu_cores=None,
        commands_per_s=peak_checks * capacity.script_commands(cand.algorithm, True),
        shard_checks_per_s=None,
        shards_for_memory=capacity.shards_needed(
            memory_bytes, options["shard_memory_bytes"], options["headroom"]
        ),
        shards_for_checks=None,
        shards=None,
        keys_per_shard=None,
    )


def plan_log(
    path: str | Path,
    limits: Sequence[Any],
    algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
    *,
    format: str | None = None,
    identity: str | None = None,
    cost: str | Callable[[dict[str, Any]], int] | None = None,
    time: str | None = None,
    redis_url: str | None = None,
    measure: bool = True,
    headroom: float = DEFAULT_SHARD.headroom,
    shard_memory_bytes: float = DEFAULT_SHARD.memory_gib * 2**30,
    top: int = 10,
    progress: bool | None = None,
    reorder_s: float = 300.0,
    chunk_lines: int = 1_000_000,
    read_ahead: int = 1,
    memory_table: str | Path | pd.DataFrame | None = None,
    bench_record: str | Path | None = None,
    example: bool = False,
    affect: float | None = 0.01,
    spread_coarse: bool = True,
) -> LogPlan:
    """Plan each candidate of `limits` ("100/min", ...) x `algorithms` on the access log
    at `path`, read once in chunks of `chunk_lines` (see the module docstring for every
    figure). `format`, `identity`, `cost`, `time`, `reorder_s`, `progress` and
    `read_ahead` go to `accesslog.LogReader`. The Redis plan measures server time on
    `redis_url` unless `measure` is False (see `choose_server_time`), and sizes shards of
    `shard_memory_bytes` keeping `headroom` free. `top`: how many of the busiest
    identities affected each candidate lists. `example` marks the lab's
    example log in the report. `affect`: the share of clients a recommended limit may
    affect (None: no recommendation); `spread_coarse`: see `plan_trace`.
    LogFormatError (a ValueError) for a file that is not a log or holds no request;
    ValueError for bad options."""
    from .. import accesslog

    limits = list(limits)
    for spec in limits:
        _candidate_limit(spec)  # bad limits fail before the log is read
    options: dict[str, Any] = dict(format=format, identity=identity, cost=cost, time=time)
    options |= dict(chunk_lines=chunk_lines, reorder_s=reorder_s, progress=progress)
    options |= dict(read_ahead=read_ahead)
    options |= dict(identity_dtype="category")  # grouped by code, never by text
    reader = accesslog.LogReader(path, **options)
    if reader.format == "combined":  # the offenders are named with their user agent
        reader = accesslog.LogReader(
            path, **options | {"format": reader.format}, fields=("agent",)
        )

    describe = describer(reader, str(path), example, cost)

    try:
        return plan_trace(
            reader, limits, algorithms, redis_url=redis_url, measure=measure, headroom=headroom,
            shard_memory_bytes=shard_memory_bytes, top=top, memory_table=memory_table,
            bench_record=bench_record, describe=describe, affect=affect,
            spread_coarse=spread_coarse,
        )  # fmt: skip
    except _NoRequests:
        summary = reader.problems.summary()
        raise accesslog.LogFormatError(f"{path} holds no request to plan on: {summary}") from None


def describer(source: Any, path: str, example: bool, cost: Any) -> Callable[[], dict[str, Any]]:
    """`plan_trace`'s `describe` for a log read by `source` (a reader, or several read as
    one): what the trace cannot tell, asked once the reading is done."""

    def describe() -> dict[str, Any]:
        return {
            "path": path,
            "example": example,
            "format": source.format,
            "identity_field": source.identity_field,
            "cost": _cost_label(cost),
            "problems": source.problems,
        }

    return describe


def _cost_label(cost: Any) -> str:
    """How a request's cost is read, as the plan shows it."""
    if cost is None:
        return "1 per request"
    if isinstance(cost, str):
        return cost
    spec = getattr(cost, "spec", None)  # a cost function named on the command line
    if isinstance(spec, str):
        return spec
    return getattr(cost, "__qualname__", None) or repr(cost)
