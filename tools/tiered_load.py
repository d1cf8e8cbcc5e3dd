"""A tiered route under load: how many requests are admitted, which tier refuses the rest,
and whether any tier's limit is ever exceeded.

    .venv/bin/python tools/tiered_load.py [--tiers "5/s; 20/10s"] [--clients 20]
                                           [--duration 10] [--algorithm log] [--clock redis]
                                           [--redis-url URL]

A fast endpoint behind `ratelimit.http.rate_limit` with a `TieredLimiter` of `--tiers`,
served by uvicorn on a free loopback port in this process, on the Redis of
`--redis-url` (default REDIS_URL, else 127.0.0.1:6379). `--clients` clients, one
connection each, all with the same API key, send back to back for `--duration`
seconds. The endpoint records the time each admission was decided and recorded at
(`Decision.decided_at_ms`); every 429 names its binding tier in its `RateLimit` field.
Afterwards, for each tier, the most admissions in any window of that tier's length
(exact: every window that starts at an admission). Every answer must be a 200 or a 429
naming a tier, and with the sliding log (the default) no tier's window may ever hold
more than its limit; the other algorithms bound other windows, so for them the figure
is only reported. Prints one JSON document.

The limiter runs on Redis's clock by default (`--clock redis`), the clock its keys
expire on. With `--clock host` a check's time is taken on this host before it waits
for Redis: one that waits longer than its key has left to live finds the log expired,
is admitted, and is recorded less than a window after the entries that expired, so
the count above can exceed a limit (seen in the first second of a fresh process on a
busy machine); the single-rate `SlidingWindowLimiter` does the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import uvicorn
from fastapi import Depends, FastAPI

import ratelimit
from ratelimit.devtools.load import load_url
from ratelimit.devtools.process import free_port
from ratelimit.http import ClientIdentity, RateLimit, RateLimitInfo, install, rate_limit

SCOPE = "tiered"
API_KEY = "load"


def build(limiter: Any) -> tuple[FastAPI, RateLimit, list[int]]:
    app = FastAPI()
    install(app)
    route = rate_limit(limiter, scope=SCOPE)
    admitted_at: list[int] = []

    async def tiered(info: RateLimitInfo = Depends(route)) -> dict[str, int]:  # noqa: B008
        if info.decision.decided_at_ms is not None:  # None only for a fail-open admission
            admitted_at.append(info.decision.decided_at_ms)
        return {"ok": 1}

    app.get("/tiered")(tiered)
    return app, route, admitted_at


def most_in_any_window(times_ms: list[int], window_ms: int) -> int:
    """The most of `times_ms` inside any window [s, s + window_ms): the busiest such
    window can be taken to end just after one of the times, so two pointers find it."""
    times = sorted(times_ms)
    most, first = 0, 0
    for last, at in enumerate(times):
        while times[first] <= at - window_ms:
            first += 1
        most = max(most, last - first + 1)
    return most


def failures(result: dict[str, Any]) -> list[str]:
    """What the run broke: answers other than 200 and 429, 429s that name no tier, and
    (sliding log only) a tier whose window held more than its limit."""
    found = []
    if set(result["statuses"]) - {"200", "429"}:
        found.append(f"statuses other than 200 and 429: {result['statuses']}")
    if result["refused_naming_no_tier"]:
        found.append(f"{result['refused_naming_no_tier']} 429s named no tier")
    if result["algorithm"] == "log":
        found += [
            f"{rate}: {tier['most_in_any_window']} admitted in one window, limit {tier['limit']}"
            for rate, tier in result["tiers"].items()
            if tier["most_in_any_window"] > tier["limit"]
        ]
    return found


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tiers", default="5/s; 20/10s")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--algorithm", choices=["log", "fw", "swc", "gcra"], default="log")
    parser.add_argument("--clock", choices=["redis", "host"], default="redis")
    parser.add_argument(
        "--redis-url", default=None, help="default: REDIS_URL, else the local 127.0.0.1:6379"
    )
    args = parser.parse_args(argv)
    args.redis_url = load_url(args.redis_url)

    # Generous timeouts, for connecting as for answering: this measures decisions, and a
    # busy machine's slow answer is still one (with 1 s, checks in CI runs beside CPU
    # burners came back as 503s, once while the client was still connecting).
    redis = ratelimit.connect(args.redis_url, timeout=10.0)
    prefix = f"tieredload:{uuid.uuid4().hex[:8]}"
    clock: Any = "redis" if args.clock == "redis" else time.time
    limiter = ratelimit.TieredLimiter(
        redis, args.tiers, prefix, algorithm=args.algorithm, clock=clock, timeout=10.0
    )
    app, route, admitted_at = build(limiter)
    by_name = dict(zip(route.policy_names, limiter.rates, strict=True))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)

    statuses: Counter[int] = Counter()
    refused_by: Counter[str] = Counter()
    stop = time.monotonic() + args.duration
    headers = {"x-api-key": API_KEY}
    last_sent = [0.0]  # wall clock, seconds: when the last request went out

    async def client() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as web:
            while time.monotonic() < stop:
                last_sent[0] = max(last_sent[0], time.time())
                response = await web.get("/tiered", headers=headers)
                statuses[response.status_code] += 1
                if response.status_code == 429:
                    # The RateLimit field names the binding tier: "tiered-10s";r=0;t=7
                    name = response.headers.get("ratelimit", "").split(";")[0].strip('"')
                    refused_by[str(by_name[name]) if name in by_name else "none"] += 1

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(args.clients)))
    elapsed = time.monotonic() - started
    server.should_exit = True
    await serving
    await redis.delete(*limiter.keys_for(route.limiter_identity(ClientIdentity("key", API_KEY))))
    await redis.aclose()
    admitted = statuses.get(200, 0)
    tiers = {
        str(rate): {
            "limit": rate.limit,
            "window_ms": rate.window_ms,
            "refused_as_binding_tier": refused_by.get(str(rate), 0),
            "most_in_any_window": most_in_any_window(admitted_at, rate.window_ms),
        }
        for rate in limiter.rates
    }
    result = {
        "command": "tools/tiered_load.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "redis": "embedded" if ratelimit.is_embedded(redis) else args.redis_url,
        "tiers_header": route.policy,
        "algorithm": args.algorithm,
        "clock": args.clock,
        "clients": args.clients,
        "seconds": round(elapsed, 2),
        "requests": sum(statuses.values()),
        "requests_per_s": round(sum(statuses.values()) / elapsed, 1),
        "statuses": {str(status): n for status, n in sorted(statuses.items())},
        "admitted": admitted,
        "admitted_seen_by_endpoint": len(admitted_at),
        # How long requests kept coming once the first was admitted (a busy host may
        # spend most of --duration connecting): what a tier's refill can be seen within.
        "sent_after_first_admission_s": round(
            max(0.0, last_sent[0] - min(admitted_at) / 1000) if admitted_at else 0.0, 3
        ),
        "refused_naming_no_tier": refused_by.get("none", 0),
        "tiers": tiers,
    }
    result["failures"] = failures(result)
    return result


if __name__ == "__main__":
    result = asyncio.run(main())
    print(json.dumps(result, indent=2))
    sys.exit(1 if result["failures"] else 0)
