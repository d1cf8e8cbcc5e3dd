"""The limiters under failure: script cache flushes, restarts, Redis down or slow.

Every scenario runs for the asyncio limiters and the synchronous ones
(`ratelimit.sync`, whose checks run in a worker thread here so that the test can
act on the server meanwhile). Restarts, outages, pauses and killed connections
happen only on a private redis-server (`private_redis`), never on the shared one.
Durations are measured with `time.monotonic()` and asserted with a margin.

The first part checks single requests around each fault. The second ("under load")
lands the same faults while several tasks (or threads) hammer one identity, and
records every check (`tests.core.loadgen.hammer`). For each fault and failure policy:

- every check returns within the limiter's timeout plus MARGIN, and its outcome is a
  normal decision or exactly what the policy documents (raise `RateLimiterUnavailable`,
  or a degraded allow / deny), never another exception;
- the checks answered before the fault, and those sent once it is over, are normal
  decisions: service resumes by itself;
- the decisions Redis made never admit more than the limit in any rolling window of
  Redis's clock (a restart empties the server, so before and after are counted apart),
  and the sliding log still holds every admitted request of the last window.

Under load the limiters read Redis's clock: with the app clock a check stamped before it
waited in the client's queue may be counted against an earlier window (see
test_load.py), which is a property of that clock, not of these faults.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import functools
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import ratelimit
import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable, algorithms
from ratelimit.devtools.process import free_port
from tests.core.checks import (
    assert_policy,
    check,
    check_many,
    host_stalls,
    stalled_within,
    timed_check,
)
from tests.core.loadgen import LoadConfig, LoadResult, hammer

ALGORITHMS = pytest.mark.parametrize("algorithm", algorithms.NAMES)
POLICIES = pytest.mark.parametrize("on_error", ["raise", "allow", "deny"])

TIMEOUT = 0.5  # the limiters' timeout in the outage and slowness tests
MARGIN = 0.5  # how much longer than its timeout a check may take, scheduling included
# What a "raise" policy's RateLimiterUnavailable is chained from: a Redis error or a timeout.
CAUSES = (redis.exceptions.RedisError, TimeoutError)
LIMIT = 5

# How the test's own asyncio clients retry. Note that in redis-py 8 a client made by
# `Redis.from_url(url)` does not retry at all; `Redis(host=..., port=...)` gets the
# constructor's default (10 retries, exponential backoff with jitter).
RETRIES = {
    "from_url": {},
    "default-retry": {
        "retry": copy.deepcopy(
            inspect.signature(redis.asyncio.Redis.__init__).parameters["retry"].default
        )
    },
    "no-retry": {"retry": Retry(NoBackoff(), 0)},
}


# Helpers -------------------------------------------------------------------------


@pytest.fixture(params=["async", "sync"])
def mode(request: pytest.FixtureRequest) -> str:
    """Runs a test once with the asyncio limiters and once with `ratelimit.sync`."""
    return request.param


def limiter_of(algorithm: str, mode: str) -> Callable[..., Any]:
    """What builds `algorithm`'s limiter in `mode` (the log as a sorted set, whose
    members some tests read)."""
    return functools.partial(algorithms.get(algorithm).build, mode)


async def resolve(result: Any) -> Any:
    """The value of a sync call's result, or of an asyncio call's awaitable."""
    return await result if inspect.isawaitable(result) else result


def assert_fresh(decision: Decision, limit: int = LIMIT) -> None:
    """A normal (not degraded) answer to the first request of an unknown identity."""
    assert decision.allowed and not decision.degraded, decision
    assert decision.remaining == limit - 1, decision


@pytest.fixture
def admin(private_redis, plain_clients) -> redis.asyncio.Redis:
    """A separate asyncio connection to the private server, for pausing and killing."""
    return plain_clients("async", private_redis.url, decode_responses=True)


async def wait_until_paused(admin: redis.asyncio.Redis, within: float = 5.0) -> None:
    """Wait (bounded) until some client's command is being held by CLIENT PAUSE."""
    deadline = time.monotonic() + within
    while not any("b" in c["flags"] for c in await admin.client_list()):
        assert time.monotonic() < deadline, "the check never reached the server"
        await asyncio.sleep(0.01)


async def kill_other_clients(admin: redis.asyncio.Redis) -> None:
    """Drop every connection to the private server except the admin's own."""
    await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


async def flush_scripts(client: Any, sha: str) -> None:
    """SCRIPT FLUSH, then check that `sha` is gone: one transaction, so that no other
    user of a shared server can reload the script in between."""
    pipe = client.pipeline(transaction=True)
    pipe.script_flush()
    pipe.script_exists(sha)
    assert await resolve(pipe.execute()) == [True, [False]]


def script_sha(limiter: Any) -> str:
    """SHA1 of the limiter's Lua script, as redis-py's `register_script` computed it."""
    return limiter.script_sha


# 1. SCRIPT FLUSH -----------------------------------------------------------------


@ALGORITHMS
@pytest.mark.parametrize("where", ["embedded", "private"])
async def test_script_flush_is_invisible(
    algorithm, mode, where, request, plain_clients, prefix, clock
):
    """After SCRIPT FLUSH (NOSCRIPT on the next call) the limiter reloads its script:
    12 checks at 10/s with a flush after the 5th still give exactly 10 allowed and
    2 rejected, the very decisions of an identical run without a flush. (A real server
    here is a private one: SCRIPT FLUSH empties the cache of every user of a server,
    and other tests and notebooks share the system Redis.)"""
    if where == "embedded":
        client = fakeredis.FakeAsyncRedis() if mode == "async" else fakeredis.FakeRedis()
    else:
        client = plain_clients(mode, request.getfixturevalue("private_redis").url)
    limiter = limiter_of(algorithm, mode)(client, 1, 10, prefix=prefix, clock=clock)
    sha = script_sha(limiter)

    control = [await check(limiter, "control") for _ in range(12)]
    flushed = []
    for n in range(12):
        if n == 5:
            await flush_scripts(client, sha)
        flushed.append(await check(limiter, "flushed"))

    assert [d.allowed for d in flushed] == [True] * 10 + [False] * 2
    assert flushed == control


async def test_flush_during_reload_is_invisible(
    mode, private_redis, plain_clients, flush_after_script_load
):
    """A SCRIPT FLUSH between the reload and the retried EVALSHA must not reach the
    caller either (seen for real: parallel runs of the flush test above on one server)."""
    client = plain_clients(mode, private_redis.url)
    limiter = limiter_of("log", mode)(client, 60, LIMIT)
    assert_fresh(await check(limiter, "alice"))
    with private_redis.client() as admin:  # the call that met the second flush went by EVAL
        assert admin.info("commandstats")["cmdstat_eval"]["calls"] == 1


# 2. Restart, dropped connections --------------------------------------------------


@ALGORITHMS
@pytest.mark.parametrize("retry", list(RETRIES))
async def test_async_limiter_survives_restart(algorithm, retry, private_redis, plain_clients):
    """A restart breaks the pooled connection and loses all data: the same limiter on
    the same plain client answers the next check normally, as for a fresh identity.
    With the client's retries disabled this is the limiter's own retry at work."""
    client = plain_clients("async", private_redis.url, **RETRIES[retry])
    limiter = limiter_of(algorithm, "async")(client, 60, LIMIT)
    for expected in range(LIMIT - 1, LIMIT - 4, -1):
        assert (await limiter.check("alice")).remaining == expected

    private_redis.restart()

    assert_fresh(await limiter.check("alice"))


@ALGORITHMS
async def test_sync_limiter_survives_restart(algorithm, private_redis, plain_clients):
    """The same for `ratelimit.sync` with a plain `redis.Redis`."""
    client = plain_clients("sync", private_redis.url)
    limiter = limiter_of(algorithm, "sync")(client, 60, LIMIT)
    for expected in range(LIMIT - 1, LIMIT - 4, -1):
        assert limiter.check("alice").remaining == expected

    private_redis.restart()

    assert_fresh(limiter.check("alice"))


async def test_no_retry_client_really_fails_after_restart(private_redis, plain_clients):
    """Control for the restart tests: without a retry, the first command on a pooled
    connection fails after a restart (redis-py's asyncio pool does not notice)."""
    client = plain_clients("async", private_redis.url, **RETRIES["no-retry"])
    await client.ping()
    private_redis.restart()
    with pytest.raises(redis.exceptions.ConnectionError):
        await client.ping()


async def test_concurrent_checks_survive_restart(mode, private_redis, plain_clients):
    """Several pooled connections all broken by one restart: concurrent checks on
    the same limiter each get a normal answer, and together admit exactly the limit."""
    client = plain_clients(mode, private_redis.url)
    limiter = limiter_of("log", mode)(client, 60, LIMIT)

    async def burst(n: int) -> list[Decision]:
        return list(await asyncio.gather(*(check(limiter, "bob") for _ in range(n))))

    assert all(d.allowed for d in await burst(LIMIT))  # several pooled connections
    private_redis.restart()

    after = await burst(2 * LIMIT)
    assert not any(d.degraded for d in after)
    assert sum(d.allowed for d in after) == LIMIT


async def test_connection_dropped_mid_check_is_retried(mode, private_redis, plain_clients, admin):
    """The server drops the connection while a check waits for its answer (the pool
    cannot see that coming): the limiter retries once on a new connection, and the
    dropped attempt, never executed, is not counted."""
    client = plain_clients(mode, private_redis.url)  # from_url: no redis-py retry
    # A long timeout: the drop comes early in the check, as a restart's would, and
    # the check ends as soon as the pause is lifted.
    limiter = limiter_of("log", mode)(client, 60, LIMIT, timeout=5.0)
    assert_fresh(await check(limiter, "alice"))

    await admin.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")  # holds EVALSHA
    try:
        pending = asyncio.create_task(check(limiter, "alice"))
        await wait_until_paused(admin)
        await kill_other_clients(admin)
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")

    decision = await pending
    assert decision.allowed and not decision.degraded, decision
    assert decision.remaining == LIMIT - 2, decision


class LosingProxy:
    """A loopback TCP proxy to Redis that loses script replies on demand: `lose(n)`
    makes the next n connections that send a script call (EVAL/EVALSHA) pass it on to
    Redis, which runs it, and then close instead of passing the reply back: a
    connection dropped after the script ran and before its reply came (what a failover
    or a network cut can do). Everything else goes through unchanged."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.armed = 0
        self.lost = 0  # replies thrown away
        self.server: asyncio.Server | None = None
        self.sessions: set[asyncio.Task] = set()
        self.writers: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def lose(self, n: int) -> None:
        self.armed = n

    async def __aenter__(self) -> LosingProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:  # every session ends, its connections closed
            writer.close()
        await asyncio.gather(*self.sessions, return_exceptions=True)
        await self.server.wait_closed()

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter):
        self.sessions.add(asyncio.current_task())  # type: ignore[arg-type]
        self.writers.append(client_out)
        redis_in, redis_out = await asyncio.open_connection(*self.target)
        self.writers.append(redis_out)
        doomed = asyncio.Event()

        async def up() -> None:
            while data := await client_in.read(1 << 16):
                if self.armed and b"EVAL" in data and not doomed.is_set():
                    self.armed -= 1
                    doomed.set()  # before Redis can answer: its reply is the one lost
                redis_out.write(data)
                await redis_out.drain()

        async def down() -> None:
            while data := await redis_in.read(1 << 16):
                if doomed.is_set():
                    self.lost += 1
                    return
                client_out.write(data)
                await client_out.drain()

        pumps = [asyncio.create_task(up()), asyncio.create_task(down())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for writer in (client_out, redis_out):
                writer.close()
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)


async def test_a_reply_lost_after_the_script_ran_is_charged_twice_and_counted(
    mode, real_redis_url, prefix, plain_clients
):
    """The bound on a retry (README, "Guarantees"): a connection that drops after Redis
    ran the script loses its reply; the limiter sends the check once more, and Redis
    charges it twice. Every such resend is counted in `limiter.resends`, the log holds
    exactly one entry more per resend than the admits the caller was told of, and no
    more than the limit is ever admitted. The same for a batch (`check_many`), whose
    every call goes again."""
    parsed = redis.connection.parse_url(real_redis_url)
    async with LosingProxy(parsed.get("host", "127.0.0.1"), parsed.get("port", 6379)) as proxy:
        # from_url: no redis-py retry; the same database as the admin client below.
        client = plain_clients(mode, proxy.url, db=parsed.get("db", 0))
        # A long timeout: a sync limiter retries only within a tenth of it, and the
        # machine may be busy; nothing here waits for it to run out.
        limiter = limiter_of("log", mode)(client, 60, LIMIT, prefix=prefix, timeout=30.0)
        assert_fresh(await check(limiter, "warm-up"))  # the script is loaded

        proxy.lose(1)
        first = await check(limiter, "alice")
        assert proxy.lost == 1 and limiter.resends == 1
        assert first.allowed and not first.degraded, first
        assert first.remaining == LIMIT - 2, first  # charged twice: stricter
        rest = [await check(limiter, "alice") for _ in range(LIMIT)]
        told = 1 + sum(d.allowed for d in rest)
        assert told == LIMIT - limiter.resends  # never more admits, one less per resend
        assert [d.allowed for d in rest] == [True] * (told - 1) + [False] * (LIMIT - told + 1)

        proxy.lose(1)
        batch = await check_many(limiter, ["bob", "bob", "carol"])
        assert proxy.lost == 2 and limiter.resends == 1 + 3
        assert [(d.allowed, d.degraded, d.remaining) for d in batch] == [
            (True, False, LIMIT - 3),  # bob's two checks ran before the reply was lost,
            (True, False, LIMIT - 4),  # then again: each charged twice
            (True, False, LIMIT - 2),
        ]
    admin = redis.Redis.from_url(real_redis_url)
    try:
        counts = {who: admin.zcard(limiter.key_for(who)) for who in ("alice", "bob", "carol")}
    finally:
        admin.close()
    assert counts == {"alice": LIMIT, "bob": 4, "carol": 2}


# 3. Redis down ---------------------------------------------------------------------


@POLICIES
async def test_redis_down_applies_policy_then_recovers(
    on_error, mode, private_redis, plain_clients
):
    """With the server stopped, each check applies the failure policy promptly; once
    the server is back on the same port, the same limiter works again by itself."""
    client = plain_clients(mode, private_redis.url)
    limiter = limiter_of("log", mode)(client, 60, LIMIT, on_error=on_error, timeout=TIMEOUT)
    assert_fresh(await check(limiter, "alice"))

    private_redis.stop()
    for _ in range(3):
        with host_stalls() as stolen:
            outcome, elapsed = await timed_check(limiter, "alice")
        assert_policy(outcome, on_error, *CAUSES)
        assert elapsed < TIMEOUT + MARGIN + stolen(), f"a check took {elapsed:.2f} s"

    private_redis.start()
    assert_fresh(await check(limiter, "alice"))


async def test_redis_down_cause_is_the_redis_error(mode, private_redis, plain_clients):
    """Under "raise", the refused connection itself is chained as `__cause__`."""
    client = plain_clients(mode, private_redis.url)
    limiter = limiter_of("log", mode)(client, 60, LIMIT, timeout=TIMEOUT)
    private_redis.stop()
    with pytest.raises(RateLimiterUnavailable) as info:
        await check(limiter, "alice")
    assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)


async def test_redis_down_with_retrying_client_is_bounded(private_redis, plain_clients):
    """An asyncio client with redis-py's default retries (10, with backoff) would keep
    reconnecting for seconds: the limiter still gives up after its timeout."""
    client = plain_clients("async", private_redis.url, **RETRIES["default-retry"])
    limiter = ratelimit.SlidingWindowLimiter(client, 60, LIMIT, timeout=TIMEOUT)
    private_redis.stop()
    with host_stalls() as stolen:
        outcome, elapsed = await timed_check(limiter, "alice")
    assert_policy(outcome, "raise", *CAUSES)
    assert elapsed < TIMEOUT + MARGIN + stolen(), f"the check took {elapsed:.2f} s"


# 4. Slow Redis ---------------------------------------------------------------------

PAUSE_MS = 1500  # long enough that waiting it out would break the TIMEOUT + MARGIN bound


@POLICIES
async def test_slow_redis_gives_up_after_timeout(
    on_error, mode, private_redis, plain_clients, admin
):
    """While Redis stalls (CLIENT PAUSE ... ALL) a check gives up after about `timeout`
    and applies the policy; once the pause is over the same limiter works again."""
    client = plain_clients(mode, private_redis.url)
    limiter = limiter_of("log", mode)(client, 60, LIMIT, on_error=on_error, timeout=TIMEOUT)
    assert_fresh(await check(limiter, "alice"))  # a warm pooled connection

    await admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
    with host_stalls() as stolen:
        outcome, elapsed = await timed_check(limiter, "alice")
    assert_policy(outcome, on_error, *CAUSES)
    # PAUSE_MS - TIMEOUT > MARGIN: a check that waited the pause out cannot pass.
    assert elapsed < TIMEOUT + MARGIN + stolen(), f"the check took {elapsed:.2f} s"
    if on_error == "raise":  # the message names the stall, not an empty TimeoutError
        assert "Timeout" in str(outcome) or "within" in str(outcome), str(outcome)
    # Under PAUSE ALL, UNPAUSE is itself held until the pause ends: a bounded wait.
    start = time.monotonic()
    await admin.execute_command("CLIENT", "UNPAUSE")
    assert time.monotonic() - start < PAUSE_MS / 1000 + MARGIN

    assert_fresh(await check(limiter, "bob"))
    # The abandoned call may still run once the pause ends (counted: stricter, never
    # over-admitting), so for "alice" only ask for a normal answer.
    assert not (await check(limiter, "alice")).degraded


async def test_retry_stays_within_timeout(mode, private_redis, plain_clients, admin):
    """A connection dropped late in a check, then a server that still does not answer:
    the retry must not get a timeout of its own; the whole check ends by `timeout`."""
    timeout = 1.0
    client = plain_clients(mode, private_redis.url)
    limiter = limiter_of("log", mode)(client, 60, LIMIT, timeout=timeout)
    assert_fresh(await check(limiter, "alice"))

    await admin.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")  # holds EVALSHA
    try:
        with host_stalls() as stolen:
            pending = asyncio.create_task(timed_check(limiter, "alice"))
            await wait_until_paused(admin)
            await asyncio.sleep(0.8 * timeout)  # the first attempt uses most of the budget
            await kill_other_clients(admin)  # ... then fails; the retry is held too
            outcome, elapsed = await pending
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")

    assert_policy(outcome, "raise", *CAUSES)
    assert elapsed < timeout + MARGIN + stolen(), f"the check took {elapsed:.2f} s"


# 5. Bad input ----------------------------------------------------------------------

BAD_INPUT = [
    pytest.param("", 1, id="empty-identity"),
    pytest.param(b"", 1, id="empty-bytes-identity"),
    pytest.param(None, 1, id="none-identity"),
    pytest.param("alice", 0, id="cost-0"),
    pytest.param("alice", -1, id="cost-negative"),
    pytest.param("alice", LIMIT + 1, id="cost-over-limit"),
    pytest.param("alice", 1.5, id="cost-float"),
]


@pytest.mark.parametrize(("identity", "cost"), BAD_INPUT)
async def test_bad_input_is_not_a_redis_failure(identity, cost, mode, plain_clients):
    """ValueError even under on_error="allow" and with no server at all: bad input is
    the caller's bug, never turned into a degraded allow."""
    client = plain_clients(mode, f"redis://127.0.0.1:{free_port()}/0")  # nobody listens
    limiter = limiter_of("log", mode)(client, 60, LIMIT, on_error="allow", timeout=TIMEOUT)
    with pytest.raises(ValueError):
        await check(limiter, identity, cost=cost)


class Stalled(fakeredis.FakeAsyncRedis):
    """A client whose script calls never answer (a stalled server)."""

    async def execute_command(self, *args, **kwargs):
        if args[0] == "EVALSHA":
            await asyncio.Event().wait()
        return await super().execute_command(*args, **kwargs)


async def test_the_timeout_bounds_every_check():
    """Stalled checks, alone or many at once, end degraded after about `timeout`."""
    # Stalled stubs EVALSHA only, so the checks go one by one (the same bound for a
    # batch: test_autopipeline.py::test_a_stalled_server_costs_each_check_at_most_its_timeout).
    limiter = ratelimit.SlidingWindowLimiter(
        Stalled(), 1, 10, on_error="deny", timeout=0.2, auto_pipeline=False
    )
    loop = asyncio.get_running_loop()
    start = loop.time()
    decisions = await asyncio.gather(*(limiter.check(f"c{i}") for i in range(20)))
    assert all(d.degraded and not d.allowed for d in decisions)
    assert loop.time() - start < 0.2 + 1.0  # generous margin for a busy machine
    start = loop.time()
    assert (await limiter.check("again")).degraded
    assert loop.time() - start >= 0.19  # (timers may fire within clock resolution)


async def test_a_cancelled_check_is_cancelled_not_degraded():
    """A caller's own cancellation must propagate, not turn into a decision."""
    limiter = ratelimit.SlidingWindowLimiter(Stalled(), 1, 10, on_error="deny", timeout=5)
    task = asyncio.ensure_future(limiter.check("a"))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# Under load ------------------------------------------------------------------------

LOAD_TIMEOUT = 0.3  # the limiters' timeout under load
# MARGIN covers a sync check that retries a connection that failed at once (within
# 0.1 x timeout) and then waits a full timeout again, and a task or thread waiting for
# the CPU on a busy two-core machine.
FAULT = 0.7  # how long SCRIPT FLUSHes go on, or the server stays down
# How long a CLIENT PAUSE or DEBUG SLEEP lasts: more than LOAD_TIMEOUT + MARGIN, so that a
# check that waited the stall out instead of giving up would break the bound.
STALL = 1.0
LOAD_LIMIT, WINDOW_MS = 20, 500
TASKS = 4
THINK = 0.002  # between a task's checks: thousands of checks/s, not a busy loop
BEFORE, AFTER = 0.2, 0.5  # seconds of load before the fault and after it is over
MIN_AFTER = 20  # checks sent after the fault, at least (~100 per task are expected)


@dataclass
class Run:
    """One load run: every check, and when (wall clock) the fault began and ended."""

    result: LoadResult
    fault_start: float
    fault_end: float
    new_server_from: float | None  # a restart: Redis state before this time is gone
    key_scores: list[int]  # the sliding log right after the run
    stalls: list[tuple[float, float]]  # when the host kept the test process waiting

    @property
    def checks(self) -> Any:
        return self.result.checks


async def run_under_load(
    server: Any, mode: str, on_error: str, fault: Callable[[], Awaitable[float | None]]
) -> Run:
    """Hammer one identity, run `fault` after BEFORE s, go on for AFTER s once it
    returns. `fault` returns the time a new (empty) server took over, if it did."""
    config = LoadConfig(
        server.url,
        window_ms=WINDOW_MS,
        limit=LOAD_LIMIT,
        clock="redis",
        timeout=LOAD_TIMEOUT,
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
            storage="sorted-set",  # its members are read back
            prefix=config.prefix,
            window_ms=WINDOW_MS,
            limit=LOAD_LIMIT,
            clock="redis",
            timeout=LOAD_TIMEOUT,
            on_error=on_error,
            ttl_slack_ms=60_000,
        )
    stop = asyncio.Event()
    stalls: list[tuple[float, float]] = []
    try:
        with host_stalls(events=stalls):
            load = asyncio.create_task(
                hammer(limiter, "victim", tasks=TASKS, duration=30, think_time=THINK, stop=stop)
            )
            await asyncio.sleep(BEFORE)
            # On a busy host the load's threads can take longer than BEFORE to start: the
            # fault waits until the server has counted a few checks.
            await _until_counted(server, config.key, 5)
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
    return Run(result, fault_start, fault_end, new_server_from, scores, stalls)


async def _until_counted(server: Any, key: str, n: int, deadline_s: float = 10.0) -> None:
    """Wait until `key` holds `n` entries on `server` (at most `deadline_s`)."""
    give_up = time.monotonic() + deadline_s
    with server.client() as reader:
        while reader.zcard(key) < n and time.monotonic() < give_up:
            await asyncio.sleep(0.02)


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
    # What the host took from the test process while each check ran: a busy machine's
    # share, which a bound on the library adds and a failure outside the fault explains
    # only when it is a good part of the timeout.
    stolen = [
        stalled_within(run.stalls, sent, received)
        for sent, received in zip(checks["sent"], checks["received"], strict=True)
    ]
    checks = checks.assign(stolen=stolen)
    # Never hang.
    over = checks[checks["latency"] > LOAD_TIMEOUT + MARGIN + checks["stolen"]]
    assert over.empty, f"checks over timeout + margin + host stalls:\n{over.head()}"
    # Normal before the fault and once it is over: it resumes by itself.
    before = checks[checks["received"] < run.fault_start]
    after = checks[checks["sent"] >= run.fault_end]
    assert len(before) > 0 and len(after) >= MIN_AFTER, (len(before), len(after))
    for phase, rows in (("before", before), ("after", after)):
        bad = rows[(rows["error"] != "") | rows["degraded"]]
        bad = bad[bad["stolen"] < LOAD_TIMEOUT / 3]
        assert bad.empty, f"{len(bad)} failed checks {phase} the fault:\n{bad.head()}"
    slowest = checks["latency"].max()
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
    assert peak <= LOAD_LIMIT, f"{peak} admitted in one window of {WINDOW_MS} ms"
    assert run.result.max_admitted() >= LOAD_LIMIT  # the load really filled the windows
    during = checks[(checks["sent"] < run.fault_end) & (checks["received"] >= run.fault_start)]
    print(  # the figures for a report: pytest -s tests/core/test_failures.py -k load
        f"\n{on_error}: {len(checks)} checks, {len(failed)} failed (policy), "
        f"{len(during)} during the {run.fault_end - run.fault_start:.2f} s fault, "
        f"max latency {slowest * 1000:.0f} ms, peak {peak}/{LOAD_LIMIT}"
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
    assert len(run.key_scores) <= LOAD_LIMIT


# Faults under load --------------------------------------------------------------


@pytest.mark.private_redis
async def test_script_flush_during_load_is_invisible(mode, private_redis, admin):
    """SCRIPT FLUSH every 20 ms for FAULT s, and at least 10 times: no check fails, none
    over-admits, no record is lost or doubled (the EVAL fallback runs each check exactly
    once)."""

    async def flush_repeatedly() -> None:
        # Bounded by a count as well as by time: on a busy machine 20 ms sleeps can
        # stretch so that FAULT s hold only a few flushes.
        end = time.monotonic() + FAULT
        flushes = 0
        while flushes < 10 or time.monotonic() < end:
            await admin.script_flush()
            flushes += 1
            await asyncio.sleep(0.02)

    run = await run_under_load(private_redis, mode, "raise", flush_repeatedly)
    assert_contract(run, "raise", failures_expected=False)
    assert_log_holds(run, exact=True)


@pytest.mark.private_redis
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


@pytest.mark.private_redis
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


@pytest.mark.private_redis
@pytest.mark.parametrize("on_error", ["deny"])
async def test_debug_sleep_longer_than_timeout(on_error, mode, private_redis, admin):
    """DEBUG SLEEP blocks the whole server (unlike CLIENT PAUSE, it does not even
    read new commands): the same bounded, policy-following answers, then recovery."""

    async def sleep() -> None:
        await admin.execute_command("DEBUG", "SLEEP", STALL)

    run = await run_under_load(private_redis, mode, on_error, sleep)
    assert_contract(run, on_error, failures_expected=True)
    assert_log_holds(run, exact=False)
