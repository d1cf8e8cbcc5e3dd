"""Chapter 7 (the HTTP route): the demo API's answers, its clients and its outages.

Sections 1 to 5 call the demo API (`ratelimit.demo`) in this process through httpx's
ASGI transport (no sockets), on a fresh embedded Redis whatever `REDIS_URL` says, so
every number is reproducible; section 6 runs it under uvicorn (`DemoServer`).

Section 4's clients are closed loops: each next request depends on the previous
answer, so they are not a trace that `ratelimit.lab.replay` could play back.
`ClientLoop` is that loop, written once: one that retries 50 ms after every 429
("hammers"), one that waits as long as `Retry-After` says (whole seconds), one that
waits as long as `Retry-After-Ms` says, one that paces itself by `RateLimit-Policy`.
`run_over_http` drives it against the demo app on a virtual clock; `simulate` drives
it against the in-memory reference model of the sliding log (`ratelimit.lab.reference`,
held to the Lua script's decisions by the property tests), with the status and header
fields the route's own code would send (`ratelimit.http.status_for`,
`RateLimit.headers_for`). No Redis, no app, no event loop: a 30 s run takes
milliseconds, and the chapter checks that its counts equal the app's.

    from ratelimit.lab.chapters import http_route
    from ratelimit.lab.plotting import explorer
    http_route.simulate(client=http_route.PACED)        # one client's run, as a ClientRun
    http_route.figure()                                  # the Explore section's default
    explorer(http_route.figure, **http_route.SLIDERS)    # sliders, in JupyterLab
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pandas as pd

from ratelimit import __main__ as command_line
from ratelimit import algorithms, connect, keys
from ratelimit.clock import ManualClock
from ratelimit.costs import GEOFENCE_MAX_COST, geofence_cost
from ratelimit.devtools.demo_server import DemoServer
from ratelimit.devtools.process import free_port, pid_alive, port_is_free
from ratelimit.http import DRAFT, RETRY_AFTER_MS_HEADER, rate_limit, status_for
from ratelimit.identity import route_identity
from ratelimit.lab.plotting import parameters_of

if TYPE_CHECKING:
    from fastapi import FastAPI
    from matplotlib.figure import Figure

__all__ = [
    "CLIENTS",
    "HEADER_MEANINGS",
    "SLIDERS",
    "TIERS",
    "ClientLoop",
    "ClientRun",
    "TierRun",
    "as_sent",
    "clients_figure",
    "cost_sequence",
    "cost_table",
    "cost_thresholds",
    "demo_app",
    "effective_window_example",
    "figure",
    "headers_table",
    "headline_numbers",
    "in_process",
    "key_from_the_command_line",
    "key_state",
    "look_ups",
    "look_ups_over_http",
    "outage_table",
    "parse_item",
    "quota_and_reset",
    "run_over_http",
    "sequence_figure",
    "simulate",
    "start_server",
    "stop_server",
    "seed_check",
    "shown",
    "summary",
    "tiered_app",
    "tiers_figure",
    "tiers_run",
    "tiers_table",
    "units_in_window",
    "verification_table",
    "within",
]

# The chapter's parameters (notebooks/07_http_route.ipynb, its "parameters" cell).
LIMIT = 10  # /within budget: cost units per window, per client
WINDOW_S = 1  # window width, seconds
TILES_LIMIT = 100  # /tiles budget per window
DURATION_S = 10  # virtual seconds each client of section 4 runs
LATENCY_MS = 20  # virtual round trip of one request, ms
HAMMER_RETRY_MS = 50  # the impatient client retries this soon after a 429

# What the README says about this chapter (`ratelimit.lab.records`): format strings whose
# fields are the notebook's record names.
TITLE = "The HTTP route"
SUMMARY = (
    "the limiter as a FastAPI dependency: {seed_admitted} look-ups answered 200, the next "
    "{seed_refused} 429, and the Redis key behind them (`python -m ratelimit key`); every "
    "header of " + DRAFT + " explained; cost-weighted geofences (cost {max_cost} above "
    "{max_cost_above_km} km); clients that hammer, honour Retry-After or Retry-After-Ms, or "
    "pace themselves; fail-open / fail-closed; a real uvicorn server; and requests in "
    "flight: look-ups of 2 s at 10 per second hold {in_flight_rate_only} at once under the "
    "rate limit alone, {in_flight_leased} with a lease each"
)
HEADLINE = (
    "Over {duration_s} s at {limit} look-ups per second, a client that retries "
    "{hammer_retry_ms} ms after every 429 gets {hammer_admitted} look-ups with "
    "{hammer_refused} of its {hammer_requests} requests refused; one that honours the "
    "whole-second Retry-After gets {polite_admitted} ({polite_loss_pct} fewer); one that "
    "waits the exact Retry-After-Ms gets {exact_admitted} and one paced by RateLimit-Policy "
    "{paced_admitted}: hammering costs the server refusals and gains nothing over a client "
    "that listens precisely."
)

CENTER = {"lng": 13.405, "lat": 52.52}  # the middle of the demo's seeded point set
RADIUS_M = 500  # the look-up of sections 1, 4, 5 and 6: 500 m costs 1 unit
SCOPE = "geofence"  # the /within route's policy name in the headers
PEER = "203.0.113.7"  # the in-process client's address (a documentation range)
COST_TABLE_RADII_M = [100, 500, 501, 750, 1000, 1250, 1500, 1600, 5000]

HAMMERS = "hammers"
HONOURS_RETRY_AFTER = "honours Retry-After"
HONOURS_RETRY_AFTER_MS = "honours Retry-After-Ms"
PACED = "paced by RateLimit-Policy"
CLIENTS = [HAMMERS, HONOURS_RETRY_AFTER, HONOURS_RETRY_AFTER_MS, PACED]
"""The client behaviours of the chapter's section 4, as the drop-down offers them."""

# The Explore section's controls (ipywidgets abbreviations; a list is a drop-down).
SLIDERS: dict[str, Any] = {"limit": (1, 50), "client": CLIENTS, "duration_s": (2, 30)}

_CLIENT_COLORS = dict(zip(CLIENTS, ["tab:red", "tab:blue", "tab:purple", "tab:green"], strict=True))
_TITLES = {
    HAMMERS: "A client that retries {retry} ms after each 429",
    HONOURS_RETRY_AFTER: "A client that honours Retry-After",
    HONOURS_RETRY_AFTER_MS: "A client that honours Retry-After-Ms",
    PACED: "A client paced by RateLimit-Policy",
}

HEADER_MEANINGS = {
    "RateLimit-Policy": "the rule: q units per window of w seconds, for the policy 'geofence'",
    "RateLimit": "r units available; t, seconds until r grows (on a 429, = Retry-After)",
    "RateLimit-Limit": "older drafts: the quota (q)",
    "RateLimit-Remaining": "older drafts: units left (r)",
    "RateLimit-Reset": "older drafts: seconds until the whole quota is back",
    "Retry-After": "429 only: whole seconds, rounded up, until this request would be admitted",
    RETRY_AFTER_MS_HEADER: "429 only: the same wait in milliseconds (not in any RFC)",
    "Content-Type": "the body: the look-up's JSON, or an RFC 9457 problem document",
}
"""Section 2's header fields, in the order the table shows them, with what each says."""


# --- the app in this process ----------------------------------------------------------------


def demo_app(
    redis: Any = None,
    *,
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    tiles_limit: int = TILES_LIMIT,
    **options: Any,
) -> FastAPI:
    """The demo API with the chapter's budgets, on a fresh embedded Redis unless `redis`
    is given (whatever REDIS_URL says); other options go to `ratelimit.demo.create_app`."""
    from ratelimit.demo import create_app

    redis = connect(embedded=True) if redis is None else redis
    return create_app(
        redis, window_s=window_s, within_limit=limit, tiles_limit=tiles_limit, **options
    )


def in_process(app: Any, peer: str = PEER) -> httpx.AsyncClient:
    """An httpx client calling `app` in this process (no sockets), as client `peer`."""
    transport = httpx.ASGITransport(app=app, client=(peer, 50000))
    return httpx.AsyncClient(transport=transport, base_url="http://demo")


def within(radius_m: float) -> dict[str, float]:
    """The query of a /within look-up of `radius_m` metres around the point set's centre."""
    return {**CENTER, "radius": radius_m}


def parse_item(value: str) -> dict[str, Any]:
    """A Structured Field item: '"geofence";r=9;t=1' -> {"name": "geofence", "r": 9, "t": 1}."""
    name, *params = value.split(";")
    return {"name": name.strip('"'), **{k: int(v) for k, v in (p.split("=") for p in params)}}


async def look_ups(
    app: Any, api_key: str, count: int, radius_m: float = RADIUS_M
) -> list[httpx.Response]:
    """`count` /within look-ups in a row with one API key, in this process."""
    async with in_process(app) as client:
        headers = {"x-api-key": api_key}
        return [
            await client.get("/within", params=within(radius_m), headers=headers)
            for _ in range(count)
        ]


def verification_table(responses: Sequence[httpx.Response]) -> pd.DataFrame:
    """Status, `RateLimit` and `Retry-After` of each response, numbered from 1."""
    rows = [
        {
            "status": r.status_code,
            "RateLimit": r.headers["RateLimit"],
            "Retry-After": r.headers.get("Retry-After", ""),
        }
        for r in responses
    ]
    return pd.DataFrame(rows, index=pd.RangeIndex(1, len(rows) + 1, name="request"))


async def key_state(app: Any, api_key: str) -> tuple[str, int, int]:
    """The /within limiter's Redis key for `api_key`, its members (ZCARD) and PTTL (ms)."""
    key = app.state.limits[SCOPE].key_for(api_key)
    redis = app.state.redis
    return key, int(await redis.zcard(key)), int(await redis.pttl(key))


def key_from_the_command_line(argv: Sequence[str]) -> str:
    """What `python -m ratelimit ARGV...` prints, run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = command_line.main(list(argv))
    if status != 0:
        raise RuntimeError(f"python -m ratelimit {' '.join(argv)} exited with {status}")
    return out.getvalue().strip()


async def seed_check(app: Any, api_key: str) -> dict[str, Any]:
    """The project's check after the look-ups, as the seed types it: the demo keeps plain
    keys, so the key of `api_key` on the geofence route is `rl:geofence:key:<api_key>`;
    the command line (`python -m ratelimit key API_KEY --scope geofence --window-ms 1000
    --plain-keys`) and `ratelimit.keys.route_key` name the same; then `ZCARD` and `PTTL`."""
    window_ms = app.state.limits[SCOPE].limiter.window_ms
    argv = ["key", api_key, "--scope", SCOPE, "--window-ms", str(window_ms), "--plain-keys"]
    key = key_from_the_command_line(argv)
    redis = app.state.redis
    return {
        "command": "python -m ratelimit " + " ".join(argv),
        "key": key,
        "typed": f"rl:{SCOPE}:key:{api_key}",
        "python": keys.route_key(api_key, scope=SCOPE, window_ms=window_ms, plain=True),
        "app": app.state.limits[SCOPE].key_for(api_key),
        "bare": app.state.limits[SCOPE].limiter.key_for(api_key),
        "ZCARD": int(await redis.zcard(key)),
        "PTTL": int(await redis.pttl(key)),
    }


async def effective_window_example(
    times_s: Sequence[float] = (0, 0, 0, 0, 0, 50, 50, 50, 50, 50, 50.5, 60, 60, 60, 60, 60, 60),
    *,
    limit: int = LIMIT,
    window_s: int = 60,
    api_key: str = "t-example",
) -> pd.DataFrame:
    """One client's look-ups at `times_s` (virtual seconds) against `limit` per `window_s`
    on a fresh demo app: each one's status, `RateLimit` field and `Retry-After`. The
    default is a minute's budget spent in two halves 50 s apart: what the first unit's
    return, 60 s after the first look-ups, does to `r` and `t`."""
    clock = ManualClock()
    app = demo_app(clock=clock, limit=limit, window_s=window_s)
    rows = []
    async with in_process(app) as client:
        for at_s in times_s:
            clock.set(at_s)
            r = await client.get("/within", params=within(RADIUS_M), headers={"x-api-key": api_key})
            rows.append(
                {
                    "time (s)": at_s,
                    "status": r.status_code,
                    "RateLimit": r.headers["RateLimit"],
                    "Retry-After": r.headers.get("Retry-After", ""),
                }
            )
    table = pd.DataFrame(rows, index=pd.RangeIndex(1, len(rows) + 1, name="request"))
    table.attrs["window_s"] = window_s  # the budget's window, for the text that quotes it
    return table


def shown(field: str, response: httpx.Response) -> str:
    """A field's value as the chapter prints it ("" when absent). On the real clock,
    `Retry-After-Ms` varies from run to run with how long the requests took: it shows as
    the range it must lie in, 1 ms to Retry-After, or as itself when outside that."""
    value = response.headers.get(field, "")
    if field.lower() == RETRY_AFTER_MS_HEADER.lower() and value:
        most = 1000 * int(response.headers["Retry-After"])
        if 1 <= int(value) <= most:
            return f"1..{most} (real time)"
    return value


def headers_table(responses: Mapping[str, httpx.Response]) -> pd.DataFrame:
    """The fields of `HEADER_MEANINGS` in each response (one column per name), as
    `shown`, and what each field means; a field a response lacks is empty."""
    columns = {
        name: [shown(field, r) for field in HEADER_MEANINGS] for name, r in responses.items()
    }
    return pd.DataFrame(
        {**columns, "meaning": list(HEADER_MEANINGS.values())},
        index=pd.Index(list(HEADER_MEANINGS), name="field"),
    )


# --- cost-weighted look-ups -------------------------------------------------------------


def _max_cost(limit: int) -> int:
    # The demo caps a look-up's cost at the limit, so that every look-up can pass.
    return min(GEOFENCE_MAX_COST, limit)


def cost_thresholds(max_cost: int = GEOFENCE_MAX_COST) -> pd.DataFrame:
    """For each cost from 2 to `max_cost`, the radius above which a look-up costs that
    much: found by bisection on `ratelimit.costs.geofence_cost` itself (to 1 mm), so it
    is the function's answer, not a formula's."""
    rows = []
    for cost in range(2, max_cost + 1):
        low, high = 0.0, 500.0 * math.sqrt(max_cost) + 1  # cost(low) < cost <= cost(high)
        while high - low > 0.001:
            middle = (low + high) / 2
            if geofence_cost(middle, max_cost=max_cost) >= cost:
                high = middle
            else:
                low = middle
        rows.append({"cost (units)": cost, "from above (m)": round(low)})
    return pd.DataFrame(rows).set_index("cost (units)")


def cost_table(
    radii_m: Sequence[float] = COST_TABLE_RADII_M, *, limit: int = LIMIT, window_s: int = WINDOW_S
) -> pd.DataFrame:
    """Each radius's cost (`ratelimit.costs.geofence_cost`, capped as the demo caps it)
    and how many such look-ups fit in one window."""
    costs = [geofence_cost(r, max_cost=_max_cost(limit)) for r in radii_m]
    table = pd.DataFrame({"radius (m)": list(radii_m), "cost (units)": costs})
    table = table.set_index("radius (m)")
    table[f"look-ups per {window_s} s"] = limit // table["cost (units)"]
    return table


async def cost_sequence(
    radii_m: Sequence[float],
    step_ms: int,
    *,
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    tiles_limit: int = TILES_LIMIT,
    api_key: str = "geofence-client",
) -> pd.DataFrame:
    """One client's look-ups of `radii_m`, one every `step_ms` of virtual time, on a
    fresh app: each one's time, cost, status, units left (`RateLimit`'s r) and
    Retry-After."""
    clock = ManualClock()
    app = demo_app(clock=clock, limit=limit, window_s=window_s, tiles_limit=tiles_limit)
    rows = []
    async with in_process(app) as client:
        for i, radius in enumerate(radii_m):
            clock.set_ms(i * step_ms)
            headers = {"x-api-key": api_key}
            r = await client.get("/within", params=within(radius), headers=headers)
            rows.append(
                {
                    "time (ms)": i * step_ms,
                    "radius (m)": radius,
                    "cost": geofence_cost(radius, max_cost=_max_cost(limit)),
                    "status": r.status_code,
                    "r (units left)": parse_item(r.headers["RateLimit"])["r"],
                    "Retry-After": r.headers.get("Retry-After", ""),
                }
            )
    return pd.DataFrame(rows)


def units_in_window(sequence: pd.DataFrame, window_ms: int) -> list[int]:
    """After each request of `sequence`, the units admitted in (t - window, t]: what the
    client's sorted set holds at t."""
    admitted = sequence[sequence.status == 200]
    ms = admitted["time (ms)"]
    return [
        int(admitted.loc[(ms > t - window_ms) & (ms <= t), "cost"].sum())
        for t in sequence["time (ms)"]
    ]


def sequence_figure(
    sequence: pd.DataFrame, *, limit: int = LIMIT, window_s: int = WINDOW_S, step_ms: int = 125
) -> Figure:
    """Section 3's look-ups as bars of their cost (admitted filled, refused hatched),
    with the units in the window after each request against the limit."""
    import matplotlib.pyplot as plt

    admitted = sequence[sequence.status == 200]
    refused = sequence[sequence.status == 429]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = step_ms * 0.6
    looks = [
        (admitted, "cost, admitted (200)", {"color": "tab:blue"}),
        (refused, "cost, refused (429)", {"color": "none", "edgecolor": "tab:red", "hatch": "//"}),
    ]
    for rows, label, look in looks:
        ax.bar(rows["time (ms)"], rows["cost"], width, label=label, **look)
    in_window = units_in_window(sequence, window_s * 1000)
    ax.step(
        sequence["time (ms)"],
        in_window,
        where="post",
        color="black",
        linewidth=1.5,
        label="units in the window after the request",
    )
    ax.axhline(limit, color="black", linestyle=":", linewidth=1, label=f"limit ({limit} units)")
    ax.set_xlabel("virtual time (ms)")
    ax.set_ylabel("units")
    ax.set_ylim(0, limit + 4)
    ax.set_title(f"Cost-weighted geofence look-ups, {limit} units per {window_s} s")
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    fig.tight_layout()
    return fig


# --- clients that listen, or not ----------------------------------------------------------


@dataclass(frozen=True)
class ClientRun:
    """One client's requests: send times (virtual ms), statuses, and whether each one
    came right after a wait that `Retry-After` asked for."""

    client: str
    times_ms: np.ndarray
    statuses: np.ndarray
    after_retry_after: np.ndarray  # bool, one per request

    @property
    def admitted(self) -> np.ndarray:
        """Whether each request got a 200."""
        return self.statuses == 200

    @property
    def requests(self) -> int:
        return len(self.times_ms)

    @property
    def admitted_count(self) -> int:
        return int(self.admitted.sum())

    @property
    def refused_count(self) -> int:
        return int((self.statuses == 429).sum())


class ClientLoop:
    """One client of section 4, as a closed loop: iterating yields the virtual ms at
    which it sends each request; `answer(status, headers)` tells it what came back,
    and its behaviour decides when it sends the next. `run()` is the record.

        loop = ClientLoop(HAMMERS)
        for now_ms in loop:
            loop.answer(*send_at(now_ms))     # over HTTP, or to a model
        loop.run()
    """

    def __init__(
        self,
        client: str,
        *,
        duration_s: float = DURATION_S,
        latency_ms: int = LATENCY_MS,
        hammer_retry_ms: int = HAMMER_RETRY_MS,
    ) -> None:
        if client not in CLIENTS:
            raise ValueError(f"client must be one of {CLIENTS}, got {client!r}")
        self.client = client
        self.end_ms = duration_s * 1000
        self.latency_ms = latency_ms
        self.hammer_retry_ms = hammer_retry_ms
        self._answer: tuple[int, Mapping[str, str]] | None = None
        self._rows: list[tuple[int, int, bool]] = []

    def answer(self, status: int, headers: Mapping[str, str]) -> None:
        """What the request just sent got back."""
        self._answer = (status, headers)

    def __iter__(self) -> Iterator[int]:
        now_ms, waited = 0, False
        while now_ms < self.end_ms:
            self._answer = None
            yield now_ms
            if self._answer is None:
                raise RuntimeError(f"no answer() for the request sent at {now_ms} ms")
            status, headers = self._answer
            self._rows.append((now_ms, status, waited))
            gap_ms, waited = self._next_gap(status, headers)
            now_ms += gap_ms

    def _next_gap(self, status: int, headers: Mapping[str, str]) -> tuple[int, bool]:
        """Virtual ms until the next request, and whether that is a Retry-After wait."""
        if self.client == PACED:
            policy = parse_item(headers["RateLimit-Policy"])
            return max(self.latency_ms, -(-policy["w"] * 1000 // policy["q"])), False  # ceil
        if status == 429 and self.client == HONOURS_RETRY_AFTER:
            return self.latency_ms + int(headers["Retry-After"]) * 1000, True
        if status == 429 and self.client == HONOURS_RETRY_AFTER_MS:
            return self.latency_ms + int(headers[RETRY_AFTER_MS_HEADER]), True
        if status == 429:
            return self.latency_ms + self.hammer_retry_ms, False
        return self.latency_ms, False

    def run(self) -> ClientRun:
        """The requests sent so far."""
        times, statuses, waited = zip(*self._rows, strict=True) if self._rows else ((), (), ())
        return ClientRun(
            self.client,
            np.array(times, dtype=np.int64),
            np.array(statuses, dtype=np.int64),
            np.array(waited, dtype=bool),
        )


def simulate(
    *,
    limit: int = LIMIT,
    client: str = HAMMERS,
    duration_s: float = DURATION_S,
    window_s: int = WINDOW_S,
    latency_ms: int = LATENCY_MS,
    hammer_retry_ms: int = HAMMER_RETRY_MS,
) -> ClientRun:
    """One client of section 4 against the sliding log's reference model (`run_over_http`
    runs the same client against the demo app).

    Every request is a 500 m look-up (cost 1) against `limit` units per `window_s`
    seconds; each takes `latency_ms` of round trip. After a 429 the hammering client
    retries `hammer_retry_ms` later, the polite ones wait `Retry-After` seconds or
    `Retry-After-Ms` milliseconds; the paced one sends every `w / q` seconds of the
    `RateLimit-Policy` it was sent.
    """
    loop = ClientLoop(
        client, duration_s=duration_s, latency_ms=latency_ms, hammer_retry_ms=hammer_retry_ms
    )
    clock = ManualClock()
    model = algorithms.SLIDING_LOG.limiter_class("reference")
    limiter = model(window_s, limit, clock=clock)
    route = rate_limit(limiter, scope=SCOPE)  # the route's header fields, from its own code
    for now_ms in loop:
        clock.set_ms(now_ms)
        decision = limiter.check(client)
        loop.answer(status_for(decision), route.headers_for(decision))
    return loop.run()


@parameters_of(simulate)
async def run_over_http(**params: Any) -> ClientRun:
    """The same client as `simulate`, against a fresh demo app in this process, whose
    limiter reads a virtual clock that the loop moves: every request a 500 m look-up."""
    timing = ("duration_s", "latency_ms", "hammer_retry_ms")
    loop = ClientLoop(params["client"], **{name: params[name] for name in timing})
    client, clock = params["client"], ManualClock()
    app = demo_app(clock=clock, limit=params["limit"], window_s=params["window_s"])
    async with in_process(app) as http:
        # The client's name as its API key, spaces made dashes: the demo's plain keys
        # hold the key as it is, and refuse one with a space (400).
        headers = {"x-api-key": client.replace(" ", "-")}
        for now_ms in loop:
            clock.set_ms(now_ms)
            r = await http.get("/within", params=within(RADIUS_M), headers=headers)
            if r.status_code not in (200, 429):
                raise RuntimeError(f"the demo answered {r.status_code}: {r.text}")
            loop.answer(r.status_code, r.headers)
    return loop.run()


def summary(runs: Sequence[ClientRun], duration_s: float = DURATION_S) -> pd.DataFrame:
    """Requests, admitted and refused per client, and the rates that compare them."""
    table = pd.DataFrame(
        {
            "requests": [run.requests for run in runs],
            "admitted": [run.admitted_count for run in runs],
            "refused": [run.refused_count for run in runs],
        },
        index=pd.Index([run.client for run in runs], name="client"),
    )
    table["admitted per second"] = table["admitted"] / duration_s
    table["refused per admitted"] = table["refused"] / table["admitted"]
    return table


def headline_numbers(
    summary: pd.DataFrame,
    *,
    limit: int = LIMIT,
    duration_s: float = DURATION_S,
    hammer_retry_ms: int = HAMMER_RETRY_MS,
    **_: Any,
) -> dict[str, tuple[Any, str, str]]:
    """Section 4's numbers the README and the text quote, from its `summary`: name ->
    (value, format, what it is), as `ratelimit.lab.records.Chapter.put` takes them."""
    hammer, polite, exact, paced = (summary.loc[name] for name in CLIENTS)
    numbers: dict[str, tuple[Any, str, str]] = {
        "duration_s": (duration_s, "d", "section 4: virtual seconds each client runs"),
        "limit": (limit, "d", "section 4: look-ups per second allowed"),
        "hammer_retry_ms": (hammer_retry_ms, "d", "the hammering client retries this soon (ms)"),
        "hammer_requests": (hammer["requests"], "d", "requests sent by the hammering client"),
        "hammer_admitted": (hammer["admitted"], "d", "look-ups admitted to the hammering client"),
        "hammer_refused": (hammer["refused"], "d", "requests refused to the hammering client"),
        "polite_admitted": (polite["admitted"], "d", "look-ups admitted, whole-second Retry-After"),
        "polite_refused": (polite["refused"], "d", "requests refused, whole-second Retry-After"),
        "polite_loss_pct": (
            1 - polite["admitted"] / hammer["admitted"],
            ".0%",
            "look-ups the whole-second Retry-After costs",
        ),
        "exact_admitted": (exact["admitted"], "d", "look-ups admitted, Retry-After-Ms"),
        "exact_refused": (exact["refused"], "d", "requests refused, Retry-After-Ms"),
        "paced_admitted": (paced["admitted"], "d", "look-ups admitted, paced by RateLimit-Policy"),
        "paced_refused": (paced["refused"], "d", "requests refused, paced by RateLimit-Policy"),
    }
    # Plain ints and floats: the records and the text's glue both quote them.
    return {
        name: (int(value) if fmt == "d" else float(value), fmt, what)
        for name, (value, fmt, what) in numbers.items()
    }


def _limit_line(ax: Any, *, limit: int, window_s: int, duration_s: float) -> None:
    """The most a client may get, cumulatively: `limit` per `window_s`, as a wide grey line."""
    ax.plot(
        [0, duration_s],
        [0, limit * duration_s / window_s],
        color="0.75",
        linewidth=4,
        zorder=0,
        label=f"the limit ({limit} per {window_s} s)",
    )


def clients_figure(
    runs: Sequence[ClientRun],
    *,
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    duration_s: float = DURATION_S,
) -> Figure:
    """Section 4's clients side by side: admitted look-ups over time against the
    limit's line (left), and requests sent, admitted and refused (right)."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(
        1, 2, figsize=(11.5, 4), gridspec_kw={"width_ratios": [3, 2.4]}
    )
    for run in runs:
        ok = run.times_ms[run.admitted] / 1000
        left.step(
            ok,
            np.arange(1, len(ok) + 1),
            where="post",
            color=_CLIENT_COLORS[run.client],
            label=run.client,
            # Clients with the same count would hide each other: the hammering one dashed.
            linestyle="--" if run.client == HAMMERS else "-",
            zorder=3 if run.client == HAMMERS else 2,
        )
    _limit_line(left, limit=limit, window_s=window_s, duration_s=duration_s)
    left.set_xlabel("virtual time (s)")
    left.set_ylabel("look-ups admitted (cumulative)")
    left.set_title("Admitted look-ups over time")
    left.legend(fontsize=8, loc="upper left")
    x = np.arange(len(runs))
    admitted = [run.admitted_count for run in runs]
    right.bar(x, admitted, color="tab:blue", label="admitted (200)")
    right.bar(
        x,
        [run.refused_count for run in runs],
        bottom=admitted,
        color="tab:red",
        label="refused (429)",
    )
    right.set_xticks(x, ["\n".join(run.client.rsplit(" ", 1)) for run in runs], fontsize=7.5)
    right.set_ylabel("requests sent")
    right.set_title(f"Requests sent in {duration_s} s")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --- requests in flight ---------------------------------------------------------------------


@dataclass(frozen=True)
class InFlightRun:
    """Section 7: one client's look-ups, each taking `service_s`, sent at a steady rate
    to the route's checks in the route's order (its rate limit, then a lease when
    `in_flight_limit` is set), on a virtual clock."""

    in_flight_limit: int | None
    times_ms: np.ndarray  # when each look-up was sent
    statuses: np.ndarray  # 200, or 429
    refused_by: np.ndarray  # "", "rate" or "in flight"
    retry_after_ms: np.ndarray  # a 429's wait (0 for a 200)
    curve_ms: np.ndarray  # the times the count below changed
    curve_in_flight: np.ndarray  # look-ups in flight from each of those times on

    @property
    def max_in_flight(self) -> int:
        return int(self.curve_in_flight.max())

    @property
    def admitted(self) -> int:
        return int((self.statuses == 200).sum())


async def in_flight_run(
    *,
    rate_per_s: int = LIMIT,
    service_s: float = 2.0,
    duration_s: float = 10.0,
    in_flight_limit: int | None = None,
    lease_seconds: float = 30.0,
) -> InFlightRun:
    """Look-ups sent `rate_per_s` a second for `duration_s`, each in flight for
    `service_s` once admitted, against the real limiters on a fresh embedded Redis and
    a `ManualClock`: a sliding log of `rate_per_s` per second, then (when
    `in_flight_limit` is set) a `ConcurrencyLimiter` of that many leases, released as
    each look-up ends. A look-up that ends at the time another is sent ends first."""
    from ratelimit import ConcurrencyLimiter, SlidingWindowLimiter

    redis, clock = connect(embedded=True), ManualClock(1_000.0)
    rate = SlidingWindowLimiter(redis, 1, rate_per_s, "sec7", clock=clock)
    leases = None
    if in_flight_limit is not None:
        leases = ConcurrencyLimiter(redis, in_flight_limit, lease_seconds, "sec7", clock=clock)
    step_ms, service_ms = 1000 // rate_per_s, round(service_s * 1000)
    ending: list[tuple[int, str | None]] = []  # (end in ms, lease) of look-ups in flight
    times, statuses, refused_by, waits, curve_ms, curve_n = [], [], [], [], [0], [0]
    for t in range(0, round(duration_s * 1000), step_ms):
        clock.set_ms(1_000_000 + t)
        for end, lease in sorted(e for e in ending if e[0] <= t):
            ending.remove((end, lease))
            if leases is not None:
                await leases.release("client", lease)
            _count(curve_ms, curve_n, end, len(ending))
        decision = await rate.check("client")
        why = "" if decision.allowed else "rate"
        if decision.allowed and leases is not None:
            decision = await leases.acquire("client")
            why = "" if decision.allowed else "in flight"
        times.append(t)
        statuses.append(200 if decision.allowed else 429)
        refused_by.append(why)
        waits.append(decision.retry_after_ms)
        if decision.allowed:
            ending.append((t + service_ms, decision.lease))
            _count(curve_ms, curve_n, t, len(ending))
    await redis.aclose()
    _count(curve_ms, curve_n, round(duration_s * 1000), curve_n[-1])
    return InFlightRun(
        in_flight_limit,
        np.array(times),
        np.array(statuses),
        np.array(refused_by),
        np.array(waits),
        np.array(curve_ms),
        np.array(curve_n),
    )


def _count(times: list[int], counts: list[int], t: int, n: int) -> None:
    """Record `n` in flight from `t` on: the count after every event at one time (a
    look-up that ends and one admitted at that time leave no dip)."""
    if times[-1] == t:
        counts[-1] = n
    else:
        times.append(t)
        counts.append(n)


def in_flight_figure(runs: Sequence[InFlightRun], *, duration_s: float = 10.0) -> Figure:
    """Section 7: look-ups in flight over virtual time, with and without leases."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.4))
    for run in runs:
        label = (
            "rate limit only"
            if run.in_flight_limit is None
            else f"rate limit + {run.in_flight_limit} leases"
        )
        ax.step(run.curve_ms / 1000, run.curve_in_flight, where="post",
                label=f"{label}: at most {run.max_in_flight} in flight, "
                f"{run.admitted} admitted")  # fmt: skip
    ax.set_xlim(0, duration_s)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("look-ups in flight")
    ax.set_title("One client within its rate, each look-up slow")
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    return fig


# --- Redis down ---------------------------------------------------------------------------


async def outage_table(
    api_key: str,
    policies: Sequence[str] = ("allow", "deny", "raise"),
    *,
    limit: int = LIMIT,
    window_s: int = WINDOW_S,
    tiles_limit: int = TILES_LIMIT,
) -> pd.DataFrame:
    """One look-up and one tile per failure policy (`on_error` on both routes), each
    app talking to a loopback port where nothing listens: status and header fields.
    The limiter logs a warning per degraded request; collect them around this call."""
    rows = []
    for on_error in policies:
        broken = connect(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
        app = demo_app(
            broken,
            limit=limit,
            window_s=window_s,
            tiles_limit=tiles_limit,
            within_on_error=on_error,
            tiles_on_error=on_error,
        )
        async with in_process(app) as client:
            for route, params in [("/within", within(RADIUS_M)), ("/tiles/12/2200/1343.png", None)]:
                r = await client.get(route, params=params, headers={"x-api-key": api_key})
                rows.append(
                    {
                        "on_error": on_error,
                        "route": route.split("/")[1],
                        "status": r.status_code,
                        "X-RateLimit-Degraded": r.headers.get("X-RateLimit-Degraded", ""),
                        "Retry-After": r.headers.get("Retry-After", ""),
                        "RateLimit": r.headers.get("RateLimit", "(none)"),
                    }
                )
        await broken.aclose()
    return pd.DataFrame(rows).set_index(["on_error", "route"])


# --- a real server ------------------------------------------------------------------------


def start_server() -> DemoServer:
    """`uvicorn ratelimit.demo:app` on a free loopback port, on the embedded Redis
    (REDIS_URL removed from its environment), once it answers; `stop_server` stops it."""
    return DemoServer().start()


def stop_server(server: DemoServer) -> dict[str, bool]:
    """Stop `server` by its PID (SIGTERM, SIGKILL if it lingers; its log is removed) and
    say whether the process is gone and its port free again."""
    pid, port = server.pid, server.port
    server.close()
    return {
        "the uvicorn process is gone": pid is not None and not pid_alive(pid),
        "its port is free again": port is not None and port_is_free(port),
    }


async def look_ups_over_http(
    url: str, api_key: str, radius_m: float = RADIUS_M
) -> tuple[list[httpx.Response], httpx.Response]:
    """Look-ups against the server at `url` until one past its quota (read from its
    first `RateLimit-Policy`: the server runs the demo's defaults), and its /docs."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def look_up() -> httpx.Response:
            return await client.get(
                "/within", params=within(radius_m), headers={"x-api-key": api_key}
            )

        first = await look_up()
        quota = parse_item(first.headers["RateLimit-Policy"])["q"]
        responses = [first] + [await look_up() for _ in range(quota + 1)]
        return responses, await client.get("/docs")


def as_sent(response: httpx.Response) -> str:
    """The response as it came over the wire: status line, header fields (less date,
    server and content-length, which vary from run to run; each as `shown`) and its JSON
    body, indented."""
    lines = [f"HTTP/1.1 {response.status_code} {response.reason_phrase}"]
    for name, _ in response.headers.raw:
        if name.decode().lower() not in ("date", "server", "content-length"):
            lines.append(f"{name.decode()}: {shown(name.decode(), response)}")
    return "\n".join([*lines, "", json.dumps(response.json(), indent=2)])


# --- Explore ------------------------------------------------------------------------------


@parameters_of(simulate)
def figure(**params: Any) -> Figure:
    """One client's admitted (200) and refused (429) look-ups over virtual time.

    The defaults are the chapter's parameters, so `figure()` is the chapter's story:
    the hammering client gets exactly the limit (100 look-ups in 10 s) and is refused
    more often than it is served. Left: cumulative counts against the limit's line;
    right: admitted and refused per virtual second. Returns a
    `matplotlib.figure.Figure` (not shown; the caller shows or closes it).
    """
    import matplotlib.pyplot as plt

    run = simulate(**params)
    limit, client, window_s = params["limit"], params["client"], params["window_s"]
    duration_s, hammer_retry_ms = params["duration_s"], params["hammer_retry_ms"]
    seconds = run.times_ms / 1000
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    for mask, color, label in [
        (run.admitted, "tab:blue", f"admitted (200): {run.admitted_count}"),
        (~run.admitted, "tab:red", f"refused (429): {run.refused_count}"),
    ]:
        x = np.concatenate([[0.0], seconds[mask], [duration_s]])
        counts = np.arange(mask.sum() + 1)
        left.step(x, np.concatenate([counts, counts[-1:]]), where="post", color=color, label=label)
    _limit_line(left, limit=limit, window_s=window_s, duration_s=duration_s)
    left.set_xlim(0, duration_s)
    left.set_xlabel("virtual time (s)")
    left.set_ylabel("look-ups (cumulative)")
    left.set_title(_TITLES[client].format(retry=hammer_retry_ms))
    left.legend(fontsize=8, loc="upper left")

    bins = np.arange(duration_s + 1)
    per_s_ok = np.histogram(seconds[run.admitted], bins)[0]
    per_s_no = np.histogram(seconds[~run.admitted], bins)[0]
    right.bar(bins[:-1] + 0.5, per_s_ok, width=0.8, color="tab:blue", label="admitted (200)")
    right.bar(
        bins[:-1] + 0.5,
        per_s_no,
        width=0.8,
        bottom=per_s_ok,
        color="tab:red",
        label="refused (429)",
    )
    right.set_xlim(0, duration_s)
    right.set_xlabel("virtual time (s)")
    right.set_ylabel("requests per second")
    right.set_title(f"{run.requests} requests sent in {duration_s} s")
    right.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


# --- tiers, and reading the quota without spending it ---------------------------------------

TIERS = ["10/s", "1000/h"]
"""Section 8's two limits on one route: ten look-ups a second and a thousand an hour."""


def tiered_app(rates: Sequence[str] = TIERS, *, clock: Any = None, redis: Any = None) -> FastAPI:
    """A small API with one `/within` route limited by a `TieredLimiter` of `rates`
    (scope "geofence": every tier a policy "geofence-<window>"), a `GET /quota` that
    answers what the caller's next look-up would get without spending anything
    (`limiter.peek`), and a `POST /admin/reset/{api_key}` that clears a client's state
    in every tier (`limiter.reset`). On a fresh embedded Redis unless `redis` is given."""
    from fastapi import Depends, FastAPI, Header

    from ratelimit import TieredLimiter
    from ratelimit.http import install

    redis = connect(embedded=True) if redis is None else redis
    # Sorted sets, as the demo keeps, so that ZCARD shows what each tier holds.
    limiter = TieredLimiter(
        redis, list(rates), "tiers", storage="sorted-set", clock=clock or ManualClock()
    )
    route = rate_limit(limiter, scope=SCOPE)
    app = FastAPI()
    install(app)
    app.state.limiter, app.state.route, app.state.redis = limiter, route, redis

    # (Annotations stay plain: this module's are strings, which FastAPI resolves in the
    # module's namespace, not this function's.)
    @app.get("/within", dependencies=[Depends(route)])
    async def look_up() -> dict[str, bool]:
        return {"found": True}

    @app.get("/quota")
    async def quota(x_api_key: str = Header()) -> dict[str, Any]:  # noqa: B008
        # The identity the route asks about for this key; the peek writes nothing.
        d = await limiter.peek(route_identity(SCOPE, "key", x_api_key))
        return {"tier": route.policy_names[d.tier or 0], "allowed": d.allowed,
                "remaining": d.remaining, "retry_after": d.retry_after}  # fmt: skip

    @app.post("/admin/reset/{api_key}")
    async def reset(api_key: str) -> dict[str, bool]:
        return {"had_state": await limiter.reset(route_identity(SCOPE, "key", api_key))}

    return app


@dataclass(frozen=True)
class TierRun:
    """Section 8: one client's look-ups against `tiered_app`, and the app and clock they
    ran on (section 9 goes on from where they stopped)."""

    requests: pd.DataFrame  # per request: time (s), status, tier named, r, t, Retry-After-Ms
    app: Any
    clock: ManualClock
    api_key: str


async def tiers_run(
    rates: Sequence[str] = TIERS,
    *,
    duration_s: float = 3700.0,
    latency_ms: int = LATENCY_MS,
    api_key: str = "tiered-key",
) -> TierRun:
    """A client that sends look-ups back to back (one every `latency_ms`) and, after a
    429, waits exactly as long as `Retry-After-Ms` says, for `duration_s` virtual
    seconds, against `tiered_app(rates)`: which tier the `RateLimit` field names on each
    answer, with its `r` and `t`."""
    clock = ManualClock()
    app = tiered_app(rates, clock=clock)
    rows, now_ms = [], 0
    async with in_process(app) as client:
        while now_ms < duration_s * 1000:
            clock.set_ms(now_ms)
            r = await client.get("/within", headers={"x-api-key": api_key})
            state = parse_item(r.headers["RateLimit"])
            wait_ms = int(r.headers.get(RETRY_AFTER_MS_HEADER, 0))
            rows.append({"time (s)": now_ms / 1000, "status": r.status_code,
                         "tier named": state["name"], "r": state["r"], "t": state.get("t"),
                         "Retry-After-Ms": wait_ms})  # fmt: skip
            now_ms += latency_ms + wait_ms
    return TierRun(pd.DataFrame(rows), app, clock, api_key)


def tiers_table(run: TierRun) -> pd.DataFrame:
    """Section 8's answers grouped by status and the tier `RateLimit` names: how many,
    the first and last at (virtual s), and the longest wait asked."""
    table = run.requests.groupby(["status", "tier named"], sort=True).agg(
        answers=("status", "size"),
        first_s=("time (s)", "min"),
        last_s=("time (s)", "max"),
        longest_wait_s=("Retry-After-Ms", "max"),
    )
    table["longest_wait_s"] = table["longest_wait_s"] / 1000
    return table.rename(
        columns={
            "first_s": "first at (s)",
            "last_s": "last at (s)",
            "longest_wait_s": "longest wait asked (s)",
        }  # fmt: skip
    )


def tiers_figure(run: TierRun) -> Figure:
    """Section 8: look-ups admitted over virtual time, each tier's most (its limit per
    window, as a line), and the 429s, marked by the tier whose policy `RateLimit` named."""
    import matplotlib.pyplot as plt

    req, route = run.requests, run.app.state.route
    times = req["time (s)"].to_numpy()
    admitted = np.cumsum(req["status"].to_numpy() == 200)
    x = np.linspace(0, float(times.max()), 4000)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.step(times, admitted, where="post", color="black", label="look-ups admitted")
    for rate, name, color in zip(
        run.app.state.limiter.rates, route.policy_names, ["tab:blue", "tab:red"], strict=False
    ):
        # [0, x] spans floor(x / W) + 1 windows (t - W, t]: the most a tier admits by x.
        most = rate.limit * (np.floor(x / (rate.window_ms / 1000)) + 1)
        ax.plot(
            x, most, color=color, alpha=0.35, linewidth=4, label=f"{rate}: the most {name} allows"
        )
        refused = (req["status"] == 429).to_numpy() & (req["tier named"] == name).to_numpy()
        ax.plot(times[refused], admitted[refused], "x", color=color, markersize=5,
                label=f"429 naming {name} ({int(refused.sum())})")  # fmt: skip
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("look-ups admitted (cumulative)")
    ax.set_title(" and ".join(str(rate) for rate in run.app.state.limiter.rates) + " on one route")
    ax.set_xlim(0, float(times.max()))
    ax.set_ylim(0, admitted.max() * 1.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


async def quota_and_reset(run: TierRun) -> pd.DataFrame:
    """Section 9, where section 8's client stopped: `GET /quota` twice (a peek, which
    spends nothing), a look-up, the reset (`POST /admin/reset/<key>`), `GET /quota`
    and a look-up again; after each, what it answered and the entries the client's
    tiers hold in Redis."""
    app, key = run.app, run.api_key
    limiter = app.state.limiter
    redis_keys = limiter.keys_for(route_identity(SCOPE, "key", key))
    steps = [("GET", "/quota"), ("GET", "/quota"), ("GET", "/within"),
             ("POST", f"/admin/reset/{key}"), ("GET", "/quota"), ("GET", "/within")]  # fmt: skip
    rows = []
    async with in_process(app) as client:
        for method, path in steps:
            r = await client.request(method, path, headers={"x-api-key": key})
            said = r.headers.get("RateLimit") or json.dumps(r.json(), separators=(",", ":"))
            entries = [int(await app.state.redis.zcard(k)) for k in redis_keys]
            names = app.state.route.policy_names
            rows.append(
                {
                    "request": f"{method} {path.replace(key, '<key>')}",
                    "status": r.status_code,
                    "answer": said,
                    **{f"entries {n}": e for n, e in zip(names, entries, strict=True)},
                }
            )
    return pd.DataFrame(rows, index=pd.RangeIndex(1, len(rows) + 1, name="step"))
