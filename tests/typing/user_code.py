"""Typical user code, checked by `mypy --strict` (`make test`): it must type-check as is.

Not collected by pytest (no test_ prefix); it is importable and runs on the embedded
fakeredis (tests/core/test_typing.py runs it), so what it shows also works.
"""

from __future__ import annotations

import asyncio

from fastapi import Depends, FastAPI

import ratelimit
import ratelimit.sync
from ratelimit import Decision, Rate, parse_rate, parse_rates
from ratelimit.clock import ManualClock
from ratelimit.http import RateLimitInfo, install, rate_limit


async def quick_start() -> list[Decision]:
    """The README's quick start."""
    redis = ratelimit.connect(embedded=True)
    limiter = ratelimit.SlidingWindowLimiter(redis, "10/s")  # 10 per rolling second
    decisions = []
    for _ in range(12):
        d = await limiter.check("api-key-123")
        print(d.allowed, d.remaining, d.retry_after)
        decisions.append(d)
    await limiter.aclose()
    return decisions


async def every_form() -> None:
    """The rate forms and the options of every async limiter."""
    redis = ratelimit.connect(embedded=True)
    per_second = ratelimit.SlidingWindowLimiter(redis, "10/s")
    per_minute = ratelimit.FixedWindowLimiter(redis, Rate(100, 60_000), prefix="api")
    short = ratelimit.SlidingWindowCounterLimiter(redis, window_ms=250, limit=5)
    bucket = ratelimit.TokenBucketLimiter(redis, "100/min", burst=20, on_error="allow")
    log = ratelimit.SlidingWindowLimiter(
        redis,
        parse_rate("1000/h"),
        storage="sorted-set",
        clock=ManualClock(1_000.0),
        timeout=0.5,
        readable_keys=True,
        key_secret=b"secret",
        ttl_slack_ms=0,
        clock_tolerance_ms=500,
        near_cache=True,
        auto_pipeline=False,
        wait_replicas=0,
    )
    on_redis_clock = ratelimit.FixedWindowLimiter(redis, 1, 10, clock="redis", on_error="deny")
    for rate in parse_rates("10/s; 1000/h"):
        async with ratelimit.SlidingWindowLimiter(redis, rate) as limiter:
            await limiter.check("user")

    d: Decision = await per_second.check("user", cost=2)
    many: list[Decision] = await per_minute.check_many(["a", "b", b"c"], costs=[1, 2, 3])
    same_cost = await short.check_many(["a", "b"], 1)
    stricter = bucket.with_options(limit=50, on_error="raise")
    longer = log.with_options(window_seconds="100/min", storage="compact")
    print(d, many, same_cost, stricter.burst, longer.storage, on_redis_clock.rate)
    print(per_second.key_for("user"), per_second.script_sha, per_second.window_seconds)


async def tiers() -> list[Decision]:
    """Several rates on one identity: the README's "Tiers"."""
    redis = ratelimit.connect(embedded=True)
    limiter = ratelimit.TieredLimiter(redis, ["3/s", "1000/h"])
    smooth = ratelimit.TieredLimiter(
        redis, "10/s; 1000/h", "api", algorithm="gcra", on_error="allow", timeout=0.5
    )
    exact = ratelimit.TieredLimiter(redis, [Rate(5, 1000), "50/min"], storage="sorted-set")
    decisions = [await limiter.check("api-key-123") for _ in range(4)]
    for d in decisions:
        if d.tier is not None:  # None only when the failure policy decided
            binding: Rate = limiter.rates[d.tier]
            print(d.allowed, str(binding), d.remaining, d.retry_after_ms)
    keys: list[str] = limiter.keys_for("api-key-123")
    per_second = limiter.tiers[0]
    print(keys, per_second.key_for("api-key-123"), await smooth.check("x", cost=2))
    print(await exact.peek("y"), await exact.reset("y"), limiter.rates, limiter.limit)
    return decisions


def sync_code() -> Decision:
    """The same for a blocking client."""
    client = ratelimit.connect_sync(embedded=True)
    with ratelimit.sync.SlidingWindowLimiter(client, "10/s", near_cache=100) as limiter:
        first = limiter.check("api-key-123")
    bucket = ratelimit.sync.TokenBucketLimiter(client, 1, 10, burst=3, on_error="deny")
    counter = ratelimit.sync.SlidingWindowCounterLimiter(client, window_ms=500, limit=3)
    fixed = ratelimit.sync.FixedWindowLimiter(client, Rate(5, 1000), prefix="sync")
    batch = fixed.check_many(["a", "b"], costs=1)
    copy = counter.with_options(timeout=2.0, readable_keys=True)
    print(bucket.check("x").retry_after_ms, batch, copy.check("y").reset_after)
    tiered = ratelimit.sync.TieredLimiter(client, "2/s; 100/h", algorithm="fw")
    print(tiered.check("api-key-123").tier, tiered.keys_for("api-key-123"))
    fields = (
        first.allowed,
        first.limit,
        first.remaining,
        first.retry_after,
        first.retry_after_ms,
        first.reset_after,
        first.reset_after_ms,
        first.degraded,
        first.decided_at_ms,
    )
    print(fields)
    return first


def make_app() -> FastAPI:
    """The FastAPI dependency, as ratelimit.http's docstring shows it."""
    app = FastAPI()
    install(app)
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), "10/s")
    geofence = rate_limit(limiter, scope="geofence", cost=1, legacy_headers=True)
    blocking = ratelimit.sync.FixedWindowLimiter(ratelimit.connect_sync(embedded=True), "5/s")
    tiles = rate_limit(blocking, scope="tiles", trusted_proxies=["127.0.0.1"])
    tiered = ratelimit.TieredLimiter(ratelimit.connect(embedded=True), "10/s; 1000/h")
    api = rate_limit(tiered, scope="api")  # RateLimit-Policy lists both tiers

    @app.get("/within", dependencies=[Depends(geofence)])
    async def within() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/tiles")
    async def read_tiles(info: RateLimitInfo = Depends(tiles)) -> dict[str, int]:  # noqa: B008
        return {"remaining": info.decision.remaining, "cost": info.cost}

    @app.get("/api/items", dependencies=[Depends(api)])
    async def items() -> list[str]:
        return []

    return app


def main() -> None:
    asyncio.run(quick_start())
    asyncio.run(every_form())
    asyncio.run(tiers())
    sync_code()
    make_app()


if __name__ == "__main__":
    main()
