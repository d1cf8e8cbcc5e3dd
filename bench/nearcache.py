"""The rejection near-cache against an abusive client at 10x its limit.

Two parts:

1. Throughput (wall clock, app clock): one client sends checks as fast as it can to
   a limit of 100 per second, so nearly every check is a rejection. Decisions per
   second through our sliding log with `near_cache=True`, the same limiter without
   it, and the classic recipe (`bench.classic`: a new limiter object and a MULTI
   pipeline per request), in interleaved rounds; medians of same-round ratios.
2. Exactness (virtual time): the same 10x trace (one request per ms for 3 s at 100
   per second) through a cached and an uncached limiter on one backend: whether
   every decision is identical, and how many Redis commands a locally rejected check
   sent (counted by the client itself).

    from bench import nearcache
    nearcache.run("redis://127.0.0.1:6379/0")   # or None: embedded fakeredis
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import fakeredis
import redis.asyncio

from ratelimit import SlidingWindowLimiter
from ratelimit.clock import ManualClock
from ratelimit.lab.classic import ClassicSlidingLog

from .cleanup import delete_prefix
from .rounds import run_async, sequential, summarize

LIMIT = 100  # per second
CHECKS_PER_ROUND = 3000
TRACE_SECONDS = 3
START_MS = 1_796_000_000_000


def _counting(url: str | None) -> Any:
    """A client (real or embedded) that counts the commands it sends."""
    base = fakeredis.FakeAsyncRedis if url is None else redis.asyncio.Redis

    class Counting(base):  # type: ignore[misc, valid-type]
        calls = 0

        async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await super().execute_command(*args, **kwargs)

    if url is None:
        return Counting()
    return Counting.from_url(url, socket_timeout=5, socket_connect_timeout=5)


async def _throughput(client: Any, prefix: str, rounds: int, checks: int) -> dict[str, Any]:
    cached = SlidingWindowLimiter(client, 1, LIMIT, prefix=f"{prefix}:nc", near_cache=True)
    plain = SlidingWindowLimiter(client, 1, LIMIT, prefix=f"{prefix}:plain")

    async def near_cache(i: int) -> None:
        await cached.check("abuser")

    async def no_cache(i: int) -> None:
        await plain.check("abuser")

    async def classic(i: int) -> None:
        # A new object per request, as a route that builds the recipe inside itself.
        await ClassicSlidingLog(client, 1, LIMIT, prefix=f"{prefix}:classic").check_transaction(
            "abuser"
        )

    cases = {
        "near-cache": sequential(near_cache),
        "no cache": sequential(no_cache),
        "classic recipe": sequential(classic),
    }
    # The warm-up alone exceeds the limit, so every round meets a client already over it.
    per_round = await run_async(cases, rounds, checks, warmup=3 * LIMIT)
    summary = summarize(per_round, ["classic recipe", "no cache"])
    return {
        "decisions_per_s": {name: s["checks_per_s"] for name, s in summary.items()},
        "near_cache_x_classic": summary["near-cache"]["ratios"]["classic recipe"],
        "near_cache_x_no_cache": summary["near-cache"]["ratios"]["no cache"],
        "no_cache_x_classic": summary["no cache"]["ratios"]["classic recipe"],
        "rounds": rounds,
        "checks_per_case_per_round": checks,
        "per_round": per_round,
        "local_share": cached.near_cache.hits / (3 * LIMIT + rounds * checks),
    }


async def _exactness(url: str | None, other: Any, prefix: str, seconds: int) -> dict[str, Any]:
    counting = _counting(url)
    clock = ManualClock()
    kw: dict[str, Any] = {"clock": clock}
    cached = SlidingWindowLimiter(counting, 1, LIMIT, prefix=f"{prefix}:vc", near_cache=True, **kw)
    plain = SlidingWindowLimiter(other, 1, LIMIT, prefix=f"{prefix}:vp", **kw)
    identical = allowed_equal = local = calls_when_local = 0
    total = seconds * 1000
    try:
        for i in range(total):  # one request per ms: 10x a limit of 100 per second
            clock.set_ms(START_MS + i)
            hits, calls = cached.near_cache.hits, counting.calls  # type: ignore[union-attr]
            got = await cached.check("abuser")
            if cached.near_cache.hits > hits:  # type: ignore[union-attr]
                local += 1
                calls_when_local += counting.calls - calls
            want = await plain.check("abuser")
            identical += got == want
            allowed_equal += got.allowed == want.allowed
    finally:
        await delete_prefix(counting, prefix)
        await counting.aclose()
    return {
        "trace": f"1 request per ms for {seconds} s at {LIMIT} per s (virtual time)",
        "checks": total,
        "identical_decisions": identical,
        "same_allowed": allowed_equal,
        "all_identical": identical == total,
        "locally_rejected": local,
        "redis_calls_per_local_rejection": calls_when_local / local if local else None,
    }


async def _run(url: str | None, rounds: int, checks: int, seconds: int) -> dict[str, Any]:
    client = fakeredis.FakeAsyncRedis() if url is None else redis.asyncio.Redis.from_url(url)
    prefix = f"bench:{os.getpid()}:nearcache"
    try:
        throughput = await _throughput(client, prefix, rounds, checks)
        exactness = await _exactness(url, client, prefix, seconds)
    finally:
        await delete_prefix(client, prefix)
        await client.aclose()
    return {
        "backend": "real Redis" if url else "embedded fakeredis",
        "abuser": f"one identity, as fast as it can, limit {LIMIT} per 1 s (app clock)",
        **throughput,
        "exactness": exactness,
        "target_x_classic": 5.0,
    }


def run(
    url: str | None,
    rounds: int = 5,
    checks_per_round: int = CHECKS_PER_ROUND,
    trace_seconds: int = TRACE_SECONDS,
) -> dict:
    """Measure the near-cache (see the module docstring); a dict of figures and ratios.

    `checks_per_round` and `trace_seconds` shrink it (quick mode in tests)."""
    return asyncio.run(_run(url, rounds, checks_per_round, trace_seconds))


if __name__ == "__main__":
    import json

    print(json.dumps(run(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")), indent=2))
