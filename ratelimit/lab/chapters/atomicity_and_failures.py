"""Chapter 4, atomicity and failure modes: the race (the classic recipe as separate
commands and as one add-then-count MULTI/EXEC, against the Lua script), the steady client
that MULTI/EXEC locks out, the duplicate member, the flushed script cache, the stopped and
the frozen Redis, and the Explore figure.

    lab = atomicity_and_failures.Lab().start()       # the chapter's servers and clients
    race = await atomicity_and_failures.race_table(lab)
    ...
    await lab.aclose()                               # everything it started is stopped

Where each section runs (`Lab`): the race, the steady client and the members (sections
1-2) on `lab.race`, `REDIS_URL` else a private redis-server else the embedded fakeredis;
the flushes, restarts, outages and freezes (sections 3-5) on `lab.target`, a private
redis-server with an append-only file else fakeredis, never a shared Redis. Every key is
written under the lab's own prefix and deleted by the function that wrote it.

The Explore figure (`figure()`) does not talk to Redis. Its race runs the classic recipe
(`ratelimit.lab.classic`: `ClassicSlidingLog` and `ClassicTransactionLog`) on a small
in-memory stand-in for the embedded backend: the same sorted-set commands, each costing
one turn of the event loop, as a round trip to fakeredis does (a MULTI/EXEC one turn in
all). Its Lua side is the reference model (`ratelimit.lab.reference.SlidingWindowLimiter`
through `ratelimit.lab.replay`), which the property tests hold to the script's
decisions; a script runs whole, so the requests of a round are decided one after
another. `embedded_counts()` runs the same race on the embedded fakeredis itself, and
`steady_model()` is `steady_client()` without Redis; the notebook and tests check that
each pair gives the same numbers.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import redis.asyncio
from matplotlib.figure import Figure

import ratelimit
import ratelimit.sync
from ratelimit import algorithms
from ratelimit.clock import ManualClock
from ratelimit.decision import Decision
from ratelimit.devtools.server import RedisServer
from ratelimit.errors import RateLimiterUnavailable
from ratelimit.http import decision_for, status_for
from ratelimit.lab import backend, logs, metrics, reference
from ratelimit.lab.classic import ClassicSlidingLog, ClassicTransactionLog
from ratelimit.lab.plotting import COLORS
from ratelimit.lab.simulation import REPLAY_TTL_SLACK_MS, replay

__all__ = [
    "HEADLINE",
    "LUA",
    "MULTI",
    "NON_ATOMIC",
    "POLICIES",
    "SUMMARY",
    "TITLE",
    "Disturbed",
    "Lab",
    "decisions_changed",
    "delete_keys",
    "describe_backend",
    "duplicate_members",
    "embedded_counts",
    "figure",
    "frozen_checks",
    "frozen_table",
    "http_answer",
    "http_table",
    "outage_steps",
    "policy_limiters",
    "policy_table",
    "race_async",
    "race_counts",
    "race_figure",
    "race_summary",
    "race_table",
    "race_threads",
    "replay_model",
    "replay_table",
    "replay_undisturbed",
    "replay_with_disturbances",
    "replay_with_flushes",
    "restart_replays",
    "script_sha",
    "steady_client",
    "steady_clients",
    "steady_figure",
    "steady_model",
    "steady_table",
    "steady_times_ms",
    "steady_windows",
    "thawed_checks",
    "ways",
]

# The README's chapter-table cell and gallery text, filled from the chapter's records
# (notebooks/data/records/04_atomicity_and_failures.json) by `ratelimit.lab.records`.
TITLE = "Atomicity and failure modes"
SUMMARY = (
    "{concurrent} concurrent requests at limit {limit}: a non-atomic log "
    "(`ratelimit.lab.classic`, wrong on purpose) over-admits, the script and an "
    "add-then-count MULTI/EXEC admit exactly {atomic_race_admitted}, but MULTI/EXEC also "
    "counts the requests it rejects, so a client that keeps sending {steady_rate} a second "
    "gets {steady_multi_after_first} after its first second; duplicate members; SCRIPT FLUSH "
    "and restarts mid-replay; raise / allow / deny while Redis is down"
)
HEADLINE = (
    "{concurrent} requests at once against a limit of {limit}, {rounds} rounds: the "
    "non-atomic log admits all {naive_embedded_admitted} every round on the embedded backend "
    "(on a real Redis the count varies from run to run, over the limit in most rounds), the "
    "Lua script and the add-then-count MULTI/EXEC exactly {atomic_race_admitted} every round. "
    "But MULTI/EXEC records the requests it rejects too: a client that keeps sending "
    "{steady_rate} a second gets {steady_multi_admitted} of its {steady_sent} requests "
    "through in {steady_duration_s} s, {steady_multi_after_first} after the first second, "
    "where the script admits {steady_lua_admitted}."
)

NON_ATOMIC = "non-atomic"
MULTI = "MULTI/EXEC, add then count"
LUA = "Lua script"
POLICIES = ("raise", "allow", "deny")
APPEND_ONLY = ("--appendonly", "yes")  # a restart keeps the data, loses only the scripts
CLASSIC_MEMBERS = 'classic "<ms>:<counter>"'
OUR_MEMBERS = "ours (picked by the script)"
# The chapter counts the log's sorted-set members, so its limiters keep that storage.
_SORTED_LOG = algorithms.SLIDING_LOG
_COLORS = {NON_ATOMIC: "tab:orange", LUA: COLORS[algorithms.SLIDING_LOG.name], MULTI: "tab:red"}
# MULTI/EXEC admits exactly what the script admits in a race: drawn as an outline over it.
_OUTLINED = {MULTI}


# --- the chapter's servers and clients --------------------------------------------------


@dataclass
class Lab:
    """The chapter's Redis: `race` for sections 1-2 and `target` for sections 3-5 (see
    the module docstring), every client handed out, and a key prefix of this run.
    `aclose()` closes the clients and stops every redis-server the lab started."""

    shared: bool = True  # may sections 1-2 use REDIS_URL?
    private: bool = True  # may it start private redis-servers?
    prefix: str = field(default_factory=lambda: f"nb04:{uuid.uuid4().hex[:12]}")
    race: backend.Backend | None = None
    target: backend.Backend | None = None
    servers: list[RedisServer] = field(default_factory=list)
    clients: list[Any] = field(default_factory=list)

    def start(self) -> Lab:
        """Choose (and start, when private) the two backends."""
        self.race = backend.choose(shared=self.shared, private=self.private)
        self.target = backend.choose(shared=False, private=self.private, server_args=APPEND_ONLY)
        self.servers += [b.server for b in (self.race, self.target) if b.server is not None]
        return self

    def keep(self, client: Any) -> Any:
        """Hand `client` back, to be closed by `aclose()`."""
        self.clients.append(client)
        return client

    def sync_client(self, where: backend.Backend, **kwargs: Any) -> Any:
        """A synchronous client of `where`, closed by `aclose()`."""
        return self.keep(where.sync_client(**kwargs))

    def async_client(self, where: backend.Backend, **kwargs: Any) -> Any:
        """An asyncio client of `where`, closed by `aclose()`."""
        return self.keep(where.async_client(**kwargs))

    def new_server(self, *args: str) -> RedisServer:
        """Start one more private redis-server, stopped by `aclose()` at the latest."""
        self.servers.append(RedisServer(args=args).start())
        return self.servers[-1]

    def describe(self) -> str:
        """Which Redis each group of sections runs on (no ports, no PIDs)."""
        if self.target.real:
            target = f"{describe_backend(self.target)}, append-only file"
        else:
            why = "redis-server is not installed" if self.private else "no private servers"
            target = f"the embedded fakeredis ({why}; no restart; section 5 on a silent socket)"
        return (
            f"Sections 1-2 (race, members): {describe_backend(self.race)}\n"
            f"Sections 3-5 (flush, restart, stop, freeze): {target}"
        )

    def leftover_keys(self) -> list[str]:
        """Keys under this run's prefix still on either backend (sorted)."""
        found = []
        for where in (self.race, self.target):
            client = where.sync_client()
            found += [k.decode() for k in client.scan_iter(match=f"{self.prefix}:*")]
            client.close()
        return sorted(found)

    def pids(self) -> list[int]:
        """The PIDs of this lab's redis-servers that run now."""
        return [s.pid for s in self.servers if s.running]

    async def aclose(self) -> None:
        """Close every client handed out and stop every server started."""
        for client in self.clients:
            if isinstance(client, redis.asyncio.Redis):
                await client.aclose()
            else:
                client.close()
        self.clients.clear()
        for server in self.servers:
            server.close()

    async def __aenter__(self) -> Lab:
        return self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def describe_backend(where: backend.Backend) -> str:
    """`where.description`, with the server's version when it is a real Redis."""
    if not where.real:
        return where.description
    client = where.sync_client()
    version = client.info("server")["redis_version"]
    client.close()
    return f"{where.description} (Redis {version})"


# --- section 1: the race ----------------------------------------------------------------


def _admitted(outcome: bool | Decision) -> bool:
    """The classic recipe answers a bool, the limiters a Decision."""
    return outcome if isinstance(outcome, bool) else outcome.allowed


def _sync_check(limiter: Any) -> Callable[[str], Any]:
    """The synchronous check: the classic recipe's `check_sync` (its MULTI/EXEC form's
    too), a `ratelimit.sync` limiter's `check`."""
    return limiter.check_sync if isinstance(limiter, ClassicSlidingLog) else limiter.check


async def race_async(limiter: Any, client: Any, *, concurrency: int, rounds: int) -> list[int]:
    """Admitted per round: `concurrency` checks of one fresh identity in flight at once
    from one event loop. Each round's key is deleted afterwards."""
    counts = []
    for r in range(rounds):
        who = f"round-{r}"
        outcomes = await asyncio.gather(*(limiter.check(who) for _ in range(concurrency)))
        counts.append(sum(_admitted(o) for o in outcomes))
        await client.delete(limiter.key_for(who))
    return counts


def race_threads(limiter: Any, client: Any, *, concurrency: int, rounds: int) -> list[int]:
    """Admitted per round: `concurrency` threads, released together by a barrier, one
    synchronous check each. Each round's key is deleted afterwards."""
    check, counts = _sync_check(limiter), []
    with ThreadPoolExecutor(concurrency) as workers:
        for r in range(rounds):
            who, start = f"round-{r}", threading.Barrier(concurrency)

            def one(_: int, who: str = who, start: threading.Barrier = start) -> bool:
                start.wait(timeout=30)
                return _admitted(check(who))

            counts.append(sum(workers.map(one, range(concurrency))))
            client.delete(limiter.key_for(who))
    return counts


def _transaction_log(client: Any, window_s: float, limit: int, **kwargs: Any) -> Any:
    """The MULTI/EXEC recipe with members unique within this process (a shared counter),
    so that no two requests of a race can ever write one member: whatever it admits is
    down to the transaction, not to a collision."""
    return ClassicTransactionLog(
        client, window_s, limit, suffix=itertools.count(1).__next__, **kwargs
    )


def ways(concurrency: int) -> tuple[str, str]:
    """The race's two ways of sending, as the tables and figures name them."""
    return "asyncio, one process", f"{concurrency} threads"


async def race_table(
    lab: Lab, *, concurrency: int = 50, limit: int = 10, window_s: float = 1, rounds: int = 100
) -> pd.DataFrame:
    """One row per round (`way`, `limiter`, `round`, `admitted`): the classic recipe as
    separate commands (`NON_ATOMIC`) and as one MULTI/EXEC (`MULTI`), and the Lua limiter,
    on `lab.race`, from one asyncio process, then from threads."""
    pool = {"max_connections": 2 * concurrency}
    aclient, sclient = lab.async_client(lab.race, **pool), lab.sync_client(lab.race, **pool)
    asyncio_way, threads_way = ways(concurrency)
    a, t = f"{lab.prefix}:race:a", f"{lab.prefix}:race:t"
    runs = {
        (asyncio_way, NON_ATOMIC): ClassicSlidingLog(aclient, window_s, limit, prefix=a),
        (asyncio_way, MULTI): _transaction_log(aclient, window_s, limit, prefix=a),
        (asyncio_way, LUA): _SORTED_LOG.build("async", aclient, window_s, limit, prefix=a),
        (threads_way, NON_ATOMIC): ClassicSlidingLog(sclient, window_s, limit, prefix=t),
        (threads_way, MULTI): _transaction_log(sclient, window_s, limit, prefix=t),
        (threads_way, LUA): _SORTED_LOG.build("sync", sclient, window_s, limit, prefix=t),
    }
    rows = []
    for (way, name), limiter in runs.items():
        if way == asyncio_way:
            counts = await race_async(limiter, aclient, concurrency=concurrency, rounds=rounds)
        else:
            counts = race_threads(limiter, sclient, concurrency=concurrency, rounds=rounds)
        rows += [
            {"way": way, "limiter": name, "round": r, "admitted": n} for r, n in enumerate(counts)
        ]
    return pd.DataFrame(rows)


def race_summary(race: pd.DataFrame, *, limit: int) -> pd.DataFrame:
    """Per way and limiter: fewest, median and most admitted, and the rounds over `limit`."""
    by_way = race.groupby(["way", "limiter"], sort=False).admitted
    summary = by_way.agg(["min", "median", "max"])
    summary["rounds over the limit"] = by_way.apply(lambda counts: int((counts > limit).sum()))
    return summary


def _drawn(names: Any) -> list[str]:
    """The limiters among `names`, in the order they are drawn (filled bars first)."""
    present = set(names)
    return [n for n in sorted(_COLORS, key=lambda n: n in _OUTLINED) if n in present]


def _histogram(ax: Any, counts: Any, bins: np.ndarray, name: str) -> None:
    """One limiter's rounds by requests admitted: filled bars, or an outline (`_OUTLINED`)
    so that it stays visible over a filled bar of the same height."""
    if name in _OUTLINED:
        # Bars for the counts that occur only: a step histogram would also trace the axis.
        seen = pd.Series(counts).value_counts().sort_index()
        ax.bar(seen.index, seen.to_numpy(), width=1, fill=False, edgecolor=_COLORS[name],
               linewidth=2, hatch="//", label=name)  # fmt: skip
    else:
        ax.hist(counts, bins=bins, color=_COLORS[name], alpha=0.8, label=name)


def race_figure(
    race: pd.DataFrame, *, concurrency: int, limit: int, window_s: float, where: str
) -> Figure:
    """One histogram per way of sending: rounds by requests admitted, per limiter."""
    way_names = list(dict.fromkeys(race.way))
    rounds = race.groupby(["way", "limiter"]).size().max()
    fig, axes = plt.subplots(1, len(way_names), figsize=(10, 4), sharey=True, squeeze=False)
    bins = np.arange(0, concurrency + 2) - 0.5  # one bin per whole count, 0 .. concurrency
    for ax, way in zip(axes[0], way_names, strict=True):
        for name in _drawn(race.limiter):
            counts = race[(race.way == way) & (race.limiter == name)].admitted
            _histogram(ax, counts, bins, name)
        ax.axvline(limit, color="black", linestyle=":", linewidth=1, label=f"limit ({limit})")
        ax.set_xlim(-0.5, concurrency + 0.5)
        ax.set_title(way)
        ax.set_xlabel(f"requests admitted in one round (of {concurrency} sent at once)")
        ax.legend(loc="upper center", fontsize=8)
    axes[0][0].set_ylabel(f"rounds (of {rounds})")
    fig.suptitle(
        f"{concurrency} concurrent requests at a limit of {limit} per {window_s:g} s, "
        f"{rounds} rounds, on {where}"
    )
    fig.tight_layout()
    return fig


# --- section 1, continued: MULTI/EXEC counts what it rejects -----------------------------

STEADY_START_S = 1_796_000_000.0  # the steady client's virtual clock starts here
STEADY = (LUA, MULTI)  # the limiters the steady client is decided by


def steady_times_ms(rate: float, duration_s: float) -> np.ndarray:
    """When a client that sends `rate` requests a second, evenly spaced, sends them
    during `duration_s` seconds: whole ms from its start."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError(f"rate and duration_s must be positive, not {rate!r}, {duration_s!r}")
    n = int(np.floor(rate * duration_s + 1e-9))
    return np.floor(np.arange(n) * 1000 / rate + 1e-9).astype(np.int64)


def _stamp_s(ms: int) -> float:
    """A virtual time that the limiters read as exactly `ms` after the start: half a ms
    past it, so that rounding in floats never moves it to the ms before."""
    return STEADY_START_S + (ms + 0.5) / 1000


def _steady_frame(times_ms: np.ndarray, admitted: Mapping[str, Sequence[bool]]) -> pd.DataFrame:
    """One row per request and limiter: `t (ms)`, `limiter`, `admitted`."""
    return pd.DataFrame(
        [
            {"t (ms)": int(t), "limiter": name, "admitted": bool(ok)}
            for name in STEADY
            for t, ok in zip(times_ms, admitted[name], strict=True)
        ]
    )


async def steady_client(
    client: Any,
    *,
    rate: float,
    limit: int = 10,
    window_s: float = 1,
    duration_s: float = 10,
    prefix: str = "steady",
) -> pd.DataFrame:
    """A client that sends `rate` requests a second, evenly spaced, for `duration_s`
    seconds of virtual time, and keeps sending while it is rejected: each request decided
    by the Lua limiter and by the MULTI/EXEC recipe (`STEADY`) on `client` (asyncio), one
    request at a time, so there is no race. One row per request and limiter: `t (ms)`
    from the start, `limiter`, `admitted`. The keys are deleted afterwards."""
    clock = ManualClock(STEADY_START_S)
    limiters = {
        LUA: _SORTED_LOG.build(
            "async", client, window_s, limit, prefix=f"{prefix}:lua", clock=clock
        ),
        MULTI: _transaction_log(client, window_s, limit, prefix=f"{prefix}:multi", clock=clock),
    }
    times_ms, admitted = steady_times_ms(rate, duration_s), {name: [] for name in STEADY}
    for ms in times_ms:
        clock.set(_stamp_s(int(ms)))
        for name, limiter in limiters.items():
            admitted[name].append(_admitted(await limiter.check("steady")))
    await client.delete(*(limiter.key_for("steady") for limiter in limiters.values()))
    return _steady_frame(times_ms, admitted)


async def steady_clients(
    client: Any,
    *,
    rates: Sequence[float],
    limit: int = 10,
    window_s: float = 1,
    duration_s: float = 10,
    prefix: str = "steady",
) -> dict[float, pd.DataFrame]:
    """`steady_client` at each of `rates` (requests per second), one after another:
    rate -> its decisions."""
    return {
        rate: await steady_client(
            client, rate=rate, limit=limit, window_s=window_s, duration_s=duration_s,
            prefix=f"{prefix}:{rate:g}",
        )
        for rate in rates
    }  # fmt: skip


def _add_then_count(times_ms: np.ndarray, limit: int, window_ms: int) -> list[bool]:
    """The MULTI/EXEC recipe's decisions in memory: every request is recorded, then the
    requests recorded in (t - window, t] are counted, this one included."""
    recorded: list[int] = []
    decisions = []
    for t in times_ms:
        recorded = [r for r in recorded if r > t - window_ms]
        recorded.append(int(t))
        decisions.append(len(recorded) <= limit)
    return decisions


def steady_model(
    *, rate: float, limit: int = 10, window_s: float = 1, duration_s: float = 10
) -> pd.DataFrame:
    """`steady_client` without Redis: the Lua limiter's decisions from the reference
    model, the MULTI/EXEC recipe's from `_add_then_count`."""
    times_ms = steady_times_ms(rate, duration_s)
    trace = pd.DataFrame(
        {"time": [_stamp_s(int(t)) for t in times_ms], "identity": "steady", "cost": 1,
         "replica": 0}
    )  # fmt: skip
    lua = replay(trace, reference.SlidingWindowLimiter(window_s, limit), progress=False)
    window_ms = round(window_s * 1000)
    admitted = {
        LUA: lua.allowed.tolist(),
        MULTI: _add_then_count(times_ms, limit, window_ms),
    }
    return _steady_frame(times_ms, admitted)


def steady_windows(steady: pd.DataFrame, *, window_s: float) -> pd.DataFrame:
    """`steady_client`'s requests admitted per window of the run (index `window`, from
    0), one column per limiter."""
    window = steady["t (ms)"] // round(window_s * 1000)
    table = steady.assign(window=window).pivot_table(
        index="window", columns="limiter", values="admitted", aggfunc="sum"
    )
    return table[list(STEADY)].astype(int).rename_axis(columns=None)


def steady_table(
    runs: Mapping[float, pd.DataFrame], *, limit: int, window_s: float
) -> pd.DataFrame:
    """One row per steady client (`runs`: rate in requests per second -> `steady_client`):
    requests sent, the most the limit allows in the run, and per limiter the requests
    admitted in all and after the first window."""
    rows = {}
    for rate, steady in runs.items():
        per_window = steady_windows(steady, window_s=window_s)
        row = {
            "requests per second": rate,
            "requests sent": int((steady.limiter == LUA).sum()),
            "the limit allows (limit x windows)": limit * len(per_window),
        }
        for name in STEADY:
            row[f"{name}: admitted"] = int(per_window[name].sum())
            row[f"{name}: after the first window"] = int(per_window[name].iloc[1:].sum())
        rows[f"{rate:g}/s"] = row
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("client")


def _steady_axes(
    ax: Any, per_window: pd.DataFrame, *, rate: float, limit: int, window_s: float
) -> None:
    """`steady_windows` on `ax`: requests admitted per window, one line per limiter."""
    for name in STEADY:
        ax.plot(per_window.index, per_window[name], marker="o", color=_COLORS[name], label=name)
    ax.axhline(limit, color="black", linestyle=":", linewidth=1, label=f"limit ({limit})")
    ax.set_ylim(-0.5, limit * 1.3 + 1)
    ax.set_xlabel(f"window of the run ({window_s:g} s each)")
    ax.set_ylabel("requests admitted in the window")
    ax.set_title(f"A client sending {rate:g}/s, and retrying while rejected", fontsize=10)
    ax.legend(loc="center right", fontsize=8)


def steady_figure(steady: pd.DataFrame, *, rate: float, limit: int, window_s: float) -> Figure:
    """`steady_client`'s requests admitted per window, per limiter, against the limit."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    _steady_axes(ax, steady_windows(steady, window_s=window_s), rate=rate, limit=limit,
                 window_s=window_s)  # fmt: skip
    fig.tight_layout()
    return fig


# --- section 2: two requests, one member ------------------------------------------------


def _slot(member: bytes) -> str:
    """Our members are 3 raw bytes: shown as the slot number they encode."""
    return str(int.from_bytes(member, "big"))


async def duplicate_members(
    lab: Lab, *, window_s: float = 1, limit: int = 10, at_s: float = 1_796_000_000.123
) -> pd.DataFrame:
    """Two hosts each send their first request for one client in the same millisecond
    (`at_s`), with the classic members (a counter per host, so both write "<ms>:1") and
    with ours: what was admitted and what the sorted set holds, per kind of member."""
    client, clock = lab.async_client(lab.race), ManualClock(at_s)
    prefix = f"{lab.prefix}:dup"
    hosts = {
        CLASSIC_MEMBERS: [
            ClassicSlidingLog(client, window_s, limit, prefix=f"{prefix}:classic", clock=clock,
                              suffix=itertools.count(1).__next__)  # a fresh counter per host
            for _host in range(2)
        ],
        OUR_MEMBERS: [
            _SORTED_LOG.build("async", client, window_s, limit, prefix=f"{prefix}:ours",
                                           clock=clock)
            for _host in range(2)
        ],
    }  # fmt: skip
    rows = {}
    for kind, limiters in hosts.items():
        admitted = sum([_admitted(await host.check("alice")) for host in limiters])
        key = limiters[0].key_for("alice")
        shown = bytes.decode if kind == CLASSIC_MEMBERS else _slot
        members = [shown(m) for m in await client.zrange(key, 0, -1)]
        zcard = await client.zcard(key)
        await client.delete(key)
        rows[kind] = {
            "requests admitted": admitted,
            "members in the set": ", ".join(members),
            "ZCARD": zcard,
            "requests lost": admitted - zcard,
        }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("members")


# --- section 3: NOSCRIPT ----------------------------------------------------------------


def script_sha(limiter: Any) -> str:
    """The SHA-1 Redis caches `limiter`'s script under: the hash of the text it loads
    (its options as constants, and a shebang on a real Redis; see scripts.py)."""
    return hashlib.sha1(limiter.script.encode()).hexdigest()


def script_heads() -> pd.DataFrame:
    """The first line of the sliding log's script as each kind of client is sent it, read
    from the limiter itself (`limiter.script`): on a real Redis the Redis 7 shebang
    (`ratelimit/scripts.py`), on the embedded fakeredis, which cannot parse one, the
    plain text. Building a limiter sends nothing, so the real client never connects."""
    clients = {
        "a real Redis (redis-py)": redis.Redis(),
        "the embedded fakeredis": backend.Backend("embedded").sync_client(),
    }
    heads = {}
    for label, client in clients.items():
        limiter = _SORTED_LOG.build("sync", client, 1, 10)
        heads[label] = limiter.script.splitlines()[0]
        client.close()
    return pd.DataFrame(
        {"the script's first line": heads}, index=pd.Index(list(heads), name="client")
    )


@dataclass
class Disturbed:
    """A replay with disturbances: its decisions, whether the script was cached right
    after each disturbance, and after each stretch of traffic (the first stretch runs
    before any disturbance)."""

    decisions: pd.DataFrame
    cached_after: list[bool]
    cached_later: list[bool]

    @property
    def reloaded(self) -> bool:
        """Each disturbance emptied the script cache and the limiter filled it again."""
        return not any(self.cached_after) and all(self.cached_later)


def replay_with_disturbances(
    client: Any,
    trace: pd.DataFrame,
    at_s: Sequence[float],
    disturb: Callable[[], Any],
    *,
    limit: int,
    window_s: float,
    prefix: str,
) -> Disturbed:
    """Replay `trace` one stretch at a time on one synchronous limiter, its state kept
    between stretches, and call `disturb()` at each time in `at_s`; the replayed key is
    deleted afterwards."""
    # On a virtual clock and with the replay's own TTL slack, the copy a replay drives
    # loads this very script (its options are constants in the text).
    limiter = _SORTED_LOG.build(
        "sync", client, window_s, limit, prefix=prefix,
        clock=ManualClock(), ttl_slack_ms=REPLAY_TTL_SLACK_MS,
    )  # fmt: skip
    sha, bounds = script_sha(limiter), [-np.inf, *at_s, np.inf]
    pieces, cached_after, cached_later = [], [], []
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        if i:
            disturb()
            cached_after.append(client.script_exists(sha)[0])
        stretch = trace[(trace.time >= lo) & (trace.time < hi)]
        pieces.append(replay(stretch, limiter, keep_state=True))
        cached_later.append(client.script_exists(sha)[0])
    client.delete(*(limiter.key_for(who) for who in trace.identity.unique()))
    return Disturbed(pd.concat(pieces), cached_after, cached_later)


def replay_undisturbed(
    lab: Lab, trace: pd.DataFrame, *, limit: int, window_s: float
) -> pd.DataFrame:
    """`trace` replayed on `lab.target` by the synchronous limiter, nothing disturbed."""
    limiter = _SORTED_LOG.build(
        "sync", lab.sync_client(lab.target), window_s, limit, prefix=f"{lab.prefix}:control"
    )
    return replay(trace, limiter)


def replay_model(trace: pd.DataFrame, *, limit: int, window_s: float) -> pd.DataFrame:
    """`trace` decided by the in-memory reference model of the sliding log."""
    return replay(trace, reference.SlidingWindowLimiter(window_s, limit))


def replay_with_flushes(
    lab: Lab, trace: pd.DataFrame, flush_at_s: Sequence[float], *, limit: int, window_s: float
) -> Disturbed:
    """`trace` replayed on `lab.target`, with SCRIPT FLUSH at each time in `flush_at_s`."""
    client = lab.sync_client(lab.target)
    return replay_with_disturbances(
        client, trace, flush_at_s, client.script_flush,
        limit=limit, window_s=window_s, prefix=f"{lab.prefix}:flush",
    )  # fmt: skip


def restart_replays(
    lab: Lab, trace: pd.DataFrame, *, restart_at_s: float, limit: int, window_s: float
) -> dict[str, Disturbed]:
    """`trace` replayed with a real restart at `restart_at_s`: on `lab.target`'s server
    (append-only file: the data survives) and on a new server without persistence
    (stopped again afterwards). Needs a private server: ValueError without one."""
    if lab.target.server is None:
        raise ValueError("restarts need a private redis-server (lab.target is embedded)")
    volatile = lab.new_server()
    runs = {}
    for label, server in (("append-only file", lab.target.server), ("no persistence", volatile)):
        runs[f"restart at {restart_at_s:g} s, {label}"] = replay_with_disturbances(
            lab.keep(server.client()), trace, [restart_at_s], server.restart,
            limit=limit, window_s=window_s, prefix=f"{lab.prefix}:restart:{label}",
        )  # fmt: skip
    volatile.close()
    return runs


def decisions_changed(replayed: pd.DataFrame, control: pd.DataFrame) -> int:
    """Requests whose decision (admitted, Retry-After) differs between two replays of
    the same trace."""
    if not replayed.index.equals(control.index):
        raise ValueError("the two replays are not of the same requests")
    columns = ["allowed", "retry_after_ms"]
    return int((replayed[columns] != control[columns]).any(axis=1).sum())


def replay_table(
    replays: Mapping[str, pd.DataFrame], control: pd.DataFrame, *, window_s: float
) -> pd.DataFrame:
    """One row per replay: requests, admitted, decisions changed against `control`,
    errors (an error would have ended the replay), degraded, most admitted in a window."""
    rows = {
        name: {
            "requests": len(replayed),
            "admitted": int(replayed.allowed.sum()),
            "decisions changed": decisions_changed(replayed, control),
            "errors": 0,
            "degraded": int(replayed.degraded.sum()),
            f"most admitted in {window_s:g} s": metrics.max_in_window(
                replayed.time[replayed.allowed], window_s
            ),
        }
        for name, replayed in replays.items()
    }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("replay")


# --- sections 4 and 5: Redis down, Redis frozen -----------------------------------------


def policy_limiters(
    lab: Lab, *, limit: int = 5, window_s: float = 60, timeout_s: float = 0.5
) -> dict[str, ratelimit.SlidingWindowLimiter]:
    """One asyncio limiter per failure policy on `lab.target`, each with its own client,
    all on one virtual clock (it stamps the requests, so Retry-After is reproducible)."""
    clock = ManualClock(0.0)
    return {
        policy: _SORTED_LOG.build("async",
            lab.async_client(lab.target), window_s, limit, prefix=f"{lab.prefix}:down",
            on_error=policy, timeout=timeout_s, clock=clock,
        )
        for policy in POLICIES
    }  # fmt: skip


def http_answer(decision: Decision) -> str:
    """The HTTP layer's answer to a decision: status, degraded mark, Retry-After."""
    status = status_for(decision)
    if decision.allowed:
        return f"{status}, degraded" if decision.degraded else f"{status}"
    return f"{status}, Retry-After: {decision.retry_after}"


def _describe(outcome: Decision | BaseException) -> str:
    """One check's outcome in words, as the tables show it."""
    if isinstance(outcome, BaseException):
        return f"raises {type(outcome).__name__}"
    verdict = "allowed" if outcome.allowed else "rejected"
    return f"{verdict}, degraded" if outcome.degraded else verdict


async def _timed_check(limiter: Any, identity: str) -> tuple[Decision | BaseException, float]:
    """One check's outcome (a Decision, or the RateLimiterUnavailable it raised) and how
    long it took, in seconds."""
    start = time.monotonic()
    try:
        outcome: Decision | BaseException = await limiter.check(identity)
    except RateLimiterUnavailable as exc:
        outcome = exc
    return outcome, time.monotonic() - start


async def _checks(limiters: Mapping[str, Any], identity: str) -> list[dict[str, Any]]:
    """One check per policy, side by side: what each gave, how the HTTP layer answers
    it, how long it took and how many warnings it logged."""
    with logs.collected("ratelimit") as records:
        timed = await asyncio.gather(
            *(_timed_check(limiter, f"{identity}-{policy}") for policy, limiter in limiters.items())
        )
    rows = []
    for (policy, limiter), (outcome, seconds) in zip(limiters.items(), timed, strict=True):
        decision = decision_for(outcome, limiter)
        rows.append({
            "policy": policy,
            "outcome": _describe(outcome),
            "HTTP": http_answer(decision),
            "admitted": decision.allowed,
            "degraded": decision.degraded,
            "retry_after": decision.retry_after,
            "cause": type(outcome.__cause__).__name__ if isinstance(outcome, BaseException) else "",
            "warnings": sum(r.args[0] == policy for r in records),
            "seconds": seconds,
        })  # fmt: skip
    return rows


_WARM_UP = "warm-up"


async def outage_steps(
    lab: Lab, limiters: Mapping[str, Any], phases: Mapping[str, int]
) -> pd.DataFrame:
    """The same checks side by side, one per second of virtual time, per phase:
    "running", then "stopped" (the target is stopped first), then "running again"
    (started again first). One row per check."""
    if list(phases) != ["running", "stopped", "running again"]:
        raise ValueError(f"phases must be running, stopped, running again: {list(phases)}")
    clock, rows, step = next(iter(limiters.values())).clock, [], 0
    # The first script call loads the script (on the embedded backend it also starts the
    # Lua runtime), which on a busy machine can outlast a short timeout: it is made here,
    # untimed, on a copy with a long timeout, and its key is deleted again.
    for limiter in limiters.values():
        await limiter.with_options(timeout=30.0).check(_WARM_UP)
        await limiter.redis.delete(limiter.key_for(_WARM_UP))
    for phase, checks in phases.items():
        if phase != "running":
            lab.target.set_down(phase == "stopped")
        for _ in range(checks):
            step += 1
            clock.set(step)
            rows += [
                {"t (s)": step, "Redis": phase} | row for row in await _checks(limiters, "client")
            ]
    return pd.DataFrame(rows)


def http_table(steps: pd.DataFrame) -> pd.DataFrame:
    """The HTTP answers of `outage_steps`, one column per policy."""
    return steps.pivot(index=["t (s)", "Redis"], columns="policy", values="HTTP")[list(POLICIES)]


def _one_way(values: pd.Series) -> Any:
    """The single value all checks of a phase share."""
    if values.nunique() != 1:
        raise ValueError(f"the checks of one phase disagree: {sorted(set(values))}")
    return values.iloc[0]


def _took(seconds: float, timeout_s: float, margin_s: float) -> str:
    """Whether a check answered within its timeout plus the margin, in words."""
    return "within timeout + margin" if seconds < timeout_s + margin_s else "too long"


def policy_table(
    steps: pd.DataFrame, *, budget: int, timeout_s: float, margin_s: float
) -> pd.DataFrame:
    """One row per policy: what each check gave while Redis was stopped, what was
    admitted, the warnings logged and whether every check answered in time."""
    stopped = steps[steps.Redis == "stopped"].groupby("policy")
    by_policy = steps.groupby("policy")
    table = pd.DataFrame({
        "each check while stopped": stopped.outcome.agg(_one_way),
        "HTTP answer while stopped": stopped.HTTP.agg(_one_way),
        "admitted while stopped": stopped.admitted.sum(),
        f"admitted in all (budget {budget})": by_policy.admitted.sum(),
        "warnings logged": by_policy.warnings.sum(),
        "each check took": by_policy.seconds.max().map(lambda s: _took(s, timeout_s, margin_s)),
    })  # fmt: skip
    return table.loc[list(POLICIES)].rename_axis("policy")


def _on(client: Any, limiter: Any) -> Any:
    """The same limiter (window, limit, prefix, policy, timeout, clock) on `client`."""
    return type(limiter)(
        client, window_ms=limiter.window_ms, limit=limiter.limit, prefix=limiter.prefix,
        on_error=limiter.on_error, timeout=limiter.timeout, clock=limiter.clock,
    )  # fmt: skip


@contextmanager
def _silent_socket() -> Iterator[int]:
    """A loopback port that accepts connections and never answers."""
    hole = socket.create_server(("127.0.0.1", 0))  # listens, never accepts
    try:
        yield hole.getsockname()[1]
    finally:
        hole.close()


async def frozen_checks(lab: Lab, limiters: Mapping[str, Any]) -> pd.DataFrame:
    """One check per policy, side by side, one second of virtual time after the last,
    while `lab.target`'s server is frozen (SIGSTOP, thawed after); on the embedded
    backend, the same limiters on a socket that never answers. One row per policy."""
    next(iter(limiters.values())).clock.advance(1)
    if lab.target.server is not None:
        with lab.target.server.paused():
            return pd.DataFrame(await _checks(limiters, "frozen")).set_index("policy")
    with _silent_socket() as port:
        silent = redis.asyncio.Redis(host="127.0.0.1", port=port)
        try:
            rows = await _checks({p: _on(silent, lim) for p, lim in limiters.items()}, "frozen")
        finally:
            await silent.aclose()
    return pd.DataFrame(rows).set_index("policy")


def frozen_table(frozen: pd.DataFrame, *, timeout_s: float, margin_s: float) -> pd.DataFrame:
    """`frozen_checks` as the chapter shows it: outcome, HTTP answer, and whether each
    check took about its timeout (from just under it to the timeout plus the margin)."""
    about = frozen.seconds.between(timeout_s - 0.01, timeout_s + margin_s, inclusive="left")
    took = about.map({True: "about the timeout (within timeout + margin)", False: "unexpected"})
    return pd.DataFrame(
        {"outcome": frozen.outcome, "HTTP answer": frozen.HTTP, "the check took": took}
    )


async def thawed_checks(limiters: Mapping[str, Any]) -> pd.DataFrame:
    """One more check per policy, side by side (after an outage or a freeze)."""
    return pd.DataFrame(await _checks(limiters, "after")).set_index("policy")


async def delete_keys(limiters: Mapping[str, Any]) -> int:
    """Delete every key under the limiters' prefixes; returns how many there were."""
    deleted = 0
    for limiter in limiters.values():
        found = [k async for k in limiter.redis.scan_iter(match=f"{limiter.prefix}:*")]
        deleted += await limiter.redis.delete(*found) if found else 0
    return deleted


# --- Explore: the race in memory --------------------------------------------------------


class _LoopStore:
    """Just the sorted-set commands the classic recipe sends, kept in dicts. Each
    command first yields to the event loop once, like a round trip to the embedded
    fakeredis, so concurrent checks interleave the way they do there; a MULTI/EXEC
    (`pipeline`) yields once and then runs all its commands together."""

    def __init__(self) -> None:
        self.sets: dict[str, dict[str, float]] = {}

    def trim(self, key: str, high: float) -> int:
        members = self.sets.get(key, {})
        gone = [m for m, score in members.items() if score <= high]
        for m in gone:
            del members[m]
        return len(gone)

    def count(self, key: str) -> int:
        return len(self.sets.get(key, {}))

    def add(self, key: str, mapping: dict[str, float]) -> int:
        members = self.sets.setdefault(key, {})
        new = sum(m not in members for m in mapping)
        members.update(mapping)
        return new

    def expire(self, key: str) -> bool:
        return key in self.sets  # the replay is shorter than any window: nothing expires

    async def zremrangebyscore(self, key: str, low: Any, high: float) -> int:
        await asyncio.sleep(0)
        return self.trim(key, high)

    async def zcard(self, key: str) -> int:
        await asyncio.sleep(0)
        return self.count(key)

    async def zadd(self, key: str, mapping: dict[str, float]) -> int:
        await asyncio.sleep(0)
        return self.add(key, mapping)

    async def pexpire(self, key: str, ms: int) -> bool:
        await asyncio.sleep(0)
        return self.expire(key)

    async def delete(self, *keys: str) -> int:
        return sum(self.sets.pop(k, None) is not None for k in keys)

    def pipeline(self, transaction: bool = True) -> _LoopTransaction:
        if not transaction:
            raise ValueError("the in-memory store only runs MULTI/EXEC transactions")
        return _LoopTransaction(self)


class _LoopTransaction:
    """MULTI/EXEC on a `_LoopStore`: the commands are queued, and `execute` runs them
    all in one turn of the event loop, with nothing in between."""

    def __init__(self, store: _LoopStore) -> None:
        self.store = store
        self.queued: list[Callable[[], Any]] = []

    def zremrangebyscore(self, key: str, low: Any, high: float) -> None:
        self.queued.append(lambda: self.store.trim(key, high))

    def zadd(self, key: str, mapping: dict[str, float]) -> None:
        self.queued.append(lambda: self.store.add(key, mapping))

    def zcard(self, key: str) -> None:
        self.queued.append(lambda: self.store.count(key))

    def pexpire(self, key: str, ms: int) -> None:
        self.queued.append(lambda: self.store.expire(key))

    async def execute(self) -> list[Any]:
        await asyncio.sleep(0)
        return [command() for command in self.queued]


def _lua_model_counts(concurrency: int, limit: int, rounds: int, window_s: float) -> list[int]:
    """The Lua limiter's admitted per round, from the reference model: every request of
    a round at the same instant, one fresh identity per round."""
    traffic = pd.DataFrame(
        {
            "time": 0.0,
            "identity": np.repeat([f"round-{r}" for r in range(rounds)], concurrency),
            "cost": 1,
            "replica": 0,
        }
    )
    decided = replay(traffic, reference.SlidingWindowLimiter(window_s, limit), progress=False)
    per_round = decided.groupby("identity", sort=False).allowed.sum()
    return [int(n) for n in per_round]


def race_counts(
    *, concurrency: int = 50, limit: int = 10, rounds: int = 100, window_s: float = 1
) -> dict[str, list[int]]:
    """Requests admitted in each round, per limiter (`NON_ATOMIC`, `MULTI`, `LUA`), in
    memory. Every request of a round is stamped at one instant, as in the Lua model: a
    clock that stands still, so that no round outlasts its window, however long a busy
    machine takes over it (on the host's clock a round stalled past the window admitted
    twice the limit under MULTI/EXEC)."""
    store = _LoopStore()
    still = ManualClock(time.time())
    naive = ClassicSlidingLog(store, window_s, limit, prefix="explore:race", clock=still)
    multi = _transaction_log(store, window_s, limit, prefix="explore:race", clock=still)
    lua = _lua_model_counts(concurrency, limit, rounds, window_s)
    # A notebook's kernel (and a slider's callback) already runs an event loop in this
    # thread, where asyncio.run is refused: run the race's own loop in a helper thread.
    with ThreadPoolExecutor(1) as helper:
        counts = {
            name: helper.submit(
                asyncio.run, race_async(limiter, store, concurrency=concurrency, rounds=rounds)
            ).result()
            for name, limiter in ((NON_ATOMIC, naive), (MULTI, multi))
        }
    return {**counts, LUA: lua}


async def embedded_counts(
    *, concurrency: int = 50, limit: int = 10, rounds: int = 100, window_s: float = 1
) -> dict[str, list[int]]:
    """`race_counts` on the embedded fakeredis, with the classic recipe (separate
    commands, and MULTI/EXEC) and the real `ratelimit.SlidingWindowLimiter` (asyncio, one
    process); `REDIS_URL` is ignored."""
    client = ratelimit.connect(embedded=True)
    prefix = "explore:race"
    limiters = {
        NON_ATOMIC: ClassicSlidingLog(client, window_s, limit, prefix=prefix),
        MULTI: _transaction_log(client, window_s, limit, prefix=prefix),
        LUA: _SORTED_LOG.build("async", client, window_s, limit, prefix=prefix),
    }
    try:
        return {
            name: await race_async(limiter, client, concurrency=concurrency, rounds=rounds)
            for name, limiter in limiters.items()
        }
    finally:
        await client.aclose()


def figure(
    *,
    concurrency: int = 50,
    limit: int = 10,
    rounds: int = 100,
    window_s: float = 1,
    rate_multiple: float = 2,
    windows: int = 10,
) -> Figure:
    """The Explore figure, in memory. Left: histogram of the requests admitted per round
    by the non-atomic log, the MULTI/EXEC recipe and the Lua script, for `concurrency`
    requests sent at once against `limit` per `window_s` seconds, `rounds` times, as on
    the embedded backend from one asyncio process (`race_counts`). Right: a client that
    keeps sending `rate_multiple` times the limit for `windows` windows, admitted per
    window by the script and by MULTI/EXEC (`steady_model`)."""
    counts = race_counts(concurrency=concurrency, limit=limit, rounds=rounds, window_s=window_s)
    rate = rate_multiple * limit / window_s
    steady = steady_model(rate=rate, limit=limit, window_s=window_s, duration_s=windows * window_s)
    fig, (ax, right) = plt.subplots(1, 2, figsize=(12, 4.2), width_ratios=(3, 2))
    bins = np.arange(0, concurrency + 2) - 0.5  # one bin per whole count, 0 .. concurrency
    for name in _drawn(counts):
        _histogram(ax, counts[name], bins, name)
    ax.axvline(limit, color="black", linestyle=":", linewidth=1, label=f"limit ({limit})")
    ax.set_xlim(-0.5, concurrency + 0.5)
    ax.set_ylim(0, rounds * 1.1)
    ax.set_xlabel(f"requests admitted in one round (of {concurrency} sent at once)")
    ax.set_ylabel(f"rounds (of {rounds})")
    ax.set_title(
        f"{concurrency} concurrent requests at a limit of {limit} per {window_s:g} s,\n"
        f"{rounds} rounds, embedded backend (asyncio)",
        fontsize=10,
    )
    ax.legend(loc="upper center", fontsize=8)
    _steady_axes(right, steady_windows(steady, window_s=window_s), rate=rate, limit=limit,
                 window_s=window_s)  # fmt: skip
    fig.tight_layout()
    return fig
