"""The limiters under load while the server misbehaves (issue 8, faults).

`tests/test_failures.py` covers single checks around a SCRIPT FLUSH, a restart, a stop
or a stall. Here the same faults land while several tasks (or threads, for
`ratelimit.sync`) hammer one identity on a private redis-server, and every check is
recorded (`tests.core.loadgen.hammer`). For each fault and failure policy:

- every check returns within the limiter's timeout plus MARGIN, and its outcome is a
  normal decision or exactly what the policy documents (raise `RateLimiterUnavailable`,
  or a degraded allow / deny), never another exception;
- the checks answered before the fault, and those sent once it is over, are normal
  decisions: service resumes by itself;
- the decisions Redis made never admit more than the limit in any rolling window of
  Redis's clock (a restart empties the server, so before and after are counted apart),
  and the sliding log still holds every admitted request of the last window.

The limiters read Redis's clock: with the app clock a check stamped before it waited
in the client's queue may be counted against an earlier window (see test_load.py),
which is a property of that clock, not of these faults.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio

import ratelimit
import ratelimit.sync
from tests.core.loadgen import LoadConfig, LoadResult, hammer

pytestmark = pytest.mark.private_redis

TIMEOUT = 0.3  # the limiters' timeout
# How much longer than TIMEOUT a check may take. A sync check may retry a connection
# that failed at once (within 0.1 x TIMEOUT) and then wait a full TIMEOUT again, and a
# check's task or thread can wait for the CPU on a busy two-core machine: 0.5 s covers
# both with room to spare.
MARGIN = 0.5
FAULT = 0.7  # how long SCRIPT FLUSHes go on, or the server stays down
# How long a CLIENT PAUSE or DEBUG SLEEP lasts: more than TIMEOUT + MARGIN, so that a
# check that waited the stall out instead of giving up would break the bound.
STALL = 1.0
LIMIT, WINDOW_MS = 20, 500
TASKS = 4
THINK = 0.002  # between a task's checks: thousands of checks/s, not a busy loop
BEFORE, AFTER = 0.2, 0.5  # seconds of load before the fault and after it is over
MIN_AFTER = 20  # checks sent after the fault, at least (~100 per task are expected)
POLICIES = pytest.mark.parametrize("on_error", ["raise", "allow", "deny"])


@dataclass
class Run:
    """One load run: every check, and when (wall clock) the fault began and ended."""

    result: LoadResult
    fault_start: float
    fault_end: float
    new_server_from: float | None  # a restart: Redis state before this time is gone
    key_scores: list[int]  # the sliding log right after the run

    @property
    def checks(self) -> Any:
        return self.result.checks


@pytest.fixture(params=["async", "sync"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def admin(private_redis) -> Any:
    """A connection of the test's own to the private server (pause, sleep, flush)."""
    client = redis.asyncio.Redis.from_url(private_redis.url, decode_responses=True)
    yield client
    await client.aclose()


async def run_under_load(
    server: Any, mode: str, on_error: str, fault: Callable[[], Awaitable[float | None]]
) -> Run:
    """Hammer one identity, run `fault` after BEFORE s, go on for AFTER s once it
    returns. `fault` returns the time a new (empty) server took over, if it did."""
    config = LoadConfig(
        server.url,
        window_ms=WINDOW_MS,
        limit=LIMIT,
        clock="redis",
        timeout=TIMEOUT,
        on_error=on_error,
        identity="victim",
        ttl_slack_ms=60_000,  # the log is read after the run: no race with its TTL
    )
    if mode == "async":
        client: Any = ratelimit.connect(server.url)
        limiter: Any = config.limiter(client)
    else:
        client = ratelimit.connect_sync(server.url)
        limiter = ratelimit.sync.SlidingWindowLimiter(
            client,
            prefix=config.prefix,
            window_ms=WINDOW_MS,
            limit=LIMIT,
            clock="redis",
            timeout=TIMEOUT,
            on_error=on_error,
            ttl_slack_ms=60_000,
        )
    stop = asyncio.Event()
    try:
        load = asyncio.create_task(
            hammer(limiter, "victim", tasks=TASKS, duration=30, think_time=THINK, stop=stop)
        )
        await asyncio.sleep(BEFORE)
        fault_start = time.time()
        new_server_from = await fault()
        fault_end = time.time()
        await asyncio.sleep(AFTER)
        stop.set()
        checks = await load
    finally:
        stop.set()
        if mode == "async":
            await client.aclose()
        else:
            client.close()
    with server.client() as reader:
        scores = [int(s) for _, s in reader.zrange(config.key, 0, -1, withscores=True)]
    result = LoadResult.from_checks(config, checks)
    return Run(result, fault_start, fault_end, new_server_from, scores)


def assert_contract(run: Run, on_error: str, *, failures_expected: bool | None) -> None:
    """The promises of the module docstring, for one run."""
    checks = run.checks
    failed = checks[(checks["error"] != "") | checks["degraded"]]
    # Only the documented outcomes: no other exception ever reaches the caller.
    errors = collections.Counter(checks["error"][checks["error"] != ""])
    if on_error == "raise":
        assert set(errors) <= {"RateLimiterUnavailable"}, errors
        assert not checks["degraded"].any()
    else:
        assert not errors, errors
        assert (failed["allowed"] == (on_error == "allow")).all(), failed.head()
    # Never hang.
    slowest = checks["latency"].max()
    assert slowest <= TIMEOUT + MARGIN, f"a check took {slowest:.3f} s"
    # Normal before the fault and once it is over: it resumes by itself.
    before = checks[checks["received"] < run.fault_start]
    after = checks[checks["sent"] >= run.fault_end]
    assert len(before) > 0 and len(after) >= MIN_AFTER, (len(before), len(after))
    for phase, rows in (("before", before), ("after", after)):
        bad = rows[(rows["error"] != "") | rows["degraded"]]
        assert bad.empty, f"{len(bad)} failed checks {phase} the fault:\n{bad.head()}"
    # The fault was real (or, for SCRIPT FLUSH, invisible). None: a quick restart may
    # fall between two checks.
    if failures_expected is not None:
        assert (len(failed) > 0) == failures_expected, len(failed)
    # Never more than the limit in any rolling window of Redis's clock.
    admitted = run.result.admitted
    segments = [admitted]
    if run.new_server_from is not None:
        split = admitted["decided_ms"] < run.new_server_from * 1000
        segments = [admitted[split], admitted[~split]]
    peak = max(LoadResult.from_checks(run.result.config, s).max_admitted() for s in segments)
    assert peak <= LIMIT, f"{peak} admitted in one window of {WINDOW_MS} ms"
    assert run.result.max_admitted() >= LIMIT  # the load really filled the windows
    during = checks[(checks["sent"] < run.fault_end) & (checks["received"] >= run.fault_start)]
    print(  # the figures for a report: pytest -s tests/test_faults.py
        f"\n{on_error}: {len(checks)} checks, {len(failed)} failed (policy), "
        f"{len(during)} during the {run.fault_end - run.fault_start:.2f} s fault, "
        f"max latency {slowest * 1000:.0f} ms, peak {peak}/{LIMIT}"
    )


def assert_log_holds(run: Run, *, exact: bool) -> None:
    """Every admitted request of the last window is in the log; with `exact`, nothing
    else is (a check abandoned at its timeout may still run later: stricter)."""
    result = run.result
    if run.new_server_from is not None:  # the old server's log went with it
        checks = result.checks
        result = LoadResult.from_checks(
            result.config, checks[checks["decided_ms"] >= run.new_server_from * 1000]
        )
    expected = collections.Counter(result.expected_log().tolist())
    actual = collections.Counter(run.key_scores)
    assert not expected - actual, f"lost records: {expected - actual}"
    if exact:
        assert actual == expected
    assert len(run.key_scores) <= LIMIT


# Faults -------------------------------------------------------------------------


async def test_script_flush_during_load_is_invisible(mode, private_redis, admin):
    """SCRIPT FLUSH every 20 ms for FAULT s: no check fails, none over-admits, no
    record is lost or doubled (the EVAL fallback runs each check exactly once)."""

    async def flush_repeatedly() -> None:
        end = time.monotonic() + FAULT
        flushes = 0
        while time.monotonic() < end:
            await admin.script_flush()
            flushes += 1
            await asyncio.sleep(0.02)
        assert flushes >= 10

    run = await run_under_load(private_redis, mode, "raise", flush_repeatedly)
    assert_contract(run, "raise", failures_expected=False)
    assert_log_holds(run, exact=True)


@POLICIES
@pytest.mark.parametrize("outage", [0.0, FAULT], ids=["restart", "stopped"])
async def test_restart_or_outage_during_load(on_error, outage, mode, private_redis):
    """The server stops (checks follow the policy, promptly), stays down for `outage`
    seconds, and starts again empty on the same port: the same limiter and client
    decide normally again without anyone reconnecting them."""

    async def restart() -> float:
        await asyncio.to_thread(private_redis.stop)
        stopped = time.time()
        await asyncio.sleep(outage)
        await asyncio.to_thread(private_redis.start)
        return stopped

    run = await run_under_load(private_redis, mode, on_error, restart)
    # A restart's gap (tens of ms) usually catches a few checks, the outage always does.
    assert_contract(run, on_error, failures_expected=True if outage else None)
    assert_log_holds(run, exact=True)


@POLICIES
async def test_client_pause_longer_than_timeout(on_error, mode, private_redis, admin):
    """CLIENT PAUSE ALL for STALL s: checks give up at their timeout
    and follow the policy; when the pause ends, decisions are normal again."""

    async def pause() -> None:
        await admin.execute_command("CLIENT", "PAUSE", int(STALL * 1000), "ALL")
        await admin.ping()  # held by the pause too: returns when it is over

    run = await run_under_load(private_redis, mode, on_error, pause)
    assert_contract(run, on_error, failures_expected=True)
    assert_log_holds(run, exact=False)


@pytest.mark.parametrize("on_error", ["deny"])
async def test_debug_sleep_longer_than_timeout(on_error, mode, private_redis, admin):
    """DEBUG SLEEP blocks the whole server (unlike CLIENT PAUSE, it does not even
    read new commands): the same bounded, policy-following answers, then recovery."""

    async def sleep() -> None:
        await admin.execute_command("DEBUG", "SLEEP", STALL)

    run = await run_under_load(private_redis, mode, on_error, sleep)
    assert_contract(run, on_error, failures_expected=True)
    assert_log_holds(run, exact=False)
