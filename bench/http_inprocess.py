"""What the HTTP layer adds per request, in process: our dependency against an unlimited
twin route, against a bare `check`, and against slowapi and fastapi-limiter.

One FastAPI app, one Redis (a private redis-server when one can be started, else the
suite's server), requests sent through httpx's ASGI transport (no sockets, no
workers), so what differs between routes is only what their limiter does:

- `unlimited route`: `GET /unlimited`, a small JSON body, no limiter;
- `limited route (ours)`: the same endpoint behind `Depends(rate_limit(limiter))`, a
  `SlidingWindowLimiter` (the default storage) whose limit is never reached;
- `bare check (ours)`: `await limiter.check(identity)` on the same limiter and the
  same identities the route asks about, no HTTP at all, one after another;
- `unlimited route, then a check`: a request to the unlimited route, then a bare
  check: the check made as it is in a route, its caches cooled by the HTTP stack's
  code between two checks (its time less the unlimited route's, shown beside the
  tight loop's);
- `slowapi route`: the endpoint under slowapi's `@limiter.limit` (its default fixed
  window, `limits`' Redis storage on the same server);
- `fastapi-limiter route`: the endpoint behind fastapi-limiter's `RateLimiter`
  dependency (a pyrate-limiter `RedisBucket` on the same server).

Every case tells clients apart by `x-api-key`, cycling over `API_KEYS` keys, with a
limit no key reaches: every request must be answered 200, and a judged row says so.

In interleaved rounds (`rounds.py`, shuffled order), each case sends `n` requests one
after another. Per round: microseconds per request per case; what a limiter adds is its
route's time less the unlimited route's in the same round. The figures are medians over
rounds of the same-round quantities: ours added, ours added / a bare check, ours added /
slowapi's added (and fastapi-limiter's, shown).
"""

# No `from __future__ import annotations`: the app's endpoints are defined inside a
# function, and FastAPI must see their annotations evaluated.
import asyncio
import os
import statistics
from typing import Any

from . import rounds
from .verdicts import answered_row, quartiles, ratios_row, skip

UNLIMITED = "unlimited route"
LIMITED = "limited route (ours)"
CHECK = "bare check (ours)"
BETWEEN = "unlimited route, then a check"
SLOWAPI = "slowapi route"
FASTAPI_LIMITER = "fastapi-limiter route"
PEERS = (SLOWAPI, FASTAPI_LIMITER)
ROUTES = {
    UNLIMITED: "/unlimited",
    LIMITED: "/limited",
    SLOWAPI: "/slowapi",
    FASTAPI_LIMITER: "/fastapi-limiter",
}
SCOPE = "bench"
API_KEYS = 1_000
LIMIT = 1_000_000  # per second per API key: never reached, every request is admitted
WARMUP = 100  # requests per case before the rounds: scripts loaded, connections open
PEER_ADDED_TARGET = 0.4  # ours added <= 0.4x what slowapi adds
CHECK_ADDED_TARGET = 2.0  # ours added <= 2x a bare check
API_KEY_HEADER = "x-api-key"


def api_key(i: int) -> str:
    return f"bench-asgi-{i % API_KEYS}"


def _api_key_of(request: Any) -> str:
    return request.headers.get(API_KEY_HEADER) or "anonymous"


def _slowapi(app: Any, url: str, prefix: str) -> None:
    """The `slowapi route` on `app` (ImportError without slowapi)."""
    from fastapi import Request
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded

    limiter = Limiter(key_func=_api_key_of, storage_uri=url, key_prefix=f"{prefix}:slowapi")
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)

    @app.get(ROUTES[SLOWAPI])
    @limiter.limit(f"{LIMIT}/second")
    async def slowapi_route(request: Request) -> dict[str, bool]:
        return {"ok": True}


async def _fastapi_limiter(app: Any, client: Any, prefix: str) -> None:
    """The `fastapi-limiter route` on `app` (ImportError without fastapi-limiter)."""
    from fastapi import Depends
    from fastapi_limiter.depends import RateLimiter
    from pyrate_limiter import Duration, Limiter, Rate, RedisBucket

    bucket = await RedisBucket.init(
        [Rate(LIMIT, Duration.SECOND)], client, f"{prefix}:fastapi-limiter"
    )

    async def identifier(request: Any) -> str:
        return _api_key_of(request)

    dependency = RateLimiter(Limiter(bucket), identifier=identifier)

    @app.get(ROUTES[FASTAPI_LIMITER], dependencies=[Depends(dependency)])
    async def fastapi_limiter_route() -> dict[str, bool]:
        return {"ok": True}


async def build(client: Any, peer_client: Any, url: str, prefix: str) -> tuple[Any, Any, dict]:
    """The app with every route this run can serve, our limiter, and why a peer is
    missing ({case: "skipped: ..."})."""
    from fastapi import Depends, FastAPI

    from ratelimit import SlidingWindowLimiter
    from ratelimit.http import install, rate_limit

    app = FastAPI()
    install(app)
    limiter = SlidingWindowLimiter(client, 1, LIMIT, prefix=f"{prefix}:ours")
    dependency = rate_limit(limiter, scope=SCOPE)

    @app.get(ROUTES[UNLIMITED])
    async def unlimited() -> dict[str, bool]:
        return {"ok": True}

    @app.get(ROUTES[LIMITED], dependencies=[Depends(dependency)])
    async def limited() -> dict[str, bool]:
        return {"ok": True}

    skipped: dict[str, str] = {}
    try:
        _slowapi(app, url, prefix)
    except ImportError as exc:
        skipped[SLOWAPI] = f"skipped: slowapi is not installed ({exc})"
    try:
        await _fastapi_limiter(app, peer_client, prefix)
    except ImportError as exc:
        skipped[FASTAPI_LIMITER] = f"skipped: fastapi-limiter is not installed ({exc})"
    return app, dependency, skipped


async def measure(url: str, n_rounds: int, n: int, seed: int = 0) -> dict[str, Any]:
    """Build the app on `url`, then `n_rounds` interleaved rounds of `n` requests per case."""
    import httpx
    import redis.asyncio

    from ratelimit import connect
    from ratelimit.http import ClientIdentity

    from .cleanup import delete_prefix

    prefix = f"bench:{os.getpid()}:asgi"
    client = connect(url)
    peer_client = redis.asyncio.Redis.from_url(url)
    statuses: dict[str, dict[str, int]] = {}
    try:
        app, dependency, skipped = await build(client, peer_client, url, prefix)
        identities = [
            dependency.limiter_identity(ClientIdentity("key", api_key(i)))
            for i in range(API_KEYS)
        ]
        transport = httpx.ASGITransport(app=app, client=("192.0.2.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:

            def route(case: str) -> rounds.Op:
                path = ROUTES[case]
                counts = statuses.setdefault(case, {})
                headers = [{API_KEY_HEADER: api_key(i)} for i in range(API_KEYS)]

                async def op(i: int) -> None:
                    status = (await http.get(path, headers=headers[i % API_KEYS])).status_code
                    counts[str(status)] = counts.get(str(status), 0) + 1

                return op

            async def check(i: int) -> None:
                await dependency.limiter.check(identities[i % API_KEYS])

            unlimited = route(UNLIMITED)

            async def between(i: int) -> None:
                await unlimited(i)
                await check(i)

            cases = {case: rounds.sequential(route(case)) for case in ROUTES if case not in skipped}
            cases[CHECK] = rounds.sequential(check)
            cases[BETWEEN] = rounds.sequential(between)
            per_round = await rounds.run_async(cases, n_rounds, n, min(WARMUP, n), seed)
        # The warm-up's answers count too: every request sent must have been a 200.
    finally:
        await delete_prefix(client, prefix)
        await client.aclose()
        await peer_client.aclose()
    return {"per_round": per_round, "statuses": statuses, "peers_skipped": skipped}


def _us(per_round: rounds.Rounds) -> list[dict[str, float]]:
    return [{case: 1e6 / rate for case, rate in r.items()} for r in per_round]


def _median_andquartiles(each: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(each), "quartiles": quartiles(each)}


def summarize(per_round: rounds.Rounds) -> dict[str, Any]:
    """Per case, the median us per request; per limited route, what it adds to the
    unlimited route (same-round differences); ours against the bare check and the peers
    (same-round quotients). All medians over rounds."""
    us = _us(per_round)
    out: dict[str, Any] = {
        "us_per_request": {case: statistics.median(r[case] for r in us) for case in us[0]},
        "added_us": {},
    }
    for case in (LIMITED, *PEERS, BETWEEN):
        if case in us[0]:
            out["added_us"][case] = _median_andquartiles([r[case] - r[UNLIMITED] for r in us])
    ours = [r[LIMITED] - r[UNLIMITED] for r in us]
    out["added_x_check"] = _median_andquartiles(
        [a / r[CHECK] for a, r in zip(ours, us, strict=True)]
    )
    out["added_x_check_between"] = _median_andquartiles(
        [a / (r[BETWEEN] - r[UNLIMITED]) for a, r in zip(ours, us, strict=True)]
    )
    out["added_x_peer"] = {
        peer: _median_andquartiles(
            [a / (r[peer] - r[UNLIMITED]) for a, r in zip(ours, us, strict=True)]
        )
        for peer in PEERS
        if peer in us[0]
    }
    return out


def run(n_rounds: int, n: int, url: str | None) -> dict[str, Any]:
    """A private redis-server when one can be started (else `url`), the app on it,
    measured; a skip with the reason when the http extra or a server is missing."""
    try:
        import fastapi  # noqa: F401
        import httpx  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"skipped: the http extra is not installed ({exc})"}
    from ratelimit.devtools.server import RedisServer

    if RedisServer.available():
        with RedisServer() as server:
            found = asyncio.run(measure(server.url, n_rounds, n))
        where = "a private redis-server (no other clients)"
    elif url is not None:
        found = asyncio.run(measure(url, n_rounds, n))
        where = f"{url} (shared)"
    else:
        return {"skipped": "skipped: no redis-server and no Redis URL (the peers need one)"}
    return {
        "server": where,
        "rounds": n_rounds,
        "requests_per_case_per_round": n,
        "api_keys": API_KEYS,
        "limit": f"{LIMIT:,} per second per API key (every request admitted)",
        "routes": {c: path for c, path in ROUTES.items() if c not in found["peers_skipped"]},
        **found,
        **summarize(found["per_round"]),
    }


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Ours added <= 2x a bare check and <= 0.4x what slowapi adds (judged), against
    a check made between requests and fastapi-limiter's (shown), and every request
    answered 200 (judged)."""
    names = {
        CHECK: "HTTP in process: added per request by our dependency vs a bare check",
        SLOWAPI: "HTTP in process: added per request, ours vs slowapi's",
        FASTAPI_LIMITER: "HTTP in process: added per request, ours vs fastapi-limiter's",
        BETWEEN: "HTTP in process: added per request by our dependency vs a check made "
        "between requests",
        "200": "HTTP in process: every request answered 200",
    }
    if "skipped" in report:
        return [skip(name, report["skipped"]) for name in names.values()]
    ours = report["added_us"][LIMITED]["median"]
    rows = []
    us = _us(report["per_round"])
    added = [r[LIMITED] - r[UNLIMITED] for r in us]
    each = [a / r[CHECK] for a, r in zip(added, us, strict=True)]
    rows.append(
        ratios_row(names[CHECK], each, CHECK_ADDED_TARGET, "<=", added_us=ours, part="asgi")
    )
    each = [a / (r[BETWEEN] - r[UNLIMITED]) for a, r in zip(added, us, strict=True)]
    rows.append(ratios_row(names[BETWEEN], each, None, "<=", added_us=ours, part="asgi"))
    for peer, need in ((SLOWAPI, PEER_ADDED_TARGET), (FASTAPI_LIMITER, None)):
        if peer in report["peers_skipped"]:
            rows.append(skip(names[peer], report["peers_skipped"][peer]))
            continue
        each = [a / (r[peer] - r[UNLIMITED]) for a, r in zip(added, us, strict=True)]
        rows.append(ratios_row(names[peer], each, need, "<=", added_us=ours, part="asgi"))
    sent = sum(sum(counts.values()) for counts in report["statuses"].values())
    ok = sum(counts.get("200", 0) for counts in report["statuses"].values())
    rows.append(answered_row(names["200"], ok, sent, "asgi"))
    return rows


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The cases' time per request and what each limiter adds, as `make bench` prints."""
    if "skipped" in report:
        return [f"HTTP in process: {report['skipped']}"]
    out = [
        f"HTTP in process (httpx ASGI transport, {report['server']}): median of "
        f"{report['rounds']} interleaved rounds of {report['requests_per_case_per_round']:,} "
        f"requests per case, {report['api_keys']:,} API keys",
        f"{'case':28} {'us/request':>11} {'added us':>9}",
    ]
    for case, us in report["us_per_request"].items():
        added = report["added_us"].get(case)
        shown = f"{added['median']:>+9.0f}" if added else f"{'':>9}"
        out.append(f"{case:28} {us:>11.0f} {shown}")
    line = (
        f"ours added: {report['added_x_check']['median']:.2f}x a bare check, "
        f"{report['added_x_check_between']['median']:.2f}x a check between requests"
    )
    for peer, x in report["added_x_peer"].items():
        line += f", {x['median']:.2f}x {peer.split()[0]}'s added"
    out.append(line + " (same-round medians)")
    out += [f"  {peer}: {why}" for peer, why in report["peers_skipped"].items()]
    return out
