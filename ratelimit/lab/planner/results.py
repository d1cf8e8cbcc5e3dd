"""What a plan found, one dataclass per object of its JSON document (`SCHEMA`):
`LogPlan`, `CandidatePlan`, `RedisPlan`, `Affected`, `LogSummary`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ratelimit import algorithms as registry

from .. import capacity
from .recommend import Recommendation
from .report import _render, _utc
from .resolution import Spread
from .servertime import ServerTimeChoice

SCHEMA: Mapping[str, tuple[str, ...]] = {
    "plan": (
        "schema", "log", "server_time", "shard", "memory_table", "candidates", "affect",
        "recommended",
    ),
    "log": (
        "path", "example", "format", "identity_field", "cost", "requests", "identities",
        "start_utc", "end_utc", "duration_s", "problems", "resolution_ms", "where",
    ),
    "problems": (
        "lines", "parsed", "skipped", "late", "partial", "stopped", "counts", "examples",
        "late_examples", "partial_examples", "summary",
    ),
    "problem_example": ("line", "reason", "excerpt"),
    "server_time": ("kind", "source", "date", "note", "us_per_check"),
    "shard": ("memory_bytes", "headroom", "key_overhead_bytes", "checks_per_s"),
    "candidate": (
        "limit_text", "limit", "window_s", "algorithm", "label", "requests", "rejected",
        "rejected_share", "refused", "refused_share", "identities", "identities_rejected",
        "identities_rejected_share", "identities_refused", "peak_admitted",
        "peak_admitted_ratio", "peak_identity", "busiest_affected", "redis",
        "rejected_by_hour", "longest_throttled", "offenders", "stamps",
    ),
    "stamps": (
        "resolution_ms", "rejected", "rejected_spread", "identities_rejected",
        "identities_rejected_spread",
    ),
    "throttled": (
        "identity", "longest_throttled_s", "throttled_from_utc", "throttled_until_utc",
        "rejected",
    ),
    "offender": ("identity", "agent", "requests", "rejected", "longest_throttled_s"),
    "affected": ("identity", "requests", "rejected", "refused", "peak_admitted"),
    "redis": (
        "keys", "key_lifetime_s", "bytes_per_key", "memory_bytes", "peak_checks_per_s",
        "mean_checks_per_s", "us_per_check", "redis_cpu_cores", "commands_per_s",
        "shard_checks_per_s", "shards_for_memory", "shards_for_checks", "shards",
        "keys_per_shard",
    ),
    "recommended": (
        "algorithm", "label", "window_s", "limit", "limit_text", "window_ms", "affect",
        "requests", "rejected", "rejected_share", "refused", "refused_share", "identities",
        "identities_affected", "identities_affected_share", "peaks", "replays",
        "unavoidable", "unavoidable_why",
    ),
    "peaks": ("p50", "p90", "p99", "p99_9", "max"),
}  # fmt: skip
"""The JSON document's field names, per object (see the module docstring)."""
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Affected:
    """One identity a candidate rejected or refused at least once."""

    identity: str
    requests: int
    rejected: int
    refused: int  # requests costing more than the limit
    peak_admitted: int


@dataclass(frozen=True)
class Throttled:
    """One identity's longest throttled stretch under a candidate (`timeline`): from
    its first rejected request (`since`, Unix s) to `until`; `rejected`: all the
    identity's rejected requests."""

    identity: str
    seconds: float
    since: float
    until: float
    rejected: int

    def to_dict(self) -> dict[str, Any]:
        values = (self.identity, self.seconds, _utc(self.since), _utc(self.until), self.rejected)
        return dict(zip(SCHEMA["throttled"], values, strict=True))


@dataclass(frozen=True)
class Offender:
    """One of the identities a candidate rejected most, with its most frequent user
    agent (None when the trace has no `agent` column)."""

    identity: str
    agent: str | None
    requests: int
    rejected: int
    longest_throttled_s: float

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SCHEMA["offender"]}


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
    rejected_by_hour: tuple[int, ...] = (0,) * 24  # rejected requests per UTC hour of day
    longest_throttled: tuple[Throttled, ...] = ()  # the `top` longest stretches
    offenders: tuple[Offender, ...] = ()  # the `top` identities rejected most
    stamps: Spread | None = None  # set when the stamps are too coarse for the window

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
            "rejected_by_hour": list(self.rejected_by_hour),
            "longest_throttled": [t.to_dict() for t in self.longest_throttled],
            "offenders": [o.to_dict() for o in self.offenders],
            "stamps": None if self.stamps is None else self.stamps.to_dict(),
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
    resolution_ms: int = 1  # the coarsest of resolution.RESOLUTIONS_MS every stamp fits
    # The filters that chose the requests (`routes`): conditions, requests_read, kept.
    where: Mapping[str, Any] | None = None

    @property
    def duration_s(self) -> float:
        return 0.0 if self.start is None or self.end is None else self.end - self.start

    def problems_dict(self) -> dict[str, Any]:
        p = self.problems
        if p is None:
            return {
                "lines": self.requests, "parsed": self.requests, "skipped": 0, "late": 0,
                "partial": 0, "stopped": "", "counts": {}, "examples": [],
                "late_examples": [], "partial_examples": [], "summary": "",
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
            "partial": int(p.partial),
            "stopped": str(p.stopped),
            "counts": {str(k): int(v) for k, v in p.counts.items()},
            "examples": listed(p.examples),
            "late_examples": listed(getattr(p, "late_examples", ())),
            "partial_examples": listed(p.partial_examples),
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
    affect: float | None = None  # the share of clients a recommended limit may affect
    recommended: tuple[Recommendation, ...] = ()  # per algorithm and window planned
    # Per window (ms), each identity's most requested cost in one rolling window, by
    # identity code: what the recommendations and `plots.peaks_figure` read.
    client_peaks: Mapping[int, np.ndarray] = dataclasses.field(default_factory=dict)

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
            "affect": self.affect,
            "recommended": [r.to_dict() for r in self.recommended],
        }
        return _plain({name: values[name] for name in SCHEMA["plan"]})

    def table(self, *, problems: bool = True) -> str:
        """The report for a terminal: the log, whom each candidate hurts, the busiest
        identities affected, and the Redis plan. With `problems`, the reader's summary
        of bad lines too (the CLI prints that to stderr instead)."""
        return _render(self, problems=problems)
