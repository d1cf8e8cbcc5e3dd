"""Checks sent alone on the client's idle connections (the lanes of `ratelimit.lanes`,
`AsyncLane.send` for asyncio, `SyncLane.send` for sync): the same decisions and
guarantees as redis-py's own calls.

- No reply is ever left unread on a connection that is used again: after a check that
  timed out, was cancelled or met an error reply, the next check gets its own answer
  (each check here has an identity and a cost of its own, so a stale reply would show
  in `remaining`).
- A connection killed server-side while idle is retried once, and the check decides.
- NOSCRIPT met on an idle connection: reload and retry, then EVAL (through the client).
- Threads sharing a sync limiter decide exactly; connections are given back, to the
  pool or to the client's close; a new event loop gets connections of its own.
- The embedded fakeredis and a cluster keep their own paths, and so does a client
  whose `execute_command` is not redis-py's own (a wrapper sees every check).

Faults are deterministic (CLIENT PAUSE, CLIENT KILL, SCRIPT FLUSH at a chosen step);
nothing is decided by a duration.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio

import ratelimit
import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable, lanes
from ratelimit.lanes import MAX_IDLE, _run_now
from tests.core.checks import check

LIMIT = 10

pytestmark = pytest.mark.private_redis


@pytest.fixture(params=["async", "sync"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make(private_redis, plain_clients) -> Any:
    """Makes plain clients (asyncio or sync) on the private server; closed after."""
    return lambda mode, **kwargs: plain_clients(mode, private_redis.url, **kwargs)


@pytest.fixture
async def admin(make) -> redis.asyncio.Redis:
    return make("async", decode_responses=True)


def limiter_of(mode: str, client: Any, **options: Any) -> Any:
    # A generous timeout unless a test sets its own: these tests decide nothing by a
    # duration, and a loaded CI machine once took over a second to open a connection.
    options.setdefault("timeout", 10.0)
    module = ratelimit if mode == "async" else ratelimit.sync
    return module.SlidingWindowLimiter(client, 60, LIMIT, **options)


def lane_of(limiter: Any) -> Any:
    return limiter._lane


def pool_counts(limiter: Any) -> tuple[int, int, int]:
    """(idle in the lane, in use in the pool, available in the pool)."""
    pool = lane_of(limiter).pool
    return (
        lane_of(limiter).idle,
        len(pool._in_use_connections),
        len(pool._available_connections),
    )


async def others(admin: redis.asyncio.Redis) -> list[dict]:
    """The server's client connections other than the admin's own."""
    me = await admin.client_id()
    return [c for c in await admin.client_list() if int(c["id"]) != me]


async def wait_until_paused(admin: redis.asyncio.Redis, within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not any("b" in c["flags"] for c in await admin.client_list()):
        assert loop.time() < deadline, "the check never reached the server"
        await asyncio.sleep(0.01)


async def assert_all_given_back(
    limiter: Any, admin: redis.asyncio.Redis, count_on_server: bool = True
) -> None:
    """No connection is lost: the pool counts in use only the lane's idle ones, and
    the server sees exactly the pool's connections that are open."""
    lane = lane_of(limiter)
    pool = lane.pool
    assert set(pool._in_use_connections) == set(lane._idle)
    if count_on_server:
        every = [*pool._available_connections, *pool._in_use_connections]
        assert len(await others(admin)) == sum(c.is_connected for c in every)


async def handed_back(limiter: Any) -> None:
    """Let the loop turn until the asyncio lane has given its kept connections back
    to the pool (it does so on the turn after a check, in a few steps)."""
    lane = lane_of(limiter)
    for _ in range(20):
        if not lane.idle and not lane.pool._in_use_connections:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"still kept after 20 turns: {pool_counts(limiter)}")


def assert_answer(decision: Decision, remaining: int) -> None:
    assert decision.allowed and not decision.degraded, decision
    assert decision.remaining == remaining, decision


# Which path ------------------------------------------------------------------------


class Counting(redis.asyncio.Redis):
    """A client that sends its own way (as a tracing subclass does): it records the
    name of every command it is asked to send."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self.seen.append(args[0])
        return await super().execute_command(*args, **kwargs)


def traced(client: Any) -> list[Any]:
    """Wrap `client.execute_command` on the client itself (as a tracer may, at any
    time); returns the names of the commands it is asked to send from then on."""
    seen: list[Any] = []
    own = client.execute_command

    def execute_command(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[0])
        return own(*args, **kwargs)

    client.execute_command = execute_command
    return seen


async def lane_took(limiter: Any, identity: str, remaining: int) -> bool:
    """Make a check (it must decide `remaining`) and say whether the lane sent it: a
    lane keeps the connection of a check it sent (the asyncio one until the loop's
    next turn, so that check is awaited here, not in a thread)."""
    lane = lane_of(limiter)
    if isinstance(limiter, ratelimit.sync.SyncLimiter):
        lane.close()
        assert_answer(await asyncio.to_thread(limiter.check, identity), remaining)
    else:
        await handed_back(limiter)
        assert_answer(await limiter.check(identity), remaining)
    return lane.idle == 1


async def test_real_clients_take_the_lone_path_others_keep_theirs(
    make, admin, cluster, private_redis
):
    """A redis-py client's checks go on its lane (also with `wait_replicas`: WAIT
    follows on the same connection). A client that sends its own way, by a subclass
    or by a wrapper set on it at any time (tracing), gets every check through its
    `execute_command` while it is so. The embedded fakeredis and a cluster get no lane."""
    for mode in ("async", "sync"):
        client = make(mode)
        for options in ({}, {"wait_replicas": 1}):
            limiter = limiter_of(mode, client, **options)
            assert lane_of(limiter) is not None and lanes.untouched(limiter._client)
        limiter = limiter_of(mode, client)
        await admin.script_load(limiter.script)  # (no reload: one command a check)
        assert await lane_took(limiter, mode, LIMIT - 1)

        # The client the limiter sends through: the caller's for asyncio, the sync
        # limiter's own copy bounded by its timeout (see backends.bounded_client).
        sender = limiter._client
        seen = traced(sender)  # (after the limiter was built)
        assert not lanes.untouched(sender)
        assert not await lane_took(limiter, mode, LIMIT - 2)
        assert seen == ["EVALSHA"]
        del sender.execute_command  # the wrapper removed: the lane again
        assert lanes.untouched(sender) and await lane_took(limiter, mode, LIMIT - 3)
        assert seen == ["EVALSHA"]

    own_way = Counting.from_url(private_redis.url)
    own_way.seen = []
    try:
        limiter = limiter_of("async", own_way, prefix="own")
        assert not lanes.untouched(own_way)
        for i in range(3):
            assert not await lane_took(limiter, "bob", LIMIT - 1 - i)
        assert own_way.seen == ["EVALSHA"] * 3
    finally:
        await own_way.aclose()
    for embedded in (fakeredis.FakeAsyncRedis(), fakeredis.FakeRedis()):
        mode = "sync" if isinstance(embedded, redis.Redis) else "async"
        assert lane_of(limiter_of(mode, embedded)) is None
    on_cluster = ratelimit.connect(cluster.url)
    try:
        assert lane_of(limiter_of("async", on_cluster)) is None
    finally:
        await on_cluster.aclose()
    sync_cluster = ratelimit.connect_sync(cluster.url)
    try:
        assert lane_of(limiter_of("sync", sync_cluster)) is None
    finally:
        sync_cluster.close()


async def test_checks_one_at_a_time_reuse_one_connection(mode, make, admin):
    limiter = limiter_of(mode, make(mode))
    assert_answer(await check(limiter, "alice"), LIMIT - 1)  # (its reload takes another)
    before = await others(admin)
    for i in range(1, 6):
        assert_answer(await check(limiter, "alice"), LIMIT - 1 - i)
    assert [c["id"] for c in await others(admin)] == [c["id"] for c in before]
    # Sync keeps its connection; asyncio gave it back when the loop turned (above).
    assert pool_counts(limiter)[:2] == ((1, 1) if mode == "sync" else (0, 0))
    await assert_all_given_back(limiter, admin)


async def test_a_kept_connection_goes_back_to_the_pool_on_the_next_turn(make):
    """A check keeps its connection only for a check that follows at once: once the
    loop has turned, a pool bounded at two serves two commands at once (one short, it
    would raise MaxConnectionsError); the next check leases one from the pool again."""
    client = make("async", max_connections=2)
    limiter = limiter_of("async", client)
    assert_answer(await limiter.check("alice"), LIMIT - 1)  # (the script loaded)
    await handed_back(limiter)
    assert_answer(await limiter.check("alice"), LIMIT - 2)
    lane = lane_of(limiter)
    (kept,) = lane._idle  # for a check made now
    await handed_back(limiter)
    assert kept in lane.pool._available_connections
    assert await asyncio.gather(client.ping(), client.ping()) == [True, True]
    assert_answer(await limiter.check("alice"), LIMIT - 3)
    assert lane.idle == 1 and len(lane.pool._in_use_connections) == 1


@pytest.mark.parametrize("options", [{"decode_responses": True}, {"protocol": 3}])
async def test_decoded_and_resp3_replies_decide_alike(mode, options, make, admin):
    limiter = limiter_of(mode, make(mode, **options))
    for i in range(3):
        assert_answer(await check(limiter, "alice", 2), LIMIT - 2 * (i + 1))
    await admin.script_flush()  # SCRIPT LOAD's reply is text either way
    assert_answer(await check(limiter, "alice", 2), LIMIT - 8)
    assert isinstance(limiter.script_sha, str)


# Nothing left unread ---------------------------------------------------------------


@pytest.mark.parametrize("on_error", ["raise", "deny"])
async def test_a_check_that_timed_out_leaves_no_reply_for_the_next(mode, on_error, make, admin):
    """CLIENT PAUSE holds a check past its timeout; once the pause is over the next
    check, of another identity and cost, gets its own answer, and the connection of
    the timed-out check went back to the pool closed (none is in use but the idle)."""
    limiter = limiter_of(mode, make(mode), timeout=0.3, on_error=on_error)
    assert_answer(await check(limiter, "warm"), LIMIT - 1)
    await admin.execute_command("CLIENT", "PAUSE", 3_000, "WRITE")
    try:
        pending = asyncio.create_task(check(limiter, "held"))
        await wait_until_paused(admin)
        try:
            outcome: Any = await pending
        except RateLimiterUnavailable as exc:
            outcome = exc
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
    if on_error == "raise":
        assert isinstance(outcome, RateLimiterUnavailable), outcome
    else:
        assert outcome.degraded and not outcome.allowed, outcome
    assert_answer(await check(limiter, "next", 3), LIMIT - 3)
    assert_answer(await check(limiter, "warm", 2), LIMIT - 3)
    idle, in_use, _ = pool_counts(limiter)
    assert in_use == idle == 1


async def test_a_cancelled_check_leaves_no_reply_for_the_next(make, admin):
    limiter = limiter_of("async", make("async"))
    assert_answer(await limiter.check("warm"), LIMIT - 1)
    await admin.execute_command("CLIENT", "PAUSE", 3_000, "WRITE")
    try:
        pending = asyncio.create_task(limiter.check("held"))
        await wait_until_paused(admin)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
    assert_answer(await limiter.check("next", 4), LIMIT - 4)
    await handed_back(limiter)  # (the cancelled check's connection was closed)


async def test_an_error_reply_keeps_the_connection_and_the_next_answer(mode, make, admin):
    """A key of the wrong type makes the script fail (an error reply, read whole):
    that check goes to the policy, the connection stays, the next check decides."""
    client = make(mode)
    limiter = limiter_of(mode, client, on_error="deny", prefix="wrong")
    assert_answer(await check(limiter, "warm"), LIMIT - 1)
    await admin.set(limiter.key_for("str"), "not a log")
    failed = await check(limiter, "str")
    assert failed.degraded and not failed.allowed, failed
    assert_answer(await check(limiter, "next", 5), LIMIT - 5)
    assert pool_counts(limiter)[:2] == (1, 1)
    await assert_all_given_back(limiter, admin)


# Dropped connections ---------------------------------------------------------------


async def test_idle_connections_killed_server_side_are_retried_once(mode, make, admin):
    """Several idle connections, all killed by the server: each next check decides
    (on_error="raise" would show any failure), and the admits are exactly the limit
    (a killed connection never carried the check, so nothing counts twice)."""
    if mode == "async":
        limiter = limiter_of(mode, make(mode), on_error="raise", auto_pipeline=False)
        await asyncio.gather(*(limiter.check("warm") for _ in range(MAX_IDLE)))
    else:  # (threads may or may not overlap: lease the connections outright)
        limiter = limiter_of(mode, make(mode), on_error="raise")
        lane = lane_of(limiter)
        for _ in range(MAX_IDLE):
            conn = lane.pool.get_connection()  # (connected)
            lane._idle.append(conn)
        assert lane.idle == MAX_IDLE
    await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    decisions = [await check(limiter, "alice") for _ in range(LIMIT + 2)]
    assert [d.allowed for d in decisions] == [True] * LIMIT + [False] * 2
    assert not any(d.degraded for d in decisions)
    # (The pool's own idle ones, killed too, are noticed only on their next use.)
    await assert_all_given_back(limiter, admin, count_on_server=False)


# NOSCRIPT --------------------------------------------------------------------------


async def test_noscript_reloads_then_falls_back_to_eval(mode, make, admin, flush_after_script_load):
    """EVALSHA (NOSCRIPT), SCRIPT LOAD, EVALSHA (NOSCRIPT again), EVAL: the check
    decides, each command ran once, and every connection went back."""
    limiter = limiter_of(mode, make(mode))
    await admin.config_resetstat()
    assert_answer(await check(limiter, "alice"), LIMIT - 1)
    stats = await admin.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 2
    assert stats["cmdstat_evalsha"]["rejected_calls"] == 0
    assert stats["cmdstat_script|load"]["calls"] == 1
    assert stats["cmdstat_eval"]["calls"] == 1
    assert_answer(await check(limiter, "alice"), LIMIT - 2)  # EVAL cached the script
    idle, in_use, _ = pool_counts(limiter)
    assert in_use == idle == 1


async def test_script_flush_between_checks_reloads_once(mode, make, admin):
    limiter = limiter_of(mode, make(mode))
    assert_answer(await check(limiter, "alice"), LIMIT - 1)
    await admin.script_flush()
    assert_answer(await check(limiter, "alice"), LIMIT - 2)
    assert (await admin.script_exists(limiter.script_sha)) == [True]
    await assert_all_given_back(limiter, admin)


# Threads, close, loops -------------------------------------------------------------


def with_threads(limiter: Any, threads: int, each: int, identity: str) -> list[Decision]:
    """`threads` threads that each make `each` checks of `identity` at once."""
    start = threading.Barrier(threads)
    out: list[list[Decision]] = [[] for _ in range(threads)]

    def run(k: int) -> None:
        start.wait()
        out[k] = [limiter.check(identity) for _ in range(each)]

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return [d for part in out for d in part]


async def test_threads_sharing_a_sync_limiter_admit_exactly_the_limit(make, admin):
    limiter = ratelimit.sync.SlidingWindowLimiter(make("sync"), 60, 37, on_error="raise")
    decisions = await asyncio.to_thread(with_threads, limiter, 8, 25, "shared")
    assert len(decisions) == 200 and not any(d.degraded for d in decisions)
    assert sum(d.allowed for d in decisions) == 37
    # Every connection went back: the lane keeps at most MAX_IDLE, the pool the rest.
    assert pool_counts(limiter)[0] <= MAX_IDLE
    await assert_all_given_back(limiter, admin)


async def test_aclose_closes_the_idle_connections(make, admin):
    client = make("async")
    limiter = limiter_of("async", client, auto_pipeline=False)
    assert_answer(await limiter.check("id-0"), LIMIT - 1)  # the script loaded
    await asyncio.gather(*(limiter.check(f"id-{i}") for i in range(1, 11)))
    await handed_back(limiter)
    assert_answer(await limiter.check("id-1"), LIMIT - 2)  # keeps its connection
    assert pool_counts(limiter)[0] == 1
    await assert_all_given_back(limiter, admin)
    await client.aclose()
    assert await others(admin) == []
    assert not any(conn.is_connected for conn in lane_of(limiter)._idle)
    assert_answer(await limiter.check("id-0"), LIMIT - 2)  # usable again, as redis-py is


def test_a_new_event_loop_gets_connections_of_its_own(private_redis):
    """Two `asyncio.run` on one client, closed at the end of each (what redis-py
    supports): the second run decides normally, on connections of its own loop, and
    the first run's were given back to the pool."""
    client = redis.asyncio.Redis.from_url(private_redis.url)
    limiter = limiter_of("async", client, on_error="raise")

    async def run(expected: int) -> Any:
        assert_answer(await limiter.check("alice"), expected)
        loop_of_idle = lane_of(limiter)._idle_loop
        await client.aclose()
        return loop_of_idle

    first = asyncio.run(run(LIMIT - 1))
    second = asyncio.run(run(LIMIT - 2))
    assert first is not second
    # The first loop's connection went back to the pool (closed by aclose), which
    # lent it again to the second loop: none is left behind in use.
    idle, in_use, _ = pool_counts(limiter)
    assert idle == in_use <= 1


def test_a_forked_child_does_not_reuse_the_parents_connections(private_redis):
    """The lane notices a new process id (as after fork) and leaves the idle
    connections, whose sockets the parent still uses, for new ones of its own."""
    client = redis.Redis.from_url(private_redis.url)
    try:
        limiter = limiter_of("sync", client)
        assert_answer(limiter.check("alice"), LIMIT - 1)
        lane = lane_of(limiter)
        parents = list(lane._idle)
        lane._pid = -1  # what a child sees: a pid that is not its own
        assert_answer(limiter.check("alice"), LIMIT - 2)
        assert lane._idle and lane._idle[0] not in parents
    finally:
        client.close()


@pytest.fixture
def sync_pair(private_redis) -> Iterator[tuple[Any, Any]]:
    client = redis.Redis.from_url(private_redis.url)
    yield client, limiter_of("sync", client)
    client.close()


def test_limiters_built_alike_share_one_lane(sync_pair, make):
    client, limiter = sync_pair
    assert lane_of(limiter_of("sync", client)) is lane_of(limiter)
    async_client = make("async")
    assert lane_of(limiter_of("async", async_client)) is lane_of(
        limiter_of("async", async_client, auto_pipeline=False)
    )


async def test_a_client_nobody_uses_is_not_kept_alive(private_redis):
    """The lanes hold the pool and its connections, never the client: once the
    client and its limiters are gone, so is the client (and its registry entries)."""
    client = redis.asyncio.Redis.from_url(private_redis.url)
    limiter = limiter_of("async", client)
    assert_answer(await limiter.check("alice"), LIMIT - 1)
    sync_client = redis.Redis.from_url(private_redis.url)
    sync_limiter = limiter_of("sync", sync_client)
    assert_answer(sync_limiter.check("alice"), LIMIT - 2)
    gone = [weakref.ref(client), weakref.ref(sync_client), weakref.ref(sync_limiter._client)]
    await client.aclose()
    sync_client.close()
    del client, limiter, sync_client, sync_limiter
    gc.collect()
    assert [ref() for ref in gone] == [None, None, None]


async def test_a_release_is_run_at_once_or_finished_by_a_task():
    """The hand-back runs the pool's release to its end at once when it never waits;
    one that waits (to reconnect, say) is finished by a task, its waits kept."""
    loop = asyncio.get_running_loop()
    steps: list[str] = []

    async def quick() -> None:
        steps.append("quick")

    tasks: set[asyncio.Task] = set()
    _run_now(quick(), loop, tasks)
    assert steps == ["quick"] and not tasks

    gate = loop.create_future()

    async def waits() -> None:
        steps.append("start")
        await asyncio.sleep(0)
        steps.append("slept")
        try:
            await gate
        except ValueError:
            steps.append("saw the error")

    _run_now(waits(), loop, tasks)
    assert steps[1:] == ["start"] and len(tasks) == 1
    for _ in range(3):
        await asyncio.sleep(0)
    assert steps[1:] == ["start", "slept"]
    gate.set_exception(ValueError("reconnect failed"))
    await asyncio.gather(*tasks)
    assert steps[1:] == ["start", "slept", "saw the error"] and not tasks
