"""The limiter's added latency per HTTP request, on the demo app as several uvicorn
worker processes sharing one private redis-server.

Two routes of the same app (`DemoServer(workers=..., app_options=...)`) do the same
work, one through the limiter and one without it:

- limited: `/tiles/{z}/{x}/{y}.png`, the demo's tiles route (a sliding log per API key,
  the app's clock; a limit high enough that every request is admitted, so what is
  measured is the admit path, one check per request);
- unlimited: `/unlimited/tiles/{z}/{x}/{y}.png`, the same validation and tile, no limiter.

In interleaved rounds (both routes in each round, in a shuffled order), a fixed number
of requests per route goes through the same number of keep-alive connections from the
bench's own load generator (`ratelimit.devtools.load`), cycling over `API_KEYS` keys.
Per round and route: the latencies' p50 and p99 and the requests answered per second;
the figures are medians over rounds of the same-round ratios (limited / unlimited) and
differences (limited - unlimited, ms). The limited route must keep at least
`THROUGHPUT_TARGET` of the unlimited route's requests per second (a judged target).
Beside them (`pooled`), each route's p50 and p99 over all its requests together.
Everything runs on one machine: the load generator, the workers and Redis share its
cores, so the milliseconds are loopback figures, the ratios what carries over.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from typing import TYPE_CHECKING, Any

from .verdicts import answered_row, judged, quartiles, skip

if TYPE_CHECKING:
    from ratelimit.devtools.load import LoadResult

WORKERS = 4
CONNECTIONS = 4  # as many as workers: latency more than queueing
API_KEYS = 1_000
LIMIT = 100_000  # per second per API key: never reached, every request is admitted
ROUTES = {
    "limited": "/tiles/3/{x}/{y}.png",
    "unlimited": "/unlimited/tiles/3/{x}/{y}.png",
}
WARMUP = 200  # requests per route before the rounds: connections to every worker, scripts
THROUGHPUT_TARGET = 0.85  # limited requests/s >= this x unlimited, same-round medians


def _plan(route: str) -> Any:
    def plan(i: int) -> tuple[str, str]:
        return ROUTES[route].format(x=i % 8, y=i // 8 % 8), f"bench-http-{i % API_KEYS}"

    return plan


def _figures(result: LoadResult) -> dict[str, Any]:
    from ratelimit.devtools.load import percentile

    latencies = result.latencies_ms()
    return {
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "per_s": result.per_s,
        "statuses": {str(k): v for k, v in result.statuses().items()},
    }


async def measure(
    url: str, n_rounds: int, n: int, connections: int = CONNECTIONS, seed: int = 0
) -> tuple[list[dict[str, dict[str, Any]]], dict[str, list[float]]]:
    """`n_rounds` rounds of `n` requests per route against the app at `url`: the
    figures of each round, and every latency (ms) per route over all rounds."""
    from ratelimit.devtools.load import run_load  # httpx: the [http] extra

    for route in ROUTES:
        warmup = min(WARMUP, 2 * n)
        await run_load(url, _plan(route), connections=connections, total=warmup)
    rng = random.Random(seed)
    per_round = []
    latencies: dict[str, list[float]] = {route: [] for route in ROUTES}
    for _ in range(n_rounds):
        row = {}
        for route in rng.sample(list(ROUTES), len(ROUTES)):
            result = await run_load(url, _plan(route), connections=connections, total=n)
            row[route] = _figures(result)
            latencies[route] += result.latencies_ms()
        per_round.append({route: row[route] for route in ROUTES})
    return per_round, latencies


def pooled(latencies: dict[str, list[float]]) -> dict[str, Any]:
    """p50 and p99 per route over every round's requests together (both routes were
    sampled in the same interleaved rounds), and limited against unlimited: a p99 of
    thousands of requests, steadier than the median of each round's few-hundred p99."""
    from ratelimit.devtools.load import percentile

    out: dict[str, Any] = {}
    for route, values in latencies.items():
        ordered = sorted(values)
        out[route] = {"p50_ms": percentile(ordered, 50), "p99_ms": percentile(ordered, 99)}
    for q in ("p50", "p99"):
        limited, unlimited = out["limited"][f"{q}_ms"], out["unlimited"][f"{q}_ms"]
        out[f"{q}_added_ms"] = limited - unlimited
        out[f"{q}_ratio"] = limited / unlimited
    return out


def summarize(per_round: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Medians per route, and the medians of the same-round ratios and differences."""
    out: dict[str, Any] = {"routes": {}}
    for route in ROUTES:
        rows = [r[route] for r in per_round]
        statuses: dict[str, int] = {}
        for r in rows:
            for status, count in r["statuses"].items():
                statuses[status] = statuses.get(status, 0) + count
        out["routes"][route] = {
            "path": ROUTES[route].format(x="{x}", y="{y}"),
            "p50_ms": statistics.median(r["p50_ms"] for r in rows),
            "p99_ms": statistics.median(r["p99_ms"] for r in rows),
            "per_s": statistics.median(r["per_s"] for r in rows),
            "statuses": statuses,
        }
    for q in ("p50", "p99"):
        ratios = [r["limited"][f"{q}_ms"] / r["unlimited"][f"{q}_ms"] for r in per_round]
        added = [r["limited"][f"{q}_ms"] - r["unlimited"][f"{q}_ms"] for r in per_round]
        out[f"{q}_ratio"] = statistics.median(ratios)
        out[f"{q}_ratio_quartiles"] = quartiles(ratios)
        out[f"{q}_added_ms"] = statistics.median(added)
        out[f"{q}_added_ms_quartiles"] = quartiles(added)
    speeds = [r["limited"]["per_s"] / r["unlimited"]["per_s"] for r in per_round]
    out["per_s_ratio"] = statistics.median(speeds)
    out["per_s_ratio_quartiles"] = quartiles(speeds)
    return out


def run(
    n_rounds: int, n: int, workers: int = WORKERS, connections: int = CONNECTIONS
) -> dict[str, Any]:
    """Start a private redis-server and the demo app with `workers` workers on it,
    measure, stop both (by PID); a skip with the reason when either cannot run here."""
    try:
        import httpx  # noqa: F401  (the load generator's client)

        from ratelimit.devtools.demo_server import DemoServer
    except ImportError as exc:  # fastapi, uvicorn or httpx missing: the [http] extra
        return {"skipped": f"skipped: the http extra is not installed ({exc})"}
    from ratelimit.devtools.server import RedisServer

    if not RedisServer.available():
        return {"skipped": "skipped: redis-server is not installed (a private one is needed)"}
    options = {"tiles_limit": LIMIT, "window_s": 1, "prefix": "bench-http"}
    with (
        RedisServer() as server,
        DemoServer(redis_url=server.url, workers=workers, app_options=options) as app,
    ):
        per_round, latencies = asyncio.run(measure(app.url, n_rounds, n, connections))
    return {
        "workers": workers,
        "connections": connections,
        "rounds": n_rounds,
        "requests_per_route_per_round": n,
        "api_keys": API_KEYS,
        "limit": f"{LIMIT:,} per second per API key (every request admitted)",
        "server": "a private redis-server (no other clients)",
        "per_round": per_round,
        **summarize(per_round),
        "pooled": pooled(latencies),
    }


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """INFO rows for the added latency (shown, not judged: no target was set), and
    judged rows: the limited route keeps >= `THROUGHPUT_TARGET` of the unlimited
    route's requests per second, and every request to it answered 200 (none 5xx, none
    lost)."""
    names = [
        "HTTP p50 latency, limited route vs unlimited (multi-worker app)",
        "HTTP p99 latency, limited route vs unlimited (multi-worker app)",
        "HTTP, limited route: requests answered 200",
        "HTTP requests/s, limited route vs unlimited (multi-worker app)",
    ]
    if "skipped" in report:
        return [skip(name, report["skipped"]) for name in names]
    rows = []
    for q, name in zip(("p50", "p99"), names, strict=False):
        row = {
            "target": name,
            "value": report[f"{q}_ratio"],
            "unit": "x",
            "quartiles": report[f"{q}_ratio_quartiles"],
            "added_ms": report[f"{q}_added_ms"],
            "part": "http",
        }
        rows.append(judged(row, None))
    if "per_s_ratio" in report:  # (reports from before the throughput target lack it)
        row = {
            "target": names[3],
            "value": report["per_s_ratio"],
            "unit": "x",
            "quartiles": report["per_s_ratio_quartiles"],
            "part": "http",
        }
        rows.append(judged(row, THROUGHPUT_TARGET))
    limited = report["routes"]["limited"]["statuses"]
    sent = sum(limited.values())
    ok = limited.get("200", 0)
    rows.append(answered_row(names[2], ok, sent, "http"))
    return rows
