"""Auto-pipelining (`ratelimit.autopipeline`): a check made while none of its client's
checks waits for Redis goes at once, on its own; the checks made while one waits go
to Redis together, as one write, on the loop's next turn; all decide exactly as the
same checks made one by one.

What is observed, not assumed: every write any asyncio connection sends is recorded
(`writes`) with the script calls it carries, so "one round trip" is a count; the
decisions are compared with the same checks made in sequence by limiters built with
`auto_pipeline=False` on the same backend (the embedded fakeredis, its replies read a
turn after their write as from a socket (`embedded`), a real Redis, a private
redis-server for faults and SCRIPT FLUSH, and the local 3-master cluster).
Faults are made deterministic: a server held by CLIENT PAUSE or stopped, a SCRIPT
FLUSH put into the batch's own write at a chosen place, a task cancelled at a chosen
turn. Durations are bounded with a margin, never used to decide what happened.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot

import ratelimit
from ratelimit import Decision, autopipeline, lanes
from ratelimit.clock import ManualClock
from tests.core.checks import assert_policy, host_stalls

CLASSES = [
    ratelimit.SlidingWindowLimiter,
    ratelimit.FixedWindowLimiter,
    ratelimit.SlidingWindowCounterLimiter,
    ratelimit.TokenBucketLimiter,
]
POLICIES = ("raise", "allow", "deny")
LIMIT = 10
START_MS = 1_796_000_000_000
MARGIN = 0.5  # how much longer than its timeout a check may take, scheduling included
CAUSES = (redis.exceptions.RedisError, TimeoutError)


# Helpers -------------------------------------------------------------------------


class SocketLikeConnection(fakeredis.FakeAsyncRedisConnection):
    """fakeredis's connection, the replies to a write read on a later turn of the loop,
    as from a socket. fakeredis answers in place: up to Python 3.11 redis-py's
    `asyncio.wait_for` around a write ran it as a task of its own, which took a turn;
    from 3.12 `wait_for` awaits in place, so a check on plain fakeredis never waits
    for its reply, no check is made while another waits, and none is batched."""

    _written = False

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        await super().send_packed_command(command, check_health)
        self._written = True

    async def _read_response(self, **kwargs: Any) -> Any:
        # (Inside `read_response`'s guard: a read cancelled here drops the connection.)
        if self._written:
            self._written = False
            await asyncio.sleep(0)
        return await super()._read_response(**kwargs)


def embedded() -> fakeredis.FakeAsyncRedis:
    """The embedded backend of these tests: fakeredis answering as through a socket."""
    return fakeredis.FakeAsyncRedis(connection_class=SocketLikeConnection)


@pytest.fixture
async def client(backend: str, client: Any) -> Any:
    """The conftest's `client`, the embedded one answering as through a socket."""
    if backend != "embedded":
        yield client
        return
    c = embedded()
    yield c
    await c.aclose()


@dataclass
class Write:
    """One write to a Redis connection: where it went and the script calls in it."""

    port: Any
    evalsha: int
    eval: int
    script_load: int


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[Write]:
    """Records every write of every asyncio connection (plain, cluster, fakeredis)."""
    sent: list[Write] = []
    original = AbstractConnection.send_packed_command

    async def recording(self: Any, command: Any, check_health: bool = True) -> None:
        if isinstance(command, str):
            data = command.encode()
        elif isinstance(command, bytes | bytearray):
            data = bytes(command)
        else:
            data = b"".join(bytes(chunk) for chunk in command)
        sent.append(
            Write(
                getattr(self, "port", None),
                data.count(b"\r\nEVALSHA\r\n"),
                data.count(b"\r\nEVAL\r\n"),
                data.count(b"\r\nSCRIPT\r\n$4\r\nLOAD\r\n"),
            )
        )
        return await original(self, command, check_health)

    # (A lane's own write, `lanes._write`, defers to a patched method.)
    monkeypatch.setattr(AbstractConnection, "send_packed_command", recording)
    return sent


def script_writes(sent: list[Write]) -> list[tuple[int, int]]:
    """(EVALSHA, EVAL) per write that carried a script call, in order."""
    return [(w.evalsha, w.eval) for w in sent if w.evalsha or w.eval]


def together(n: int) -> list[tuple[int, int]]:
    """The script writes of `n` checks made in one turn on a client with none in
    flight (`AutoPipeline.alone`): the first goes at once, on its own; the rest,
    made while it waits, share one write, sent once the first is answered (so Redis
    decides them in the order they were made)."""
    return [(1, 0), (n - 1, 0)] if n > 1 else [(1, 0)] * n


def limiters(client: Any, prefix: str, clock: Any = None, **options: Any) -> list[Any]:
    """One limiter of each class on `client`, each under its own prefix."""
    if clock is not None:
        options["clock"] = clock
    return [cls(client, 1, LIMIT, prefix=f"{prefix}:{cls.__name__}", **options) for cls in CLASSES]


async def warm(*some: Any) -> None:
    """One lone check per limiter: scripts loaded, a pooled connection open."""
    for limiter in some:
        assert not (await limiter.check("warm-up")).degraded


async def timed(limiter: Any, identity: str) -> tuple[Decision | Exception, float]:
    start = time.monotonic()
    try:
        outcome: Decision | Exception = await limiter.check(identity)
    except ratelimit.RateLimiterUnavailable as exc:
        outcome = exc
    return outcome, time.monotonic() - start


async def wait_until_paused(admin: Any, clients: int = 1, within: float = 5.0) -> None:
    """Bounded wait until the commands of `clients` clients are held by CLIENT PAUSE."""
    deadline = time.monotonic() + within
    while sum("b" in c["flags"] for c in await admin.client_list()) < clients:
        assert time.monotonic() < deadline, "the checks never reached the server"
        await asyncio.sleep(0.01)


@pytest.fixture
async def private_client(private_redis) -> Any:
    """A plain asyncio client (no socket timeout, no retries) on the private server."""
    client = redis.asyncio.Redis.from_url(private_redis.url)
    yield client
    await client.aclose()


@pytest.fixture
async def admin(private_redis) -> Any:
    client = redis.asyncio.Redis.from_url(private_redis.url, decode_responses=True)
    yield client
    await client.aclose()


# 1. Decisions: the same as the checks made one by one ------------------------------

# A trace: waves of checks made at once (gather), the clock moved between waves. A
# check: (which limiter: one of the four classes, identity, cost).
checks = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from("abc"), st.integers(1, 3)),
    min_size=1,
    max_size=30,
)
traces = st.lists(st.tuples(st.integers(0, 400), checks), min_size=1, max_size=8)
# Always among the examples: one identity far over its limit, on every limiter at once.
# ... and a mixed one: big waves over every limiter, identity and cost.
_rng = random.Random(7)
MIXED = [
    (_rng.randint(0, 400), [(_rng.randint(0, 3), _rng.choice("abc"), _rng.randint(1, 3))
                            for _ in range(30)])
    for _ in range(6)
]  # fmt: skip
OVER = [
    (0, [(i % 4, "a", 1 + i % 2) for i in range(24)]),
    (150, [(i % 4, "a", 1) for i in range(8)]),
]


async def compare_with_one_by_one(
    make_client: Callable[[], Any], prefix: str, trace: list, sent: list[Write], cluster: bool
) -> set[bool]:
    """Run `trace` on auto-pipelined limiters and the same checks one by one on
    unpipelined ones (other keys, same clock); assert equal decisions and, per wave,
    the first check's own write then one write (per node on a cluster) for the rest.
    Returns the answers seen."""
    clock = ManualClock()
    now = START_MS
    clock.set_ms(now)
    client = make_client()
    seen: set[bool] = set()
    try:
        batched = limiters(client, f"{prefix}:on", clock, timeout=10)
        one_by_one = limiters(client, f"{prefix}:off", clock, timeout=10, auto_pipeline=False)
        await warm(*batched, *one_by_one)
        for gap, wave in trace:
            now += gap
            clock.set_ms(now)
            sent.clear()
            got = await asyncio.gather(*(batched[i].check(who, c) for i, who, c in wave))
            carried = [(w.port, w.evalsha, w.eval) for w in sent if w.evalsha or w.eval]
            want = [await one_by_one[i].check(who, c) for i, who, c in wave]
            assert got == want, (wave, got, want)
            assert not any(d.degraded for d in got)
            if cluster:  # the first to its node, then one write per node for the rest
                ports = [
                    client.get_node_from_key(batched[i].key_for(who)).port for i, who, _ in wave
                ]
                per_node = Counter(ports[1:]).items()
                expected = [(ports[0], 1, 0), *((port, n, 0) for port, n in per_node)]
                assert sorted(carried) == sorted(expected), (wave, carried)
            else:  # (a NOSCRIPT would add writes after these)
                expected = together(len(wave))
                assert [(e, v) for _, e, v in carried[: len(expected)]] == expected, carried
            seen.update(d.allowed for d in got)
    finally:
        await client.aclose()
    return seen


def test_decisions_equal_one_by_one_embedded(writes):
    seen: set[bool] = set()

    @settings(max_examples=60, deadline=None)
    @given(trace=traces)
    @example(trace=OVER)
    @example(trace=MIXED)
    def prop(trace):
        seen.update(asyncio.run(compare_with_one_by_one(embedded, "ap", trace, writes, False)))

    prop()
    assert seen == {True, False}


@pytest.mark.real_redis
def test_decisions_equal_one_by_one_real(real_redis_url, prefix, writes):
    seen: set[bool] = set()

    def make() -> Any:
        return redis.asyncio.Redis.from_url(real_redis_url, socket_timeout=10)

    @settings(max_examples=30, deadline=None)
    @given(trace=traces)
    @example(trace=OVER)
    @example(trace=MIXED)
    def prop(trace):
        sub = f"{prefix}:{uuid.uuid4().hex[:8]}"  # the worlds start empty
        seen.update(asyncio.run(compare_with_one_by_one(make, sub, trace, writes, False)))

    prop()
    assert seen == {True, False}


def test_decisions_equal_one_by_one_cluster(cluster, prefix, writes):
    seen: set[bool] = set()

    def make() -> Any:
        return ratelimit.connect(cluster.url, timeout=10)

    @settings(max_examples=20, deadline=None)
    @given(trace=traces)
    @example(trace=OVER)
    @example(trace=MIXED)
    def prop(trace):
        sub = f"{prefix}:{uuid.uuid4().hex[:8]}"
        seen.update(asyncio.run(compare_with_one_by_one(make, sub, trace, writes, True)))

    try:
        prop()
    finally:
        for node in cluster.nodes:  # SCAN is per node
            with node.admin() as admin:
                for key in list(admin.scan_iter(match=f"{prefix}:*", count=1000)):
                    admin.delete(key)  # (one slot per command)
    assert seen == {True, False}


# 2. One round trip -------------------------------------------------------------------


async def test_concurrent_checks_of_four_limiters_share_one_write(client, prefix, writes):
    """40 checks at once over the four algorithms (four scripts) on one client: the
    first goes on its own, one write carries the other 39 EVALSHAs; every check gets
    its own answer."""
    four = limiters(client, prefix)
    await warm(*four)
    writes.clear()
    decisions = await asyncio.gather(*(four[i % 4].check(f"id-{i}", 1 + i % 3) for i in range(40)))
    assert script_writes(writes) == together(40) == [(1, 0), (39, 0)]
    assert [d.remaining for d in decisions] == [LIMIT - 1 - i % 3 for i in range(40)]


@pytest.mark.private_redis
async def test_the_server_runs_each_batched_call_once(private_redis, private_client, admin, writes):
    """On a private server, INFO commandstats counts exactly one EVALSHA per check and
    our client holds one connection (the first check's, which the batch, sent once
    it is answered, takes again): N checks, 2 writes, N scripts run."""
    four = limiters(private_client, "p")
    for limiter in four:  # (a NOSCRIPT's reload would take a connection of its own)
        await admin.script_load(limiter.script)
    await warm(*four)
    await admin.config_resetstat()
    writes.clear()
    decisions = await asyncio.gather(*(four[i % 4].check(f"id-{i}") for i in range(100)))
    assert all(d.allowed and not d.degraded for d in decisions)
    stats = await admin.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 100
    assert "cmdstat_eval" not in stats and "cmdstat_script|load" not in stats
    assert script_writes(writes) == together(100)
    me = await admin.client_id()
    ours = [c for c in await admin.client_list() if int(c["id"]) != me]
    # The first check took the warm connection, and the batch the same one after it.
    assert len(ours) == 1, ours


async def test_a_lone_check_is_sent_at_once_without_a_batch(client, prefix, writes, monkeypatch):
    """A check made while none of its client's checks waits for Redis goes out at
    once as a plain EVALSHA, no batch, no task; those made while it waits batch."""
    submitted = []
    submit = autopipeline.AutoPipeline.submit

    def spy(self, *args):
        submitted.append(args[0])
        return submit(self, *args)

    monkeypatch.setattr(autopipeline.AutoPipeline, "submit", spy)
    limiter = ratelimit.SlidingWindowLimiter(client, 1, LIMIT, prefix=prefix)
    await warm(limiter)
    writes.clear()
    for i in range(5):
        assert (await limiter.check(f"alone-{i}")).allowed
    assert submitted == [] and script_writes(writes) == [(1, 0)] * 5
    writes.clear()
    await asyncio.gather(limiter.check("x"), limiter.check("y"), limiter.check("z"))
    assert submitted == [limiter, limiter] and script_writes(writes) == together(3)


async def test_auto_pipeline_false_sends_each_check_alone(client, prefix, writes):
    limiter = ratelimit.SlidingWindowLimiter(client, 1, LIMIT, prefix=prefix, auto_pipeline=False)
    await warm(limiter)
    writes.clear()
    decisions = await asyncio.gather(*(limiter.check(f"id-{i}") for i in range(10)))
    assert all(d.allowed for d in decisions)
    assert script_writes(writes) == [(1, 0)] * 10


async def test_a_large_turn_is_sent_in_batches_of_at_most_max_batch(client, prefix, writes):
    """2,500 checks of one identity at one instant: the first on its own, then three
    writes of at most 1,000, sent at once (so in any order), and exactly the limit
    admitted whatever it is."""
    clock = ManualClock(1_796_000_000.5)
    limiter = ratelimit.SlidingWindowLimiter(
        client,
        1,
        1000,
        prefix=prefix,
        clock=clock,
        timeout=60,  # fakeredis: ~2,000/s
    )
    await warm(limiter)
    writes.clear()
    decisions = await asyncio.gather(*(limiter.check("busy") for _ in range(2500)))
    first, *batches = script_writes(writes)
    assert first == (1, 0) and sorted(batches) == [(499, 0), (1000, 0), (1000, 0)]
    assert sum(d.allowed for d in decisions) == 1000
    assert not any(d.degraded for d in decisions)


async def test_batches_are_split_at_the_cap(monkeypatch, writes, clock):
    monkeypatch.setattr(autopipeline, "MAX_BATCH", 10)
    # One window for all 25 (a virtual clock), and a timeout no stall of a busy machine
    # reaches: the batches are under test, not how long they take.
    limiter = ratelimit.FixedWindowLimiter(
        embedded(), 1, 100, clock=clock, timeout=60
    )
    await warm(limiter)
    writes.clear()
    decisions = await asyncio.gather(*(limiter.check("k") for _ in range(25)))
    first, *batches = script_writes(writes)  # the first on its own, 24 in batches
    assert first == (1, 0) and sorted(batches) == [(4, 0), (10, 0), (10, 0)]
    assert sorted(d.remaining for d in decisions) == list(range(100 - 25, 100))


async def test_limiters_on_one_client_share_one_batcher():
    one, other = embedded(), embedded()
    a = ratelimit.SlidingWindowLimiter(one, 1, 10)
    b = ratelimit.TokenBucketLimiter(one, 60, 5)
    assert a._batcher is b._batcher is a.with_options(prefix="copy")._batcher
    assert ratelimit.SlidingWindowLimiter(other, 1, 10)._batcher is not a._batcher
    assert a.with_options(auto_pipeline=False)._batcher is None


# 3. Each check keeps its own timeout and failure policy ------------------------------


@pytest.mark.private_redis
async def test_each_check_in_a_batch_keeps_its_timeout_and_policy(private_client, admin, writes):
    """Redis holds the checks (CLIENT PAUSE WRITE for 1.5 s, then answers them): the
    first check, sent on its own, gives up at its 1 s timeout with its own policy; the
    batch made meanwhile goes then. Its checks with a 0.3 s timeout gave up before it
    went, each with its own policy, and are never sent; the one with a 5 s timeout
    gets Redis's answer."""
    opener = ratelimit.SlidingWindowLimiter(
        private_client, 60, LIMIT, prefix="o", on_error="deny", timeout=1
    )
    hurried = {
        policy: ratelimit.SlidingWindowLimiter(
            private_client, 60, LIMIT, prefix=f"h-{policy}", on_error=policy, timeout=0.3
        )
        for policy in POLICIES
    }
    patient = ratelimit.SlidingWindowLimiter(private_client, 60, LIMIT, prefix="p", timeout=5)
    await warm(opener, *hurried.values(), patient)
    writes.clear()
    await admin.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
    with host_stalls() as stolen:
        outcomes = await asyncio.gather(
            *(ended(x, "x") for x in [opener, *hurried.values(), patient])
        )
    (first, first_took, first_end), *rest, (decision, _, _) = outcomes
    assert_policy(first, "deny", *CAUSES)
    assert 0.95 <= first_took < 1 + MARGIN + stolen(), first_took
    for policy, (outcome, took, _) in zip(POLICIES, rest, strict=True):
        assert_policy(outcome, policy, *CAUSES)
        assert 0.25 <= took < 0.3 + MARGIN + stolen(), took
    # A hurried check joins the batch's write only if it had not given up when the
    # first one did (a host that held this process for most of a second between the
    # starts of the checks); otherwise the batch carries the patient check alone.
    late = sum(end > first_end for _, _, end in rest)
    assert script_writes(writes) == [(1, 0), (1 + late, 0)], (late, stolen())
    assert late == 0 or stolen() > 0.5, late
    assert isinstance(decision, Decision) and not decision.degraded
    assert decision.allowed and decision.remaining == LIMIT - 1, decision


async def ended(limiter: Any, identity: str) -> tuple[Decision | Exception, float, float]:
    """`timed`, with the monotonic time at which the caller had its outcome."""
    outcome, took = await timed(limiter, identity)
    return outcome, took, time.monotonic()


@pytest.mark.private_redis
async def test_a_stalled_server_costs_each_check_at_most_its_timeout(private_redis, private_client):
    """A frozen server (SIGSTOP) and 20 checks at once in one batch: every one ends
    degraded after about its timeout; the same limiter answers once the server is back."""
    limiter = ratelimit.SlidingWindowLimiter(
        private_client, 60, LIMIT, prefix="s", on_error="deny", timeout=0.3
    )
    await warm(limiter)
    with private_redis.paused(), host_stalls() as stolen:
        start = time.monotonic()
        decisions = await asyncio.gather(*(limiter.check(f"c{i}") for i in range(20)))
        elapsed = time.monotonic() - start
    assert all(d.degraded and not d.allowed for d in decisions)
    assert elapsed < 0.3 + MARGIN + stolen(), elapsed
    patient = limiter.with_options(timeout=5)  # the same client and batcher
    after = await asyncio.gather(*(patient.check(f"d{i}") for i in range(3)))
    assert all(d.allowed and not d.degraded for d in after), after


@pytest.mark.private_redis
@pytest.mark.parametrize("on_error", POLICIES)
async def test_server_down_each_check_gets_its_policy(on_error, private_redis, private_client):
    """A stopped server: the batch's connection fails (and its one retry); each check of
    the batch applies its limiter's policy, and the same limiters work once it is back."""
    mine = ratelimit.SlidingWindowLimiter(
        private_client, 60, LIMIT, prefix="m", on_error=on_error, timeout=1
    )
    others = {
        p: ratelimit.FixedWindowLimiter(private_client, 60, LIMIT, prefix=p, on_error=p, timeout=1)
        for p in POLICIES
    }
    await warm(mine, *others.values())
    private_redis.stop()
    with host_stalls() as stolen:
        outcomes = await asyncio.gather(
            timed(mine, "x"), *(timed(o, "x") for o in others.values())
        )
    for policy, (outcome, elapsed) in zip((on_error, *POLICIES), outcomes, strict=True):
        assert_policy(outcome, policy, *CAUSES)
        assert elapsed < 1 + MARGIN + stolen(), elapsed
    private_redis.start()
    after = await asyncio.gather(mine.check("y"), *(o.check("y") for o in others.values()))
    assert all(d.allowed and not d.degraded for d in after), after


async def test_an_error_reply_fails_only_its_own_check(client, prefix):
    """One identity's key holds the wrong type (a WRONGTYPE error for its script): that
    check alone gets its policy; the others of the same batch are decided."""
    strict = ratelimit.SlidingWindowLimiter(client, 60, LIMIT, prefix=f"{prefix}:s")
    lenient = ratelimit.SlidingWindowLimiter(
        client, 60, LIMIT, prefix=f"{prefix}:l", on_error="allow"
    )
    await warm(strict, lenient)
    await client.rpush(strict.key_for("broken"), "x")  # a type no algorithm uses
    await client.rpush(lenient.key_for("broken"), "x")
    outcomes = await asyncio.gather(
        timed(strict, "ok-1"),
        timed(strict, "broken"),
        timed(lenient, "broken"),
        timed(lenient, "ok-2"),
    )
    (ok1, _), (broken, _), (allowed, _), (ok2, _) = outcomes
    assert_policy(broken, "raise", redis.exceptions.ResponseError)
    assert_policy(allowed, "allow")
    for d in (ok1, ok2):
        assert isinstance(d, Decision) and d.allowed and not d.degraded and d.remaining == LIMIT - 1


@pytest.mark.private_redis
async def test_restart_between_batches_is_retried_once(private_redis, private_client):
    """A restart closes the pooled connection: the next batch fails on it once, goes
    again on a fresh one, and every check gets a normal answer (the server is empty,
    so each identity is new)."""
    four = limiters(private_client, "r")
    await warm(*four)
    private_redis.restart()
    decisions = await asyncio.gather(*(four[i % 4].check(f"id-{i}") for i in range(12)))
    assert all(d.allowed and not d.degraded and d.remaining == LIMIT - 1 for d in decisions)


# 4. NOSCRIPT: a flushed script cache, between batches and inside one ---------------


def flushing_client(where: str, request: pytest.FixtureRequest) -> Any:
    """SCRIPT FLUSH empties the cache of every user of a server: only fakeredis or a
    private server."""
    if where == "embedded":
        return embedded()
    return redis.asyncio.Redis.from_url(request.getfixturevalue("private_redis").url)


def wave(n: int) -> list[tuple[int, str, int]]:
    return [(i % 4, "abc"[i % 3], 1 + i % 2) for i in range(n)]


async def run_waves(four: list[Any], waves: list[list], between: Callable[[int], Any]) -> list:
    """The waves of checks, each made at once; `between(k)` is awaited before wave k."""
    decisions = []
    for k, checks_ in enumerate(waves):
        await between(k)
        decisions += await asyncio.gather(*(four[i].check(w, c) for i, w, c in checks_))
    return decisions


@pytest.mark.parametrize("where", ["embedded", "private"])
async def test_script_flush_between_batches_is_invisible(where, request, writes):
    """A SCRIPT FLUSH between two waves: the second's first check meets NOSCRIPT and
    goes again behind its script's SCRIPT LOAD; then its batch, whose calls of the
    three other scripts meet NOSCRIPT and go again behind their loads (in one write);
    it decides exactly as a run without the flush."""
    client = flushing_client(where, request)
    try:
        clock = ManualClock(1_796_000_000.5)
        control, flushed = limiters(client, "c", clock), limiters(client, "f", clock)
        await warm(*control, *flushed)
        plan = [wave(12), wave(14)]

        async def nothing(k: int) -> None:
            return None

        async def flush_before_second(k: int) -> None:
            if k == 1:
                assert await client.script_flush()
                writes.clear()

        expected = await run_waves(control, plan, nothing)
        got = await run_waves(flushed, plan, flush_before_second)
        assert got == expected
        # The first check, twice (its NOSCRIPT, then behind its script's load: in its
        # write on a lane, just before it through the client); then the batch, and
        # again its calls of the other three scripts, behind their three loads.
        first, *rest = plan[1]
        others = sum(1 for i, _, _ in rest if i != first[0])
        carried = script_writes(writes)
        assert carried == [(1, 0), (1, 0), (13, 0), (others, 0)], carried
        assert [w.script_load for w in writes if w.evalsha == others] == [3]
        assert sum(w.script_load for w in writes) == 1 + 3
    finally:
        await client.aclose()


def flush_inside(
    monkeypatch: pytest.MonkeyPatch, four: list[Any], stage: int, after: int
) -> list[int]:
    """Put a SCRIPT FLUSH into a batch's own write: in the `stage`-th round trip of a
    batch of these limiters (0: the EVALSHAs, 1: the reload), after its first `after`
    commands (another client's flush landing right there, made deterministic).
    Returns the sizes of the batch's round trips. (A batch's round trips, unlike a
    lone check's, carry no key: see `autopipeline._plain`.)"""
    calls: list[int] = []

    for limiter in four:
        send = limiter._send

        async def with_flush(key: Any, commands: list, send: Any = send) -> Any:
            if key is not None:  # a check sent on its own
                return await send(key, commands)
            calls.append(len(commands))
            if len(calls) - 1 != stage:
                return await send(key, commands)
            flushed = [*commands[:after], ("SCRIPT", "FLUSH"), *commands[after:]]
            replies = await send(key, flushed)
            assert replies[after] in (b"OK", "OK", True)
            return replies[:after] + replies[after + 1 :]

        monkeypatch.setattr(limiter, "_send", with_flush)
    return calls


@pytest.mark.parametrize("where", ["embedded", "private"])
async def test_script_flush_inside_a_batch_counts_nothing_twice(
    where, request, monkeypatch, writes
):
    """20 checks at once (the first on its own, 19 in a batch) and a flush after the
    7th of the batch's EVALSHAs: those 7 ran, the 12 after it met NOSCRIPT and did
    not; only those are sent again (with the scripts reloaded). Decisions are those
    of a run without the flush, and the log holds exactly the admitted units."""
    client = flushing_client(where, request)
    try:
        clock = ManualClock(1_796_000_000.5)
        control, flushed = limiters(client, "c", clock), limiters(client, "f", clock)
        await warm(*control, *flushed)
        plan = wave(20)
        expected = await asyncio.gather(*(control[i].check(w, c) for i, w, c in plan))
        stages = flush_inside(monkeypatch, flushed, stage=0, after=7)
        writes.clear()
        got = await asyncio.gather(*(flushed[i].check(w, c) for i, w, c in plan))
        assert got == expected
        assert stages == [19, 12 + 4]  # the 12 again, after reloading the 4 scripts
        assert script_writes(writes) == [*together(20), (12, 0)]
        # Nothing counted twice: the next check of each identity on each limiter is
        # answered exactly as after the run without the flush.
        again = [(i, who, 1) for i in range(4) for who in "abc"]
        assert await asyncio.gather(*(flushed[i].check(w, c) for i, w, c in again)) == [
            await control[i].check(w, c) for i, w, c in again
        ]
    finally:
        await client.aclose()


@pytest.mark.parametrize("where", ["embedded", "private"])
async def test_a_second_flush_after_the_reload_falls_back_to_eval(
    where, request, monkeypatch, writes
):
    """Flushed once before 9 checks at once: the first check, on its own, reloads its
    script and is answered; the batch then meets NOSCRIPT for the calls of the three
    other scripts, which a second flush, right after their reload in the batch's
    second write, sends a third time with EVAL (which carries the script), once each."""
    client = flushing_client(where, request)
    try:
        clock = ManualClock(1_796_000_000.5)
        control, flushed = limiters(client, "c", clock), limiters(client, "f", clock)
        await warm(*control, *flushed)
        plan = wave(9)
        expected = await asyncio.gather(*(control[i].check(w, c) for i, w, c in plan))
        assert await client.script_flush()
        stages = flush_inside(monkeypatch, flushed, stage=1, after=3)  # after the 3 LOADs
        writes.clear()
        got = await asyncio.gather(*(flushed[i].check(w, c) for i, w, c in plan))
        assert got == expected
        first, *rest = plan
        others = sum(1 for i, _, _ in rest if i != first[0])  # not the first's script
        assert stages == [8, 3 + others, others]
        # The first check's two writes (its NOSCRIPT, then its reload), then the
        # batch's three.
        carried = script_writes(writes)
        assert carried == [(1, 0), (1, 0), (8, 0), (others, 0), (0, others)], carried
    finally:
        await client.aclose()


# 5. Cancellation ---------------------------------------------------------------------


async def test_a_check_cancelled_before_the_flush_is_not_sent(client, prefix, writes):
    limiter = ratelimit.SlidingWindowLimiter(client, 1, LIMIT, prefix=prefix)
    await warm(limiter)
    writes.clear()
    tasks = [asyncio.create_task(limiter.check(f"id-{i}")) for i in range(5)]
    if asyncio.get_running_loop().get_task_factory() is None:
        await asyncio.sleep(0)  # the five ran up to their await; the flush is the next turn
    # (An eager task factory ran them inside create_task: the flush is already next.)
    tasks[2].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[2], asyncio.CancelledError)
    assert all(isinstance(d, Decision) and d.allowed for i, d in enumerate(results) if i != 2)
    assert script_writes(writes) == [(1, 0), (3, 0)]  # the first alone; the batch lost one
    assert await client.exists(limiter.key_for("id-2")) == 0  # never counted


@pytest.mark.private_redis
async def test_a_check_cancelled_during_the_round_trip_leaves_the_others(
    private_client, admin, writes, monkeypatch
):
    """Redis holds the batch (paused right before it is sent); a task of the batch is
    cancelled meanwhile: it raises CancelledError (no decision, no policy), and the
    others get Redis's answers."""
    limiter = ratelimit.SlidingWindowLimiter(private_client, 60, LIMIT, prefix="c", timeout=10)
    await warm(limiter)
    send = limiter._send

    async def pause_before_the_batch(key: Any, commands: list) -> Any:
        if key is None:  # a batch's round trip (a lone check's carries its key)
            await admin.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
        return await send(key, commands)

    monkeypatch.setattr(limiter, "_send", pause_before_the_batch)
    writes.clear()
    try:
        tasks = [asyncio.create_task(limiter.check("same")) for _ in range(5)]
        await wait_until_paused(admin)  # the batch's, sent after the first's answer
        tasks[2].cancel()
        with pytest.raises(asyncio.CancelledError):
            await tasks[2]
        assert tasks[0].done() and not any(t.done() for t in (tasks[1], *tasks[3:]))
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
    rest = await asyncio.gather(tasks[0], tasks[1], *tasks[3:])
    assert script_writes(writes) == together(5)
    # Redis ran all five (the cancelled one was already sent): 1..5 counted, in order.
    assert [d.remaining for d in rest] == [LIMIT - 1, LIMIT - 2, LIMIT - 4, LIMIT - 5]


def test_a_batch_left_open_by_a_stopped_loop_is_not_reused():
    """A loop stopped before its batch was flushed, its tasks cancelled and the loop
    closed: the next loop starts a batch of its own instead of joining the dead one."""
    client = embedded()
    limiter = ratelimit.SlidingWindowLimiter(client, 1, LIMIT, timeout=1)
    loop = asyncio.new_event_loop()

    def open_a_batch_and_stop() -> None:
        keys, args = limiter._prepare("left", 1)
        limiter._batcher.submit(limiter, keys, args)  # its flush would run next turn
        loop.stop()  # ... but the loop ends with this turn

    loop.call_soon(open_a_batch_and_stop)
    loop.run_forever()
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()
    assert len(pending) == 1 and limiter._batcher._open is not None  # the dead batch

    async def check_twice() -> list[Decision]:
        return list(await asyncio.gather(limiter.check("a"), limiter.check("b")))

    assert all(d.allowed and not d.degraded for d in asyncio.run(check_twice()))


# 6. The near-cache, the option -------------------------------------------------------


async def test_cached_rejections_never_reach_redis(client, prefix, writes):
    limiter = ratelimit.SlidingWindowLimiter(client, 60, 2, prefix=prefix, near_cache=True)
    for _ in range(3):
        await limiter.check("abuser")  # the third is rejected, and remembered
    writes.clear()
    decisions = await asyncio.gather(
        *(limiter.check("abuser") for _ in range(10)), *(limiter.check(f"ok-{i}") for i in range(5))
    )
    assert [d.allowed for d in decisions] == [False] * 10 + [True] * 5
    assert script_writes(writes) == together(5)  # only the five others went to Redis


def test_auto_pipeline_is_an_option_fixed_once_built():
    client = embedded()
    for cls in CLASSES:
        assert cls(client, 1, 10).auto_pipeline is True
        assert cls(client, 1, 10, auto_pipeline=False).auto_pipeline is False
        for bad in ("no", 0, None, 1):
            with pytest.raises(ValueError, match="auto_pipeline must be True or False"):
                cls(client, 1, 10, auto_pipeline=bad)
    limiter = ratelimit.SlidingWindowLimiter(client, 1, 10)
    with pytest.raises(AttributeError, match=r"with_options\(auto_pipeline="):
        limiter.auto_pipeline = False
    off = limiter.with_options(auto_pipeline=False)
    assert limiter.auto_pipeline and not off.auto_pipeline
    assert off.with_options(prefix="other").auto_pipeline is False


@pytest.mark.parametrize(
    "command",
    [
        ("EVALSHA", "a" * 40, 1, "rl:log:{abc}", 1_796_000_000_123, b"1000", b"10", 3, b"0"),
        ("EVAL", "return 1", 1, "ключ:{日本}", -5, b"", 2**70, b"\x00\xff\r\n"),
        ("SCRIPT", "LOAD", "return redis.call('GET', KEYS[1])"),
        ("EVALSHA", "b" * 40, 1, "k", 1.5, memoryview(b"mv"), 1),  # redis-py's own rules
    ],
)
def test_packed_commands_are_redis_pys_bytes(command):
    conn = redis.asyncio.Connection()
    commands = [command, command[:3]]
    assert b"".join(lanes.packed(conn, commands)) == b"".join(
        bytes(c) for c in conn.pack_commands(commands)
    )


# 7. The cluster: one write per node, and a stalled node holds up only its own checks --


def identities_on(cluster: Any, limiter: Any, n: int) -> dict[int, list[str]]:
    """The first `n` identities `n<i>` whose key this limiter keeps, for each node."""
    with cluster.nodes[0].admin() as admin:
        ranges = [
            (int(start), int(end), cluster.ports.index(int(master[1])))
            for start, end, master, *_ in admin.execute_command("CLUSTER SLOTS")
        ]
    found: dict[int, list[str]] = {node: [] for node in range(len(cluster.ports))}
    for i in range(10_000):
        slot = key_slot(limiter.key_for(f"n{i}").encode())
        node = next(node for start, end, node in ranges if start <= slot <= end)
        if len(found[node]) < n:
            found[node].append(f"n{i}")
    assert all(len(who) == n for who in found.values()), found
    return found


async def test_cluster_batch_is_one_write_per_node(cluster, prefix, writes):
    """Checks of two algorithms (two scripts) over the three masters at once: the
    first goes to its node on its own; the batch of the others is one write per
    node, whatever the scripts."""
    client = ratelimit.connect(cluster.url, timeout=5)
    try:
        log = ratelimit.SlidingWindowLimiter(client, 60, LIMIT, prefix=prefix)
        bucket = ratelimit.TokenBucketLimiter(client, 60, LIMIT, prefix=prefix)
        await warm(log, bucket)
        on_log, on_bucket = identities_on(cluster, log, 2), identities_on(cluster, bucket, 2)
        writes.clear()
        made = [
            (limiter, w)
            for node in range(3)
            for limiter, people in ((log, on_log), (bucket, on_bucket))
            for w in people[node]
        ]
        decisions = await asyncio.gather(*(limiter.check(w) for limiter, w in made))
        assert all(d.allowed and not d.degraded for d in decisions)
        per_port = sorted((w.port, w.evalsha) for w in writes if w.evalsha)
        first, *others = cluster.ports  # (the first check's node)
        assert per_port == sorted([(first, 1), (first, 3), *((port, 4) for port in others)])
    finally:
        await client.aclose()


async def test_a_paused_cluster_node_holds_up_only_its_own_checks(cluster, prefix):
    """CLIENT PAUSE on one master while a batch spans all three: the checks on its
    slots get the policy at their timeout; those on the other two are decided."""
    client = ratelimit.connect(cluster.url, timeout=5)
    try:
        limiter = ratelimit.SlidingWindowLimiter(
            client, 60, LIMIT, prefix=prefix, on_error="deny", timeout=1.0
        )
        await warm(limiter)
        people = identities_on(cluster, limiter, 2)
        for node in range(3):  # warm each node's connection
            assert not (await limiter.check(people[node][0])).degraded
        with cluster.nodes[1].admin() as node_admin:
            node_admin.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
            try:
                who = [p for node in range(3) for p in people[node]]
                decisions = await asyncio.gather(*(limiter.check(w) for w in who))
            finally:
                node_admin.execute_command("CLIENT", "UNPAUSE")
        for w, d in zip(who, decisions, strict=True):
            if w in people[1]:
                assert d.degraded and not d.allowed, (w, d)
            else:
                assert d.allowed and not d.degraded, (w, d)
    finally:
        await client.aclose()
