"""The rate-limit header fields as draft-ietf-httpapi-ratelimit-headers-11 defines them:
`t` is the time until `r` grows, `Retry-After-Ms` is the exact wait, and what real
clients (a Structured Field parser, urllib3's `Retry`) make of them."""

from __future__ import annotations

import random

import http_sfv as sfv
import httpx
import pytest
import urllib3
from fastapi import Depends, FastAPI
from urllib3.util import retry as retry_module

import ratelimit
import ratelimit.sync
from ratelimit import algorithms
from ratelimit.clock import ManualClock
from ratelimit.demo import create_app
from ratelimit.http import DRAFT, RETRY_AFTER_MS_HEADER, install, rate_limit

CENTER = {"lng": 13.405, "lat": 52.52, "radius": 500}


def http(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=("192.0.2.1", 50000))
    return httpx.AsyncClient(transport=transport, base_url="http://demo")


def one_route(limiter, **options) -> FastAPI:
    app = FastAPI()
    install(app)

    @app.get("/thing", dependencies=[Depends(rate_limit(limiter, **options))])
    async def thing() -> dict[str, str]:
        return {"ok": "yes"}

    return app


def item(value: str) -> dict[str, object]:
    name, *params = value.split(";")
    return {"name": name.strip('"'), **{k: int(v) for k, v in (p.split("=") for p in params)}}


def test_the_module_names_the_revision_it_follows():
    import ratelimit.http as module

    assert DRAFT == "draft-ietf-httpapi-ratelimit-headers-11"
    assert DRAFT in module.__doc__


# --- t: the time until r grows ----------------------------------------------------------------


def schedule(seed: int, n: int, limit: int) -> list[tuple[int, int]]:
    """`n` (ms after the previous request, cost) pairs, bursts and pauses mixed."""
    rng = random.Random(seed)
    return [(rng.choice([0, 1, 7, 40, 130, 333, 999]), rng.randint(1, limit)) for _ in range(n)]


@pytest.mark.parametrize(
    ("algorithm", "window_s", "limit"),
    [("fw", 1, 5), ("fw", 3, 4), ("gcra", 1, 3), ("gcra", 2, 7), ("gcra", 1, 10)],
)
def test_t_on_a_200_is_when_r_grows_and_not_sooner(algorithm, window_s, limit):
    """After an admission saying r units and t ms: a request of r + 1 units is still
    refused just before t, and admitted at t. A fixed window's t is exact; GCRA's may be
    1 ms late, since its answer rounds the time until its bucket is full up to a ms."""
    cls = algorithms.get(algorithm).limiter_class("sync")
    redis, clock = ratelimit.connect_sync(embedded=True), ManualClock()
    limiter = cls(redis, window_s, limit, clock=clock)
    route = rate_limit(limiter)
    steps = schedule(seed=window_s * 100 + limit, n=25, limit=limit)
    checked = 0
    for i in range(len(steps)):
        who, now = f"client-{i}", 0  # replay the first i + 1 requests on a fresh client
        for gap, cost in steps[: i + 1]:
            now += gap
            clock.set_ms(now)
            decision = limiter.check(who, cost)
        window_ms = route.effective_window_ms(decision)
        if not decision.allowed or decision.remaining + 1 > limit:
            continue
        assert window_ms is not None and window_ms > 0
        t = item(route.headers_for(decision)["RateLimit"])["t"]
        assert t == -(-window_ms // 1000)
        more = decision.remaining + 1
        clock.set_ms(now + window_ms - (1 if algorithm == "fw" else 2))
        assert not limiter.check(who, more).allowed, (i, decision, window_ms)
        clock.set_ms(now + window_ms)
        assert limiter.check(who, more).allowed, (i, decision, window_ms)
        checked += 1
    assert checked >= 5


async def test_the_sliding_log_says_no_t_on_a_200_and_retry_after_on_a_429():
    """10 per 60 s, 5 requests at 0 s and 5 at 50 s: the tenth answer has r=0, and the
    first unit comes back at 60 s, not after the whole window (the old `t=60`)."""
    clock = ManualClock()
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 60, 10, clock=clock)
    async with http(one_route(limiter, scope="minute")) as c:
        answers = []
        for at_s in [0] * 5 + [50] * 5:
            clock.set(at_s)
            answers.append(await c.get("/thing"))
        clock.set(50.5)
        refused = await c.get("/thing")
        clock.set(60)
        later = [(await c.get("/thing")).status_code for _ in range(6)]
    assert [r.status_code for r in answers] == [200] * 10
    assert answers[-1].headers["ratelimit"] == '"minute";r=0'  # no t it cannot vouch for
    assert item(refused.headers["ratelimit"]) == {"name": "minute", "r": 0, "t": 10}
    assert refused.headers["retry-after"] == "10"  # 9.5 s, rounded up
    assert refused.headers[RETRY_AFTER_MS_HEADER] == "9500"
    assert later == [200] * 5 + [429]  # the five of 0 s have left the window


@pytest.mark.parametrize("algorithm", ["log", "fw", "swc", "gcra"])
async def test_a_429_of_cost_1_says_when_r_grows_to_the_millisecond(algorithm):
    """Retry-After-Ms is the exact wait: 1 ms less is refused, that long is admitted;
    Retry-After and t are the same wait in whole seconds, rounded up."""
    clock = ManualClock()
    cls = algorithms.get(algorithm).limiter_class("async")
    limiter = cls(ratelimit.connect(embedded=True), 1, 10, clock=clock)
    async with http(one_route(limiter)) as c:
        now, refused = 0, None
        while refused is None or refused.status_code == 200:  # 7 ms apart until refused
            now += 7
            clock.set_ms(now)
            refused = await c.get("/thing")
        wait_ms = int(refused.headers[RETRY_AFTER_MS_HEADER])
        assert int(refused.headers["retry-after"]) == -(-wait_ms // 1000)
        assert item(refused.headers["ratelimit"])["t"] == int(refused.headers["retry-after"])
        clock.set_ms(now + wait_ms - 1)
        assert (await c.get("/thing")).status_code == 429
        clock.set_ms(now + wait_ms)
        assert (await c.get("/thing")).status_code == 200


async def test_retry_after_ms_can_be_left_out(clock):
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 1, 1, clock=clock)
    async with http(one_route(limiter, retry_after_ms_header=False)) as c:
        await c.get("/thing")
        r = await c.get("/thing")
    assert r.status_code == 429 and "retry-after" in r.headers
    assert RETRY_AFTER_MS_HEADER.lower() not in r.headers


async def test_problem_members_follow_the_drafts_spelling(clock):
    app = create_app(ratelimit.connect(embedded=True), clock=clock)  # 11 requests, one window
    async with http(app) as c:
        for _ in range(11):
            r = await c.get("/within", params=CENTER, headers={"x-api-key": "spelling"})
    body = r.json()
    assert r.status_code == 429
    extensions = set(body) - {"type", "title", "status", "detail"}
    assert extensions == {"retry-after", "violated-policies"}
    assert body["retry-after"] == int(r.headers["retry-after"])


# --- what real clients make of them -------------------------------------------------------------


async def test_a_structured_field_parser_reads_every_field(clock):
    app = create_app(ratelimit.connect(embedded=True), clock=clock)  # 11 requests, one window
    async with http(app) as c:
        headers = {"x-api-key": "sf-parser"}
        answers = [await c.get("/within", params=CENTER, headers=headers) for _ in range(11)]
        answers.append(await c.get("/tiles/1/0/0.png", headers=headers))
    assert [r.status_code for r in answers] == [200] * 10 + [429, 200]
    for r in answers:
        policy, state = sfv.List(), sfv.List()
        policy.parse(r.headers["ratelimit-policy"].encode())
        state.parse(r.headers["ratelimit"].encode())
        assert len(policy) == len(state) == 1
        assert isinstance(policy[0].value, str) and policy[0].value == state[0].value
        assert set(policy[0].params) == {"q", "w"} and policy[0].params["w"] == 1
        assert all(type(v) is int and v >= 0 for v in state[0].params.values())
        assert item(r.headers["ratelimit"]) == {"name": state[0].value, **state[0].params}
    assert state_of(answers[9]) == {"r": 0}  # the log's 200: no t
    assert state_of(answers[10]) == {"r": 0, "t": 1}


def state_of(response: httpx.Response) -> dict[str, object]:
    parsed = sfv.List()
    parsed.parse(response.headers["ratelimit"].encode())
    return dict(parsed[0].params)


async def test_urllib3_retry_waits_as_long_as_retry_after_says_and_then_gets_in(monkeypatch):
    clock = ManualClock()
    app = create_app(ratelimit.connect(embedded=True), clock=clock)
    slept: list[float] = []
    monkeypatch.setattr(retry_module.time, "sleep", slept.append)
    policy = retry_module.Retry(total=3, status_forcelist=[429], backoff_factor=0)
    async with http(app) as c:
        headers = {"x-api-key": "urllib3"}
        for _ in range(10):
            await c.get("/within", params=CENTER, headers=headers)
        clock.advance(0.25)
        refused = await c.get("/within", params=CENTER, headers=headers)
        as_urllib3 = urllib3.response.HTTPResponse(
            body=b"", headers=dict(refused.headers), status=refused.status_code
        )
        assert policy.is_retry("GET", refused.status_code, has_retry_after=True)
        policy.sleep(as_urllib3)  # what its retrying request does before trying again
        clock.advance(sum(slept))
        again = await c.get("/within", params=CENTER, headers=headers)
    assert slept == [1.0]  # 0.75 s, rounded up
    assert again.status_code == 200
