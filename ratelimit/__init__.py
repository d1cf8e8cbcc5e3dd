"""Atomic Redis rate limiters: sliding-window log, fixed window, sliding-window
counter and token bucket (GCRA), each one Lua script under `ratelimit/lua/`.

The classes here take a `redis.asyncio` client; `ratelimit.sync` has the same four
for a synchronous `redis.Redis`. A limit is a rate string or a `Rate`
(`SlidingWindowLimiter(redis, "10/s")`, see `parse_rate`) or a window and a limit
(`SlidingWindowLimiter(redis, 1, 10)`). `ConcurrencyLimiter` bounds requests in flight
rather than a rate: each holds a lease until released (`ratelimit/lua/leases.lua`).
`TieredLimiter` puts several rates on one identity at once ("10/s" and "1000/h").
`connect()` gives a client for `REDIS_URL`; when none is set, an embedded fakeredis (the
`embedded` extra), with an `EmbeddedRedisWarning` that says each process then has its
own. `ratelimit.http` puts a limiter on FastAPI routes. `__version__` is the installed
distribution's (`ratelimit-lab`).

This package is the library a service imports; it needs neither numpy, pandas nor
matplotlib. The lab that simulates and measures it lives in `ratelimit.lab` (the
`lab` extra), and the tooling for private servers in `ratelimit.devtools`.
"""

from importlib import metadata as _metadata
from pathlib import Path as _Path

from .backends import EmbeddedRedisWarning, connect, connect_sync, is_embedded
from .decision import Decision
from .doctor import Finding, Report, doctor
from .errors import RateLimiterUnavailable
from .limiters import (
    ConcurrencyLimiter,
    FixedWindowLimiter,
    SlidingWindowCounterLimiter,
    SlidingWindowLimiter,
    TieredLimiter,
    TokenBucketLimiter,
)
from .rates import Rate, parse_rate, parse_rates


def _version() -> str:
    try:
        return _metadata.version("ratelimit-lab")
    except _metadata.PackageNotFoundError:
        pass
    # A source tree on sys.path without an install: its pyproject.toml says, if it is ours.
    import tomllib

    try:
        with open(_Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
            project = tomllib.load(f).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        project = {}
    version = project.get("version") if project.get("name") == "ratelimit-lab" else None
    return version if isinstance(version, str) else "0+unknown"


__version__ = _version()
"""The installed distribution's version (ratelimit-lab), as `python -m ratelimit --version`
prints it."""

__all__ = [
    "ConcurrencyLimiter",
    "Decision",
    "EmbeddedRedisWarning",
    "Finding",
    "FixedWindowLimiter",
    "Rate",
    "RateLimiterUnavailable",
    "Report",
    "SlidingWindowCounterLimiter",
    "SlidingWindowLimiter",
    "TieredLimiter",
    "TokenBucketLimiter",
    "__version__",
    "connect",
    "connect_sync",
    "doctor",
    "is_embedded",
    "parse_rate",
    "parse_rates",
]
