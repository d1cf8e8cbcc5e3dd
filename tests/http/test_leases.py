"""`ratelimit.http.concurrency_limit`: a lease held for the whole request, in process
through httpx's ASGI transport. Endpoints block on an `asyncio.Event`, so requests stay
in flight exactly as long as a test says, whatever the machine's speed."""

# No `from __future__ import annotations`: the endpoints built in `build` name a local
# dependency in Annotated[...], which FastAPI must see evaluated.

import asyncio
import logging
from typing import Annotated, Any

import fakeredis
import httpx
import pytest
from fastapi import Depends, FastAPI
from fastapi.responses import StreamingResponse

import ratelimit
import ratelimit.sync
from ratelimit.devtools.process import free_port
from ratelimit.http import (
    DEGRADED_HEADER,
    PROBLEM_JSON,
    QUOTA_EXCEEDED,
    RETRY_AFTER_MS_HEADER,
    LeaseInfo,
    concurrency_limit,
    install,
)


class Gate:
    """Requests that enter the endpoint and wait there until let go."""

    def __init__(self) -> None:
        self.inside = 0
        self.entered = asyncio.Condition()
        self.go = asyncio.Event()

    async def enter(self) -> None:
        async with self.entered:
            self.inside += 1
            self.entered.notify_all()
        await self.go.wait()

    async def until_inside(self, n: int) -> None:
        async with self.entered:
            await asyncio.wait_for(self.entered.wait_for(lambda: self.inside >= n), 10)


def build(limiter: Any) -> tuple[FastAPI, dict[str, Gate]]:
    app = FastAPI()
    install(app)
    lease = concurrency_limit(limiter, scope="slow")
    gates: dict[str, Gate] = {}

    @app.get("/slow/{name}")
    async def slow(name: str, info: Annotated[LeaseInfo, Depends(lease)]) -> dict[str, Any]:
        await gates.setdefault(name, Gate()).enter()
        return {"lease": info.lease}

    @app.get("/boom")
    async def boom(info: Annotated[LeaseInfo, Depends(lease)]) -> None:
        raise RuntimeError("the endpoint failed")

    @app.get("/stream/{name}")
    async def stream(name: str, info: Annotated[LeaseInfo, Depends(lease)]) -> Any:
        gate = gates.setdefault(name, Gate())

        async def body() -> Any:
            yield b"first part, "
            await gate.enter()  # the response has started; the lease is still held
            yield b"last part"

        return StreamingResponse(body())

    app.state.lease = lease
    return app, gates


def http(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


KEY = {"x-api-key": "the-key"}


@pytest.fixture
def limiter(client, prefix) -> Any:
    return ratelimit.ConcurrencyLimiter(client, 2, 30, prefix)


async def test_two_in_flight_the_third_is_refused_then_admitted_after_one_ends(limiter, client):
    app, gates = build(limiter)
    async with http(app) as web:
        first = asyncio.create_task(web.get("/slow/a", headers=KEY))
        second = asyncio.create_task(web.get("/slow/b", headers=KEY))
        await gates_inside(gates, "a", "b")
        key = app.state.lease.key_for("the-key")
        assert await client.zcard(key) == 2

        third = await web.get("/slow/c", headers=KEY)
        assert third.status_code == 429
        assert third.headers["content-type"] == PROBLEM_JSON
        body = third.json()
        assert body["type"] == QUOTA_EXCEEDED and body["violated-policies"] == ["slow"]
        retry_ms = int(third.headers[RETRY_AFTER_MS_HEADER])
        assert 0 < retry_ms <= 30_000  # until the earliest lease expires, at the latest
        assert int(third.headers["retry-after"]) == body["retry-after"] == -(-retry_ms // 1000)
        assert "c" not in gates  # the endpoint never ran

        # Another client has its own leases.
        other = asyncio.create_task(web.get("/slow/o", headers={"x-api-key": "other"}))
        await gates_inside(gates, "o")

        gates["a"].go.set()
        done = await first
        assert done.status_code == 200 and done.json()["lease"]
        assert await client.zcard(key) == 1  # released once the response went out

        fourth = asyncio.create_task(web.get("/slow/d", headers=KEY))
        await gates_inside(gates, "d")
        assert (await web.get("/slow/e", headers=KEY)).status_code == 429
        for name in ("b", "d", "o"):
            gates[name].go.set()
        assert [r.status_code for r in await asyncio.gather(second, fourth, other)] == [200] * 3
        assert await client.zcard(key) == 0


async def gates_inside(gates: dict[str, Gate], *names: str) -> None:
    for name in names:
        for _ in range(1000):  # the task has not reached the endpoint yet
            if name in gates:
                break
            await asyncio.sleep(0.001)
        await gates[name].until_inside(1)


async def test_a_request_that_raises_still_releases(limiter, client):
    app, gates = build(limiter)
    key = app.state.lease.key_for("the-key")
    async with http(app) as web:
        for _ in range(3):  # more than the limit: each one gave its lease back
            failed = await web.get("/boom", headers=KEY)
            assert failed.status_code == 500
        assert await client.zcard(key) == 0
        ok = asyncio.create_task(web.get("/slow/a", headers=KEY))
        await gates_inside(gates, "a")
        assert await client.zcard(key) == 1
        gates["a"].go.set()
        assert (await ok).status_code == 200


async def test_the_lease_is_held_until_the_response_has_been_sent(client, prefix):
    """A streaming response: its head is out, its body not yet; the request is still in
    flight, so with a limit of 1 the next one is refused until the body is done."""
    app, gates = build(ratelimit.ConcurrencyLimiter(client, 1, 30, prefix))
    async with http(app) as web:
        streaming = asyncio.create_task(web.get("/stream/s", headers=KEY))
        await gates_inside(gates, "s")
        assert (await web.get("/slow/x", headers=KEY)).status_code == 429
        gates["s"].go.set()
        done = await streaming
        assert done.status_code == 200 and done.content == b"first part, last part"
        assert await client.zcard(app.state.lease.key_for("the-key")) == 0


async def test_a_client_that_goes_away_releases_its_lease(client, prefix):
    app, gates = build(ratelimit.ConcurrencyLimiter(client, 1, 30, prefix))
    async with http(app) as web:
        request = asyncio.create_task(web.get("/slow/gone", headers=KEY))
        await gates_inside(gates, "gone")
        request.cancel()  # the request's task is cancelled inside the endpoint
        with pytest.raises(asyncio.CancelledError):
            await request
        key = app.state.lease.key_for("the-key")
        for _ in range(1000):  # the release runs as the cancellation unwinds
            if await client.zcard(key) == 0:
                break
            await asyncio.sleep(0.001)
        assert await client.zcard(key) == 0


def test_a_sync_limiter_works_too(prefix):
    client = fakeredis.FakeRedis()
    app, gates = build(ratelimit.sync.ConcurrencyLimiter(client, 1, 30, prefix))

    async def scenario() -> None:
        async with http(app) as web:
            held = asyncio.create_task(web.get("/slow/a", headers=KEY))
            await gates_inside(gates, "a")
            assert (await web.get("/slow/b", headers=KEY)).status_code == 429
            gates["a"].go.set()
            assert (await held).status_code == 200

    asyncio.run(scenario())
    assert client.zcard(app.state.lease.key_for("the-key")) == 0


@pytest.mark.parametrize(
    ("on_error", "status", "marked"),
    [("allow", 200, "fail-open"), ("deny", 503, "fail-closed"), ("raise", 503, "fail-closed")],
)
async def test_redis_down_maps_the_failure_policy(on_error, status, marked, caplog):
    down = ratelimit.connect(f"redis://127.0.0.1:{free_port()}/0")
    limiter = ratelimit.ConcurrencyLimiter(down, 2, 30, on_error=on_error, timeout=0.5)
    app, gates = build(limiter)
    async with http(app) as web:
        with caplog.at_level(logging.WARNING, logger="ratelimit.http"):
            request = asyncio.create_task(web.get("/slow/a", headers=KEY))
            if status == 200:
                await gates_inside(gates, "a")
                gates["a"].go.set()
            response = await request
    await down.aclose()
    assert response.status_code == status
    assert response.headers[DEGRADED_HEADER] == marked
    if status == 503:
        assert response.headers["retry-after"] == "1"
        assert response.headers["content-type"] == PROBLEM_JSON
    assert any("fail-" in r.getMessage() for r in caplog.records)


async def test_bad_identities_and_limiters_are_refused(limiter):
    app, _ = build(limiter)
    async with http(app) as web:
        too_long = await web.get("/slow/a", headers={"x-api-key": "k" * 1000})
        assert too_long.status_code == 431
    with pytest.raises(ValueError, match="scope must be"):
        concurrency_limit(limiter, scope="has spaces")
    with pytest.raises(ValueError, match="acquire"):
        concurrency_limit(ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 1, 10))


async def test_the_demo_geofence_holds_four_leases_per_key_beside_its_rate(client, prefix):
    """Four look-ups of one key in flight (their leases taken here by hand, as four slow
    requests would hold them): the fifth is refused with the lease's problem, and once
    one ends the route answers again; a request the rate limit refuses takes none."""
    from ratelimit.demo import create_app

    app = create_app(client, prefix=prefix, clock=ratelimit.clock.ManualClock(1000.0))
    in_flight = app.state.in_flight
    assert in_flight.limiter.limit == 4
    who = "geofence:key:the-key"  # the route's identity for the key (ratelimit.identity)
    assert in_flight.key_for("the-key") == in_flight.limiter.key_for(who)
    held = [await in_flight.limiter.acquire(who) for _ in range(4)]
    assert all(d.allowed for d in held)
    params = {"lng": 13.405, "lat": 52.52, "radius": 500}
    async with http(app) as web:
        refused = await web.get("/within", params=params, headers=KEY)
        assert (
            refused.status_code == 429 and refused.json()["title"] == "Too Many Requests In Flight"
        )
        await in_flight.limiter.release(who, held[0].lease)
        statuses = [
            (await web.get("/within", params=params, headers=KEY)).status_code for _ in range(12)
        ]
    # The rate is checked first (`after=`): the refused request spent one of its 10
    # units, so 9 more are admitted; the rate refuses the rest, which take no lease.
    assert statuses == [200] * 9 + [429] * 3
    assert await client.zcard(in_flight.key_for("the-key")) == 3  # the 3 still held
