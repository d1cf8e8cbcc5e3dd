"""A `TieredLimiter` on a route: every tier is a policy of its own in `RateLimit-Policy`,
and `RateLimit`, `Retry-After` and the problem name the tier that binds. In process
through httpx's ASGI transport, on fakeredis and on a real Redis, on an injected clock
so that every window is where the test says."""

# No `from __future__ import annotations`: the endpoints below name a local dependency in
# Annotated[...], which FastAPI must see evaluated.

import asyncio
import logging
from typing import Annotated, Any

import http_sfv as sfv
import httpx
import pytest
from fastapi import Depends, FastAPI, Request

import ratelimit
import ratelimit.sync
from ratelimit import algorithms
from ratelimit.clock import ManualClock
from ratelimit.devtools.process import free_port
from ratelimit.http import (
    DEGRADED_HEADER,
    QUOTA_EXCEEDED,
    RETRY_AFTER_MS_HEADER,
    ClientIdentity,
    LeaseInfo,
    RateLimitInfo,
    concurrency_limit,
    install,
    rate_limit,
)

KEY = {"x-api-key": "the-key"}


def http(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=("192.0.2.1", 50000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def one_route(limiter: Any, **options: Any) -> FastAPI:
    app = FastAPI()
    install(app)
    route = rate_limit(limiter, scope="geo", **options)

    @app.get("/thing")
    async def thing(info: Annotated[RateLimitInfo, Depends(route)]) -> dict[str, Any]:
        return {"tier": info.decision.tier, "remaining": info.decision.remaining}

    app.state.route = route
    return app


def item(value: str) -> dict[str, object]:
    name, *params = value.split(";")
    return {"name": name.strip('"'), **{k: int(v) for k, v in (p.split("=") for p in params)}}


async def test_every_tier_is_a_policy_and_the_binding_one_is_named(client, prefix):
    """3 per second and 5 per 10 s: the second's tier binds the first three requests
    and refuses the fourth; a second later it has refilled and the 10 s tier binds,
    down to its 429, whose Retry-After is the 9 s until that window's first unit."""
    clock = ManualClock(1000.0)
    limiter = ratelimit.TieredLimiter(client, "3/s; 5/10s", prefix, clock=clock)
    app = one_route(limiter, legacy_headers=True)
    assert app.state.route.policy_names == ("geo-1s", "geo-10s")
    async with http(app) as web:
        first = [await web.get("/thing", headers=KEY) for _ in range(4)]
        clock.set(1001.0)
        later = [await web.get("/thing", headers=KEY) for _ in range(3)]
        clock.set(1009.25)
        still = await web.get("/thing", headers=KEY)
        clock.set(1010.0)
        again = await web.get("/thing", headers=KEY)

    answers = [*first, *later]
    assert [r.status_code for r in answers] == [200, 200, 200, 429, 200, 200, 429]
    for r in answers:  # every answer lists every tier, shortest window first
        assert r.headers["ratelimit-policy"] == '"geo-1s";q=3;w=1, "geo-10s";q=5;w=10'
        policy = sfv.List()
        policy.parse(r.headers["ratelimit-policy"].encode())
        assert [(p.value, dict(p.params)) for p in policy] == [
            ("geo-1s", {"q": 3, "w": 1}),
            ("geo-10s", {"q": 5, "w": 10}),
        ]
    assert [item(r.headers["ratelimit"]) for r in answers] == [
        {"name": "geo-1s", "r": 2},  # the log's 200 carries no t
        {"name": "geo-1s", "r": 1},
        {"name": "geo-1s", "r": 0},
        {"name": "geo-1s", "r": 0, "t": 1},
        {"name": "geo-10s", "r": 1},  # the second has refilled: 2 left there, 1 here
        {"name": "geo-10s", "r": 0},
        {"name": "geo-10s", "r": 0, "t": 9},
    ]
    assert [r.json()["tier"] for r in answers if r.status_code == 200] == [0, 0, 0, 1, 1]
    # The legacy triple is the binding tier's too.
    assert [r.headers["ratelimit-limit"] for r in answers] == ["3"] * 4 + ["5"] * 3

    short, long = answers[3], answers[6]
    assert short.headers["retry-after"] == "1" and short.headers[RETRY_AFTER_MS_HEADER] == "1000"
    assert long.headers["retry-after"] == "9" and long.headers[RETRY_AFTER_MS_HEADER] == "9000"
    body = long.json()
    assert body["type"] == QUOTA_EXCEEDED
    assert body["violated-policies"] == ["geo-10s"] and body["retry-after"] == 9
    assert 'Policy "geo-10s" allows 5 units per 10 s' in body["detail"]
    assert short.json()["violated-policies"] == ["geo-1s"]

    # 750 ms before the 10 s window's first unit comes back: still refused, and told so.
    assert still.status_code == 429 and still.headers[RETRY_AFTER_MS_HEADER] == "750"
    assert item(still.headers["ratelimit"]) == {"name": "geo-10s", "r": 0, "t": 1}
    assert again.status_code == 200


async def test_a_rejected_request_spends_nothing(client, prefix):
    """2 per second and 4 per minute: ten requests in one second admit 2; had the eight
    refused ones counted in the minute's tier, nothing more would pass this minute. A
    second later two more pass, and then the minute's tier binds, 58 s away."""
    clock = ManualClock(1000.0)
    limiter = ratelimit.TieredLimiter(client, ["2/s", "4/min"], prefix, clock=clock)
    app = one_route(limiter)
    who = app.state.route.limiter_identity(ClientIdentity("key", "the-key"))
    async with http(app) as web:
        burst = [(await web.get("/thing", headers=KEY)).status_code for _ in range(10)]
        # Each tier's key holds the two admits only: the second's is full, and the
        # minute's would admit a third and keep one.
        peeks = [await tier.peek(who) for tier in limiter.tiers]
        assert [(d.allowed, d.remaining) for d in peeks] == [(False, 0), (True, 1)]
        clock.set(1001.0)
        after = [await web.get("/thing", headers=KEY) for _ in range(3)]
    assert burst == [200] * 2 + [429] * 8
    assert [r.status_code for r in after] == [200, 200, 429]
    # Both tiers left 0: a tie binds the tier listed first.
    assert item(after[1].headers["ratelimit"]) == {"name": "geo-1s", "r": 0}
    refused = after[2]
    assert item(refused.headers["ratelimit"]) == {"name": "geo-1min", "r": 0, "t": 59}
    assert refused.headers[RETRY_AFTER_MS_HEADER] == "59000"
    assert refused.json()["violated-policies"] == ["geo-1min"]


async def test_the_long_tier_binds_a_200_by_its_own_rule(client, prefix):
    """GCRA tiers: a 200's `t` is the binding tier's own (its interval and burst), not
    the first tier's, and it says when that tier's next unit is back."""
    clock = ManualClock(1000.0)
    limiter = ratelimit.TieredLimiter(client, "2/s; 4/10s", prefix, algorithm="gcra", clock=clock)
    route = rate_limit(limiter, scope="geo")
    gcra = algorithms.get("gcra")
    seen_long = 0
    for at_ms in (0, 0, 1000, 1500, 1600, 4000, 9000, 9200):
        clock.set_ms(1_000_000 + at_ms)
        decision = await limiter.check("who")
        if not decision.allowed:
            continue
        tier = limiter.tiers[decision.tier]
        t_ms = gcra.effective_window_ms(tier, decision)
        assert route.effective_window_ms(decision) == t_ms
        assert item(route.headers_for(decision)["RateLimit"]) == {
            "name": route.policy_names[decision.tier],
            "r": decision.remaining,
            "t": -(-t_ms // 1000),
        }
        if decision.tier == 1:
            # The first tier's interval and burst would say otherwise.
            assert gcra.effective_window_ms(limiter.tiers[0], decision) != t_ms
            seen_long += 1
    assert seen_long >= 1


async def test_a_cost_must_fit_the_smallest_tier(client, prefix):
    """The smallest limit need not be the shortest window's: 10 per second and 5 per
    minute refuse a cost of 6 with a 400 naming the minute's tier, before Redis."""
    limiter = ratelimit.TieredLimiter(client, "10/s; 5/min", prefix)

    def cost_of(request: Request) -> int:
        return int(request.query_params["cost"])

    app = one_route(limiter, cost=cost_of)
    async with http(app) as web:
        too_much = await web.get("/thing", params={"cost": 6}, headers=KEY)
        fits = await web.get("/thing", params={"cost": 5}, headers=KEY)
    assert too_much.status_code == 400
    assert 'more than the 5 allowed per 60 s by policy "geo-1min"' in too_much.json()["detail"]
    assert fits.status_code == 200
    assert item(fits.headers["ratelimit"]) == {"name": "geo-1min", "r": 0}
    with pytest.raises(ValueError):
        rate_limit(limiter, scope="geo", cost=6)  # a fixed cost is refused when built


async def test_a_leased_route_under_a_tiered_rate(client, prefix):
    """One lease per key and 3 per second / 4 per minute: the rate is solved first
    (`after=`), so a request the tiers refuse never takes a lease, and a request
    refused for want of a lease has spent its unit of every tier."""
    clock = ManualClock(1000.0)
    tiers = ratelimit.TieredLimiter(client, "3/s; 4/min", prefix, clock=clock)
    leases = ratelimit.ConcurrencyLimiter(client, 1, 30, prefix)
    rate = rate_limit(tiers, scope="slow")
    lease = concurrency_limit(leases, scope="slow", after=rate)
    app = FastAPI()
    install(app)
    go = asyncio.Event()
    inside = asyncio.Event()

    @app.get("/slow")
    async def slow(
        info: Annotated[RateLimitInfo, Depends(rate)], held: Annotated[LeaseInfo, Depends(lease)]
    ) -> dict[str, Any]:
        inside.set()
        await go.wait()
        return {"tier": info.decision.tier, "lease": held.lease}

    lease_key = lease.key_for("the-key")
    async with http(app) as web:
        first = asyncio.create_task(web.get("/slow", headers=KEY))
        await asyncio.wait_for(inside.wait(), 10)
        busy = await web.get("/slow", headers=KEY)  # the rate admits, no lease is free
        assert busy.status_code == 429
        assert busy.json()["title"] == "Too Many Requests In Flight"
        go.set()
        done = await first
        assert done.status_code == 200 and done.json()["lease"]
        assert done.headers["ratelimit-policy"] == '"slow-1s";q=3;w=1, "slow-1min";q=4;w=60'
        over = await web.get("/slow", headers=KEY)  # the second's third unit
        assert over.status_code == 200
        refused = await web.get("/slow", headers=KEY)
        assert refused.status_code == 429 and refused.json()["title"] == "Quota Exceeded"
        assert refused.json()["violated-policies"] == ["slow-1s"]
        assert await client.zcard(lease_key) == 0  # refused by the rate: no lease taken
        clock.set(1001.0)
        last = await web.get("/slow", headers=KEY)  # the minute's fourth unit
        assert last.status_code == 200
        assert item(last.headers["ratelimit"]) == {"name": "slow-1min", "r": 0}
        closed = await web.get("/slow", headers=KEY)
        assert closed.json()["violated-policies"] == ["slow-1min"]
    assert await client.zcard(lease_key) == 0


def test_a_sync_tiered_limiter_works_too(prefix):
    clock = ManualClock(1000.0)
    client = ratelimit.connect_sync(embedded=True)
    limiter = ratelimit.sync.TieredLimiter(client, "2/s; 3/h", prefix, algorithm="fw", clock=clock)

    async def run() -> list[httpx.Response]:
        async with http(one_route(limiter)) as web:
            answers = [await web.get("/thing", headers=KEY) for _ in range(3)]
            clock.set(1001.0)
            answers += [await web.get("/thing", headers=KEY) for _ in range(2)]
            return answers

    answers = asyncio.run(run())
    assert [r.status_code for r in answers] == [200, 200, 429, 200, 429]
    # A fixed window's 200 says when its window ends: the second's, then the hour's.
    assert item(answers[0].headers["ratelimit"]) == {"name": "geo-1s", "r": 1, "t": 1}
    hour = item(answers[3].headers["ratelimit"])
    assert hour["name"] == "geo-1h" and hour["r"] == 0 and hour["t"] > 1
    assert answers[4].headers["ratelimit-policy"] == '"geo-1s";q=2;w=1, "geo-1h";q=3;w=3600'
    assert answers[4].json()["violated-policies"] == ["geo-1h"]
    assert answers[4].headers["retry-after"] == str(hour["t"])


@pytest.mark.parametrize(("on_error", "status"), [("allow", 200), ("deny", 503)])
async def test_redis_down_lists_every_tier_and_names_none(on_error, status, caplog):
    down = ratelimit.connect(f"redis://127.0.0.1:{free_port()}/0")
    limiter = ratelimit.TieredLimiter(down, "10/s; 1000/h", on_error=on_error, timeout=0.5)
    async with http(one_route(limiter)) as web:
        with caplog.at_level(logging.WARNING, logger="ratelimit.http"):
            response = await web.get("/thing", headers=KEY)
    await down.aclose()
    assert response.status_code == status
    assert response.headers[DEGRADED_HEADER] in {"fail-open", "fail-closed"}
    assert response.headers["ratelimit-policy"] == '"geo-1s";q=10;w=1, "geo-1h";q=1000;w=3600'
    assert "ratelimit" not in response.headers  # nobody knows which tier would bind


def test_a_single_rate_limiter_keeps_its_one_policy():
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), "10/s")
    route = rate_limit(limiter, scope="geofence")
    assert route.policy == '"geofence";q=10;w=1' and route.policy_names == ("geofence",)
    one_tier = rate_limit(ratelimit.TieredLimiter(ratelimit.connect(embedded=True), "10/s"))
    assert one_tier.policy == '"default-1s";q=10;w=1'
