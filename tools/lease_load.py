"""A leased route under load: how many requests are in flight at once, admitted, refused.

    .venv/bin/python tools/lease_load.py [--clients 50] [--limit 4] [--service-ms 200]
                                          [--duration 10] [--redis-url URL]

A slow endpoint (it sleeps `--service-ms`) behind `ratelimit.http.concurrency_limit`
with a `ConcurrencyLimiter` of `--limit` leases, served by uvicorn on a free loopback
port in this process, on the Redis of `--redis-url` (default REDIS_URL, else
127.0.0.1:6379). `--clients` clients, one connection each, all with the same API key,
send back to back for `--duration` seconds. The endpoint counts the requests inside it
(the most at once is the figure that matters: never above the limit); every answer must
be a 200 or a 429, and no lease may be left in Redis at the end. Prints one JSON
document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from ratelimit.http import LeaseInfo, concurrency_limit, install


def build(limiter: Any, service_s: float) -> tuple[FastAPI, dict[str, int]]:
    app = FastAPI()
    install(app)
    lease = concurrency_limit(limiter, scope="slow")
    seen = {"inside": 0, "most": 0}

    async def slow(info: LeaseInfo = Depends(lease)) -> dict[str, int]:  # noqa: B008
        seen["inside"] += 1
        seen["most"] = max(seen["most"], seen["inside"])
        try:
            await asyncio.sleep(service_s)
        finally:
            seen["inside"] -= 1
        return {"ok": 1}

    app.get("/slow")(slow)
    return app, seen


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--service-ms", type=int, default=200)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument(
        "--redis-url", default=None, help="default: REDIS_URL, else the local 127.0.0.1:6379"
    )
    args = parser.parse_args(argv)
    args.redis_url = load_url(args.redis_url)

    # Generous timeouts: this counts leases, and on a busy machine a slow answer (or a
    # slow connect) is still an answer, not a 503.
    redis = ratelimit.connect(args.redis_url, timeout=10.0)
    prefix = f"leaseload:{uuid.uuid4().hex[:8]}"
    limiter = ratelimit.ConcurrencyLimiter(redis, args.limit, 30, prefix, timeout=10.0)
    app, seen = build(limiter, args.service_ms / 1000)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)

    statuses: Counter[int] = Counter()
    retry_after: list[int] = []
    stop = time.monotonic() + args.duration
    headers = {"x-api-key": "load"}

    async def client() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as web:
            while time.monotonic() < stop:
                response = await web.get("/slow", headers=headers)
                statuses[response.status_code] += 1
                if response.status_code == 429:
                    retry_after.append(int(response.headers["retry-after-ms"]))

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(args.clients)))
    elapsed = time.monotonic() - started
    # Counted once the server has stopped: a lease is released after its response is
    # sent, so a client can hold its answer a moment before the release is done.
    server.should_exit = True
    await serving
    left = await redis.zcard(limiter.key_for("slow:key:load"))
    await redis.delete(limiter.key_for("slow:key:load"))
    await redis.aclose()
    admitted = statuses.get(200, 0)
    return {
        "command": "tools/lease_load.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "redis": "embedded" if ratelimit.is_embedded(redis) else args.redis_url,
        "clients": args.clients,
        "limit": args.limit,
        "service_ms": args.service_ms,
        "seconds": round(elapsed, 2),
        "requests": sum(statuses.values()),
        "statuses": dict(sorted(statuses.items())),
        "max_in_flight_observed": seen["most"],
        "admitted_per_s": round(admitted / elapsed, 1),
        "ideal_admitted_per_s": round(args.limit / (args.service_ms / 1000), 1),
        "retry_after_ms_range": [min(retry_after), max(retry_after)] if retry_after else None,
        "leases_left_in_redis": left,
    }


if __name__ == "__main__":
    result = asyncio.run(main())
    print(json.dumps(result, indent=2))
    ok = (
        result["max_in_flight_observed"] <= result["limit"]
        and set(result["statuses"]) <= {200, 429}
        and result["leases_left_in_redis"] == 0
    )
    sys.exit(0 if ok else 1)
