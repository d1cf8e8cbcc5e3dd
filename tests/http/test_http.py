"""The HTTP route: `ratelimit.http` (dependency, headers, problem bodies, identity,
failure policies) and `ratelimit.demo` (tiles, geofence look-ups), in process through
httpx's ASGI transport, and once as a real uvicorn process."""

from __future__ import annotations

import logging
import struct
import sys
import uuid
import warnings
import zlib

import fakeredis
import httpx
import pytest
import redis.asyncio
from fastapi import Depends, FastAPI, Query, Request
from starlette.requests import Request as StarletteRequest

import ratelimit
import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable, demo
from ratelimit.demo import create_app, tile_png
from ratelimit.devtools.demo_server import DemoServer
from ratelimit.devtools.process import free_port, pid_alive, port_is_free
from ratelimit.http import (
    DEGRADED_HEADER,
    PROBLEM_JSON,
    QUOTA_EXCEEDED,
    RateLimitInfo,
    install,
    rate_limit,
)

CENTER = {"lng": 13.405, "lat": 52.52}
LIMIT_HEADERS = ("ratelimit-policy", "ratelimit", "ratelimit-limit", "ratelimit-remaining")


def http(app: FastAPI, peer: str = "127.0.0.1") -> httpx.AsyncClient:
    """An in-process client whose requests come from `peer`."""
    transport = httpx.ASGITransport(app=app, client=(peer, 50000))
    return httpx.AsyncClient(transport=transport, base_url="http://demo")


def within(radius: float = 500, **extra: object) -> dict[str, object]:
    return {**CENTER, "radius": radius, **extra}


def key() -> dict[str, str]:
    return {"x-api-key": f"key-{uuid.uuid4().hex[:12]}"}


def broken_redis() -> redis.asyncio.Redis:
    """A client for a port nothing listens on: every command fails at once."""
    return ratelimit.connect(f"redis://127.0.0.1:{free_port()}/0")


class CountingRedis(fakeredis.FakeAsyncRedis):
    """The embedded Redis, recording the name of every command it is sent."""

    async def execute_command(self, *args, **options):
        self.__dict__.setdefault("commands", []).append(str(args[0]).upper())
        return await super().execute_command(*args, **options)

    @property
    def sent(self) -> list[str]:
        return self.__dict__.setdefault("commands", [])


@pytest.fixture
def app(clock) -> FastAPI:
    """The demo app on the embedded Redis and a virtual clock that stands still: a
    test's requests all fall in one of the routes' 1 s windows, however slowly a busy
    machine serves them."""
    return create_app(ratelimit.connect(embedded=True), clock=clock)


# --- the 12-request verification ----------------------------------------------------------


async def test_twelve_requests_give_ten_200_and_two_429(backend, client, prefix, clock):
    # On a virtual clock: twelve requests in one second of the host's clock is more
    # than a busy machine promises.
    app = create_app(client, prefix=prefix, clock=clock)
    headers = key()
    async with http(app) as c:
        responses = [await c.get("/within", params=within(), headers=headers) for _ in range(12)]
    assert [r.status_code for r in responses] == [200] * 10 + [429] * 2
    for r in responses[10:]:
        assert int(r.headers["retry-after"]) >= 1
    redis_key = app.state.limits["geofence"].key_for(headers["x-api-key"])
    assert await client.zcard(redis_key) == 10  # the admits, not the rejections
    # On the host's clock, the key holds at most the limit and expires within one
    # window (a virtual clock's keys live an hour longer: VIRTUAL_CLOCK_TTL_SLACK_MS).
    # A window of a minute: one of a second can be over before the key is read.
    live = create_app(client, prefix=prefix, window_s=60)
    async with http(live) as c:
        for _ in range(12):
            await c.get("/within", params=within(), headers=headers)
    redis_key = live.state.limits["geofence"].key_for(headers["x-api-key"])
    assert 0 < await client.zcard(redis_key) <= 10
    assert 0 < await client.pttl(redis_key) <= 60_000


async def test_allowed_responses_carry_the_rate_limit_fields(app):
    headers = key()
    async with http(app) as c:
        responses = [await c.get("/within", params=within(), headers=headers) for _ in range(10)]
    for i, r in enumerate(responses):
        assert r.status_code == 200
        assert r.headers["ratelimit-policy"] == '"geofence";q=10;w=1'
        assert r.headers["ratelimit"] == f'"geofence";r={9 - i}'
        assert r.headers["ratelimit-limit"] == "10"
        assert r.headers["ratelimit-remaining"] == str(9 - i)
        assert r.headers["ratelimit-reset"] == "1"
        assert "retry-after" not in r.headers
        assert DEGRADED_HEADER.lower() not in r.headers
        assert r.headers["content-type"] == "application/json"


async def test_a_429_is_a_problem_with_retry_after_and_the_fields(app):
    headers = key()
    async with http(app) as c:
        for _ in range(10):
            await c.get("/within", params=within(), headers=headers)
        r = await c.get("/within", params=within(), headers=headers)
    assert r.status_code == 429
    assert r.headers["content-type"] == PROBLEM_JSON
    assert r.headers["retry-after"] == "1"
    assert r.headers["ratelimit-policy"] == '"geofence";q=10;w=1'
    assert r.headers["ratelimit"] == '"geofence";r=0;t=1'
    assert 0 < int(r.headers["retry-after-ms"]) <= 1000  # the exact wait
    assert (r.headers["ratelimit-remaining"], r.headers["ratelimit-reset"]) == ("0", "1")
    body = r.json()
    assert body["type"] == QUOTA_EXCEEDED
    assert body["title"] == "Quota Exceeded"
    assert body["status"] == 429
    assert body["retry-after"] == 1 == int(r.headers["retry-after"])
    assert body["violated-policies"] == ["geofence"]
    assert "costs 1" in body["detail"] and "Retry after 1 s" in body["detail"]


async def test_legacy_fields_are_optional():
    app = create_app(ratelimit.connect(embedded=True), legacy_headers=False)
    async with http(app) as c:
        r = await c.get("/within", params=within(), headers=key())
    assert r.headers["ratelimit"] == '"geofence";r=9'
    assert not {"ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"} & set(r.headers)


def small_app(limiter, **options) -> FastAPI:
    """One route limited by `limiter`, for the dependency's own options."""
    app = FastAPI()
    install(app)
    limit = rate_limit(limiter, **options)

    @app.get("/thing")
    async def thing(info: RateLimitInfo = Depends(limit)) -> dict[str, object]:  # noqa: B008
        return {"cost": info.cost, "identity": str(info.identity), "degraded": info.degraded}

    return app


async def test_retry_after_is_whole_seconds_rounded_up(clock):
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 3, 1, clock=clock)
    app = small_app(limiter, scope="slow")
    async with http(app) as c:
        assert (await c.get("/thing")).status_code == 200
        clock.advance(0.5)  # 2.5 s until the first request leaves the window
        r = await c.get("/thing")
        assert (r.status_code, r.headers["retry-after"]) == (429, "3")
        assert r.headers["ratelimit"] == '"slow";r=0;t=3'
        assert r.headers["ratelimit-policy"] == '"slow";q=1;w=3'
        clock.advance(2.499)  # 1 ms to go: still a whole second
        r = await c.get("/thing")
        assert (r.status_code, r.headers["retry-after"]) == (429, "1")
        clock.advance(1)  # a client that waited as told gets in
        assert (await c.get("/thing")).status_code == 200


# --- cost -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("radius", "cost"),
    [(1, 1), (500, 1), (501, 2), (1000, 4), (1500, 9), (1600, 10), (50_000, 10)],
)
async def test_geofence_cost_grows_with_the_radius(app, radius, cost):
    async with http(app) as c:
        r = await c.get("/within", params=within(radius), headers=key())
    assert r.status_code == 200
    assert r.json()["cost"] == cost
    assert r.headers["ratelimit"] == f'"geofence";r={10 - cost}'


async def test_a_cost_weighted_sequence(app):
    headers = key()
    expected = [  # radius, status, remaining
        (1000, 200, 6),
        (1500, 429, 6),  # costs 9: rejected although 6 remain, and takes nothing
        (1000, 200, 2),
        (600, 200, 0),
        (100, 429, 0),
    ]
    async with http(app) as c:
        for radius, status, remaining in expected:
            r = await c.get("/within", params=within(radius), headers=headers)
            assert r.status_code == status, radius
            assert r.headers["ratelimit"].split(";")[1] == f"r={remaining}"
    body = r.json()
    assert body["retry-after"] == 1 and "costs 1 and 0 remain" in body["detail"]


async def test_cost_as_a_function_of_the_request():
    # A minute's window: the requests below must all fall in one, however slow the host.
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 60, 10)

    def by_size(request: Request) -> int:
        return int(request.query_params.get("size", "1"))

    app = small_app(limiter, scope="sized", cost=by_size)
    async with http(app) as c:
        r = await c.get("/thing", params={"size": 3})
        assert (r.status_code, r.json()["cost"]) == (200, 3)
        assert r.headers["ratelimit"] == '"sized";r=7'
        too_big = await c.get("/thing", params={"size": 11})  # could never pass
        assert too_big.status_code == 400
        assert too_big.headers["content-type"] == PROBLEM_JSON
        assert "never be admitted" in too_big.json()["detail"]
        bad = await c.get("/thing", params={"size": "many"})  # the function raises ValueError
        assert bad.status_code == 400
        assert (await c.get("/thing")).headers["ratelimit"] == '"sized";r=6'


async def test_cost_as_an_async_function_and_as_a_dependency():
    redis = ratelimit.connect(embedded=True)

    async def async_cost(request: Request) -> int:
        return 2

    def validated_cost(units: int = Query(ge=1, le=5)) -> int:  # noqa: B008
        return units

    # Minute windows: the requests of each app fall in one, however slow the host.
    by_function = small_app(ratelimit.SlidingWindowLimiter(redis, 60, 10), cost=async_cost)
    by_dependency = small_app(
        ratelimit.SlidingWindowLimiter(redis, 60, 10, "other"), cost=Depends(validated_cost)
    )
    async with http(by_function) as c:
        assert (await c.get("/thing")).json()["cost"] == 2
    async with http(by_dependency) as c:
        assert (await c.get("/thing", params={"units": 4})).json()["cost"] == 4
        # Its parameter is validated before the limiter is asked: 422, budget untouched.
        assert (await c.get("/thing", params={"units": 9})).status_code == 422
        assert (await c.get("/thing")).status_code == 422
        r = await c.get("/thing", params={"units": 1})
        assert r.headers["ratelimit"] == '"default";r=5'


async def test_a_cost_function_returning_nonsense_is_a_bug_not_a_decision():
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 1, 10)
    app = small_app(limiter, cost=lambda request: 0)
    async with http(app) as c:
        with pytest.raises(TypeError, match="cost function"):
            await c.get("/thing")


def test_bad_options_are_refused_when_the_app_is_built():
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 1, 10)
    with pytest.raises(ValueError, match="cost"):
        rate_limit(limiter, cost=11)
    with pytest.raises(ValueError, match="cost"):
        rate_limit(limiter, cost=0)
    for scope in ("", "has space", 'quo"te', "x" * 65, None):
        with pytest.raises(ValueError, match="scope"):
            rate_limit(limiter, scope=scope)
    with pytest.raises(ValueError, match="trusted_proxies"):
        rate_limit(limiter, trusted_proxies=["not-an-address"])
    with pytest.raises(ValueError, match="max_api_key_bytes"):
        rate_limit(limiter, max_api_key_bytes=0)
    with pytest.raises(ValueError, match="ipv6_prefix"):
        rate_limit(limiter, ipv6_prefix=129)
    with pytest.raises(ValueError, match="limiter"):
        rate_limit(object())


def test_the_policy_field_counts_whole_seconds():
    redis = ratelimit.connect(embedded=True)
    sub_second = ratelimit.SlidingWindowLimiter(redis, window_ms=250, limit=5)
    assert rate_limit(sub_second, scope="burst").policy == '"burst";q=5;w=1'
    minute = ratelimit.SlidingWindowLimiter(redis, 60, 600)
    assert rate_limit(minute, scope="per-minute").policy == '"per-minute";q=600;w=60'


# --- identity -----------------------------------------------------------------------------


async def test_each_api_key_has_its_own_budget(app):
    first, second = key(), key()
    async with http(app) as c:
        for _ in range(10):
            await c.get("/within", params=within(), headers=first)
        assert (await c.get("/within", params=within(), headers=first)).status_code == 429
        assert (await c.get("/within", params=within(), headers=second)).status_code == 200
        # The same client without its key is counted by address, apart from the key.
        assert (await c.get("/within", params=within())).status_code == 200


async def test_without_a_key_the_address_counts(app):
    async with http(app, peer="192.0.2.10") as c:
        statuses = [(await c.get("/within", params=within())).status_code for _ in range(11)]
        empty = await c.get("/within", params=within(), headers={"x-api-key": ""})
    assert statuses == [200] * 10 + [429]
    assert empty.status_code == 429  # an empty key is no key: still this address
    async with http(app, peer="192.0.2.11") as c:
        assert (await c.get("/within", params=within())).status_code == 200


async def test_routes_never_share_a_budget(app):
    headers = key()
    async with http(app) as c:
        for _ in range(11):
            await c.get("/within", params=within(), headers=headers)
        r = await c.get("/tiles/0/0/0.png", headers=headers)
    assert r.status_code == 200
    assert r.headers["ratelimit"] == '"tiles";r=99'
    limits = app.state.limits
    assert limits["geofence"].key_for("k") != limits["tiles"].key_for("k")
    assert limits["geofence"].key_for("k") != limits["geofence"].key_for(address="k")


async def test_oversized_api_keys_get_431_and_never_reach_redis():
    spy = CountingRedis()
    app = create_app(spy)
    async with http(app) as c:
        for size in (257, 1000, 10_000):
            r = await c.get("/within", params=within(), headers={"x-api-key": "k" * size})
            assert r.status_code == 431
            assert r.headers["content-type"] == PROBLEM_JSON
            body = r.json()
            assert body["status"] == 431 and f"{size} bytes" in body["detail"]
        assert spy.sent == []
        longest = await c.get("/within", params=within(), headers={"x-api-key": "k" * 256})
    assert longest.status_code == 200


async def test_two_api_keys_in_one_request_are_refused():
    spy = CountingRedis()
    app = create_app(spy)
    async with http(app) as c:
        r = await c.get(
            "/within", params=within(), headers=[("x-api-key", "a"), ("x-api-key", "b")]
        )
    assert r.status_code == 400 and r.headers["content-type"] == PROBLEM_JSON
    assert spy.sent == []


async def test_spoofed_forwarded_for_from_an_untrusted_peer_changes_nothing(clock):
    app = create_app(ratelimit.connect(embedded=True), trusted_proxies=["10.0.0.0/8"], clock=clock)
    async with http(app, peer="203.0.113.9") as c:
        statuses = [
            (
                await c.get(
                    "/within", params=within(), headers={"x-forwarded-for": f"198.51.100.{i}"}
                )
            ).status_code
            for i in range(12)
        ]
        plain = await c.get("/within", params=within())
    assert statuses == [200] * 10 + [429] * 2
    assert plain.status_code == 429  # all of them were counted against the peer


async def test_a_trusted_proxy_forwards_the_client_address(clock):
    app = create_app(ratelimit.connect(embedded=True), trusted_proxies=["10.0.0.0/8"], clock=clock)
    async with http(app, peer="10.0.0.2") as c:

        async def status(forwarded_for: str) -> int:
            headers = {"x-forwarded-for": forwarded_for}
            return (await c.get("/within", params=within(), headers=headers)).status_code

        assert [await status("198.51.100.7") for _ in range(10)] == [200] * 10
        assert await status("198.51.100.7") == 429
        # What the client wrote left of its proxies' entries is ignored...
        assert await status("1.2.3.4, 198.51.100.7") == 429
        # ...and a chain of trusted proxies is walked through to the client.
        assert await status("198.51.100.7, 10.0.0.9") == 429
        assert await status("198.51.100.8") == 200
        assert await status("198.51.100.8, 10.1.2.3") == 200


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        ("203.0.113.9", "198.51.100.1", "203.0.113.9"),  # not a proxy of ours
        ("10.0.0.2", "198.51.100.1", "198.51.100.1"),
        ("10.0.0.2", "spoof, 198.51.100.1", "198.51.100.1"),
        ("10.0.0.2", "198.51.100.1, 10.0.0.3", "198.51.100.1"),
        ("10.0.0.2", "10.0.0.4, 10.0.0.3", "10.0.0.4"),  # only proxies: the left-most
        ("10.0.0.2", "", "10.0.0.2"),  # nothing forwarded
        ("10.0.0.2", "garbage", "10.0.0.2"),  # not an address: the hop that wrote it
        ("10.0.0.2", "198.51.100.1, garbage", "10.0.0.2"),
        ("10.0.0.2", "198.51.100.1:4711", "198.51.100.1"),
        ("10.0.0.2", "[2001:db8::1]:443", "2001:db8::/64"),
        ("10.0.0.2", "::ffff:198.51.100.1", "198.51.100.1"),
        ("2001:db8::1", "", "2001:db8::/64"),  # IPv6 clients count per /64
        ("2001:db8::ffff", "198.51.100.1", "2001:db8::/64"),
        ("::ffff:192.0.2.1", "", "192.0.2.1"),
    ],
)
def test_client_address(peer, forwarded, expected):
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 1, 10)
    limit = rate_limit(limiter, trusted_proxies=["10.0.0.0/8"])
    headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded else []
    request = StarletteRequest({"type": "http", "headers": headers, "client": (peer, 1)})
    assert limit.client_address(request) == expected


def test_client_address_without_a_peer():
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 1, 10)
    limit = rate_limit(limiter, ipv6_prefix=128)
    assert limit.client_address(StarletteRequest({"type": "http", "headers": []})) == "unknown"
    request = StarletteRequest({"type": "http", "headers": [], "client": ("2001:db8::1", 1)})
    assert limit.client_address(request) == "2001:db8::1"


class AskedLimiter:
    """A limiter that admits everything and records what it was asked about."""

    limit = 10
    window_ms = 1000
    on_error = "deny"

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    def validate_cost(self, cost: int) -> int:
        return cost

    async def check(self, identity: str, cost: int = 1) -> Decision:
        self.asked.append((identity, cost))
        return Decision(True, self.limit, self.limit - cost, 0, 1000)


async def test_the_limiter_is_asked_about_the_route_identity():
    from ratelimit.identity import route_identity

    limiter = AskedLimiter()
    app = small_app(limiter, scope="maps")
    async with http(app, peer="2001:db8::7") as c:
        by_key = await c.get("/thing", headers={"x-api-key": "k-1"})
        by_address = await c.get("/thing")
    assert by_key.json()["identity"] == "key:k-1"
    assert by_address.json()["identity"] == "address:2001:db8::/64"
    assert limiter.asked == [
        (route_identity("maps", "key", "k-1"), 1),
        (route_identity("maps", "address", "2001:db8::/64"), 1),
    ]


async def test_the_admitted_request_leaves_its_info_in_the_request_state():
    app = FastAPI()
    limit = rate_limit(AskedLimiter(), scope="maps")

    @app.get("/thing", dependencies=[Depends(limit)])
    async def thing(request: Request) -> dict[str, object]:
        info = request.state.rate_limit
        return {"scope": info.scope, "remaining": info.decision.remaining}

    async with http(app) as c:
        r = await c.get("/thing", headers={"x-api-key": "k"})
    assert r.json() == {"scope": "maps", "remaining": 9}


async def test_two_limits_on_one_route_send_each_field_once_the_last_ones():
    app = FastAPI()
    first = rate_limit(AskedLimiter(), scope="first", legacy_headers=True)
    second = rate_limit(AskedLimiter(), scope="second")

    @app.get("/thing", dependencies=[Depends(first), Depends(second)])
    async def thing() -> dict[str, bool]:
        return {"ok": True}

    async with http(app) as c:
        r = await c.get("/thing", headers={"x-api-key": "k"})
    fields = [(k.lower(), v) for k, v in r.headers.multi_items()]
    assert fields.count(("ratelimit-policy", '"second";q=10;w=1')) == 1
    assert fields.count(("ratelimit", '"second";r=9')) == 1
    assert [k for k, _ in fields].count("ratelimit") == 1
    # The first limit's legacy fields, which the second does not send, stay.
    assert r.headers["ratelimit-remaining"] == "9"


# --- malformed requests --------------------------------------------------------------------


BAD_WITHIN = [
    {},
    {"lng": 13.4, "lat": 52.5},
    within(radius="abc"),
    within(radius=0),
    within(radius=-5),
    within(radius="nan"),
    within(radius="inf"),
    within(radius=50_001),
    {"lng": 181, "lat": 52.5, "radius": 500},
    {"lng": 13.4, "lat": -90.5, "radius": 500},
    {"lng": "east", "lat": 52.5, "radius": 500},
]
BAD_TILES = ["/tiles/x/0/0.png", "/tiles/23/0/0.png", "/tiles/2/4/0.png", "/tiles/2/0/-1.png"]


async def test_malformed_parameters_get_422_and_cost_nothing():
    spy = CountingRedis()
    app = create_app(spy)
    headers = key()
    async with http(app) as c:
        for params in BAD_WITHIN:
            r = await c.get("/within", params=params, headers=headers)
            assert r.status_code == 422, params
            detail = r.json()["detail"]
            assert len(detail) == len({str(e) for e in detail})  # each error once
        for path in BAD_TILES:
            assert (await c.get(path, headers=headers)).status_code == 422, path
        assert spy.sent == []  # never reached Redis
        statuses = [
            (await c.get("/within", params=within(), headers=headers)).status_code
            for _ in range(10)
        ]
    assert statuses == [200] * 10


# --- failure policies ---------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/within", "/tiles/1/1/1.png"])
@pytest.mark.parametrize("on_error", ["allow", "deny", "raise"])
async def test_a_broken_redis_never_gives_500(route, on_error, caplog):
    app = create_app(broken_redis(), within_on_error=on_error, tiles_on_error=on_error)
    scope = "geofence" if route == "/within" else "tiles"
    with caplog.at_level(logging.WARNING, logger="ratelimit.http"):
        async with http(app) as c:
            r = await c.get(route, params=within(), headers=key())
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "ratelimit.http"]
    assert r.headers["ratelimit-policy"].startswith(f'"{scope}";')
    assert "ratelimit" not in r.headers  # nobody knows the remaining quota
    if on_error == "allow":
        assert r.status_code == 200
        assert r.headers[DEGRADED_HEADER] == "fail-open"
        assert any("fail-open" in line and route.split("?")[0] in line for line in lines)
    else:
        assert r.status_code == 503
        assert r.headers[DEGRADED_HEADER] == "fail-closed"
        assert r.headers["retry-after"] == "1"
        assert r.headers["content-type"] == PROBLEM_JSON
        body = r.json()
        assert (body["status"], body["title"], body["retry-after"]) == (
            503,
            "Service Unavailable",
            1,
        )
        assert any("fail-closed" in line for line in lines)


async def test_the_demo_fails_closed_on_geofences_and_open_on_tiles():
    app = create_app(broken_redis())
    async with http(app) as c:
        assert (await c.get("/within", params=within())).status_code == 503
        assert (await c.get("/tiles/0/0/0.png")).status_code == 200


@pytest.mark.parametrize(("on_error", "status"), [("allow", 200), ("deny", 503), ("raise", 503)])
async def test_an_unexpected_error_in_the_check_follows_the_policy(on_error, status, caplog):
    limiter = ratelimit.SlidingWindowLimiter(
        ratelimit.connect(embedded=True), 1, 10, on_error=on_error
    )

    async def broken_check(identity, cost=1):
        raise RuntimeError("something nobody expected")

    limiter.check = broken_check
    app = small_app(limiter)
    with caplog.at_level(logging.WARNING, logger="ratelimit.http"):
        async with http(app) as c:
            r = await c.get("/thing")
    assert r.status_code == status
    assert "something nobody expected" in caplog.text
    if status == 200:
        assert r.json()["degraded"] is True


async def test_a_synchronous_limiter_works_too():
    # A minute's window: the twelve requests fall in one, however slow the host.
    limiter = ratelimit.sync.SlidingWindowLimiter(ratelimit.connect_sync(embedded=True), 60, 10)
    app = small_app(limiter)
    async with http(app) as c:
        statuses = [(await c.get("/thing")).status_code for _ in range(12)]
    assert statuses == [200] * 10 + [429] * 2


async def test_without_install_a_429_is_still_a_429_with_its_headers():
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 1, 1)
    app = FastAPI()  # no install(app): FastAPI's own HTTPException handler answers
    limit = rate_limit(limiter)

    @app.get("/plain", dependencies=[Depends(limit)])
    async def plain() -> dict[str, str]:
        return {"ok": "yes"}

    async with http(app) as c:
        assert (await c.get("/plain")).status_code == 200
        r = await c.get("/plain")
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1" and r.headers["ratelimit"] == '"default";r=0;t=1'
    assert r.headers["content-type"] == "application/json" and "detail" in r.json()


async def test_one_limiter_per_app_loads_its_script_once():
    spy = CountingRedis()
    app = create_app(spy)
    headers = key()
    async with http(app) as c:
        for _ in range(12):
            await c.get("/within", params=within(), headers=headers)
    # The rate limit's and the lease's first calls meet NOSCRIPT and load their script
    # once each; then every request is one EVALSHA for its rate, and each of the ten it
    # admits two more, to take its lease and give it back.
    assert spy.sent.count("SCRIPT") == 2  # SCRIPT LOAD
    assert spy.sent.count("EVALSHA") == (12 + 1) + (2 * 10 + 1)
    assert set(spy.sent) == {"EVALSHA", "SCRIPT"}


# --- the demo app ---------------------------------------------------------------------------


async def test_tiles_are_png_images(app):
    async with http(app) as c:
        r = await c.get("/tiles/3/2/5.png", headers=key())
        other = await c.get("/tiles/3/2/6.png")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert r.headers["ratelimit-policy"] == '"tiles";q=100;w=1'
    assert r.headers["ratelimit"] == '"tiles";r=99'
    png = r.content
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert png[12:16] == b"IHDR" and struct.unpack(">II", png[16:24]) == (256, 256)
    idat = png.index(b"IDAT")
    (length,) = struct.unpack(">I", png[idat - 4 : idat])
    assert len(zlib.decompress(png[idat + 4 : idat + 4 + length])) == 256 * (1 + 3 * 256)
    assert png.endswith(b"IEND\xaeB`\x82")
    assert png == tile_png(3, 2, 5) != other.content


async def test_within_finds_the_seeded_points_near_the_centre(app):
    async with http(app) as c:
        small = (await c.get("/within", params=within(300), headers=key())).json()
        large = (await c.get("/within", params=within(2000), headers=key())).json()
    assert 0 < small["count"] < large["count"] <= 2000
    distances = [p["distance_m"] for p in large["points"]]
    assert distances == sorted(distances) and max(distances) <= 2000
    assert len(large["points"]) == min(20, large["count"])
    assert small == (await _fresh_within(300))  # seeded: the same points every time


async def _fresh_within(radius: float) -> dict[str, object]:
    async with http(create_app(ratelimit.connect(embedded=True))) as c:
        return (await c.get("/within", params=within(radius))).json()


async def test_docs_openapi_index_and_health(app):
    async with http(app) as c:
        docs = await c.get("/docs")
        spec = (await c.get("/openapi.json")).json()
        index = (await c.get("/")).json()
        health = await c.get("/healthz")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    assert {"/within", "/tiles/{z}/{x}/{y}.png"} <= set(spec["paths"])
    names = {p["name"] for p in spec["paths"]["/within"]["get"]["parameters"]}
    assert names == {"lng", "lat", "radius"}  # the limiter adds no parameters of its own
    assert index["routes"]["/within?lng=&lat=&radius="]["policy"] == '"geofence";q=10;w=1'
    assert health.status_code == 200 and not set(LIMIT_HEADERS) & set(health.headers)


async def test_create_app_honours_redis_url(monkeypatch, caplog):
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(ratelimit.backends, "_fallback_announced", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ratelimit.EmbeddedRedisWarning)  # it logs instead
        with caplog.at_level(logging.INFO, logger="ratelimit.demo"):
            assert ratelimit.is_embedded(create_app().state.redis)
    assert "rate limits in the embedded fakeredis" in caplog.text
    caplog.clear()
    monkeypatch.setenv("REDIS_URL", f"redis://user:secret@127.0.0.1:{free_port()}/0")
    with caplog.at_level(logging.INFO, logger="ratelimit.demo"):
        app = create_app()
    assert "rate limits in the Redis at redis://user:***@127.0.0.1:" in caplog.text
    assert not ratelimit.is_embedded(app.state.redis)
    async with app.router.lifespan_context(app), http(app) as c:
        # Fail-closed on a Redis that is not there.
        assert (await c.get("/within", params=within())).status_code == 503


async def test_the_app_closes_only_the_client_it_made(monkeypatch, clock):
    monkeypatch.delenv("REDIS_URL", raising=False)
    closed = []

    def recorder(name):
        async def aclose() -> None:
            closed.append(name)

        return aclose

    given = ratelimit.connect(embedded=True)
    monkeypatch.setattr(given, "aclose", recorder("given"))
    app = create_app(given)
    async with app.router.lifespan_context(app), http(app) as c:
        assert (await c.get("/within", params=within())).status_code == 200
    assert closed == []
    own = create_app(clock=clock)  # twelve requests in one window, however slow the machine
    monkeypatch.setattr(own.state.redis, "aclose", recorder("own"))
    async with own.router.lifespan_context(own), http(own) as c:
        statuses = [(await c.get("/within", params=within())).status_code for _ in range(12)]
    assert statuses == [200] * 10 + [429] * 2
    assert closed == ["own"]


def test_python_dash_m_serves_without_uvicorns_proxy_headers(monkeypatch):
    seen = {}

    def fake_run(application, **options):
        seen.update(options, app=application)

    monkeypatch.setattr("uvicorn.run", fake_run)
    monkeypatch.delenv("REDIS_URL", raising=False)
    demo.main(["--port", "8123", "--trusted-proxy", "10.0.0.1"])
    assert seen["proxy_headers"] is False
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 8123)
    assert seen["app"].state.limits["geofence"].trusted_proxies[0].compressed == "10.0.0.1/32"


# --- a real server ----------------------------------------------------------------------------


REAL_WINDOW_S = 60  # the real server's window: a second is less than 12 requests may take


def test_a_real_uvicorn_process_answers_ten_200_and_two_429(backend, request):
    url = None if backend == "embedded" else request.getfixturevalue("real_redis_url")
    # The app as `uvicorn ratelimit.demo:app` serves it...
    assert DemoServer(redis_url=url).command(8123)[:4] == [
        sys.executable,
        "-m",
        "uvicorn",
        "ratelimit.demo:app",
    ]
    # ...made with a longer window (the same `create_app`, through uvicorn's --factory):
    # twelve requests in one second of the host's clock is more than a busy machine
    # promises, and an admit that left the window would make room for an eleventh.
    server = DemoServer(redis_url=url, app_options={"window_s": REAL_WINDOW_S})
    try:
        server.start()
        assert server.running
        if backend == "embedded":
            # A fresh embedded Redis in the server: count by address, with an
            # X-Forwarded-For that changes every time. uvicorn runs with
            # --no-proxy-headers and the app trusts no proxy: all 12 are one client.
            headers = [{"x-forwarded-for": f"198.51.100.{i}"} for i in range(12)]
        else:
            # A shared Redis: a key of this test's own.
            headers = [key()] * 12
        with httpx.Client(base_url=server.url, timeout=5) as c:
            responses = [c.get("/within", params=within(), headers=h) for h in headers]
            docs = c.get("/docs")
        assert [r.status_code for r in responses] == [200] * 10 + [429] * 2
        for i, r in enumerate(responses[:10]):
            assert r.headers["ratelimit-policy"] == f'"geofence";q=10;w={REAL_WINDOW_S}'
            assert r.headers["ratelimit"] == f'"geofence";r={9 - i}'
        for r in responses[10:]:
            retry = int(r.headers["retry-after"])  # when the first admit leaves the window
            assert 1 <= retry <= REAL_WINDOW_S
            assert -(-int(r.headers["retry-after-ms"]) // 1000) == retry
            assert r.headers["ratelimit"] == f'"geofence";r=0;t={retry}'
            assert r.headers["content-type"] == PROBLEM_JSON
            assert r.json()["retry-after"] == retry
        assert docs.status_code == 200
    finally:
        pid, port = server.pid, server.port
        server.close()
    assert pid is not None and not pid_alive(pid)
    assert not server.running and port_is_free(port)


def test_status_for_every_kind_of_outcome():
    """The one mapping from a check's outcome to a status, which the dependency uses."""
    from ratelimit.http import decision_for, status_for

    admitted, rejected = Decision(True, 10, 9, 0, 1000), Decision(False, 10, 0, 1500, 2000)
    limiter = ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 10, on_error="allow")
    assert (status_for(admitted), status_for(rejected)) == (200, 429)
    assert decision_for(rejected, limiter) is rejected
    down = decision_for(RateLimiterUnavailable("no Redis"), limiter)
    assert (status_for(down), down.retry_after, down.degraded) == (503, 1, True)
    bug = decision_for(RuntimeError("a bug in a custom limiter"), limiter)
    assert status_for(bug) == 200 and bug.degraded  # on_error="allow" admits
    closed = decision_for(RuntimeError("a bug"), limiter.with_options(on_error="deny"))
    assert status_for(closed) == 503 and closed.retry_after == 1
