"""What the library's failure and cluster tests share: one check of either flavour (a
sync limiter's in a worker thread, so the test can act on the server meanwhile), timed,
and the check that a failure policy, and only it, decided."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable


async def check(limiter: Any, identity: Any, cost: Any = 1) -> Decision:
    """One check: awaited for an asyncio limiter, in a worker thread for a sync one."""
    if isinstance(limiter, ratelimit.sync.SyncLimiter):
        return await asyncio.to_thread(limiter.check, identity, cost)
    return await limiter.check(identity, cost=cost)


async def peek(limiter: Any, identity: Any, cost: Any = 1) -> Decision:
    """`peek`, the same way."""
    if isinstance(limiter, ratelimit.sync.SyncLimiter):
        return await asyncio.to_thread(limiter.peek, identity, cost)
    return await limiter.peek(identity, cost=cost)


async def reset(limiter: Any, identity: Any) -> bool:
    """`reset`, the same way."""
    if isinstance(limiter, ratelimit.sync.SyncLimiter):
        return await asyncio.to_thread(limiter.reset, identity)
    return await limiter.reset(identity)


async def check_many(limiter: Any, identities: list[str], costs: Any = 1) -> list[Decision]:
    """`check_many`, the same way."""
    if isinstance(limiter, ratelimit.sync.SyncLimiter):
        return await asyncio.to_thread(limiter.check_many, identities, costs)
    return await limiter.check_many(identities, costs)


async def timed_check(limiter: Any, identity: str) -> tuple[Decision | Exception, float]:
    """The outcome of one check (a Decision or RateLimiterUnavailable) and its duration."""
    start = time.monotonic()
    try:
        outcome: Decision | Exception = await check(limiter, identity)
    except RateLimiterUnavailable as exc:
        outcome = exc
    return outcome, time.monotonic() - start


@contextlib.contextmanager
def host_stalls(
    step: float = 0.01, events: list[tuple[float, float]] | None = None
) -> Iterator[Callable[[], float]]:
    """Seconds the host kept this process waiting meanwhile, as a thread sees it: the sum
    of how far each of its `step`-second sleeps overran.

    A bound on a check's duration adds this, so a busy machine (other processes taking the
    cores) does not fail a test about the library. A check that blocks its event loop is
    not excused: the thread sleeps apart from the loop and waits at most Python's switch
    interval (5 ms) for the GIL per 10 ms step, so a blocked loop adds at most a third of
    its length here.

    `events`, when given, receives every overrun as `(start, end)` on the wall clock
    (`time.time()`), to tell which checks a stall overlapped (`stalled_within`).
    """
    stolen = [0.0]
    done = threading.Event()

    def watch() -> None:
        while True:
            start = time.monotonic()
            if done.wait(step):
                return
            overrun = time.monotonic() - start - step
            if overrun > 0:
                stolen[0] += overrun
                if events is not None:
                    now = time.time()
                    events.append((now - overrun, now))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield lambda: stolen[0]
    finally:
        done.set()
        watcher.join()


def stalled_within(events: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of the `host_stalls` events that fall between `start` and `end`."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in events)


def assert_policy(outcome: Decision | Exception, on_error: str, *causes: type) -> None:
    """The failure policy `on_error` was applied, and nothing else happened; under
    "raise", the error is chained from one of `causes` when any are given."""
    if on_error == "raise":
        assert isinstance(outcome, RateLimiterUnavailable), outcome
        if causes:
            assert isinstance(outcome.__cause__, causes), repr(outcome.__cause__)
        return
    assert isinstance(outcome, Decision) and outcome.degraded, outcome
    assert outcome.allowed == (on_error == "allow"), outcome
    if not outcome.allowed:
        assert outcome.retry_after >= 1, outcome
