"""Throughput with 1, 10 and 50 asyncio tasks sharing one client (and its pool).

Each task awaits its own checks one after another; the tasks run at once. Every
figure is a ratio against PING at the same concurrency, in the same round.
"""

from __future__ import annotations

import os
from typing import Any

from ratelimit import SlidingWindowLimiter

from . import rounds
from .checks import LIMIT, Identities
from .cleanup import delete_prefix

TASKS = (1, 10, 50)


def name(case: str, tasks: int) -> str:
    return f"{case}, {tasks} tasks"


def make_cases(client: Any, prefix: str, tasks: tuple[int, ...]) -> dict[str, rounds.AsyncCase]:
    noop = client.register_script("return 1")
    limiter = SlidingWindowLimiter(client, 1, LIMIT, prefix=f"{prefix}:log")

    async def ping(i: int) -> Any:
        return await client.ping()

    async def evalsha(i: int) -> Any:
        return await noop()

    identity = Identities()

    async def check(i: int) -> Any:
        return await limiter.check(identity())

    cases = {}
    for t in tasks:
        cases[name("PING", t)] = rounds.concurrent(ping, t)
        cases[name("EVALSHA return 1", t)] = rounds.concurrent(evalsha, t)
        cases[name("SlidingWindowLimiter 10k keys", t)] = rounds.concurrent(check, t)
    return cases


async def run(
    client: Any, n_rounds: int, n: int, tasks: tuple[int, ...] = TASKS, warmup: int = 100
) -> dict[str, Any]:
    prefix = f"bench:{os.getpid()}:concurrency"
    cases = make_cases(client, prefix, tasks)
    try:
        per_round = await rounds.run_async(cases, n_rounds, n, warmup)
    finally:
        await delete_prefix(client, prefix)
    baselines = {
        name(case, t): [name("PING", t)]
        for t in tasks
        for case in ("PING", "EVALSHA return 1", "SlidingWindowLimiter 10k keys")
    }
    return {
        "rounds": n_rounds,
        "checks_per_case_per_round": n,
        "tasks": list(tasks),
        "per_round": per_round,
        "results": rounds.summarize(per_round, baselines),
    }
