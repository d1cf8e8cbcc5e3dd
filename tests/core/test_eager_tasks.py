"""asyncio's eager task factory (Python 3.12+): a task runs at once, inside `create_task`,
up to its first wait. Auto-pipelining batches under it as under the default factory
(`ratelimit.autopipeline`): a batch's flush task, started eagerly inside `submit`
before the checks of its turn have joined, goes on the next turn, as a task started
the usual way does; nothing reads the loop's run queue.

Before that (the batcher read asyncio's private `loop._ready` to tell whether a check
was alone), every check under the eager factory looked alone: 300 checks at once on a
client bounded at 20 connections gave 20 admitted and 280 degraded
(MaxConnectionsError), against 300 and 0 under the default factory.

The checks below run on a real Redis, where a reply is read turns after its write.
`make test-pythons` runs them on 3.12 and 3.13; on 3.11 the eager cases skip (there is
no eager factory). `make test-eager` runs every library test on eager loops
(RATELIMIT_TASK_FACTORY=eager, tests/conftest.py), and the first two tests say which
factory the loops have.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio

import ratelimit
from ratelimit.clock import ManualClock
from tests.conftest import TASK_FACTORY
from tests.core import test_autopipeline
from tests.core.test_autopipeline import limiters, script_writes, together, warm

writes = test_autopipeline.writes  # the fixture: every write of every asyncio connection

NEEDS_EAGER = pytest.mark.skipif(
    sys.version_info < (3, 12),
    reason="asyncio.eager_task_factory is new in Python 3.12 (CI runs this on 3.12 and 3.13)",
)
FACTORIES = ["default", pytest.param("eager", marks=NEEDS_EAGER)]
# Small enough to matter: a check that took a connection of its own for each of 300
# checks at once would run out of them.
POOL = 20


def asked_for() -> Any:
    return asyncio.eager_task_factory if TASK_FACTORY == "eager" else None


async def test_the_tests_loops_have_the_task_factory_asked_for():
    assert asyncio.get_running_loop().get_task_factory() is asked_for()


def test_asyncio_run_loops_have_it_too():
    async def factory() -> Any:
        return asyncio.get_running_loop().get_task_factory()

    assert asyncio.run(factory()) is asked_for()


@contextlib.contextmanager
def task_factory(name: str) -> Iterator[None]:
    """The running loop's task factory is `name`'s ("default" or "eager") meanwhile."""
    loop = asyncio.get_running_loop()
    before = loop.get_task_factory()
    loop.set_task_factory(asyncio.eager_task_factory if name == "eager" else None)
    try:
        yield
    finally:
        loop.set_task_factory(before)


@pytest.mark.real_redis
@pytest.mark.parametrize("factory", FACTORIES)
async def test_300_checks_at_once_are_batched(factory, real_redis_url, prefix, writes):
    """300 checks of one identity at once on a pool bounded at 20 connections: every
    one answered, none degraded, exactly the limit admitted, and two writes: the first
    check alone, the 299 made while it waits in one pipeline."""
    client = redis.asyncio.Redis.from_url(real_redis_url, max_connections=POOL)
    try:
        limiter = ratelimit.SlidingWindowLimiter(client, 60, 50, prefix=prefix, timeout=10)
        await warm(limiter)
        writes.clear()
        with task_factory(factory):
            decisions = await asyncio.gather(*(limiter.check("one") for _ in range(300)))
    finally:
        await client.aclose()
    assert len(decisions) == 300 and not any(d.degraded for d in decisions)
    assert sum(d.allowed for d in decisions) == limiter.limit
    assert script_writes(writes) == together(300)


@pytest.mark.real_redis
@NEEDS_EAGER
async def test_eager_tasks_batch_as_usual_ones(real_redis_url, prefix, writes):
    """300 tasks each make three checks one after another, over the four algorithms, at
    one virtual instant: under the eager factory every decision and every write (how
    many script calls each carried, in order) is the same as under the default one."""

    async def run(factory: str) -> tuple[list[Any], list[tuple[int, int]]]:
        client = redis.asyncio.Redis.from_url(real_redis_url, max_connections=POOL)
        try:
            four = limiters(client, f"{prefix}:{factory}", ManualClock(1_796_000_000.5), timeout=10)
            await warm(*four)
            writes.clear()

            async def three(i: int) -> list[Any]:
                return [await four[(i + k) % 4].check(f"id-{i % 7}", 1 + k % 2) for k in range(3)]

            with task_factory(factory):
                got = await asyncio.gather(*(three(i) for i in range(300)))
            return [d for per_task in got for d in per_task], script_writes(writes)
        finally:
            await client.aclose()

    default, default_writes = await run("default")
    eager, eager_writes = await run("eager")
    assert not any(d.degraded for d in default + eager)
    assert {d.allowed for d in eager} == {True, False}
    assert eager == default
    assert eager_writes == default_writes
    assert sum(calls for calls, _ in eager_writes) == 900 and len(eager_writes) <= 6, eager_writes
