"""One whole bench run: every part in order, gathered into one report (a dict for JSON).

Parts that cannot run here say why in the report instead of failing the run: the
peers without their packages or on fakeredis, the cluster when none is up (neither
`RATELIMIT_CLUSTER_URL` nor a running `make cluster-up`), memory and server cost
without a real server, http and soak without redis-server (they start their own,
whatever the other parts use) or the http extra; asgi (the HTTP layer in process)
without the http extra, or with neither redis-server nor a Redis URL. Each part's
duration is recorded (`timings_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis

from ratelimit import connect, connect_sync
from ratelimit.devtools.server import RedisServer

from . import (
    checks,
    cluster,
    concurrency,
    hotpath,
    http_inprocess,
    http_latency,
    logplan,
    logplan_dask,
    memory_per_key,
    nearcache,
    progress,
    replay,
    server_cost,
    soak,
    sync_checks,
)
from . import targets as targets_mod

DEFAULT_URL = "redis://127.0.0.1:6379/0"


@dataclass
class Options:
    """How much to measure. `quick()` is for tests: tiny, two rounds."""

    rounds: int = 21
    n: int = 400  # checks per case per round
    concurrency_n: int = 1000
    tasks: tuple[int, ...] = concurrency.TASKS
    # server cost: interleaved rounds of every case, checks per case per round (at most
    # 10,000); short rounds pair a case with the one it is compared to more tightly
    cost_rounds: int = 15
    cost_calls: int = 400
    memory_limits: tuple[int, ...] = memory_per_key.LIMITS
    requests: int = 1_000_000  # replay: the model's trace
    # replay: rows decided by Redis and fakeredis; their rates do not depend on the
    # length, and fakeredis (~1,200 rows/s) would otherwise dominate the run
    redis_rows: int = 5_000
    replay_rounds: int = 3
    # logplan: a synthetic access log of this many lines planned end to end (and one a
    # tenth its size), with this many distinct API keys
    logplan_lines: int = 50_000_000
    logplan_identities: int = 100_000
    # dask: a log set of this many lines in this many files, planned by the local engine
    # and by Dask at one and two workers, in this many interleaved rounds
    dask_lines: int = 8_000_000
    dask_files: int = 4
    dask_rounds: int = 3
    nearcache_rounds: int = 9
    nearcache_checks: int = nearcache.CHECKS_PER_ROUND
    nearcache_trace_s: int = nearcache.TRACE_SECONDS
    # http: the demo app as uvicorn workers on a private redis-server; interleaved rounds
    # of requests per route (limited, unlimited) over a fixed number of connections
    http_rounds: int = 15
    http_requests: int = 300
    http_workers: int = http_latency.WORKERS
    http_connections: int = http_latency.CONNECTIONS
    # asgi: one app in process (httpx's ASGI transport); interleaved rounds of requests
    # per case (unlimited, ours, a bare check, the HTTP peers)
    asgi_rounds: int = 21
    asgi_requests: int = 400
    # soak: steady paced load with API keys churning, then idle until they expired
    soak_seconds: float = soak.SECONDS
    soak_rate: float = soak.RATE
    soak_window_s: int = soak.WINDOW_S
    profile_n: int = 0  # 0: no cProfile of the hot path
    private_server: bool = True  # server cost and memory on a redis-server of our own
    parts: set[str] = field(
        default_factory=lambda: {
            "checks",
            "sync",
            "concurrency",
            "cluster",
            "cost",
            "memory",
            "nearcache",
            "replay",
            "logplan",
            "dask",
            "http",
            "asgi",
            "soak",
        }
    )

    @classmethod
    def quick(cls) -> Options:
        return cls(
            rounds=2,
            n=40,
            concurrency_n=100,
            cost_rounds=2,
            cost_calls=50,
            memory_limits=(10, 128, 129, 1_000),
            requests=5_000,
            redis_rows=300,
            replay_rounds=2,
            logplan_lines=20_000,
            logplan_identities=2_000,
            dask_lines=20_000,
            dask_rounds=1,
            nearcache_rounds=2,
            nearcache_checks=300,
            nearcache_trace_s=1,
            http_rounds=2,
            http_requests=40,
            http_workers=2,
            asgi_rounds=2,
            asgi_requests=40,
            soak_seconds=3.0,
            soak_rate=100.0,
            soak_window_s=1,
        )


def _why(url: str | None) -> str:
    """Why this Redis: said before anything is measured on it."""
    if url and url == os.environ.get("REDIS_URL"):
        return "REDIS_URL"
    if url == DEFAULT_URL:
        return "REDIS_URL is unset and the local default answered"
    return "REDIS_URL is unset and no local Redis answered" if url is None else "given"


def pick_url() -> str | None:
    """REDIS_URL, else 127.0.0.1:6379 when it answers, else None (fakeredis)."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    try:
        client = redis.Redis.from_url(DEFAULT_URL, socket_connect_timeout=0.5)
        try:
            client.ping()
        finally:
            client.close()
        return DEFAULT_URL
    except redis.exceptions.RedisError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> str:
    """What ran the bench: architecture, CPU, cores, Python and redis-py."""
    return (
        f"{platform.machine()}, {_cpu_model()}, {os.cpu_count()} cores; "
        f"Python {platform.python_version()}, redis-py {redis.__version__}"
    )


def server_version(url: str | None) -> str:
    """The Redis version at `url` (INFO server), or what answers instead."""
    if url is None:
        return "none (embedded fakeredis)"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1)
        try:
            return str(client.info("server")["redis_version"])
        finally:
            client.close()
    except (redis.exceptions.RedisError, KeyError) as exc:
        return f"unknown ({type(exc).__name__})"


@contextlib.contextmanager
def cost_server(url: str | None, private: bool) -> Iterator[tuple[str | None, str]]:
    """(url, description) of the server for server cost and memory figures."""
    if url is None:
        yield None, "none: embedded fakeredis has no commandstats or MEMORY USAGE"
    elif private and RedisServer.available():
        with RedisServer() as server:
            yield server.url, f"private redis-server on {server.url} (no other clients)"
    else:
        yield url, f"{url} (shared: other clients' commands may be counted)"


async def _async_parts(
    url: str | None, cost_url: str | None, where: str, o: Options, timer: progress.Parts
) -> dict:
    out: dict[str, Any] = {}
    client = connect(url, embedded=url is None)
    try:
        if "checks" in o.parts:
            with timer.part("checks"):
                out["checks"] = await checks.run(client, url, o.rounds, o.n)
        if "concurrency" in o.parts:
            with timer.part("concurrency"):
                out["concurrency"] = await concurrency.run(
                    client, o.rounds, o.concurrency_n, o.tasks, url=url
                )
        if o.profile_n:
            with timer.part("profile"):
                out["profile"] = await hotpath.run(client, o.profile_n)
    finally:
        await client.aclose()
    if "cluster" in o.parts:
        with timer.part("cluster"):
            out["cluster"] = await cluster.run(o.rounds, o.n)
    if "cost" in o.parts:
        if cost_url is None:
            out["server_cost"] = {"skipped": f"skipped: {where}"}
            timer.skip("cost", f"skipped: {where}")
        else:
            cost_client = connect(cost_url)
            try:
                with timer.part("cost"):
                    out["server_cost"] = await server_cost.run(
                        cost_client, cost_url, o.cost_rounds, o.cost_calls, where
                    )
            finally:
                await cost_client.aclose()
    return out


def run(options: Options | None = None, url: str | None = "auto") -> dict[str, Any]:
    """Measure everything `options.parts` names; `url="auto"` picks a server (`pick_url`)."""
    o = options or Options()
    url = pick_url() if url == "auto" else url
    timer = progress.Parts(len(o.parts) + (1 if o.profile_n else 0))
    report: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "backend": f"real Redis at {url}" if url else "embedded fakeredis (no Redis answered)",
        "redis_version": server_version(url),
        "options": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(o).items()},
    }
    progress.say(f"[bench] measuring on the {report['backend']} ({_why(url)})")
    with cost_server(url, o.private_server) as (cost_url, where):
        report.update(asyncio.run(_async_parts(url, cost_url, where, o, timer)))
        if "memory" in o.parts:
            if cost_url is None:
                report["memory"] = {"skipped": f"skipped: {where}"}
                timer.skip("memory", f"skipped: {where}")
            else:
                mem_client = redis.Redis.from_url(cost_url)
                try:
                    with timer.part("memory"):
                        report["memory"] = {
                            "server": where,
                            **memory_per_key.run(mem_client, o.memory_limits),
                        }
                finally:
                    mem_client.close()
    if "sync" in o.parts:
        sync_client = connect_sync(url, embedded=url is None)
        try:
            with timer.part("sync"):
                report["sync"] = sync_checks.run(sync_client, o.rounds, o.n, url)
        finally:
            sync_client.close()
    if "nearcache" in o.parts:
        with timer.part("nearcache"):
            report["nearcache"] = nearcache.run(
                url, o.nearcache_rounds, o.nearcache_checks, o.nearcache_trace_s
            )
    if "replay" in o.parts:
        with timer.part("replay"):
            report["replay"] = replay.run(o.replay_rounds, o.requests, o.redis_rows, url)
    if "logplan" in o.parts:
        with timer.part("logplan"):
            report["logplan"] = logplan.run(o.logplan_lines, o.logplan_identities)
    if "dask" in o.parts:
        with timer.part("dask"):
            report["dask"] = logplan_dask.run(
                o.dask_lines, o.dask_files, o.logplan_identities, o.dask_rounds
            )
    if "http" in o.parts:
        with timer.part("http"):
            report["http"] = http_latency.run(
                o.http_rounds, o.http_requests, o.http_workers, o.http_connections
            )
    if "asgi" in o.parts:
        with timer.part("asgi"):
            report["asgi"] = http_inprocess.run(o.asgi_rounds, o.asgi_requests, url)
    if "soak" in o.parts:
        with timer.part("soak"):
            report["soak"] = soak.run(o.soak_seconds, o.soak_rate, o.soak_window_s, o.http_workers)
    report["targets"] = targets_mod.judge(report)
    report["timings_s"] = timer.seconds
    return report
