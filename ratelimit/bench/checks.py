"""How fast one check is, as ratios against floors measured in the same run.

Cases run in interleaved rounds (A B C ... A B C ...), so drift on a noisy machine
hits every case alike; each figure is the median over rounds, and each ratio is
taken against the PING of the same round.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Awaitable, Callable

import redis.asyncio

from .. import (
    FixedWindowLimiter,
    SlidingWindowCounterLimiter,
    SlidingWindowLimiter,
    TokenBucketLimiter,
    connect,
)

Case = Callable[[int], Awaitable[None]]


def make_cases(client: redis.asyncio.Redis, prefix: str) -> dict[str, Case]:
    noop = client.register_script("return 1")

    async def ping(i: int) -> None:
        await client.ping()

    async def evalsha_return_1(i: int) -> None:
        await noop()

    cases: dict[str, Case] = {"PING": ping, "EVALSHA return 1": evalsha_return_1}
    for cls in (
        SlidingWindowLimiter,
        FixedWindowLimiter,
        SlidingWindowCounterLimiter,
        TokenBucketLimiter,
    ):
        # A large limit keeps every check on the admit path, the one that writes.
        limiter = cls(client, 1, 1_000_000, prefix=f"{prefix}:{cls.__name__}")

        async def hot(i: int, limiter=limiter) -> None:
            await limiter.check("hot")

        async def spread(i: int, limiter=limiter) -> None:
            await limiter.check(f"client-{i % 10_000}")

        cases[f"{cls.__name__} hot key"] = hot
        cases[f"{cls.__name__} 10k keys"] = spread
    return cases


def make_batch_cases(client: redis.asyncio.Redis, prefix: str) -> dict[str, Case]:
    """Batches of 100 checks, one pipelined round trip each (see `measure_batches`)."""
    limiter = SlidingWindowLimiter(client, 1, 1_000_000, prefix=f"{prefix}:batch")

    async def batch(i: int) -> None:
        await limiter.check_many([f"client-{(i * 100 + j) % 10_000}" for j in range(100)])

    return {"SlidingWindowLimiter check_many(100), 10k keys": batch}


async def measure(case: Case, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        await case(i)
    return n / (time.perf_counter() - start)


async def run(rounds: int, n: int, url: str | None) -> dict:
    client = connect(url)
    prefix = f"bench:{os.getpid()}"
    cases = make_cases(client, prefix)
    for case in cases.values():  # warm up: load scripts, open connections
        await measure(case, 50)
    batches = make_batch_cases(client, prefix)
    per_round: list[dict[str, float]] = []
    for _ in range(rounds):
        speeds = {name: await measure(case, n) for name, case in cases.items()}
        # A batch call decides 100 requests: checks per second = calls per second x 100.
        speeds.update(
            {name: 100 * await measure(b, max(1, n // 100)) for name, b in batches.items()}
        )
        per_round.append(speeds)
    cases = {**cases, **batches}
    if url is not None:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        for i in range(0, len(keys), 1000):
            await client.delete(*keys[i : i + 1000])
    await client.aclose()
    results = {}
    for name in cases:
        ops = [r[name] for r in per_round]
        ratios = [r[name] / r["PING"] for r in per_round]
        results[name] = {"ops_per_s": statistics.median(ops), "x_ping": statistics.median(ratios)}
    return {"rounds": rounds, "calls_per_case_per_round": n, "results": results}
