"""A soak: the demo app (several uvicorn workers, one private redis-server) under a
steady load with API keys churning, then left idle until every key has expired.

The load: `rate` requests per second for `seconds` (`ratelimit.devtools.load`, paced),
to the limited tiles route, with a new API key every `REQUESTS_PER_KEY` requests, so
keys are born all the time and each is left behind after a moment; the route's window
is short (`window_s`), its limit below `REQUESTS_PER_KEY`, so each key sees admits and
rejections. Memory is read three times:

- baseline: after a warm-up of the same traffic (every worker has served, connected to
  Redis, loaded the script) and once its keys have expired;
- peak: the largest of the baseline and the figures sampled every `SAMPLE_S` during
  the load;
- after: once Redis holds no key again (its own expiry, nothing deleted by hand), and
  `SETTLE_S` later.

Figures: Redis `used_memory` (INFO memory: what its allocator holds for data, clients
and scripts) and the summed resident memory (VmRSS) of the app's worker processes.
"Returns to baseline" holds when the figure after expiry is within the tolerance of the
baseline: `REDIS_TOLERANCE` for Redis, `RSS_TOLERANCE` for the workers, as a fraction of
the baseline. Reported by `make bench` (met / not met), never asserted in a test.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import redis

from .verdicts import judged, skip

WORKERS = 4
CONNECTIONS = 8
RATE = 100.0  # requests per second, paced: steady on 2 shared cores (200 was not)
SECONDS = 60.0
WINDOW_S = 5
LIMIT = 2  # per window per API key
REQUESTS_PER_KEY = 3  # then a new key: each key is admitted twice and rejected once
WARMUP_S = 5.0
WARMUP_RUNS = 30  # short runs on fresh connections, until every worker has served
SAMPLE_S = 0.25
SETTLE_S = 1.0  # for Redis's cron to shrink its emptied tables
EXPIRY_DEADLINE_S = 60.0  # past the window, for Redis's own expiry to clear every key
REDIS_TOLERANCE = 0.02  # after expiry, used_memory <= baseline x 1.02
RSS_TOLERANCE = 0.05  # after expiry, the workers' RSS <= baseline x 1.05


def _rss(pids: list[int]) -> dict[str, int]:
    from ratelimit.devtools.demo_server import rss_bytes

    found = {str(pid): rss_bytes(pid) for pid in pids}
    return {pid: rss for pid, rss in found.items() if rss is not None}


def _snapshot(admin: redis.Redis, pids: list[int]) -> dict[str, Any]:
    rss = _rss(pids)
    return {
        "redis_used_memory": int(admin.info("memory")["used_memory"]),
        "redis_keys": int(admin.dbsize()),
        "workers_rss": sum(rss.values()),
        "rss_by_worker": rss,
    }


class _Sampler:
    """Samples memory every SAMPLE_S in a thread while the load runs; keeps the largest."""

    def __init__(self, admin: redis.Redis, pids: list[int]) -> None:
        self.admin, self.pids = admin, pids
        self.peak: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.take()

    def take(self, snap: dict[str, Any] | None = None) -> None:
        snap = snap or _snapshot(self.admin, self.pids)
        self.samples += 1
        for name in ("redis_used_memory", "redis_keys", "workers_rss"):
            self.peak[name] = max(self.peak.get(name, 0), snap[name])

    @contextlib.contextmanager
    def running(self) -> Iterator[_Sampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()
            self.take()  # the end of the load too


def _wait_until_empty(admin: redis.Redis, deadline_s: float) -> float | None:
    """Seconds until Redis holds no key (None if it still does at the deadline)."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        if admin.dbsize() == 0:
            return time.monotonic() - start
        time.sleep(0.1)
    return None


def _plan(run_id: str) -> Any:
    def plan(i: int) -> tuple[str, str]:
        return f"/tiles/3/{i % 8}/{i // 8 % 8}.png", f"soak-{run_id}-{i // REQUESTS_PER_KEY}"

    return plan


def _warm_up(url: str, pids: list[int], seconds: float, rate: float) -> None:
    """The soak's traffic for `seconds`, in short runs on fresh connections until every
    worker has served some (a worker takes the connections it accepts, and the first to
    wake may take them all): a worker's first requests grow its memory once."""
    from ratelimit.devtools.demo_server import WORKER_HEADER
    from ratelimit.devtools.load import run_load

    served: set[str] = set()
    start = time.monotonic()
    for attempt in range(WARMUP_RUNS):
        result = asyncio.run(
            run_load(
                url,
                _plan(f"warmup{attempt}"),
                connections=CONNECTIONS,
                duration_s=max(0.5, seconds / 5),
                rate=rate,
                keep_headers=True,
            )
        )
        served |= {o.headers[WORKER_HEADER.lower()] for o in result.outcomes if o.headers}
        if served >= {str(pid) for pid in pids} and time.monotonic() - start >= seconds:
            return
    raise RuntimeError(f"{WARMUP_RUNS} warm-up runs reached workers {sorted(served)} of {pids}")


def measure(
    url: str, admin: redis.Redis, pids: list[int], seconds: float, rate: float, window_s: int
) -> dict[str, Any]:
    """Warm up, baseline, load (sampled), wait for expiry, after; see the module doc."""
    from ratelimit.devtools.load import run_load  # httpx: the [http] extra

    _warm_up(url, pids, min(WARMUP_S, seconds), rate)
    deadline = window_s + EXPIRY_DEADLINE_S
    if _wait_until_empty(admin, deadline) is None:
        raise RuntimeError(f"the warm-up's keys did not expire within {deadline} s")
    time.sleep(SETTLE_S)
    baseline = _snapshot(admin, pids)
    sampler = _Sampler(admin, pids)
    sampler.take(baseline)  # the peak is the largest figure from the baseline on
    with sampler.running():
        result = asyncio.run(
            run_load(
                url,
                _plan(uuid.uuid4().hex[:8]),
                connections=CONNECTIONS,
                duration_s=seconds,
                rate=rate,
            )
        )
    emptied_s = _wait_until_empty(admin, deadline)
    time.sleep(SETTLE_S)
    after = _snapshot(admin, pids)
    statuses = {str(k): v for k, v in result.statuses().items()}
    sent = len(result.outcomes)
    return {
        "requests": sent,
        "requests_per_s": result.per_s,
        "api_keys": -(-sent // REQUESTS_PER_KEY),
        "statuses": statuses,
        "samples": sampler.samples,
        "keys_expired_after_s": None if emptied_s is None else round(emptied_s, 2),
        "memory": {
            name: {"baseline": baseline[name], "peak": sampler.peak[name], "after": after[name]}
            for name in ("redis_used_memory", "redis_keys", "workers_rss")
        },
        "rss_by_worker": {"baseline": baseline["rss_by_worker"], "after": after["rss_by_worker"]},
    }


def run(
    seconds: float = SECONDS, rate: float = RATE, window_s: int = WINDOW_S, workers: int = WORKERS
) -> dict[str, Any]:
    """Start a private redis-server and the demo app on it, soak, stop both (by PID); a
    skip with the reason when either cannot run here."""
    try:
        import httpx  # noqa: F401  (the load generator's client)

        from ratelimit.devtools.demo_server import DemoServer
    except ImportError as exc:  # fastapi, uvicorn or httpx missing: the [http] extra
        return {"skipped": f"skipped: the http extra is not installed ({exc})"}
    from ratelimit.devtools.server import RedisServer

    if not RedisServer.available():
        return {"skipped": "skipped: redis-server is not installed (a private one is needed)"}
    options = {"tiles_limit": LIMIT, "window_s": window_s, "prefix": "soak", "trace_headers": True}
    with (
        RedisServer() as server,
        DemoServer(redis_url=server.url, workers=workers, app_options=options) as app,
    ):
        admin = server.client()
        try:
            figures = measure(app.url, admin, app.worker_pids(), seconds, rate, window_s)
        finally:
            admin.close()
    return {
        "seconds": seconds,
        "rate": rate,
        "workers": workers,
        "connections": CONNECTIONS,
        "window_s": window_s,
        "limit": LIMIT,
        "requests_per_key": REQUESTS_PER_KEY,
        "server": "a private redis-server (no other clients)",
        "tolerance": {"redis_used_memory": REDIS_TOLERANCE, "workers_rss": RSS_TOLERANCE},
        **figures,
    }


NAMES = {
    "redis_used_memory": "soak: Redis used_memory after the keys expired, x its baseline",
    "workers_rss": "soak: the app workers' RSS after the keys expired, x its baseline",
}


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One judged row per figure, after / baseline <= 1 + its tolerance, and one for
    the keys: none left once Redis's own expiry had `EXPIRY_DEADLINE_S` past the window."""
    if "skipped" in report:
        return [skip(name, report["skipped"]) for name in NAMES.values()]
    rows = []
    for figure, name in NAMES.items():
        m = report["memory"][figure]
        row = {
            "target": name,
            "value": m["after"] / m["baseline"],
            "unit": "x",
            "baseline": m["baseline"],
            "peak": m["peak"],
            "after": m["after"],
            "part": "soak",
        }
        rows.append(judged(row, 1 + report["tolerance"][figure], "<="))
    keys = report["memory"]["redis_keys"]
    row = {
        "target": f"soak: keys left in Redis after the wait (of {keys['peak']:,} at the peak)",
        "value": keys["after"],
        "unit": " keys",
        "part": "soak",
    }
    rows.append(judged(row, 0, "<="))
    return rows
