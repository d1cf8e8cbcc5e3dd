"""Plan a limit policy on an access log: whom each candidate limit hurts, and how big
Redis must be to enforce it.

    from ratelimit.lab import planner
    planner.parse_limit("100/min")                        # (100, 60.0)
    plan = planner.plan_log("access.log", ["100/min", "1000/h"], measure=False)
    print(plan.table())                                   # what `plan` prints
    plan.to_dict()                                        # what `plan --json` writes

`plan_log` reads the log once, in chunks (`accesslog.LogReader`, bounded memory), and
decides every request under every candidate (limit x algorithm) as it goes, with one
compiled replayer per candidate (`fastreplay.Replayer`) whose state is carried from
chunk to chunk. `plan_trace` does the same on trace tables already in memory.

What a candidate reports, and how it is counted:

- Every request is decided at its logged time, in the order the reader gives
  (sorted by time; a line that arrives too late is decided where it appears). A
  request whose cost exceeds the candidate's limit (or GCRA's burst, the limit) can
  never be admitted: the library refuses it with ValueError before asking Redis. Such
  requests are counted apart, as `refused` (and `identities_refused`), and are neither
  decided, nor checks, nor keys.
- `rejected` counts the requests the limiter rejected; `identities_rejected` the
  identities rejected at least once. Shares are of all the log's requests and
  identities.
- `busiest_affected`: the identities rejected or refused at least once, busiest
  (most requests) first.
- `peak_admitted`: the most cost admitted to one identity in any rolling window
  (t - W, t] of the candidate's window W, in whole ms as the limiters stamp requests.
  At most the limit for the sliding log; more for the others (a fixed window lets
  twice it through across a boundary).

The Redis plan of a candidate:

- `keys`: the most identities whose keys are alive at one instant. A key lives one
  key lifetime L after a request (the TTL the limiter gives its state,
  `Policy.state_ttl_ms()`: one window, two for the sliding-window counter). So
  `keys` = max over t of the number of identities with a request in (t - L, t]:
  conservative, since a rejected request does not refresh every algorithm's TTL.
  Computed exactly in one streaming pass, with one timestamp per identity; a late
  line counts from the latest time already read.
- `memory_bytes`: each key at its identity's own peak, i.e. holding `peak_admitted`
  units of that identity (its most admitted in one window, at least 1), sized with
  `capacity.bytes_per_key` from the measured table of chapter 3
  (`notebooks/data/memory_per_key.csv`, sorted-set log members), plus the shard's
  per-key overhead; and the `keys` heaviest such keys alive together. No instant can
  need more, so this is an upper bound. `bytes_per_key` is their mean.
- `peak_checks_per_s`: the most requests (checks, one EVALSHA each, admitted or not)
  in any rolling second (t - 1 s, t] of the whole log: the peak, not the mean
  (`mean_checks_per_s`, over the log's span or 1 s if shorter, is given for
  comparison). `commands_per_s` counts every check's script commands on the admit
  path, the costlier (`capacity.script_commands`).
- Server time per check: measured now on the reader's Redis with `INFO commandstats`
  (`capacity.measure_server_time`, which writes scratch keys and deletes them) when
  one answers, else what the latest `make bench` recorded (`bench/record.json`,
  `capacity.server_time_from_bench`); `server_time.kind` says which, and `note` why
  a measurement was not used. With neither, the plan says so and leaves the
  check-bound figures out (null).
- Shards: `capacity.plan_fleet` with the chapter 5 shard (`capacity.Shard`:
  `shard_memory_bytes` of data memory, `headroom` kept free, 64 bytes of per-key
  overhead): enough shards for the memory and for the checks, whichever needs more.

Memory: besides the reader's chunk, one small record per identity (its code, counts,
last request) per candidate, plus each replayer's state and the admitted stamps of
each identity's last window (and the `windowpeaks.WindowPeaks` reorder margin): it
grows with the identities and with what one window holds, never with the log's length.

JSON document (`LogPlan.to_dict()`, `plan --json OUT`); the field names of each
object are listed in `SCHEMA`, one place:

- top level: `schema` (this layout's version, 1), `log`, `server_time`, `shard`,
  `memory_table` (path of the bytes-per-key table), `candidates` (a list).
- `log`: `path`, `example` (true for the lab's example log), `format`,
  `identity_field`, `cost` (how a request's cost was read: "1 per request", a field's
  name, or a function's), `requests`, `identities`, `start_utc`, `end_utc` (ISO 8601),
  `duration_s`, `problems`.
- `problems` (the reader's bad lines): `lines`, `parsed`, `skipped`, `late` (lines
  logged more than the reader's reorder window after later ones, decided late),
  `counts` (reason -> lines), `examples` and `late_examples` (lists of `line`,
  `reason`, `excerpt`: the first few), `summary` (the reader's words).
- `server_time`: `kind` ("measured", "bench" or "none"), `source`, `date`, `note`,
  `us_per_check` (algorithm -> microseconds).
- `shard`: `memory_bytes`, `headroom`, `key_overhead_bytes`, `checks_per_s` (null:
  the server time per check alone limits a shard).
- a candidate: `limit_text`, `limit`, `window_s`, `algorithm`, `label`, `requests`,
  `rejected`, `rejected_share`, `refused`, `refused_share`, `identities`,
  `identities_rejected`, `identities_rejected_share`, `identities_refused`,
  `peak_admitted`, `peak_admitted_ratio` (over the limit), `peak_identity`,
  `busiest_affected` (a list of `identity`, `requests`, `rejected`, `refused`,
  `peak_admitted`), `redis` (null when no request reaches Redis).
- `redis`: `keys`, `key_lifetime_s`, `bytes_per_key`, `memory_bytes`,
  `peak_checks_per_s`, `mean_checks_per_s`, `us_per_check`, `redis_cpu_cores`,
  `commands_per_s`, `shard_checks_per_s`, `shards_for_memory`, `shards_for_checks`,
  `shards`, `keys_per_shard` (the check-bound ones null without a server time).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ratelimit import algorithms as registry
from ratelimit import validation

from . import capacity
from .memory import format_bytes
from .timebase import seconds_to_ms

__all__ = [
    "DEFAULT_ALGORITHMS",
    "DEFAULT_REDIS_URL",
    "DEFAULT_SHARD",
    "SCHEMA",
    "Affected",
    "CandidatePlan",
    "LogPlan",
    "LogSummary",
    "RedisPlan",
    "ServerTimeChoice",
    "choose_server_time",
    "default_bench_record",
    "default_memory_table",
    "format_limit",
    "parse_limit",
    "plan_log",
    "plan_trace",
]

DEFAULT_ALGORITHMS: tuple[str, ...] = registry.NAMES
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_SHARD = capacity.DEFAULT_SHARD
"""Chapter 5's shard: 14 GiB of data, half kept free, 64 bytes of per-key overhead."""
_REPO = Path(__file__).resolve().parents[2]
_CHECK_WINDOW_MS = 1_000  # checks per second: the most in any rolling second
_NEVER = np.iinfo(np.int64).min // 4  # "no request yet": far below any t - L

SCHEMA: Mapping[str, tuple[str, ...]] = {
    "plan": ("schema", "log", "server_time", "shard", "memory_table", "candidates"),
    "log": (
        "path", "example", "format", "identity_field", "cost", "requests", "identities",
        "start_utc", "end_utc", "duration_s", "problems",
    ),
    "problems": (
        "lines", "parsed", "skipped", "late", "counts", "examples", "late_examples", "summary",
    ),
    "problem_example": ("line", "reason", "excerpt"),
    "server_time": ("kind", "source", "date", "note", "us_per_check"),
    "shard": ("memory_bytes", "headroom", "key_overhead_bytes", "checks_per_s"),
    "candidate": (
        "limit_text", "limit", "window_s", "algorithm", "label", "requests", "rejected",
        "rejected_share", "refused", "refused_share", "identities", "identities_rejected",
        "identities_rejected_share", "identities_refused", "peak_admitted",
        "peak_admitted_ratio", "peak_identity", "busiest_affected", "redis",
    ),
    "affected": ("identity", "requests", "rejected", "refused", "peak_admitted"),
    "redis": (
        "keys", "key_lifetime_s", "bytes_per_key", "memory_bytes", "peak_checks_per_s",
        "mean_checks_per_s", "us_per_check", "redis_cpu_cores", "commands_per_s",
        "shard_checks_per_s", "shards_for_memory", "shards_for_checks", "shards",
        "keys_per_shard",
    ),
}  # fmt: skip
"""The JSON document's field names, per object (see the module docstring)."""
SCHEMA_VERSION = 1


# --- limits ---------------------------------------------------------------------------

_UNITS_MS: Mapping[str, int] = {
    "ms": 1,
    "s": 1_000, "sec": 1_000, "second": 1_000,
    "min": 60_000, "minute": 60_000,
    "h": 3_600_000, "hour": 3_600_000,
    "d": 86_400_000, "day": 86_400_000,
}  # fmt: skip
_ACCEPTED = (
    "give REQUESTS/WINDOW, e.g. 100/min, 10/s, 1000/10s or 50/5min: REQUESTS a whole "
    f"number from 1 to {validation.MAX_LIMIT:,}, WINDOW a unit (ms, s, sec, second, min, "
    "minute, h, hour, d, day, or a plural) with an optional multiplier"
)
_LIMIT = re.compile(
    r"^\s*(?P<n>[+-]?(?:\d{1,3}(?:[,_]\d{3})+|\d+))\s*/\s*(?P<k>\d+(?:\.\d+)?)?\s*"
    r"(?P<unit>[A-Za-z]+)\s*$"
)


def parse_limit(text: str) -> tuple[int, float]:
    """A limit as written by people, "100/min", as (requests, window in seconds):
    `parse_limit("100/min") == (100, 60.0)`, `parse_limit("1000/10s") == (1000, 10.0)`.

    Units: ms, s, sec, second, min, minute, h, hour, d, day (and plurals), with an
    optional multiplier (5min, 1.5h; the window must be whole milliseconds, at most a
    year). ValueError, naming `text` and what is accepted, for anything else.
    """
    if not isinstance(text, str):
        raise ValueError(f"a limit must be text such as '100/min', got {text!r}")
    found = _LIMIT.match(text)
    if found is None:
        raise ValueError(f"cannot read the limit {text!r}: {_ACCEPTED}")
    unit = found["unit"].lower()
    if unit not in _UNITS_MS and unit.endswith("s") and unit[:-1] in _UNITS_MS:
        unit = unit[:-1]  # "seconds", "mins", "hours"
    if unit not in _UNITS_MS:
        raise ValueError(
            f"cannot read the limit {text!r}: unknown unit {found['unit']!r}; {_ACCEPTED}"
        )
    count = int(found["n"].replace("_", "").replace(",", ""))
    if not 1 <= count <= validation.MAX_LIMIT:
        raise ValueError(
            f"cannot read the limit {text!r}: the number of requests must be from 1 to "
            f"{validation.MAX_LIMIT:,}, got {count:,}; {_ACCEPTED}"
        )
    multiplier = float(found["k"]) if found["k"] is not None else 1.0
    window = multiplier * _UNITS_MS[unit]
    window_ms = round(window)
    if window_ms < 1 or abs(window - window_ms) > 1e-6:
        raise ValueError(
            f"cannot read the limit {text!r}: the window must be a positive whole number "
            f"of milliseconds; {_ACCEPTED}"
        )
    if window_ms > validation.MAX_WINDOW_MS:
        raise ValueError(f"cannot read the limit {text!r}: the window must be at most a year")
    return count, window_ms / 1000


def format_limit(limit: int, window_s: float) -> str:
    """A limit as people write it: `format_limit(100, 60) == "100/min"`."""
    window_ms = round(window_s * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000)):
        if window_ms % size == 0:
            k = window_ms // size
            return f"{limit}/{'' if k == 1 else k}{unit}"
    return f"{limit}/{window_ms}ms"


def _candidate_limit(spec: Any) -> tuple[str, int, int]:
    """(text, limit, window_ms) from "100/min" or a (limit, window_s) pair."""
    if isinstance(spec, str):
        limit, window_s = parse_limit(spec)
        return spec.strip(), limit, round(window_s * 1000)
    if isinstance(spec, tuple) and len(spec) == 2:
        limit = validation.limit(spec[0])
        window_s = validation.positive("window_s", spec[1])
        if abs(window_s * 1000 - round(window_s * 1000)) > 1e-6:
            raise ValueError(f"window_s must be whole milliseconds, got {spec[1]!r}")
        text = format_limit(limit, window_s)
        limit, window_s = parse_limit(text)
        return text, limit, round(window_s * 1000)
    raise ValueError(
        f"a limit must be text such as '100/min' or a (limit, window_s) pair, got {spec!r}"
    )


# --- server time ------------------------------------------------------------------------


def _shown_path(path: Path) -> str:
    """`path` relative to the repository when it lies inside it: plans and the chapter
    quote no machine's folders."""
    try:
        return path.resolve().relative_to(_REPO).as_posix()
    except ValueError:
        return str(path)


def default_bench_record() -> Path:
    """Where `make bench` records its figures: bench/record.json in this repository."""
    return _REPO / "bench" / "record.json"


def default_memory_table() -> Path:
    """Chapter 3's measured bytes per key: notebooks/data/memory_per_key.csv."""
    return _REPO / "notebooks" / "data" / "memory_per_key.csv"


@dataclass(frozen=True)
class ServerTimeChoice:
    """The server time per check a plan uses, and why: `kind` is "measured" (now, on
    the reader's Redis), "bench" (the latest `make bench` record) or "none"; `note`
    says why a measurement was not used ("" when it was)."""

    kind: str
    server_time: capacity.ServerTime | None
    note: str = ""

    def us_per_check(self, algorithm: str) -> float | None:
        if self.server_time is None:
            return None
        return self.server_time.us_per_check.get(algorithm)

    def to_dict(self) -> dict[str, Any]:
        st = self.server_time
        return {
            "kind": self.kind,
            "source": st.source if st is not None else "",
            "date": st.date if st is not None else "",
            "note": self.note,
            "us_per_check": dict(st.us_per_check) if st is not None else {},
        }


def _shown_url(url: str) -> str:
    """The URL without its password, to print."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _measured(
    url: str, names: Sequence[str], checks: int
) -> tuple[capacity.ServerTime | None, str]:
    import redis

    shown = _shown_url(url)
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=10.0)
    except ValueError as exc:
        return None, f"not measured: cannot use the Redis URL {shown!r} ({exc})"
    try:
        try:
            client.ping()
        except (redis.exceptions.RedisError, OSError) as exc:
            return None, f"not measured: no Redis answered at {shown} ({exc})"
        try:
            return capacity.measure_server_time(client, names, checks=checks, where=shown), ""
        except (ValueError, RuntimeError, redis.exceptions.RedisError, OSError) as exc:
            return None, f"not measured: the Redis at {shown} could not be measured ({exc})"
    finally:
        client.close()


def choose_server_time(
    names: Sequence[str] = DEFAULT_ALGORITHMS,
    *,
    redis_url: str | None = None,
    measure: bool = True,
    bench_record: str | Path | None = None,
    checks: int = 2_000,
) -> ServerTimeChoice:
    """Server time per check of `names`: measured on the Redis at `redis_url` (default:
    REDIS_URL, else redis://127.0.0.1:6379/0; one second to connect) unless `measure`
    is False or none answers, else read from `bench_record` (default:
    `default_bench_record()`), else "none", with a note that says why."""
    names = [registry.get(n).name for n in names]
    notes = []
    if measure:
        url = redis_url or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
        measured, why = _measured(url, names, checks)
        if measured is not None:
            return ServerTimeChoice("measured", measured)
        notes.append(why)
    else:
        notes.append("not measured: measure=False (--no-measure)")
    record = Path(bench_record) if bench_record is not None else default_bench_record()
    if not record.exists():
        notes.append(f"no `make bench` record at {record}: run `make bench` or measure on a Redis")
        return ServerTimeChoice("none", None, "; ".join(notes))
    try:
        recorded = capacity.server_time_from_bench(record, names, shown_as=_shown_path(record))
    except (ValueError, KeyError, TypeError) as exc:
        notes.append(f"the `make bench` record at {record} cannot be used ({exc})")
        return ServerTimeChoice("none", None, "; ".join(notes))
    return ServerTimeChoice("bench", recorded, "; ".join(notes))


# --- streaming measures ----------------------------------------------------------------


def _grown(values: np.ndarray, size: int, fill: int = 0) -> np.ndarray:
    """`values` extended to at least `size` entries (doubling), new ones `fill`."""
    if len(values) >= size:
        return values
    out = np.full(max(size, 2 * len(values)), fill, dtype=values.dtype)
    out[: len(values)] = values
    return out


class _LiveKeys:
    """The most identities alive at one instant, over a stream of requests in time
    order: identity i is alive at t while its last request at or before t is later
    than t - L. In closed form, the maximum over t of the identities with a request in
    (t - L, t]; it is attained at a request's time.

    Each request k starts a share of its identity's alive time, [t_k, e_k) with e_k
    the identity's next request or t_k + L, whichever is first; these shares never
    overlap, so the identities alive at t are the shares started minus those ended by
    t. A share is still open after a chunk only for an identity's last request, so
    the state is one timestamp per identity (`last`) and a count.
    """

    def __init__(self, lifetime_ms: int) -> None:
        self.lifetime = lifetime_ms
        self.last = np.full(0, _NEVER, dtype=np.int64)
        self.horizon: int | None = None  # the latest time seen
        self.alive = 0  # shares open after the horizon
        self.peak = 0

    def add(self, codes: np.ndarray, times: np.ndarray) -> None:
        """One chunk: `times` whole ms, non-decreasing and not before earlier chunks."""
        n = len(times)
        if n == 0:
            return
        life = self.lifetime
        end_of_chunk = int(times[-1])
        self.last = _grown(self.last, int(codes.max()) + 1, _NEVER)
        order = np.argsort(codes, kind="stable")
        c, t = codes[order], times[order]
        first = np.concatenate(([True], c[1:] != c[:-1]))
        final = np.concatenate((c[1:] != c[:-1], [True]))
        ends = t + life
        ends[:-1] = np.where(final[:-1], ends[:-1], np.minimum(t[1:], ends[:-1]))
        settled = [ends[~final | (ends <= end_of_chunk)]]
        if self.horizon is not None:
            open_before = np.flatnonzero(self.last + life > self.horizon)
            closing = self.last[open_before] + life
            first_here = np.full(len(self.last), np.iinfo(np.int64).max, dtype=np.int64)
            first_here[c[first]] = t[first]
            closing = np.minimum(closing, first_here[open_before])
            settled.append(closing[closing <= end_of_chunk])
        ended = np.sort(np.concatenate(settled))
        started = np.searchsorted(times, times, side="right")
        alive = self.alive + started - np.searchsorted(ended, times, side="right")
        self.peak = max(self.peak, int(alive.max()))
        self.alive += n - len(ended)
        self.last[c[final]] = t[final]
        self.horizon = end_of_chunk


# --- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Affected:
    """One identity a candidate rejected or refused at least once."""

    identity: str
    requests: int
    rejected: int
    refused: int  # requests costing more than the limit
    peak_admitted: int


@dataclass(frozen=True)
class RedisPlan:
    """What one candidate costs Redis (see the module docstring)."""

    keys: int
    key_lifetime_s: float
    bytes_per_key: float  # mean MEMORY USAGE of the keys counted, plus the overhead
    memory_bytes: float
    peak_checks_per_s: int
    mean_checks_per_s: float
    us_per_check: float | None
    redis_cpu_cores: float | None
    commands_per_s: float
    shard_checks_per_s: float | None
    shards_for_memory: int
    shards_for_checks: int | None
    shards: int | None
    keys_per_shard: int | None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SCHEMA["redis"]}


@dataclass(frozen=True)
class CandidatePlan:
    """One candidate limit under one algorithm, decided on the whole log."""

    limit_text: str
    limit: int
    window_s: float
    algorithm: str
    requests: int
    rejected: int
    refused: int
    identities: int
    identities_rejected: int
    identities_refused: int
    peak_admitted: int
    peak_identity: str | None
    busiest_affected: tuple[Affected, ...]
    redis: RedisPlan | None

    @property
    def label(self) -> str:
        return registry.get(self.algorithm).label

    def _share(self, part: int, whole: int) -> float:
        return part / whole if whole else 0.0

    def to_dict(self) -> dict[str, Any]:
        values = {
            "label": self.label,
            "rejected_share": self._share(self.rejected, self.requests),
            "refused_share": self._share(self.refused, self.requests),
            "identities_rejected_share": self._share(self.identities_rejected, self.identities),
            "peak_admitted_ratio": self.peak_admitted / self.limit,
            "busiest_affected": [
                {name: getattr(a, name) for name in SCHEMA["affected"]}
                for a in self.busiest_affected
            ],
            "redis": None if self.redis is None else self.redis.to_dict(),
        }
        return {name: values.get(name, getattr(self, name, None)) for name in SCHEMA["candidate"]}


@dataclass(frozen=True)
class LogSummary:
    """The log a plan was made on: where, how it was read, what it held."""

    path: str
    example: bool
    format: str
    identity_field: str
    cost: str  # "1 per request", the cost field's name, or the cost function's
    requests: int
    identities: int
    start: float | None  # Unix seconds of the first and last request
    end: float | None
    problems: Any = None  # accesslog.Problems, or None for a trace in memory

    @property
    def duration_s(self) -> float:
        return 0.0 if self.start is None or self.end is None else self.end - self.start

    def problems_dict(self) -> dict[str, Any]:
        p = self.problems
        if p is None:
            return {
                "lines": self.requests, "parsed": self.requests, "skipped": 0, "late": 0,
                "counts": {}, "examples": [], "late_examples": [], "summary": "",
            }  # fmt: skip

        def listed(examples: Iterable[tuple[int, str, str]]) -> list[dict[str, Any]]:
            return [
                dict(zip(SCHEMA["problem_example"], (int(n), str(r), str(x)), strict=True))
                for n, r, x in examples
            ]

        return {
            "lines": int(p.lines),
            "parsed": int(p.parsed),
            "skipped": int(p.skipped),
            "late": int(p.late),
            "counts": {str(k): int(v) for k, v in p.counts.items()},
            "examples": listed(p.examples),
            "late_examples": listed(getattr(p, "late_examples", ())),
            "summary": p.summary(),
        }

    def to_dict(self) -> dict[str, Any]:
        values = {
            "start_utc": _utc(self.start),
            "end_utc": _utc(self.end),
            "duration_s": self.duration_s,
            "problems": self.problems_dict(),
        }
        return {name: values.get(name, getattr(self, name, None)) for name in SCHEMA["log"]}


def _plain(value: Any) -> Any:
    """`value` with numpy scalars turned into Python's, for `json`."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _utc(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class LogPlan:
    """Everything `plan` found: the log, the server time used, the shard, and one
    `CandidatePlan` per candidate limit and algorithm."""

    log: LogSummary
    server_time: ServerTimeChoice
    shard: capacity.Shard
    memory_table: str
    candidates: tuple[CandidatePlan, ...]
    top: int = 10  # how many of the busiest affected identities each candidate lists

    def to_dict(self) -> dict[str, Any]:
        """One JSON-able document (plain Python values); field names in `SCHEMA` and
        the module docstring."""
        shard = self.shard.plan_options()
        values = {
            "schema": SCHEMA_VERSION,
            "log": self.log.to_dict(),
            "server_time": self.server_time.to_dict(),
            "shard": {
                "memory_bytes": shard["shard_memory_bytes"],
                "headroom": shard["headroom"],
                "key_overhead_bytes": shard["key_overhead_bytes"],
                "checks_per_s": shard["shard_checks_per_s"],
            },
            "memory_table": self.memory_table,
            "candidates": [c.to_dict() for c in self.candidates],
        }
        return _plain({name: values[name] for name in SCHEMA["plan"]})

    def table(self, *, problems: bool = True) -> str:
        """The report for a terminal: the log, whom each candidate hurts, the busiest
        identities affected, and the Redis plan. With `problems`, the reader's summary
        of bad lines too (the CLI prints that to stderr instead)."""
        return _render(self, problems=problems)


# --- planning -----------------------------------------------------------------------------


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
) -> LogPlan:
    """`plan_log` on trace tables (`time`, `identity`, `cost`): one, or an iterable of
    chunks, each sorted by time, read once. `server_time` replaces the choice
    `choose_server_time` would make; `describe()`, called once the chunks are read,
    gives what the trace cannot tell (`path`, `example`, `format`, `identity_field`,
    `problems`)."""
    from . import fastreplay, windowpeaks

    candidates = _candidates(limits, algorithms)
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
    )
    if server_time is None:
        names = list(dict.fromkeys(c.algorithm for c in candidates))
        server_time = choose_server_time(
            names, redis_url=redis_url, measure=measure, bench_record=bench_record
        )
    requests = requests[: len(codes_of)]
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
        )  # fmt: skip
        for cand in candidates
    )
    return LogPlan(log, server_time, shard, table_name, planned, top)


def _candidates(limits: Sequence[Any], algorithms: Sequence[str]) -> list[_Candidate]:
    """One `_Candidate` per distinct limit and algorithm, in the order given."""
    from . import fastreplay, windowpeaks

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


def _columns_of(chunk: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A chunk's seconds, whole-ms times, costs and identities, checked."""
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
    return seconds, times, costs.astype(np.int64), chunk["identity"].to_numpy(dtype=object)


def _memory_table(given: Any) -> tuple[pd.DataFrame, str]:
    """The bytes-per-key table and where it comes from."""
    from . import memory

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
    )


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
    memory_table: str | Path | pd.DataFrame | None = None,
    bench_record: str | Path | None = None,
    example: bool = False,
) -> LogPlan:
    """Plan each candidate of `limits` ("100/min", ...) x `algorithms` on the access log
    at `path`, read once in chunks of `chunk_lines` (see the module docstring for every
    figure). `format`, `identity`, `cost`, `time`, `reorder_s` and `progress` go to
    `accesslog.LogReader`. The Redis plan measures server time on `redis_url` unless
    `measure` is False (see `choose_server_time`), and sizes shards of
    `shard_memory_bytes` keeping `headroom` free. `top`: how many of the busiest
    identities affected each candidate lists. `example` marks the lab's
    example log in the report. LogFormatError (a ValueError) for a file that is not a
    log or holds no request; ValueError for bad options."""
    from . import accesslog

    limits = list(limits)
    for spec in limits:
        _candidate_limit(spec)  # bad limits fail before the log is read
    reader = accesslog.LogReader(
        path,
        format=format,
        identity=identity,
        cost=cost,
        time=time,
        chunk_lines=chunk_lines,
        reorder_s=reorder_s,
        progress=progress,
    )

    def describe() -> dict[str, Any]:
        return {
            "path": str(path),
            "example": example,
            "format": reader.format,
            "identity_field": reader.identity_field,
            "cost": _cost_label(cost),
            "problems": reader.problems,
        }

    try:
        return plan_trace(
            reader, limits, algorithms, redis_url=redis_url, measure=measure, headroom=headroom,
            shard_memory_bytes=shard_memory_bytes, top=top, memory_table=memory_table,
            bench_record=bench_record, describe=describe,
        )  # fmt: skip
    except _NoRequests:
        summary = reader.problems.summary()
        raise accesslog.LogFormatError(f"{path} holds no request to plan on: {summary}") from None


def _cost_label(cost: Any) -> str:
    if cost is None:
        return "1 per request"
    if isinstance(cost, str):
        return cost
    return getattr(cost, "__qualname__", None) or repr(cost)


# --- the report ----------------------------------------------------------------------------


def _columns(rows: Sequence[Sequence[str]], right: Iterable[int]) -> list[str]:
    """Rows of cells as aligned text: columns in `right` right-aligned."""
    right = set(right)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days} d"] * bool(days) + [f"{hours} h"] * bool(hours)
    parts += [f"{minutes} min"] * bool(minutes) + [f"{secs} s"] * bool(secs)
    return " ".join(parts[:2]) or "0 s"


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _rate(value: float) -> str:
    """A rate to about three significant digits."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value >= 0.001 else f"{value:.1g}"


def _busiest(plan: LogPlan) -> list[str]:
    """Per limit, the busiest identities affected under any algorithm, with what each
    algorithm rejected. Exact from the candidates' own lists: an identity among the
    `top` busiest affected under any algorithm is, under each algorithm that affects
    it, among that algorithm's `top` busiest affected too."""
    out: list[str] = []
    by_limit: dict[str, list[CandidatePlan]] = {}
    for c in plan.candidates:
        by_limit.setdefault(c.limit_text, []).append(c)
    for text, group in by_limit.items():
        top = plan.top
        known = {(c.algorithm, a.identity): a for c in group for a in c.busiest_affected}
        requests = {a.identity: a.requests for a in known.values()}
        refused = {a.identity: a.refused for a in known.values()}
        ranked = sorted(requests, key=lambda who: (-requests[who], who))[:top]
        if not ranked:
            continue
        header = ["identity", "requests", *(c.label for c in group)]
        header += ["cost > limit"] if any(refused.values()) else []
        rows = [header]
        for who in ranked:
            row = [who, f"{requests[who]:,}"]
            row += [f"{known[(c.algorithm, who)].rejected:,}" if (c.algorithm, who) in known
                    else "0" for c in group]  # fmt: skip
            row += [f"{refused[who]:,}"] if len(header) > len(row) else []
            rows.append(row)
        out += ["", f"Busiest identities affected by {text} (requests, and rejected by each)"]
        out += ["  " + line for line in _columns(rows, right=range(1, len(header)))]
    return out


def _render(plan: LogPlan, *, problems: bool) -> str:
    log = plan.log
    where = "the lab's example log (synthetic traffic)" if log.example else log.path
    out = [
        f"Plan for {where}: format {log.format}, identity: {log.identity_field}, cost: {log.cost}",
        f"  {log.requests:,} requests from {log.identities:,} identities, "
        f"{_utc(log.start)} to {_utc(log.end)} ({_duration(log.duration_s)})",
    ]
    if problems and log.problems is not None:
        out += ["  " + line for line in log.problems.summary().splitlines()]
    out += ["", "Who is hurt"]
    rows = [["limit", "algorithm", "rejected", "share", "identities rejected", "share",
             "peak admitted / limit", "cost > limit"]]  # fmt: skip
    for c in plan.candidates:
        rows.append([
            c.limit_text, c.label, f"{c.rejected:,}", _pct(c.rejected, c.requests),
            f"{c.identities_rejected:,} of {c.identities:,}",
            _pct(c.identities_rejected, c.identities),
            f"{c.peak_admitted:,} / {c.limit:,} ({c.peak_admitted / c.limit:.2f}x)",
            f"{c.refused:,}",
        ])  # fmt: skip
    out += ["  " + line for line in _columns(rows, right=(2, 3, 4, 5, 6, 7))]
    refused = [c for c in plan.candidates if c.refused]
    for c in refused:
        out.append(
            f"  {c.limit_text}: {c.refused:,} requests ({_pct(c.refused, c.requests)}) from "
            f"{c.identities_refused:,} identities cost more than the limit: the library refuses "
            "them (ValueError), they are neither admitted nor rejected"
        )
    out += _busiest(plan)
    out += ["", "Redis plan"]
    choice = plan.server_time
    if choice.server_time is not None:
        out.append(f"  server time per check: {choice.server_time.source}")
    else:
        out.append("  server time per check: unknown, so no shards for checks are planned")
    if choice.note:
        out.append(f"  ({choice.note})")
    options = plan.shard.plan_options()
    out.append(
        f"  shards of {format_bytes(options['shard_memory_bytes'])} of data with "
        f"{options['headroom']:.0%} headroom, {options['key_overhead_bytes']:g} B per key "
        "of overhead; memory: each key at its identity's peak"
    )
    rows = [["limit", "algorithm", "keys", "memory", "checks/s at peak", "(mean)", "us/check",
             "Redis CPU", "shards", "(memory, checks)"]]  # fmt: skip
    for c in plan.candidates:
        r = c.redis
        if r is None:
            rows.append([c.limit_text, c.label, "0", "-", "0", "-", "-", "-", "0", "no checks"])
            continue
        cpu = "-" if r.redis_cpu_cores is None else f"{_rate(r.redis_cpu_cores)} cores"
        rows.append([
            c.limit_text, c.label, f"{r.keys:,}", format_bytes(r.memory_bytes),
            f"{r.peak_checks_per_s:,}", f"({_rate(r.mean_checks_per_s)})",
            "-" if r.us_per_check is None else f"{r.us_per_check:.1f}", cpu,
            "-" if r.shards is None else str(r.shards),
            f"({r.shards_for_memory}, {_or_dash(r.shards_for_checks)})",
        ])  # fmt: skip
    out += ["  " + line for line in _columns(rows, right=(2, 3, 4, 5, 6, 7, 8))]
    return "\n".join(out)
