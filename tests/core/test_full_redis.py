"""A Redis that fills up, on private servers (never the shared one).

Under `maxmemory-policy noeviction` a full Redis refuses writes. The limiters load
their scripts with a Redis 7 shebang (`ratelimit/scripts.py`), so Redis refuses the
whole check before its first command: every limiter then answers by its failure
policy, promptly, and writes nothing; once memory is freed, its decisions resume from
the state it had. Without the shebang a script whose first write deletes something
(the log's trim of aged-out entries) gets past the memory check and admits for real:
`test_without_the_shebang_a_trim_lets_the_write_through` shows that on the same server.

Under an evicting policy a full Redis deletes keys to make room, limiter keys
included (they all carry a TTL, so `volatile-*` policies pick them too): a client whose
key is evicted gets its whole budget again. The eviction tests measure that
over-admission; it is a risk to warn about (`ratelimit.doctor` does), not something a
limiter can prevent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from ratelimit import RateLimiterUnavailable, algorithms, scripts
from ratelimit.clock import ManualClock
from ratelimit.devtools.server import RedisServer
from tests.conftest import _missing
from tests.core.checks import assert_policy, check, check_many, host_stalls

pytestmark = pytest.mark.private_redis

# The four algorithms and the compact log, by the tag in their keys.
KINDS = [*algorithms.NAMES, algorithms.COMPACT_LOG.name]
POLICIES = ["allow", "deny", "raise"]
MODES = ["async", "sync"]

MAXMEMORY = 4 * 1024 * 1024  # small, so that filling it takes a few hundred writes
FILLER = 10_000  # bytes per filler value: the cache that fills memory
WINDOW_S, LIMIT = 60, 10
TIMEOUT = 0.5  # the limiters' timeout
MARGIN = 0.5  # how much longer than its timeout a check may take on a busy machine
T0 = 1_000_000.0  # the virtual time at which the state was written
AGED = T0 + WINDOW_S + 1  # every entry written at T0 has left the window by now
BEFORE = 3  # admits each identity got before memory filled up


def make(kind: str, mode: str, client: Any, clock: ManualClock, **kwargs: Any) -> Any:
    """The limiter of `kind` ("log", "fw", "swc", "gcra", "logc") for `client`."""
    return algorithms.get(kind).build(
        mode, client, WINDOW_S, LIMIT, f"full:{kind}", clock=clock, **kwargs
    )


def start_server(policy: str, maxmemory: int = MAXMEMORY) -> RedisServer:
    if not RedisServer.available():
        _missing("redis-server is not installed; the full-Redis tests need it")
    args = ("--maxmemory", str(maxmemory), "--maxmemory-policy", policy)
    return RedisServer(args=args).start()


def fill(client: redis.Redis, *, ttl_ms: int | None = None, limit: int = 5000) -> int:
    """Write filler values until Redis refuses one for lack of memory; how many it took."""
    for n in range(limit):
        try:
            client.set(f"filler:{n}", b"x" * FILLER, px=ttl_ms)
        except redis.exceptions.OutOfMemoryError:
            return n
    raise AssertionError(f"{limit} filler values never filled {MAXMEMORY} bytes")


def squeeze(client: redis.Redis, by: int = 512 * 1024) -> None:
    """Put maxmemory well below what is used: a full Redis stays full even when a
    connection that closes gives back its buffers (a few kB), so no test can pass or
    fail by a write that slipped in at the edge."""
    used = client.info("memory")["used_memory"]
    client.config_set("maxmemory", used - by)


def free(client: redis.Redis) -> None:
    """Delete the filler (DEL is allowed on a full Redis: it frees memory)."""
    filler = list(client.scan_iter(match="filler:*", count=1000))
    client.delete(*filler)


def memory(client: redis.Redis) -> dict[str, Any]:
    info = client.info("memory")
    return {"used": info["used_memory"], "max": info["maxmemory"]}


def state(client: redis.Redis) -> tuple[str, int]:
    """A digest of the whole keyspace (any write changes it) and the number of keys."""
    return client.execute_command("DEBUG", "DIGEST"), client.dbsize()


# noeviction: the failure policy decides ----------------------------------------------


@pytest.fixture(scope="module")
def full() -> Iterator[RedisServer]:
    """A private server under noeviction holding every limiter's state for the
    identities "aged" and "other" (BEFORE admits each at T0), then filled to maxmemory."""
    server = start_server("noeviction")
    try:
        with server.client() as admin:
            clock = ManualClock(T0)
            for kind in KINDS:
                limiter = make(kind, "sync", admin, clock)
                for _ in range(BEFORE):
                    made = limiter.check_many(["aged", "other"])
                    assert all(d.allowed and not d.degraded for d in made), made
            fill(admin)
            squeeze(admin)
        yield server
    finally:
        server.close()


async def outcome_of(call: Any) -> Any:
    """What a check gave: its result, or the RateLimiterUnavailable it raised; and
    how long it took."""
    start = time.monotonic()
    try:
        result = await call
    except RateLimiterUnavailable as exc:
        result = exc
    return result, time.monotonic() - start


@pytest.mark.parametrize("on_error", POLICIES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_full_redis_answers_by_the_failure_policy(
    kind, mode, on_error, full, plain_clients
):
    """Every check on a full noeviction Redis (the identities with state, whose entries
    have all left the window, and a new one) follows the failure policy within the
    timeout, one by one, batched by `check_many` and concurrent (the async limiters'
    auto-pipeline); the keyspace is exactly what it was."""
    limiter = make(kind, mode, plain_clients(mode, full.url), ManualClock(AGED),
                   on_error=on_error, timeout=TIMEOUT)  # fmt: skip
    with full.client() as admin:
        before = state(admin)
        for identity in ("aged", "other", "new"):
            with host_stalls() as stolen:
                outcome, took = await outcome_of(check(limiter, identity))
            assert_policy(outcome, on_error, redis.exceptions.OutOfMemoryError)
            assert took <= TIMEOUT + MARGIN + stolen(), took
            if on_error == "raise":
                assert "maxmemory" in str(outcome), outcome
        with host_stalls() as stolen:
            batch, took = await outcome_of(
                check_many(limiter, ["aged", "other", "new"], [1, 2, 1])
            )
        assert took <= TIMEOUT + MARGIN + stolen(), took
        if on_error == "raise":
            assert_policy(batch, on_error, redis.exceptions.OutOfMemoryError)
        else:
            assert len(batch) == 3
            for decision in batch:
                assert_policy(decision, on_error)
        if mode == "async":  # checks in one turn of the loop share a pipeline
            with host_stalls() as stolen:
                together = await asyncio.gather(
                    *(outcome_of(limiter.check(who)) for who in ("aged", "other", "new", "aged"))
                )
            for outcome, took in together:
                assert_policy(outcome, on_error, redis.exceptions.OutOfMemoryError)
                assert took <= TIMEOUT + MARGIN + stolen(), took
        assert state(admin) == before


@pytest.mark.parametrize("mode", MODES)
async def test_many_checks_on_a_full_redis_write_nothing(mode, full, plain_clients):
    """Hundreds of checks of every limiter on a full Redis: the keyspace does not
    change and used memory does not grow (what a connection itself uses aside)."""
    limiters = [
        make(kind, mode, plain_clients(mode, full.url), ManualClock(AGED), on_error="allow")
        for kind in KINDS
    ]
    with full.client() as admin:
        for limiter in limiters:  # every connection is open before measuring
            assert_policy(await check(limiter, "warm-up"), "allow")
        before, used_before = state(admin), memory(admin)["used"]
        for n in range(60):
            for limiter in limiters:
                decision = await check(limiter, ("aged", "other", f"new-{n}")[n % 3])
                assert decision.allowed and decision.degraded, decision
        after, mem_after = state(admin), memory(admin)
    assert after == before
    print(f"\nused_memory {used_before} -> {mem_after['used']} (maxmemory {mem_after['max']})")
    assert mem_after["used"] - used_before < 64 * 1024, (used_before, mem_after)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private noeviction server of this test's own."""
    started = start_server("noeviction")
    try:
        yield started
    finally:
        started.close()


# Where a script without the shebang writes on a full Redis: its first write is one
# that may run when memory is full (ZREMRANGEBYSCORE, DEL), and from then on Redis
# lets the script's other writes run, so as not to stop a script half-way. That holds
# whether the trim deleted anything or not. (The fixed window, the counter and GCRA
# write with INCRBY or SET first, which Redis refuses.)
LEGACY_WRITES = [("log", "aged"), ("log", "new"), ("logc", "aged")]


@pytest.mark.parametrize(("kind", "identity"), LEGACY_WRITES)
def test_without_the_shebang_a_full_redis_admits_for_real(kind, identity, server):
    """The case that admitted with degraded=False on a full Redis. The limiter (its
    script behind the shebang) gets the failure policy and writes nothing; the same
    script without the shebang, sent the same check, answers a normal admit and writes
    on a full Redis. ("aged": a key whose entries have all left the window.)"""
    with server.client() as admin:
        old = make(kind, "sync", admin, ManualClock(T0))
        assert all(old.check("aged").allowed for _ in range(BEFORE))
        fill(admin)
        squeeze(admin)
        limiter = make(kind, "sync", admin, ManualClock(AGED), on_error="deny")
        before = state(admin)

        assert_policy(limiter.check(identity), "deny")
        assert state(admin) == before

        keys, args = limiter._prepare(identity, 1)
        assert limiter.script.startswith(scripts.SHEBANG)
        legacy = limiter.script.removeprefix(scripts.SHEBANG)  # the same script, bare
        assert legacy.startswith("local window = ") and scripts.SHEBANG not in legacy
        decision = limiter._decision(admin.eval(legacy, 1, *keys, *args), args[0])
        assert decision.allowed and not decision.degraded, decision
        assert decision.remaining == LIMIT - 1  # the old entries, if any, were trimmed
        assert state(admin) != before  # written while memory was full
        assert admin.info("memory")["used_memory"] > admin.info("memory")["maxmemory"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
async def test_decisions_resume_once_memory_is_freed(kind, mode, server, plain_clients):
    """While Redis is full a check gets the failure policy; once the filler is deleted
    the next check is a normal decision that counts the admits made before memory ran
    out, and nothing from the full period."""
    clock = ManualClock(T0)
    with server.client() as admin:
        limiter = make(kind, mode, plain_clients(mode, server.url), clock, on_error="deny",
                       timeout=TIMEOUT)  # fmt: skip
        for n in range(BEFORE):
            decision = await check(limiter, "alice")
            assert decision.allowed and decision.remaining == LIMIT - n - 1, decision
        fill(admin)
        squeeze(admin)
        for _ in range(3):
            assert_policy(await check(limiter, "alice"), "deny")
        free(admin)
        admin.config_set("maxmemory", MAXMEMORY)
        decision = await check(limiter, "alice")
    assert decision.allowed and not decision.degraded, decision
    assert decision.remaining == LIMIT - BEFORE - 1, decision


# Evicting policies: a limit forgotten ---------------------------------------------

EVICTING = ["allkeys-lru", "volatile-lru", "volatile-ttl"]
EVICT_MAXMEMORY = 3 * 1024 * 1024  # as in the report that found it
CACHE_TTL_MS = 3_600_000  # the cache's entries under a volatile-* policy: an hour


def present(client: redis.Redis, key: str) -> bool:
    """Whether `key` exists, found by SCAN: EXISTS would count as a use of the key,
    which an LRU policy weighs."""
    return any(True for _ in client.scan_iter(match=key, count=1000))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", EVICTING)
def test_eviction_forgets_a_limit(policy, kind):
    """10 per 60 s, a client admitted 10 times and then rejected; a cache fills memory
    until Redis evicts the client's key; within the same minute (the clock does not
    move) the client is admitted again, a whole limit's worth: the over-admission is
    the limit per eviction. Under volatile-* the cache's entries carry a TTL, as a
    cache's do; the limiter's keys always do, so those policies pick them too."""
    server = start_server(policy, EVICT_MAXMEMORY)
    try:
        with server.client() as admin:
            # No TTL slack, which a virtual clock gets by default: the key lives for
            # its window, as with the host's clock.
            limiter = make(kind, "sync", admin, ManualClock(T0), ttl_slack_ms=0)
            first = [limiter.check("client") for _ in range(LIMIT + 1)]
            assert [d.allowed for d in first] == [True] * LIMIT + [False]
            key = limiter.key_for("client")
            ttl = None if policy.startswith("allkeys") else CACHE_TTL_MS
            written = 0
            while present(admin, key):
                assert written < 5000, "the limiter's key was never evicted"
                admin.set(f"filler:{written}", b"x" * FILLER, px=ttl)
                written += 1
            assert admin.info("stats")["evicted_keys"] > 0
            extra = 0
            while limiter.check("client").allowed:
                extra += 1
                assert extra <= 3 * LIMIT, "no limit at all"
    finally:
        server.close()
    print(f"\n{policy} {kind}: key evicted after {written} cache writes; {extra} extra admits")
    assert extra == LIMIT  # the whole budget again: 2 x the limit in one window
