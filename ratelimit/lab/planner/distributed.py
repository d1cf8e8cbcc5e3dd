"""The planner on a Dask cluster (`plan_on_dask`, `plan_logs(..., engine="dask")`): the
same plan as the local engine, key for key, with reading and replay spread over workers.

Two rounds of tasks:

1. one task per file reads it (`accesslog.LogReader`, as the local engine does) and
   splits its requests by identity into partitions (a stable hash of the identity, so
   one identity's requests all land in one partition, whatever file they come from);
   each row keeps its place in the merged order (`sources`: key, file, position);
2. one task per partition gathers its rows from every file, puts them in the merged
   order, and replays them under every candidate with the same compiled kernels
   (`fastreplay.Replayer`, `windowpeaks.WindowPeaks`) and the same per-candidate
   bookkeeping as `plan_trace`.

Per-identity figures (requests, rejected, refused, peak admitted, the longest
throttled stretch, the most frequent user agent, each window's demand peak) belong to
one partition each and are put together in the order the local engine first meets the
identities, so ties (the peak identity, the lists of offenders) fall the same way.
Rejections by hour add up; the stamp resolution is the finest any partition found
(each of `resolution.RESOLUTIONS_MS` divides the coarser ones). The figures that span
identities are combined exactly, not estimated: each partition returns the changes,
millisecond by millisecond, in its number of live keys (a key lives from a request
until the identity's next request or the key lifetime, whichever is first), which
summed and accumulated give the most keys alive at once; and its checks per
millisecond, which the client replays through the same rolling-second `WindowPeaks`
the local engine uses. Memory per key then follows as in `plan_trace`.

The recommendation bisects on the limit at the client, and each limit it tries is
replayed on every partition's requests (kept on the workers) and the rejected,
refused and affected counts summed: a limiter decides each identity on its own, so
this is the replay of the whole log. Spreading whole-second stamps (`resolution.spread`)
numbers the requests sharing a stamp across every identity, so when a candidate's
window is too coarse for the stamps, the requests are gathered at the client in the
merged order (20 bytes a request, kept as the local engine keeps them) and the spread
replays and the recommendation run there, by the local engine's code.

Memory: the cluster holds the requests of the logs (about 70 bytes a request, plus
each file's identity names and user agents) between the two rounds, and 48 bytes a
request until the plan is made; the client, one record per
identity and candidate, as the local engine. Reading is spread by file (a gzip file
cannot be split), so a log set should hold at least as many files as there are
workers. Workers must run this package (the same version) and read the logs at the
same paths as the client: on an existing cluster, a shared file system.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ratelimit import validation

from .. import capacity
from .kept import KeptTrace
from .planning import (
    _CHECK_WINDOW_MS,
    _Candidate,
    _candidates,
    _cost_label,
    _count_into,
    _finish,
    _memory_table,
    _peaks,
    _spread_coarse,
)
from .recommend import Outcome, Recommendation, recommend, replay
from .resolution import RESOLUTIONS_MS, Resolution, is_coarse
from .results import LogPlan, LogSummary
from .servertime import DEFAULT_ALGORITHMS, choose_server_time
from .sources import KeyedRows, keyed_chunks, merged_problems, open_reader, shown_paths
from .timeline import Agents

DEFAULT_MAX_WORKERS = 4  # a local cluster's workers when none are asked for: at most this


def partition_of(identities: np.ndarray, partitions: int) -> np.ndarray:
    """Each identity's partition, 0..partitions-1: a hash that is the same in every
    process (Python's own `hash` of a string is not)."""
    hashed = pd.util.hash_array(np.asarray(identities, dtype=object), categorize=True)
    return (hashed % np.uint64(partitions)).astype(np.int64)


_Piece = tuple[KeyedRows, np.ndarray, np.ndarray]
"""One file's rows of one partition: `identity` and `agent` hold codes into the
identities and user agents given."""


def _read_file(
    path: str, file: int, partitions: int, options: Mapping[str, Any]
) -> tuple[list[_Piece | None], dict[str, Any]]:
    """Round 1: one file's requests, per partition, and what its reader found.
    Identities and user agents travel as small integer codes and one table of names
    per piece, which costs far less to send between processes than a string per
    request."""
    from .. import fastreplay

    reader = open_reader(path, progress=False, **options)
    names = fastreplay.Codes()
    partition = np.zeros(0, dtype=np.int64)  # per code of this file
    parts: list[list[KeyedRows]] = [[] for _ in range(partitions)]
    for rows in keyed_chunks(reader, file):
        known = len(names)
        rows.identity = names.encode(rows.identity)
        if len(names) > known:
            fresh = np.array(names.identities()[known:], dtype=object)
            partition = np.concatenate((partition, partition_of(fresh, partitions)))
        where = partition[rows.identity]
        order = np.argsort(where, kind="stable")
        bounds = np.searchsorted(where[order], np.arange(partitions + 1))
        for p in range(partitions):
            if bounds[p + 1] > bounds[p]:
                parts[p].append(rows.take(order[bounds[p] : bounds[p + 1]]))
    about = {
        "format": reader.format,
        "identity_field": reader.identity_field,
        "problems": reader.problems,
    }
    every = np.array(names.identities(), dtype=object)
    pieces: list[_Piece | None] = []
    for found in parts:
        if not found:
            pieces.append(None)
            continue
        rows = KeyedRows.concat(found)
        used, rows.identity = np.unique(rows.identity, return_inverse=True)
        # A missing agent names none, as "" does (`timeline.Agents`).
        text = pd.Series(rows.agent, dtype=object).fillna("").astype(str).to_numpy()
        agents, rows.agent = np.unique(text, return_inverse=True)
        pieces.append((rows, every[used], agents.astype(object)))
    return pieces, about


def _piece(read: tuple[list[_Piece | None], dict[str, Any]], p: int) -> _Piece | None:
    """Partition `p`'s piece of one file read by `_read_file`."""
    return read[0][p]


def _about(read: tuple[list[_Piece | None], dict[str, Any]]) -> dict[str, Any]:
    """What `_read_file`'s reader found."""
    return read[1]


def _live_changes(codes: np.ndarray, keys: np.ndarray, lifetime: int) -> np.ndarray:
    """Per ms, the change in live keys, as (ms, change) rows: each request opens a
    share of its identity's alive time, [key, min(next key of the identity, key + L)),
    as `measures._LiveKeys` counts them; `keys` in merged order (never going back)."""
    if len(codes) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    order = np.argsort(codes, kind="stable")
    c, t = codes[order], keys[order]
    ends = t + lifetime
    same = c[1:] == c[:-1]
    ends[:-1] = np.where(same, np.minimum(t[1:], ends[:-1]), ends[:-1])
    stamps = np.concatenate((t, ends))
    changes = np.concatenate((np.ones(len(t), np.int64), -np.ones(len(t), np.int64)))
    return _summed(stamps[:, None], changes)


def _summed(stamps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Rows of `stamps` (2-d) made distinct, with `values` summed per row; the result
    is (stamps..., total) sorted by stamp columns, zero totals dropped."""
    if len(values) == 0:
        return np.zeros((0, stamps.shape[1] + 1), dtype=np.int64)
    order = np.lexsort(stamps.T[::-1])
    s, v = stamps[order], values[order]
    new = np.concatenate(([True], (s[1:] != s[:-1]).any(axis=1)))
    starts = np.flatnonzero(new)
    totals = np.add.reduceat(v, starts)
    out = np.column_stack((s[starts], totals)).astype(np.int64)
    return out[out[:, -1] != 0]


def _replay_partition(
    pieces: Sequence[_Piece | None],
    limits: Sequence[Any],
    algorithms: Sequence[str],
    chunk_lines: int,
    keep_rows: bool,
) -> dict[str, Any] | None:
    """Round 2: one partition's requests from every file, replayed as `plan_trace`
    replays the whole log; what the client needs to put the plan together. `keep_rows`:
    return the requests too (identity code, ms, cost and merge place), for the
    replays that span partitions (the recommendation, spread stamps)."""
    from .. import fastreplay, windowpeaks

    found = [p for p in pieces if p is not None and len(p[0])]
    if not found:
        return None
    codes_of = fastreplay.Codes()  # an identity's code here: when its file first came
    for rows_, names, agents in found:
        rows_.identity = codes_of.encode(names)[rows_.identity]
        rows_.agent = agents[rows_.agent]
    rows = KeyedRows.concat([rows_ for rows_, _, _ in found]).merged()
    del found
    n, size = len(rows), len(codes_of)
    codes = rows.identity.astype(np.int64)
    candidates = _candidates(limits, algorithms)
    fits_of = sorted({c.limit for c in candidates})
    demand = {c.window_ms: windowpeaks.WindowPeaks(c.window_ms) for c in candidates}
    agents, resolution = Agents(), Resolution()
    requests = _count_into(np.zeros(size, dtype=np.int64), codes)
    for lo in range(0, n, chunk_lines):
        part = codes[lo : lo + chunk_lines]
        times, costs = rows.ms[lo : lo + chunk_lines], rows.cost[lo : lo + chunk_lines]
        costs = costs.astype(np.int64)
        fits = {limit: None if costs.max() <= limit else costs <= limit for limit in fits_of}
        for cand in candidates:
            cand.add(part, times, costs, fits[cand.limit], size)
        for peaks in demand.values():
            peaks.add(part, times, costs)
        agents.add(part, pd.DataFrame({"agent": rows.agent[lo : lo + chunk_lines]}))
        resolution.add(times)
    _, first = np.unique(codes, return_index=True)  # every code 0..size-1 occurs
    fitting = {limit: rows.cost <= limit for limit in fits_of}
    # Keys alive, as the local engine counts them: per key lifetime and limit.
    live = {}
    for lifetime, limit in dict.fromkeys((c.lifetime_ms, c.limit) for c in candidates):
        keep = fitting[limit]
        live[(lifetime, limit)] = _live_changes(codes[keep], rows.key[keep], lifetime)
    checks = {}
    for limit, keep in fitting.items():
        stamps = np.column_stack((rows.key[keep], rows.ms[keep]))
        checks[limit] = _summed(stamps, np.ones(len(stamps), dtype=np.int64))
    return {
        "identities": np.array(codes_of.identities(), dtype=object),
        "first": np.column_stack((rows.key[first], rows.file[first], rows.pos[first])),
        "requests": requests[:size],
        "candidates": [
            (
                cand.rejected[:size], cand.refused[:size], _peaks(cand.peaks, size),
                *cand.stretches.longest(size),  # type: ignore[union-attr]
            )  # fmt: skip
            for cand in candidates
        ],
        "hours": [cand.hours for cand in candidates],
        "demand": {w: _peaks(peaks, size) for w, peaks in demand.items()},
        "agents": agents.most_frequent(),
        "resolution_ms": resolution.ms,
        "kept": (
            np.column_stack((codes, rows.ms, rows.cost, rows.key, rows.file, rows.pos))
            if keep_rows
            else None
        ),
        "live": live,
        "checks": checks,
        "requests_total": n,
        "start": float(rows.seconds.min()),
        "end": float(rows.seconds.max()),
    }


class _Names:
    """What `planning._finish` asks of `fastreplay.Codes`: the identity of a code."""

    def __init__(self, names: np.ndarray) -> None:
        self._names = names

    def identity(self, code: int) -> Any:
        return self._names[int(code)]


class _Peaks:
    def __init__(self, peaks: np.ndarray) -> None:
        self.peaks = peaks


class _Longest:
    """What `planning._finish` asks of `timeline.Stretches`, joined from partitions."""

    def __init__(self, longest: np.ndarray, since: np.ndarray, until: np.ndarray) -> None:
        self._found = (longest, since, until)

    def longest(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(v[:size] for v in self._found)  # type: ignore[return-value]


def _without_rows(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """A partition's result without its requests (they stay on the worker)."""
    return None if result is None else {k: v for k, v in result.items() if k != "kept"}


def _rows_of(result: dict[str, Any]) -> np.ndarray:
    """A partition's requests: (code, ms, cost, key, file, pos) rows, merged order."""
    return result["kept"]


def _replay_rows(
    result: dict[str, Any], algorithm: str, limit: int, window_ms: int
) -> tuple[int, int, int]:
    """One partition's requests replayed under `limit`: (rejected, refused, identities
    affected). A limiter decides each identity on its own, and an identity's requests
    all lie in one partition, in their merged order, so these add up across partitions
    to the replay of the whole log."""
    rows = result["kept"]
    trace = KeptTrace.in_memory(rows[:, 0], rows[:, 1], rows[:, 2])
    found = replay(trace, algorithm, limit, window_ms, len(result["identities"]))
    return found.rejected, found.refused, found.identities_affected


def _remote_replays(
    client: Any, results: Sequence[Any], algorithm: str, window_ms: int
) -> Callable[[int], Outcome]:
    """`recommend`'s replay of one limit, run on every partition and summed."""

    def replay_limit(limit: int) -> Outcome:
        parts = client.gather(
            [client.submit(_replay_rows, r, algorithm, limit, window_ms) for r in results]
        )
        rejected, refused, affected = (sum(p[j] for p in parts) for j in range(3))
        return Outcome(limit, rejected, refused, affected, np.zeros(0, dtype=np.int64))

    return replay_limit


def _kept(rows_of: Sequence[np.ndarray], code_of: Sequence[np.ndarray]) -> KeptTrace:
    """Every partition's kept requests, in the merged order, with the plan's codes."""
    rows = np.concatenate(rows_of)
    codes = np.concatenate([c[r[:, 0]] for r, c in zip(rows_of, code_of, strict=True)])
    order = np.lexsort((rows[:, 5], rows[:, 4], rows[:, 3]))
    kept = KeptTrace()
    kept.add(codes[order], rows[order, 1], rows[order, 2])
    return kept


def _most_alive(changes: Sequence[np.ndarray]) -> int:
    """The most keys alive at once, from every partition's (ms, change) rows."""
    rows = np.concatenate(changes) if changes else np.zeros((0, 2), dtype=np.int64)
    summed = _summed(rows[:, :1], rows[:, 1])
    return max(0, int(np.cumsum(summed[:, 1]).max())) if len(summed) else 0


def _peak_checks(counts: Sequence[np.ndarray]) -> int:
    """The most checks in a rolling second, from every partition's (key, ms, checks)
    rows, fed to `WindowPeaks` in the merged order: by key, then a key's own ms
    before the late ones (whose ms is below it)."""
    from .. import windowpeaks

    rows = np.concatenate(counts) if counts else np.zeros((0, 3), dtype=np.int64)
    summed = _summed(rows[:, :2], rows[:, 2])
    order = np.lexsort((-summed[:, 1], summed[:, 0]))
    summed = summed[order]
    peaks = windowpeaks.WindowPeaks(_CHECK_WINDOW_MS)
    peaks.add(np.zeros(len(summed), dtype=np.int64), summed[:, 1], summed[:, 2])
    return int(_peaks(peaks, 1)[0])


def _client(scheduler: str | None, workers: int | None) -> tuple[Any, Any]:
    """A Dask client on `scheduler`, or on a local cluster started here (returned too,
    to be closed)."""
    from distributed import Client, LocalCluster

    if scheduler is not None:
        if workers is not None:
            raise ValueError("workers sizes a local cluster, not the scheduler's")
        try:
            return Client(scheduler, timeout="30s"), None
        except OSError as exc:
            raise ValueError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    count = workers or min(os.cpu_count() or 1, DEFAULT_MAX_WORKERS)
    count = validation.count("workers", count)
    cluster = LocalCluster(
        n_workers=count, threads_per_worker=1, processes=True, dashboard_address=None
    )
    return Client(cluster), cluster


def plan_on_dask(
    paths: Sequence[str | Path],
    limits: Sequence[Any],
    algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    client: Any = None,
    partitions: int | None = None,
    reader_options: Mapping[str, Any] | None = None,
    example: bool = False,
    redis_url: str | None = None,
    measure: bool = True,
    headroom: float = capacity.DEFAULT_SHARD.headroom,
    shard_memory_bytes: float = capacity.DEFAULT_SHARD.memory_gib * 2**30,
    top: int = 10,
    memory_table: Any = None,
    bench_record: str | Path | None = None,
    affect: float | None = 0.01,
    spread_coarse: bool = True,
) -> LogPlan:
    """The plan of the logs at `paths` read as one (`sources.LogSet`), computed on Dask:
    `client` (a `distributed.Client`), else `scheduler` (an address), else a local
    cluster of `workers` processes started and closed here. `partitions`: how many
    groups of identities (default: the cluster's threads). `reader_options` go to each
    file's `accesslog.LogReader`; the rest are `plan_trace`'s. Equal to
    `plan_logs(paths, ...)` on the local engine."""
    from .. import accesslog

    options = dict(reader_options or {})
    candidates = _candidates(limits, algorithms)
    if affect is not None and not 0 <= affect < 1:
        raise ValueError(f"affect must be a share of clients from 0 to below 1, got {affect!r}")
    keep = affect is not None or spread_coarse
    top = validation.count("top", top, minimum=0)
    shard = dataclasses.replace(
        capacity.DEFAULT_SHARD,
        memory_gib=validation.positive("shard_memory_bytes", shard_memory_bytes) / 2**30,
        headroom=capacity.headroom_share(headroom),
    )
    table, table_name = _memory_table(memory_table)
    paths = [Path(p) for p in paths]
    for path in paths:  # a file that is not a log fails here, in one line
        accesslog.LogReader(path, progress=False, **options)

    made = client is None  # a client made here is closed here, with its local cluster
    cluster = None
    if made:
        client, cluster = _client(scheduler, workers)
    try:
        if partitions is None:
            partitions = max(1, sum(client.nthreads().values()))
        partitions = validation.count("partitions", partitions)
        chunk_lines = int(options.get("chunk_lines", 1_000_000))
        files = [
            client.submit(_read_file, str(p), i, partitions, options, pure=False)
            for i, p in enumerate(paths)
        ]
        metas = [client.submit(_about, f) for f in files]
        results = [
            client.submit(
                _replay_partition,
                [client.submit(_piece, f, p) for f in files],
                list(limits),
                list(algorithms),
                chunk_lines,
                keep,
            )  # fmt: skip
            for p in range(partitions)
        ]
        del files  # the pieces are released as the partitions finish with them
        about = client.gather(metas)
        # The partitions' requests stay on the workers, for the recommendation's replays.
        found = client.gather([client.submit(_without_rows, r) for r in results])
        results = [r for r, d in zip(results, found, strict=True) if d is not None]
        done = [d for d in found if d is not None]

        problems = merged_problems(paths, [a["problems"] for a in about])
        if not done:
            raise accesslog.LogFormatError(
                f"{shown_paths(paths)} holds no request to plan on: {problems.summary()}"
            )
        first = np.concatenate([d["first"] for d in done])
        order = np.lexsort((first[:, 2], first[:, 1], first[:, 0]))
        names = np.concatenate([d["identities"] for d in done])[order]
        requests = np.concatenate([d["requests"] for d in done])[order]
        # A partition's own code -> the plan's code (the order the local engine meets them).
        plan_code = np.empty(len(order), dtype=np.int64)
        plan_code[order] = np.arange(len(order))
        bounds = np.cumsum([0] + [len(d["identities"]) for d in done])
        code_of = [plan_code[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        log = LogSummary(
            path=shown_paths(paths),
            example=example,
            format=", ".join(dict.fromkeys(a["format"] for a in about)),
            identity_field=", ".join(dict.fromkeys(a["identity_field"] for a in about)),
            cost=_cost_label(options.get("cost")),
            requests=sum(d["requests_total"] for d in done),
            identities=len(names),
            start=min(d["start"] for d in done),
            end=max(d["end"] for d in done),
            problems=problems,
            # Each resolution divides the coarser ones: the log's is the finest found.
            resolution_ms=min((d["resolution_ms"] for d in done), default=RESOLUTIONS_MS[0]),
        )
        server_time = choose_server_time(
            list(dict.fromkeys(c.algorithm for c in candidates)),
            redis_url=redis_url, measure=measure, bench_record=bench_record,
        )  # fmt: skip
        agent_of = None
        if any(a["format"] == "combined" for a in about):
            agent_of = {
                int(c[code]): agent for d, c in zip(done, code_of, strict=True)
                for code, agent in d["agents"].items()
            }  # fmt: skip
        planned = []
        codes_of = _Names(names)
        for k, cand in enumerate(candidates):
            rejected, refused, peaks, longest, since, until = (
                np.concatenate([d["candidates"][k][j] for d in done])[order] for j in range(6)
            )
            combined = _Candidate(
                cand.text, cand.limit, cand.window_ms, cand.algorithm, cand.lifetime_ms,
                None, _Peaks(peaks), rejected, refused, sum(d["hours"][k] for d in done),
            )  # fmt: skip
            combined.stretches = _Longest(longest, since, until)  # type: ignore[assignment]
            keys = _most_alive([d["live"][(cand.lifetime_ms, cand.limit)] for d in done])
            checks = _peak_checks([d["checks"][cand.limit] for d in done])
            planned.append(
                _finish(
                    combined, codes_of, requests, keys, checks, log, table, server_time, shard,
                    top, agent_of,
                )  # fmt: skip
            )
        n = len(names)
        kept = None
        coarse = any(is_coarse(log.resolution_ms, c.window_ms) for c in candidates)
        if spread_coarse and coarse:
            # Spreading a stamp's requests needs all of them in the merged order, across
            # partitions: gathered here, and replayed by the local engine's code.
            rows = client.gather([client.submit(_rows_of, r) for r in results])
            kept = _kept(rows, code_of)
        result = _spread_coarse(tuple(planned), kept, log.resolution_ms, n)
        client_peaks = {  # as the local engine: none without a recommendation
            w: np.concatenate([d["demand"][w] for d in done])[order]
            for w in (done[0]["demand"] if affect is not None else ())
        }
        recommended: tuple[Recommendation, ...] = ()
        if affect is not None:
            pairs = dict.fromkeys((c.algorithm, c.window_ms) for c in candidates)
            recommended = tuple(
                recommend(
                    kept, name, window_ms, client_peaks[window_ms], affect,
                    replay_limit=None if kept is not None else _remote_replays(
                        client, results, name, window_ms
                    ),
                    requests=log.requests,
                )  # fmt: skip
                for name, window_ms in pairs
            )
        return LogPlan(
            log, server_time, shard, table_name, result, top, affect, recommended, client_peaks
        )
    finally:
        if made:
            client.close()
        if cluster is not None:
            cluster.close()
