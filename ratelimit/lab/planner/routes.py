"""Routes, filters and cost functions for the planner: each route of an API planned with
its own limit and its own key, on the requests a filter keeps.

    from ratelimit.lab.planner import routes
    plan = routes.plan_routes(
        "access.log",
        ["/tiles/*=100/s", "/within=10/s,cost=ratelimit.costs:geofence_cost(radius)"],
        where=["status=2xx", "method=GET"],
    )
    print(plan.table())        # `plan --route ... --where ...`
    plan.to_dict()             # `plan --route ... --json OUT`
    plan.frame()               # one row per route and algorithm, ready for a CSV

Routes (`parse_route`, `--route`): ``PATTERN=RATE[,cost=COST][,name=NAME]``.

- PATTERN is a shell-style glob (`fnmatch`, case-sensitive) matched against the whole
  path of the request without its query string: ``/tiles/*`` matches
  ``/tiles/10/3/4.png`` (``*`` also crosses ``/``), ``/within`` matches
  ``/within?lat=52.5&lng=13.4&radius=800``. ``?`` is the one-character wildcard, as in
  `fnmatch`; ``[?]`` is a literal question mark.
- RATE is a limit as `--limit` writes it ("10/s", "100/min").
- ``cost=COST`` prices the route's requests (the grammar of `parse_cost`); without it the
  route's requests cost what `--cost` says, else 1.
- ``name=NAME`` labels the route in the report (default: the pattern).

Each route is planned as the HTTP layer enforces it: its own limiter, and a key per
identity and route (the route's scope is part of the key), so an identity's requests on
one route never count against another. Concretely, each route's plan is `plan_trace`
on exactly the requests routed to it, with the route's limit under every algorithm; its
keys, memory and checks are that route's. A request goes to the *first* route whose
pattern matches, in the order the routes are given; the report counts the requests that
another, later pattern matched too. Requests that match no route are *unplanned*: counted
(with the most frequent first path segments among them), never planned, never dropped
silently.

Filters (`parse_where`, `--where`): ``FIELD=VALUES`` keeps the requests whose field is
one of VALUES (comma-separated), ``FIELD!=VALUES`` those whose field is none of them; all
filters must hold. Fields:

- ``status``: a code (``404``) or a class (``2xx``, ``5xx``); a line without a status
  matches no value;
- ``method``: ``GET``, ``POST``, ... (case does not matter);
- ``path``: a glob as for routes, on the path without its query string.

Filters apply before routing; the log summary says how many of the requests read they
kept (``where`` in the JSON: `conditions`, `requests_read`, `kept`).

Costs (`parse_cost`, `--cost`, a route's ``cost=``): a text with a colon names a Python
function, ``MODULE:FUNCTION`` or ``MODULE:FUNCTION(NAME)``; any other text is the name of
an integer field, as before (so a field whose name holds a colon cannot be a cost).

- ``MODULE:FUNCTION(NAME)``: ``FUNCTION(value)``, the value of NAME: the line's field of
  that name if it has one (jsonl and csv; a dotted name reaches into objects), else the
  query parameter NAME of the request's path. A number's text is passed as an int or a
  float. ``ratelimit.costs:geofence_cost(radius)`` prices a demo look-up by its radius.
- ``MODULE:FUNCTION``: ``FUNCTION(fields)``, the line's fields as a dict (the reader's
  convention for a cost callable), e.g. ``ratelimit.lab.samplelog:example_cost``.

A line whose cost cannot be read (the parameter is missing, the function raises
ValueError, TypeError, KeyError, IndexError or ArithmeticError, or returns no integer
>= 1) is a bad line of the log ("bad cost"), counted in its problems. A module or
function that cannot be found is a ValueError at once, before the log is read.

Reading: the log is read once per route (the reader's state is one pass), so a plan of
R routes reads it R times; memory stays that of one plan. A route with a cost of its
own (or a cost function) makes the reader hand every line's fields to Python, several
times slower than a cost field or no cost (on a loaded 2-core machine, 60,000 demo
lines and two routes: 8 s without route costs, 18 s with the geofence cost).
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pandas as pd

from ..accesslog.fields import _lookup
from .limits import parse_limit
from .planning import _cost_label, _NoRequests, describer, plan_trace
from .report import _columns, _duration, _pct, _utc
from .results import LogPlan, _plain
from .servertime import DEFAULT_ALGORITHMS, ServerTimeChoice, choose_server_time

__all__ = [
    "CostFunction",
    "Route",
    "RoutePlan",
    "RouteResult",
    "Where",
    "parse_cost",
    "parse_route",
    "parse_where",
    "plan_routes",
    "plan_routes_trace",
    "plan_where",
    "plan_where_trace",
]

WHERE_FIELDS = ("status", "method", "path")
"""The fields `--where` can test."""
ROUTE_FIELDS = ("path",)
"""The trace columns routing reads (besides time, identity and cost)."""
UNPLANNED_TOP = 5  # how many of the unplanned requests' first path segments to list
_SEGMENTS_KEPT = 10_000  # distinct first segments counted; the rest count as "(other)"
_FUNCTION = re.compile(
    r"^(?P<module>[A-Za-z_][\w.]*):(?P<function>[A-Za-z_]\w*)(?:\((?P<name>[^()]*)\))?$"
)
_ROUTE_OPTION = re.compile(r"[,\s]+(?=(?:cost|name)=)")
_STATUS = re.compile(r"^[1-5](?:\d\d|xx)$", re.IGNORECASE)


# -- costs -----------------------------------------------------------------------------



def _request_path(fields: Mapping[str, Any]) -> str:
    """The request's path with its query: the ``path`` field, else the middle of
    ``request`` ("GET /x?y=1 HTTP/1.1")."""
    path = fields.get("path")
    if isinstance(path, str) and path:
        return path
    parts = str(fields.get("request") or "").split(" ")
    return parts[1] if len(parts) == 3 else ""


def _number(value: Any) -> Any:
    """A field's or parameter's text as an int or a float when it is a number."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            return value
    return value


class CostFunction:
    """A request's cost from a named function (see the module docstring): called with
    the value of `name` (a field, else a query parameter), or with the line's fields
    when `name` is None. Raises KeyError for a line without that value, which the
    reader counts as a bad cost."""

    def __init__(self, spec: str, function: Callable[..., Any], name: str | None) -> None:
        self.spec = spec
        self.function = function
        self.name = name
        self.__qualname__ = spec  # the label the plan shows for its cost

    def __call__(self, fields: dict[str, Any]) -> Any:
        if self.name is None:
            return self.function(fields)
        value = _lookup(fields, self.name)
        if value is None:
            query = parse_qs(urlsplit(_request_path(fields)).query)
            if self.name not in query:
                raise KeyError(self.name)
            value = query[self.name][0]
        return self.function(_number(value))

    def __repr__(self) -> str:
        return self.spec


def parse_cost(text: str) -> str | CostFunction:
    """A cost as `--cost` takes it: a `CostFunction` for ``MODULE:FUNCTION`` or
    ``MODULE:FUNCTION(NAME)``, else the text itself, an integer field's name. ValueError
    with one line for a function that cannot be found."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a cost must be a field name or MODULE:FUNCTION, got {text!r}")
    text = text.strip()
    if ":" not in text:
        return text
    found = _FUNCTION.match(text)
    if found is None:
        raise ValueError(
            f"cannot read the cost {text!r}: a cost function is MODULE:FUNCTION or "
            "MODULE:FUNCTION(NAME), e.g. ratelimit.costs:geofence_cost(radius)"
        )
    module_name, function_name = found["module"], found["function"]
    name = found["name"].strip() if found["name"] is not None else None
    if name == "":
        raise ValueError(f"cost function {text!r}: name the field or query parameter in ()")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cost function {text!r}: cannot import {module_name}: {exc}") from None
    function = getattr(module, function_name, None)
    if function is None:
        raise ValueError(f"cost function {text!r}: {module_name} has no {function_name!r}")
    if not callable(function):
        raise ValueError(f"cost function {text!r}: {module_name}.{function_name} is not callable")
    return CostFunction(text, function, name)


# -- paths -----------------------------------------------------------------------------


def _paths(values: Any) -> pd.Series:
    """Request paths without their query strings."""
    series = pd.Series(values, dtype=object).fillna("").astype(str)
    return series.str.split("?", n=1).str[0]


@functools.lru_cache(maxsize=256)
def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(pattern))


def _matching(patterns: Sequence[re.Pattern[str]], paths: pd.Series) -> np.ndarray:
    """A (requests, patterns) boolean table: which patterns each path matches. Each
    distinct path is matched once."""
    codes, uniques = pd.factorize(paths, use_na_sentinel=False)
    table = np.zeros((len(uniques), len(patterns)), dtype=bool)
    for j, pattern in enumerate(patterns):
        table[:, j] = [pattern.match(p) is not None for p in uniques]
    return table[codes]


# -- filters ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Where:
    """One `--where` condition: `field` is (or with `negate`, is not) one of `values`."""

    text: str
    field: str
    values: tuple[str, ...]
    negate: bool

    def mask(self, chunk: pd.DataFrame) -> np.ndarray:
        """The rows of `chunk` this condition keeps."""
        if self.field not in chunk.columns:
            raise ValueError(
                f"--where {self.text!r}: the trace has no {self.field!r} column (the reader "
                "gives it with fields=)"
            )
        column = chunk[self.field].fillna("").astype(str)
        hit = np.zeros(len(chunk), dtype=bool)
        if self.field == "status":
            for value in self.values:
                if value.lower().endswith("xx"):
                    hit |= ((column.str.len() == 3) & (column.str[0] == value[0])).to_numpy()
                else:
                    hit |= (column == value).to_numpy()
        elif self.field == "method":
            hit = column.str.upper().isin(self.values).to_numpy()
        else:
            matched = _matching([_glob(v) for v in self.values], _paths(column))
            hit = matched.any(axis=1)
        return ~hit if self.negate else hit

    def holds(self, fields: Mapping[str, Any]) -> bool:
        """Whether one line's fields (a dict of their text) pass this condition, as
        `mask` decides for a row; plain Python, as the reader asks it once per line."""
        if self.field == "path":
            path = _request_path(fields).split("?", 1)[0]
            hit = any(_glob(v).match(path) is not None for v in self.values)
        else:
            value = str(fields.get(self.field) or "")
            if self.field == "method":
                hit = value.upper() in self.values
            else:
                hit = any(
                    (len(value) == 3 and value[0] == v[0]) if v.endswith("xx") else value == v
                    for v in self.values
                )
        return hit != self.negate


def parse_where(text: str) -> Where:
    """``FIELD=VALUES`` or ``FIELD!=VALUES`` (see the module docstring). ValueError with
    one line for anything else."""
    found = re.match(r"^\s*(\w+)\s*(!?=)(.*)$", text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(
            f"cannot read the filter {text!r}: write FIELD=VALUES or FIELD!=VALUES, e.g. "
            "status=2xx, method=GET, path=/api/*, status!=5xx"
        )
    field, negate = found[1].lower(), found[2] == "!="
    if field not in WHERE_FIELDS:
        raise ValueError(
            f"cannot filter on {found[1]!r} ({text!r}): the fields are {', '.join(WHERE_FIELDS)}"
        )
    values = tuple(v.strip() for v in found[3].split(",") if v.strip())
    if not values:
        raise ValueError(f"the filter {text!r} names no value")
    if field == "status":
        bad = [v for v in values if not _STATUS.match(v)]
        if bad:
            raise ValueError(
                f"the filter {text!r}: {bad[0]!r} is not a status; give a code such as 404 "
                "or a class such as 2xx"
            )
        values = tuple(v.lower() for v in values)
    if field == "method":
        values = tuple(v.upper() for v in values)
    return Where(text.strip(), field, values, negate)


def _kept(conditions: Sequence[Where], chunk: pd.DataFrame) -> np.ndarray:
    keep = np.ones(len(chunk), dtype=bool)
    for condition in conditions:
        keep &= condition.mask(chunk)
    return keep


# -- routes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """One `--route`: the requests whose path matches `pattern`, limited to `rate`."""

    text: str
    pattern: str
    rate: str
    limit: int
    window_s: float
    cost: str | CostFunction | None
    name: str

    @property
    def cost_text(self) -> str | None:
        return None if self.cost is None else _cost_label(self.cost)


def parse_route(text: str) -> Route:
    """``PATTERN=RATE[,cost=COST][,name=NAME]`` (see the module docstring). ValueError
    with one line for anything else."""
    if not isinstance(text, str):
        raise ValueError(f"a route must be text such as '/tiles/*=100/s', got {text!r}")
    head, *options = _ROUTE_OPTION.split(text.strip())
    pattern, sep, rate = head.rpartition("=")
    pattern, rate = pattern.strip(), rate.strip()
    if not sep or not pattern or not rate:
        raise ValueError(
            f"cannot read the route {text!r}: write PATTERN=RATE, e.g. '/tiles/*=100/s' "
            "(optionally ',cost=COST' and ',name=NAME')"
        )
    try:
        limit, window_s = parse_limit(rate)
    except ValueError as exc:
        raise ValueError(f"route {text!r}: {exc}") from None
    settings: dict[str, str] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key in settings:
            raise ValueError(f"route {text!r}: {key}= given twice")
        settings[key] = value.strip()
    if "name" in settings and not settings["name"]:
        raise ValueError(f"route {text!r}: name= is empty")
    cost = parse_cost(settings["cost"]) if "cost" in settings else None
    name = settings.get("name") or pattern
    return Route(text.strip(), pattern, rate, limit, window_s, cost, name)


def _routes(specs: Sequence[str | Route]) -> list[Route]:
    routes = [s if isinstance(s, Route) else parse_route(s) for s in specs]
    if not routes:
        raise ValueError("give at least one route, e.g. '/tiles/*=100/s'")
    names = [r.name for r in routes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two routes are named {twice[0]!r}; give each a name=")
    return routes


def _dispatch(routes: Sequence[Route], default: Any, conditions: Sequence[Where]) -> Any:
    """The reader's cost: each line priced by the first route its path matches (that
    route's cost, else `default`); lines the filters drop and unplanned lines cost 1, as
    they are never planned. When no route has a cost of its own, `default` prices every
    line."""
    if all(r.cost is None for r in routes):
        return default
    patterns = [_glob(r.pattern) for r in routes]
    reader_cost = [r.cost if r.cost is not None else default for r in routes]

    def field_cost(name: str, fields: Mapping[str, Any]) -> Any:
        value = _lookup(fields, name)
        return value if value is not None else 0  # 0: the reader's bad cost

    def cost(fields: dict[str, Any]) -> Any:
        if not all(c.holds(fields) for c in conditions):
            return 1
        path = _request_path(fields).split("?", 1)[0]
        for pattern, priced in zip(patterns, reader_cost, strict=True):
            if pattern.match(path):
                if priced is None:
                    return 1
                if isinstance(priced, str):
                    return field_cost(priced, fields)
                return priced(fields)
        return 1

    cost.__qualname__ = "per route"
    return cost


# -- results ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RouteResult:
    """One route's share of the log and its plan (None when no request was routed to
    it)."""

    route: Route
    requests: int
    also_matched: Mapping[str, int]  # later route's name -> requests it matched too
    plan: LogPlan | None


@dataclass(frozen=True)
class RoutePlan:
    """Per-route plans of one log: the log, the filters, each route, the unplanned."""

    log: Mapping[str, Any]  # path, example, format, identity_field, cost, span, problems
    where: Mapping[str, Any]  # conditions, requests_read, kept
    routes: tuple[RouteResult, ...]
    unplanned: int
    unplanned_top: tuple[tuple[str, int], ...]
    server_time: ServerTimeChoice

    def to_dict(self) -> dict[str, Any]:
        """One JSON-able document: `log`, `where`, `server_time`, `routes` (each with
        `name`, `pattern`, `rate`, `limit`, `window_s`, `cost`, `requests`, `share`,
        `also_matched`, `identities` and the `candidates` of a plan, as `plan --json`
        writes them), `unplanned` (`requests`, `share`, `top`: first path segments)."""
        kept = self.where["kept"]
        routes = []
        for r in self.routes:
            doc = r.plan.to_dict() if r.plan is not None else None
            routes.append({
                "name": r.route.name, "pattern": r.route.pattern, "rate": r.route.rate,
                "limit": r.route.limit, "window_s": r.route.window_s,
                "cost": r.route.cost_text or self.log["cost"], "requests": r.requests,
                "share": r.requests / kept if kept else 0.0,
                "also_matched": dict(r.also_matched),
                "identities": 0 if doc is None else doc["log"]["identities"],
                "candidates": [] if doc is None else doc["candidates"],
            })  # fmt: skip
        first = next((r.plan for r in self.routes if r.plan is not None), None)
        return _plain({
            "schema": 1,
            "log": dict(self.log),
            "where": dict(self.where),
            "server_time": self.server_time.to_dict(),
            "shard": None if first is None else first.to_dict()["shard"],
            "routes": routes,
            "unplanned": {
                "requests": self.unplanned,
                "share": self.unplanned / kept if kept else 0.0,
                "top": [{"path": p, "requests": n} for p, n in self.unplanned_top],
            },
        })  # fmt: skip

    def frame(self) -> pd.DataFrame:
        """One row per route and algorithm (and one for the unplanned requests), with
        what the table shows: ready for `to_csv`."""
        rows = []
        for r in self.routes:
            base = {
                "route": r.route.name,
                "pattern": r.route.pattern,
                "rate": r.route.rate,
                "cost": r.route.cost_text or self.log["cost"],
                "route_requests": r.requests,
            }
            for c in [] if r.plan is None else r.plan.candidates:
                redis = c.redis
                rows.append({
                    **base, "algorithm": c.algorithm, "limit": c.limit, "window_s": c.window_s,
                    "identities": c.identities, "rejected": c.rejected,
                    "rejected_share": c.rejected / c.requests if c.requests else 0.0,
                    "refused": c.refused, "identities_rejected": c.identities_rejected,
                    "peak_admitted": c.peak_admitted,
                    "keys": None if redis is None else redis.keys,
                    "memory_bytes": None if redis is None else redis.memory_bytes,
                    "peak_checks_per_s": None if redis is None else redis.peak_checks_per_s,
                    "shards": None if redis is None else redis.shards,
                })  # fmt: skip
            if r.plan is None:
                rows.append(base)
        rows.append({"route": "(unplanned)", "route_requests": self.unplanned})
        columns = [
            "route", "pattern", "rate", "cost", "route_requests", "algorithm", "limit",
            "window_s", "identities", "rejected", "rejected_share", "refused",
            "identities_rejected", "peak_admitted", "keys", "memory_bytes",
            "peak_checks_per_s", "shards",
        ]  # fmt: skip
        return pd.DataFrame(rows, columns=columns)

    def table(self, *, problems: bool = True) -> str:
        """The report for a terminal: the log, the filters, each route's requests, whom
        its limit hurts and its Redis plan, and the unplanned requests."""
        return _render_routes(self, problems=problems)


def _render_routes(plan: RoutePlan, *, problems: bool) -> str:
    from ..memory import format_bytes

    log, where = plan.log, plan.where
    shown = "the lab's example log (synthetic traffic)" if log["example"] else log["path"]
    out = [
        f"Per-route plan for {shown}: format {log['format']}, identity: "
        f"{log['identity_field']}, key: identity x route",
        f"  {where['requests_read']:,} requests, {log['start_utc']} to {log['end_utc']} "
        f"({_duration(log['duration_s'])})",
    ]
    if where["conditions"]:
        out.append(
            f"  --where {' and '.join(where['conditions'])}: kept {where['kept']:,} of "
            f"{where['requests_read']:,} requests ({_pct(where['kept'], where['requests_read'])})"
        )
    if problems and log["problems"]:
        out += ["  " + line for line in log["problems"].splitlines()]
    kept = where["kept"]
    out += ["", "Routes (a request goes to the first pattern it matches)"]
    rows = [["route", "pattern", "limit", "cost", "requests", "share", "identities"]]
    for r in plan.routes:
        rows.append([
            r.route.name, r.route.pattern, r.route.rate, r.route.cost_text or log["cost"],
            f"{r.requests:,}", _pct(r.requests, kept),
            "-" if r.plan is None else f"{r.plan.log.identities:,}",
        ])  # fmt: skip
    rows.append(["(unplanned)", "no pattern matched", "-", "-", f"{plan.unplanned:,}",
                 _pct(plan.unplanned, kept), "-"])  # fmt: skip
    out += ["  " + line for line in _columns(rows, right=(4, 5, 6))]
    for r in plan.routes:
        for other, n in r.also_matched.items():
            out.append(
                f"  {n:,} requests matched both {r.route.name!r} and {other!r}: planned on "
                f"{r.route.name!r}, the first"
            )
    if plan.unplanned_top:
        listed = ", ".join(f"{p} {n:,}" for p, n in plan.unplanned_top)
        out.append(f"  unplanned, by first path segment: {listed}")
    out += ["", "Per route: who is hurt, and the Redis it needs (its own keys)"]
    rows = [["route", "limit", "algorithm", "rejected", "share", "identities rejected",
             "peak admitted / limit", "cost > limit", "keys", "memory", "checks/s at peak",
             "shards"]]  # fmt: skip
    for r in plan.routes:
        if r.plan is None:
            rows.append([r.route.name, r.route.rate, "-", "no requests"] + ["-"] * 8)
            continue
        for c in r.plan.candidates:
            redis = c.redis
            rows.append([
                r.route.name, c.limit_text, c.label, f"{c.rejected:,}",
                _pct(c.rejected, c.requests),
                f"{c.identities_rejected:,} of {c.identities:,}",
                f"{c.peak_admitted:,} / {c.limit:,} ({c.peak_admitted / c.limit:.2f}x)",
                f"{c.refused:,}",
                "0" if redis is None else f"{redis.keys:,}",
                "-" if redis is None else format_bytes(redis.memory_bytes),
                "0" if redis is None else f"{redis.peak_checks_per_s:,}",
                "-" if redis is None or redis.shards is None else str(redis.shards),
            ])  # fmt: skip
    out += ["  " + line for line in _columns(rows, right=range(3, 12))]
    choice = plan.server_time
    if choice.server_time is not None:
        out.append(f"  server time per check: {choice.server_time.source}")
    else:
        out.append("  server time per check: unknown, so no shards for checks are planned")
    return "\n".join(out)


# -- planning --------------------------------------------------------------------------


class _Tally:
    """What one pass over the requests saw: read, kept by the filters, per route, the
    requests also matched by a later route, and the unplanned by first path segment."""

    def __init__(self, routes: int) -> None:
        self.read = 0
        self.kept = 0
        self.routed = np.zeros(routes, dtype=np.int64)
        self.overlap = np.zeros((routes, routes), dtype=np.int64)
        self.unplanned = 0
        self.segments: Counter[str] = Counter()
        self.start, self.end = np.inf, -np.inf

    def add(self, chunk: pd.DataFrame, keep: np.ndarray, route: np.ndarray | None,
            matched: np.ndarray | None, paths: pd.Series | None) -> None:  # fmt: skip
        self.read += len(chunk)
        self.kept += int(np.count_nonzero(keep))
        if len(chunk):
            seconds = chunk["time"].to_numpy(dtype=np.float64)
            self.start, self.end = min(self.start, seconds.min()), max(self.end, seconds.max())
        if route is None or matched is None or paths is None:
            return
        mine = route[keep]
        self.routed += np.bincount(mine[mine >= 0], minlength=len(self.routed))
        first = matched[keep]
        for i in range(len(self.routed)):
            self.overlap[i] += first[mine == i].sum(axis=0)
        lost = paths[keep][mine < 0]
        self.unplanned += len(lost)
        for segment, n in _segments(lost).items():
            if segment in self.segments or len(self.segments) < _SEGMENTS_KEPT:
                self.segments[segment] += n
            else:
                self.segments["(other)"] += n


def _segments(paths: pd.Series) -> Mapping[str, int]:
    """Paths counted by their first segment: "/images/a.png" -> "/images/*"."""
    if not len(paths):
        return {}
    head = paths.str.extract(r"^(/[^/]*)(/?)", expand=True)
    label = head[0].fillna("(no path)") + np.where(head[1] == "/", "/*", "")
    label = label.where(paths != "", "(no path)")
    return label.value_counts().to_dict()


Chunks = Callable[[], Iterable[pd.DataFrame]]
"""A source of trace chunks, called once per pass: each call reads the requests again."""


def _split_pass(
    source: Chunks,
    conditions: Sequence[Where],
    patterns: Sequence[re.Pattern[str]] | None,
    index: int | None,
    tally: _Tally | None,
) -> Iterable[pd.DataFrame]:
    """The chunks of one pass, keeping the requests the filters keep and, with
    `patterns`, that route `index` gets; `tally` counts the whole pass."""
    for chunk in source():
        keep = _kept(conditions, chunk)
        route = matched = paths = None
        if patterns is not None:
            if "path" not in chunk.columns:
                raise ValueError(
                    "routes need the requests' paths: the trace has no 'path' column (the "
                    "reader gives it with fields=)"
                )
            paths = _paths(chunk["path"].to_numpy(dtype=object))
            matched = _matching(patterns, paths)
            route = np.where(matched.any(axis=1), matched.argmax(axis=1), -1)
        if tally is not None:
            tally.add(chunk, keep, route, matched, paths)
        if route is not None and index is not None:
            keep = keep & (route == index)
        yield chunk[keep] if not keep.all() else chunk


def _plan_routes(
    source: Chunks,
    routes: Sequence[Route],
    algorithms: Sequence[str],
    conditions: Sequence[Where],
    describe: Callable[[], Mapping[str, Any]],
    options: Mapping[str, Any],
    server_time: ServerTimeChoice,
) -> RoutePlan:
    patterns = [_glob(r.pattern) for r in routes]
    tally = _Tally(len(routes))
    results = []
    found: Mapping[str, Any] = {}
    for i, route in enumerate(routes):
        chunks = _split_pass(source, conditions, patterns, i, tally if i == 0 else None)
        where = {
            "conditions": [c.text for c in conditions] + [f"route {route.name}"],
            "requests_read": None, "kept": None,
        }  # fmt: skip

        def described(where: dict[str, Any] = where, route: Route = route) -> dict[str, Any]:
            found = dict(describe())
            where.update(requests_read=tally.read, kept=int(tally.routed[routes.index(route)]))
            return {**found, "cost": route.cost_text or found.get("cost"), "where": where}

        try:
            plan = plan_trace(
                chunks, [(route.limit, route.window_s)], algorithms, server_time=server_time,
                describe=described, **options,
            )  # fmt: skip
        except _NoRequests:
            plan = None
            for _ in chunks:  # the first pass still counts the whole log
                pass
        if i == 0:
            found = describe()
        later = {routes[j].name: int(tally.overlap[i, j]) for j in range(i + 1, len(routes))}
        results.append(
            RouteResult(route, int(tally.routed[i]), {k: v for k, v in later.items() if v}, plan)
        )
    problems = found.get("problems")
    log = {
        "path": str(found.get("path", "(a trace in memory)")),
        "example": bool(found.get("example", False)),
        "format": str(found.get("format", "trace")),
        "identity_field": str(found.get("identity_field", "identity")),
        "cost": str(found.get("cost", "cost")),
        "requests": tally.read,
        "start_utc": _utc(tally.start) if tally.read else None,
        "end_utc": _utc(tally.end) if tally.read else None,
        "duration_s": float(tally.end - tally.start) if tally.read else 0.0,
        "problems": problems.summary() if problems is not None else "",
    }
    top = tuple(tally.segments.most_common(UNPLANNED_TOP))
    where = {"conditions": [c.text for c in conditions], "requests_read": tally.read,
             "kept": tally.kept}  # fmt: skip
    return RoutePlan(log, where, tuple(results), tally.unplanned, top, server_time)


def _server_time(
    algorithms: Sequence[str], options: dict[str, Any]
) -> tuple[ServerTimeChoice, dict[str, Any]]:
    """The server time chosen once for every route, and the options left for
    `plan_trace`."""
    from ratelimit import algorithms as registry

    names = list(dict.fromkeys(registry.get(a).name for a in algorithms))
    choice = options.pop("server_time", None) or choose_server_time(
        names,
        redis_url=options.pop("redis_url", None),
        measure=options.pop("measure", True),
        bench_record=options.pop("bench_record", None),
    )
    for name in ("redis_url", "measure", "bench_record"):
        options.pop(name, None)
    return choice, options


def _trace_source(chunks: pd.DataFrame | Iterable[pd.DataFrame] | Chunks) -> Chunks:
    if isinstance(chunks, pd.DataFrame):
        return lambda: [chunks]
    if callable(chunks):
        return chunks
    held = list(chunks)  # an iterable is read once; every pass reads it again
    return lambda: held


def plan_routes_trace(
    chunks: pd.DataFrame | Iterable[pd.DataFrame] | Chunks,
    routes: Sequence[str | Route],
    algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
    *,
    where: Sequence[str | Where] = (),
    describe: Callable[[], Mapping[str, Any]] | None = None,
    **options: Any,
) -> RoutePlan:
    """`plan_routes` on trace tables with a ``path`` column (and ``status`` and
    ``method`` for the filters that test them): one frame, a list of chunks, or a
    function returning fresh chunks on each call (one call per route). `options` go to
    `plan_trace` (`measure`, `redis_url`, `server_time`, `top`, ...)."""
    routes = _routes(routes)
    conditions = [w if isinstance(w, Where) else parse_where(w) for w in where]
    choice, rest = _server_time(algorithms, dict(options))
    return _plan_routes(
        _trace_source(chunks), routes, algorithms, conditions, describe or dict, rest, choice
    )


def plan_where_trace(
    chunks: pd.DataFrame | Iterable[pd.DataFrame],
    limits: Sequence[Any],
    algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
    *,
    where: Sequence[str | Where],
    describe: Callable[[], Mapping[str, Any]] | None = None,
    **options: Any,
) -> LogPlan:
    """`plan_trace` on the requests the filters `where` keep; the plan's log summary
    says how many (`LogSummary.where`)."""
    conditions = [w if isinstance(w, Where) else parse_where(w) for w in where]
    tally = _Tally(0)

    def source() -> Iterable[pd.DataFrame]:  # one pass: an iterable is read as it comes
        return [chunks] if isinstance(chunks, pd.DataFrame) else chunks

    def described() -> dict[str, Any]:
        found = dict(describe() if describe is not None else {})
        found["where"] = {"conditions": [c.text for c in conditions],
                          "requests_read": tally.read, "kept": tally.kept}  # fmt: skip
        return found

    return plan_trace(
        _split_pass(source, conditions, None, None, tally), limits, algorithms,
        describe=described, **options,
    )  # fmt: skip


def _reader(path: str | Path, fields: Sequence[str], cost: Any, reader_options: Any) -> Any:
    from .. import accesslog

    return accesslog.LogReader(path, cost=cost, fields=tuple(fields), **reader_options)


def _log_describe(reader: Any, path: Any, example: bool, cost: Any) -> Callable[[], dict]:
    return describer(reader, str(path), example, cost)


_READER_OPTIONS = (
    "format", "identity", "time", "progress", "reorder_s", "chunk_lines", "read_ahead",
)  # fmt: skip


def plan_routes(
    path: str | Path,
    routes: Sequence[str | Route],
    algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
    *,
    where: Sequence[str | Where] = (),
    cost: str | Callable[[dict[str, Any]], int] | None = None,
    example: bool = False,
    **options: Any,
) -> RoutePlan:
    """Plan each route of `routes` (``PATTERN=RATE[,cost=COST][,name=NAME]`` or `Route`)
    with its own limit and key, on the requests of the access log at `path` that the
    filters `where` keep (see the module docstring). `cost` prices the requests of a
    route without a cost of its own (a field, a `CostFunction`, a callable). `options`:
    the reader's (`format`, `identity`, `time`, `progress`, `reorder_s`, `chunk_lines`,
    `read_ahead`) and `plan_trace`'s (`measure`, `redis_url`, `top`, `headroom`, ...)."""
    from .. import accesslog

    routes = _routes(routes)
    conditions = [w if isinstance(w, Where) else parse_where(w) for w in where]
    reader_options = {k: options.pop(k) for k in _READER_OPTIONS if k in options}
    fields = sorted({*ROUTE_FIELDS, *(c.field for c in conditions)})
    reader = _reader(path, fields, _dispatch(routes, cost, conditions), reader_options)
    choice, rest = _server_time(algorithms, options)
    describe = _log_describe(reader, path, example, cost)
    plan = _plan_routes(lambda: reader, routes, algorithms, conditions, describe, rest, choice)
    if plan.where["requests_read"] == 0:
        summary = reader.problems.summary()
        raise accesslog.LogFormatError(f"{path} holds no request to plan on: {summary}")
    return plan


def plan_where(
    path: str | Path,
    limits: Sequence[Any],
    algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
    *,
    where: Sequence[str | Where],
    cost: str | Callable[[dict[str, Any]], int] | None = None,
    example: bool = False,
    **options: Any,
) -> LogPlan:
    """`planning.plan_log` on the requests of the log at `path` that the filters `where`
    keep; the plan's log summary says how many. `options` as `plan_routes`'s."""
    from .. import accesslog

    conditions = [w if isinstance(w, Where) else parse_where(w) for w in where]
    reader_options = {k: options.pop(k) for k in _READER_OPTIONS if k in options}
    fields = sorted({c.field for c in conditions})
    reader = _reader(path, fields, cost, reader_options)
    try:
        return plan_where_trace(
            reader, limits, algorithms, where=conditions,
            describe=_log_describe(reader, path, example, cost), **options,
        )  # fmt: skip
    except _NoRequests:
        summary = reader.problems.summary()
        raise accesslog.LogFormatError(
            f"{path} holds no request to plan on after --where: {summary}"
        ) from None
