"""A small spatial API behind the rate limiter: map tiles and geofence look-ups.

    python -m ratelimit.demo                       # http://127.0.0.1:8000/docs
    uvicorn ratelimit.demo:app --no-proxy-headers  # the same app (uvicorn's own options)

Routes, each with its own sliding-log budget per client (the `x-api-key` header, else
the address; see `ratelimit.http`):

- `GET /within?lng=&lat=&radius=`: 10 units per second; a look-up costs 1 up to 500 m,
  then by area (`ratelimit.costs.geofence_cost`, at most 10); and at most 4 look-ups
  in flight per client at once (a lease each, `ratelimit.http.concurrency_limit`: a
  rate does not bound how many slow look-ups pile up, each holding a pooled database
  connection). Redis down: 503 (fail-closed, for the same reason).
- `GET /tiles/{z}/{x}/{y}.png`: 100 per second, 1 each. Redis down: served anyway
  (fail-open, tiles are cheap), marked `X-RateLimit-Degraded: fail-open`.

`/`, `/healthz`, `/docs` and `/openapi.json` are not limited. Malformed parameters get
422 before the limiter is asked, so they cost nothing.

`create_app(redis=None, ...)` builds the app: `redis` is an asyncio client, by default
the Redis at `REDIS_URL`, else an embedded fakeredis (this process's alone), closed again
when the app shuts down; which one is logged (logger `ratelimit.demo`, shown by
`python -m ratelimit.demo`). `clock=` takes a virtual clock for simulations. `app` (for uvicorn) is
`create_app()`, made on first use.

uvicorn rewrites the client address from `X-Forwarded-For` itself when the peer is
127.0.0.1 unless started with `--no-proxy-headers`: run it so, and name the proxies
to believe with `create_app(trusted_proxies=...)` (`--trusted-proxy` here), so that
one place decides. `python -m ratelimit.demo` does that.
(`ratelimit.devtools.demo_server.DemoServer` runs it in a subprocess for tests and
chapters.)
"""

# No `from __future__ import annotations` here: the routes in create_app use local
# dependencies in Annotated[...], which FastAPI must see evaluated.
import argparse
import logging
import math
import random
import struct
import zlib
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from . import clock as clocks
from .backends import configured_url, connect, redact_url
from .costs import GEOFENCE_MAX_COST, geofence_cost
from .http import LeaseInfo, RateLimit, RateLimitInfo, concurrency_limit, install, rate_limit
from .limiters import ConcurrencyLimiter, SlidingWindowLimiter
from .policy import OnError

__all__ = ["create_app", "tile_png"]

_log = logging.getLogger(__name__)

CENTER = (13.405, 52.52)  # lng, lat of the synthetic point set (central Berlin)
POINTS_RADIUS_M = 5_000.0  # points are spread over a disc of this radius
MAX_RADIUS_M = 50_000.0  # largest look-up accepted
MAX_ZOOM = 22
TILE_SIZE = 256
EARTH_RADIUS_M = 6_371_008.8
MAX_POINTS_RETURNED = 20


# --- the tile -----------------------------------------------------------------------


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


@lru_cache(maxsize=1024)
def tile_png(z: int, x: int, y: int, size: int = TILE_SIZE) -> bytes:
    """A `size` x `size` RGB PNG for tile (z, x, y): a colour of its own, a grid border."""
    seed = zlib.crc32(f"{z}/{x}/{y}".encode())
    fill = bytes((96 + seed % 128, 96 + (seed >> 8) % 128, 96 + (seed >> 16) % 128))
    edge = bytes(max(0, c - 64) for c in fill)
    border_row = b"\x00" + edge * size
    inner_row = b"\x00" + edge + fill * (size - 2) + edge
    raw = border_row + inner_row * (size - 2) + border_row
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(raw, 6))
        + _png_chunk(b"IEND", b"")
    )


@dataclass(frozen=True)
class Tile:
    z: int
    x: int
    y: int


# The parameter and cost dependencies below are `async def` although they never wait:
# FastAPI runs a plain `def` dependency in its thread pool, a hand-off per request that
# costs more than all they compute.


async def tile_params(
    z: Annotated[int, PathParam(ge=0, le=MAX_ZOOM, description="zoom level")],
    x: Annotated[int, PathParam(ge=0, description="column, 0 .. 2^z - 1")],
    y: Annotated[int, PathParam(ge=0, description="row, 0 .. 2^z - 1")],
) -> Tile:
    """The validated tile address (x and y must lie on the zoom level's grid)."""
    errors = [
        {
            "type": "less_than",
            "loc": ("path", name),
            "msg": f"Input should be less than {2**z} at zoom {z}",
            "input": value,
            "ctx": {"lt": 2**z},
        }
        for name, value in (("x", x), ("y", y))
        if value >= 2**z
    ]
    if errors:
        raise RequestValidationError(errors)
    return Tile(z, x, y)


async def tile_cost(tile: Annotated[Tile, Depends(tile_params)]) -> int:
    """Every tile costs 1; depending on `tile_params` validates the path before pricing."""
    return 1


# --- the geofence ---------------------------------------------------------------------


class Point(BaseModel):
    id: int
    lng: float
    lat: float
    distance_m: float


class WithinResult(BaseModel):
    lng: float
    lat: float
    radius_m: float
    cost: int
    count: int
    points: list[Point]


@dataclass(frozen=True)
class WithinQuery:
    lng: float
    lat: float
    radius: float


async def within_params(
    lng: Annotated[float, Query(ge=-180, le=180, allow_inf_nan=False, description="degrees")],
    lat: Annotated[float, Query(ge=-90, le=90, allow_inf_nan=False, description="degrees")],
    radius: Annotated[
        float, Query(gt=0, le=MAX_RADIUS_M, allow_inf_nan=False, description="metres")
    ],
) -> WithinQuery:
    return WithinQuery(lng, lat, radius)


def seeded_points(n: int, seed: int) -> list[tuple[float, float]]:
    """`n` (lng, lat) points spread evenly over a disc of 5 km around `CENTER`."""
    rng = random.Random(seed)
    lng0, lat0 = CENTER
    metres_per_degree = math.pi * EARTH_RADIUS_M / 180
    points = []
    for _ in range(n):
        r = POINTS_RADIUS_M * math.sqrt(rng.random())
        theta = 2 * math.pi * rng.random()
        dlat = r * math.sin(theta) / metres_per_degree
        dlng = r * math.cos(theta) / (metres_per_degree * math.cos(math.radians(lat0)))
        points.append((round(lng0 + dlng, 6), round(lat0 + dlat, 6)))
    return points


def distance_m(lng1: float, lat1: float, lng2: float, lat2: float) -> float:
    """Great-circle (haversine) distance in metres."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lng2 - lng1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(a)))


# --- the app --------------------------------------------------------------------------


def create_app(
    redis: Any = None,
    *,
    clock: clocks.Clock = clocks.DEFAULT,
    window_s: int = 1,
    within_limit: int = 10,
    within_in_flight: int = 4,
    lease_seconds: float = 30,
    tiles_limit: int = 100,
    within_on_error: OnError = "deny",
    tiles_on_error: OnError = "allow",
    trusted_proxies: Iterable[str] = (),
    legacy_headers: bool = True,
    prefix: str = "rl",
    timeout: float = 1.0,
    points: int = 2_000,
    seed: int = 0,
) -> FastAPI:
    """The demo API with one limiter per route, built once for the app's lifetime.

    `redis`: an asyncio Redis client; None connects to REDIS_URL, else to an embedded
    fakeredis, logs which, and closes that client when the app shuts down. `clock`: where the
    limiters read the time (a `ratelimit.clock.ManualClock` for virtual time). The rest
    sets the budgets, the failure policies and the synthetic point set.
    """
    owned = redis is None
    if owned:
        # The demo falls back on the embedded Redis by design; it says so in its log
        # rather than with connect()'s warning.
        url = configured_url()
        redis = connect(url, embedded=url is None)
        where = (
            f"the Redis at {redact_url(url)} (REDIS_URL)"
            if url
            else "the embedded fakeredis (REDIS_URL unset): this process's own in-memory "
            "Redis, empty at start; set REDIS_URL for a real one"
        )
        _log.info("rate limits in %s", where)
    # The sorted-set log under plain keys, so that `redis-cli ZCARD rl:geofence:key:demo`
    # shows the API key "demo"'s entries on the geofence route, typed as a person would
    # (the default, compact storage under hashed keys decides alike in fewer bytes).
    # Each route has its own scope in the key, and one window, so one prefix serves both.
    within_limiter, tiles_limiter = (
        SlidingWindowLimiter(
            redis, window_s, limit, prefix, on_error=on_error, clock=clock, timeout=timeout,
            storage="sorted-set", plain_keys=True,
        )
        for limit, on_error in ((within_limit, within_on_error), (tiles_limit, tiles_on_error))
    )  # fmt: skip
    # Look-ups in flight per client: a lease each, on the same policy as the rate (hashed
    # keys under the same prefix: "rl:lease:...", apart from every route's plain key).
    within_leases = ConcurrencyLimiter(
        redis, within_in_flight, lease_seconds, prefix, on_error=within_on_error, timeout=timeout
    )
    max_cost = min(GEOFENCE_MAX_COST, within_limit)

    async def within_cost(query: Annotated[WithinQuery, Depends(within_params)]) -> int:
        return geofence_cost(query.radius, max_cost=max_cost)

    limits = {
        "geofence": rate_limit(
            within_limiter,
            scope="geofence",
            cost=Depends(within_cost),
            trusted_proxies=trusted_proxies,
            legacy_headers=legacy_headers,
        ),
        "tiles": rate_limit(
            tiles_limiter,
            scope="tiles",
            cost=Depends(tile_cost),
            trusted_proxies=trusted_proxies,
            legacy_headers=legacy_headers,
        ),
    }
    # After the rate limit: a request over its rate, or malformed, never takes a lease.
    in_flight = concurrency_limit(
        within_leases, scope="geofence", trusted_proxies=trusted_proxies, after=limits["geofence"]
    )
    point_set = seeded_points(points, seed)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if owned:
            await redis.aclose()

    app = FastAPI(
        title="Rate-limit lab demo",
        summary="Map tiles and geofence look-ups behind a Redis sliding-log rate limiter.",
        description=(
            "Every limited response carries `RateLimit-Policy` and `RateLimit` "
            "(draft-ietf-httpapi-ratelimit-headers); a rejection is 429 with "
            "`Retry-After` and an `application/problem+json` body. Clients are told "
            "apart by `x-api-key`, else by address."
        ),
        version="1.0",
        lifespan=lifespan,
    )
    install(app)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own 422 body, without repeats: a parameter used by both the route
        # and its cost dependency is reported by each.
        unique: list[Any] = []
        for error in jsonable_encoder(exc.errors()):
            if error not in unique:
                unique.append(error)
        return JSONResponse({"detail": unique}, status_code=422)

    app.state.redis = redis
    app.state.limits = limits
    app.state.in_flight = in_flight
    app.state.points = point_set

    within_limit_dep: RateLimit = limits["geofence"]
    tiles_limit_dep: RateLimit = limits["tiles"]

    @app.get("/", summary="What this API serves and its limits")
    async def index() -> dict[str, Any]:
        return {
            "routes": {
                "/within?lng=&lat=&radius=": {
                    "policy": within_limit_dep.policy,
                    "in_flight": within_in_flight,
                },
                "/tiles/{z}/{x}/{y}.png": {"policy": tiles_limit_dep.policy},
            },
            "docs": "/docs",
        }

    @app.get("/healthz", summary="Liveness (not rate limited, no Redis)")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/within",
        summary="Points within a radius (a geofence look-up)",
        response_model=WithinResult,
        responses={429: {"description": "Quota exceeded"}, 503: {"description": "No limiter"}},
    )
    async def within(
        query: Annotated[WithinQuery, Depends(within_params)],
        limit: Annotated[RateLimitInfo, Depends(within_limit_dep)],
        lease: Annotated[LeaseInfo, Depends(in_flight)],
    ) -> WithinResult:
        found = []
        for i, (lng, lat) in enumerate(point_set):
            d = distance_m(query.lng, query.lat, lng, lat)
            if d <= query.radius:
                found.append((d, i, lng, lat))
        found.sort()
        return WithinResult(
            lng=query.lng,
            lat=query.lat,
            radius_m=query.radius,
            cost=limit.cost,
            count=len(found),
            points=[
                Point(id=i, lng=lng, lat=lat, distance_m=round(d, 1))
                for d, i, lng, lat in found[:MAX_POINTS_RETURNED]
            ],
        )

    @app.get(
        "/tiles/{z}/{x}/{y}.png",
        summary="A map tile (a generated PNG)",
        response_class=Response,
        responses={
            200: {"content": {"image/png": {}}, "description": "The tile"},
            429: {"description": "Quota exceeded"},
        },
    )
    async def tile(
        tile: Annotated[Tile, Depends(tile_params)],
        limit: Annotated[RateLimitInfo, Depends(tiles_limit_dep)],
    ) -> Response:
        # A Response returned as is loses the headers dependencies set: pass them on.
        return Response(
            tile_png(tile.z, tile.x, tile.y), media_type="image/png", headers=limit.headers
        )

    return app


_app: FastAPI | None = None


def __getattr__(name: str) -> Any:
    # `ratelimit.demo:app` for uvicorn, made on first use (importing this module for
    # `create_app` connects to nothing).
    global _app
    if name == "app":
        if _app is None:
            _app = create_app()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- python -m ratelimit.demo ----------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ratelimit.demo",
        description="Serve the rate-limited demo API (REDIS_URL picks a real Redis, "
        "else the embedded one).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="believe X-Forwarded-For from this address or network (repeatable)",
    )
    args = parser.parse_args(argv)

    import uvicorn

    # Which Redis the app uses, on stderr beside uvicorn's own start-up lines.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    _log.addHandler(handler)
    _log.setLevel(logging.INFO)
    application = create_app(trusted_proxies=args.trusted_proxy)
    # proxy_headers=False: the app alone decides whose X-Forwarded-For to believe.
    uvicorn.run(application, host=args.host, port=args.port, proxy_headers=False)


if __name__ == "__main__":
    main()
