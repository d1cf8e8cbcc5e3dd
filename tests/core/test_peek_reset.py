"""`peek` and `reset` on every limiter: the four algorithms and both sliding-log
storages, asyncio and sync, on fakeredis, a real Redis and a Redis Cluster.

A peek returns the decision a check would return at that moment and changes nothing
in Redis: the key's DUMP (its value and encoding), its absolute expiry (PEXPIRETIME,
which a TTL refresh would move), its OBJECT ENCODING, and on a private server the
count of writes since start (`rdb_changes_since_last_save`) and DEBUG OBJECT are the
same before and after, and the next check decides as the peek said. The peek's script
is declared read-only, and Redis refuses a write from it. A reset deletes the
identity's state: its next check has the whole budget. A hypothesis state machine
interleaves checks, peeks, resets and clock moves (backwards too, so the rewrite of
times from a clock far ahead is met) and holds every answer to the reference model.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

import ratelimit
import ratelimit.lab  # noqa: F401  (registers the reference models)
import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable, algorithms, scripts
from ratelimit.clock import ManualClock
from tests.core.checks import check, peek, reset
from tests.core.machines import run_machine

ENTRIES = [algorithms.get(name) for name in ("logc", "log", "fw", "swc", "gcra")]
IDS = [entry.name for entry in ENTRIES]
KINDS = ["async", "sync"]


def outcome(decision: Decision) -> tuple[Any, ...]:
    return (
        decision.allowed,
        decision.remaining,
        decision.retry_after_ms,
        decision.reset_after_ms,
        decision.degraded,
    )


def snapshot(admin: Any, key: str, real: bool) -> tuple[Any, ...]:
    """What a write or a TTL change to `key` would alter. PEXPIRETIME is absolute, so
    it stays put while time passes unless the TTL is set again."""
    state: tuple[Any, ...] = (
        admin.exists(key),
        admin.dump(key),
        admin.execute_command("PEXPIRETIME", key),
    )
    if real and state[0]:
        state += (admin.object("encoding", key), admin.type(key))
    return state


def make_limiter(kind: str, entry: Any, client: Any, **options: Any) -> Any:
    return entry.build(kind, client, **options)


def clients_for(kind: str, backend: str, real_url: str | None) -> tuple[Any, Any]:
    """A client of `kind` for the limiter, and a sync one on the same data to look at
    it with (fakeredis: one FakeServer behind both)."""
    if backend == "embedded":
        server = fakeredis.FakeServer()
        client = (
            fakeredis.FakeRedis(server=server)
            if kind == "sync"
            else fakeredis.FakeAsyncRedis(server=server)
        )
        return client, fakeredis.FakeRedis(server=server)
    if kind == "sync":
        return redis.Redis.from_url(real_url), redis.Redis.from_url(real_url)
    return redis.asyncio.Redis.from_url(real_url), redis.Redis.from_url(real_url)


async def close(client: Any) -> None:
    if hasattr(client, "aclose"):
        await client.aclose()
    else:
        client.close()


@pytest.fixture(params=["embedded", "real"])
def backend_url(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    if request.param == "real":
        return "real", request.getfixturevalue("real_redis_url")
    return "embedded", None


# -- peek changes nothing, and the next check agrees ----------------------------------


# A script of steps: ("check" | "peek", cost) or ("advance", ms). It walks each algorithm
# through an empty key, admits, a cost > 1, a rejection, a window boundary, and a key
# whose times all left the window.
STEPS: list[tuple[str, int]] = [
    ("peek", 1), ("check", 1), ("peek", 2), ("check", 2), ("peek", 1), ("check", 1),
    ("peek", 1), ("check", 1), ("peek", 3), ("advance", 400), ("peek", 1), ("check", 1),
    ("advance", 700), ("peek", 2), ("check", 2), ("advance", 5000), ("peek", 4),
    ("check", 4),
]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
async def test_peek_changes_nothing_and_the_next_check_agrees(kind, entry, backend_url, prefix):
    backend, url = backend_url
    client, admin = clients_for(kind, backend, url)
    clock = ManualClock(1_000_000.0)
    lim = make_limiter(kind, entry, client, window_ms=1000, limit=4, prefix=prefix, clock=clock)
    key = lim.key_for("alice")
    seen = {"allowed": 0, "rejected": 0, "on a key": 0}
    try:
        pending: Decision | None = None
        for step, n in STEPS:
            if step == "advance":
                clock.advance(n / 1000)
                pending = None
            elif step == "peek":
                before = snapshot(admin, key, backend == "real")
                pending = await peek(lim, "alice", n)
                assert not pending.degraded
                assert snapshot(admin, key, backend == "real") == before, step
                # Twice in a row: still the same answer, still nothing changed.
                assert outcome(await peek(lim, "alice", n)) == outcome(pending)
                assert snapshot(admin, key, backend == "real") == before
                seen["allowed" if pending.allowed else "rejected"] += 1
                seen["on a key"] += before[0]
                last_cost = n
            else:
                before = snapshot(admin, key, backend == "real")
                decision = await check(lim, "alice", n)
                if decision.allowed:  # the snapshot does see a write
                    assert snapshot(admin, key, backend == "real") != before
                if pending is not None and last_cost == n:
                    assert outcome(decision) == outcome(pending), (step, n)
                    assert decision.decided_at_ms == pending.decided_at_ms
                pending = None
        assert seen["allowed"] and seen["rejected"]  # both paths of the script ran
        assert seen["on a key"] >= 5
    finally:
        await close(client)
        admin.close()


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_a_peek_decides_on_times_from_far_ahead_as_a_check_would(entry, backend_url, prefix):
    """A full key written by a host 5 s ahead, read with a 100 ms tolerance: a check
    first brings the stored times back to now + 100 ms (and stores them), a peek only
    decides as if it had. Same rejection, nothing stored by the peek."""
    backend, url = backend_url
    client, admin = clients_for("sync", backend, url)
    clock = ManualClock(1_000_000.0)
    lim = entry.build(
        "sync", client, window_ms=1000, limit=2, prefix=prefix, clock=clock,
        clock_tolerance_ms=100,
    )  # fmt: skip
    key = lim.key_for("a")
    try:
        clock.advance(5.0)
        assert lim.check("a", 2).allowed  # full, 5 s ahead of what follows
        clock.advance(-5.0)
        before = snapshot(admin, key, backend == "real")
        said = lim.peek("a")
        assert snapshot(admin, key, backend == "real") == before
        # (The counter forgets a count from a window ahead of the check's own.)
        assert said.allowed == (entry.name == "swc")
        if entry.exact:  # the logs: the blocking entry, moved back to now + 100 ms
            assert said.retry_after_ms == 100 + 1000
        assert outcome(lim.check("a")) == outcome(said)
        assert snapshot(admin, key, backend == "real") != before  # the check rewrote
    finally:
        client.close()
        admin.close()


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_a_peek_writes_nothing_on_a_private_server(entry, private_redis):
    """No write at all, counted by the server itself (its dirty counter), on every
    path: an empty key, admits, a rejection, a key whose stored time is far ahead (the
    path on which a check rewrites it), and DEBUG OBJECT's size and encoding stay."""
    admin = private_redis.client()
    clock = ManualClock(1_000_000.0)
    lim = entry.build(
        "sync", private_redis.client(), window_ms=1000, limit=3, clock=clock,
        clock_tolerance_ms=100,
    )  # fmt: skip
    key = lim.key_for("a")

    def writes() -> int:
        return int(admin.info("persistence")["rdb_changes_since_last_save"])

    def debug() -> Any:
        if not admin.exists(key):
            return None
        # "Value at:0x... refcount:1 encoding:... serializedlength:... lru:... ...": all
        # but the LRU fields, which any read (a peek's too) refreshes.
        text = admin.execute_command("DEBUG", "OBJECT", key, NEVER_DECODE=True)
        text = text.decode() if isinstance(text, bytes) else str(text)
        return [field for field in text.split() if not field.startswith("lru")]

    def peek_and_check(cost: int) -> Decision:
        before, shape = writes(), debug()
        said = lim.peek("a", cost)
        assert writes() == before and debug() == shape
        done = lim.check("a", cost)
        assert outcome(done) == outcome(said)
        return said

    assert peek_and_check(1).allowed  # an empty key
    assert peek_and_check(2).allowed
    assert not peek_and_check(1).allowed
    clock.advance(5.0)  # the host jumps far ahead and admits there
    assert peek_and_check(1).allowed
    clock.advance(-4.0)  # back: the stored time is beyond now + tolerance
    said = peek_and_check(1)  # (the check then rewrote the stored time)
    assert said.allowed or said.retry_after_ms <= 1000 + 100
    admin.close()


def test_the_peek_script_is_read_only_to_redis(real_redis_url, prefix):
    """The peek's script carries the read-only flag; the same text with `dry` = 0 (the
    check's decision and writes) is refused by Redis under that flag, so a peek that
    tried to write could not."""
    client = redis.Redis.from_url(real_redis_url)
    try:
        lim = ratelimit.sync.SlidingWindowLimiter(client, 1, 5, prefix)
        text = lim._peek_script.script
        assert text.startswith(scripts.READ_ONLY_SHEBANG)
        assert lim.script.startswith(scripts.SHEBANG) and "local dry = 0\n" in lim.script
        # Apart from the flag and `dry`, the peek runs the check's very script.
        assert (
            text.replace(scripts.READ_ONLY_SHEBANG, scripts.SHEBANG, 1).replace(
                "local dry = 1\n", "local dry = 0\n", 1
            )
            == lim.script
        )
        writing = text.replace("local dry = 1\n", "local dry = 0\n", 1)
        key = lim.key_for("x")
        args = lim.script_args(int(lim.clock() * 1000), 1)
        with pytest.raises(redis.exceptions.ResponseError, match="(?i)write"):
            client.eval(writing, 1, key, *args)
        assert not client.exists(key)
    finally:
        client.close()


# -- reset -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
async def test_reset_gives_a_fresh_budget(kind, entry, backend_url, prefix):
    backend, url = backend_url
    client, admin = clients_for(kind, backend, url)
    clock = ManualClock(1_000_000.0)
    lim = make_limiter(kind, entry, client, window_ms=60_000, limit=3, prefix=prefix, clock=clock)
    other = make_limiter(kind, entry, client, window_ms=60_000, limit=3, prefix=prefix, clock=clock)
    try:
        for _ in range(3):
            assert (await check(lim, "alice")).allowed
            assert (await check(lim, "bob")).allowed
        assert not (await check(lim, "alice")).allowed
        assert await reset(lim, "alice") is True
        assert not admin.exists(lim.key_for("alice"))
        first = await check(other, "alice")  # any limiter of that policy sees it
        assert first.allowed and first.remaining == 2
        assert not (await peek(lim, "bob")).allowed  # bob keeps his state
        assert await reset(lim, "nobody") is False  # nothing to forget
        assert await reset(lim, "alice") is True
        assert (await peek(lim, "alice")).remaining == 2
    finally:
        await close(client)
        admin.close()


# -- against the reference model --------------------------------------------------------


class PeekResetMachine(RuleBasedStateMachine):
    """Checks, peeks, resets and clock moves on one limiter and its reference model."""

    client: Any = None

    @initialize(
        entry=st.sampled_from(ENTRIES),
        window_ms=st.sampled_from([1000, 2000]),
        limit=st.integers(1, 8),
        tolerance=st.sampled_from([None, 0, 300]),
    )
    def start(self, entry, window_ms, limit, tolerance):
        self.prefix = "peek-" + uuid.uuid4().hex[:10]
        self.now_ms = 1_000_000_000
        self.clock = ManualClock()
        self.clock.set_ms(self.now_ms)
        options = dict(
            window_ms=window_ms, prefix=self.prefix, clock=self.clock,
            clock_tolerance_ms=tolerance, on_error="raise",
        )  # fmt: skip
        self.limiter = entry.build("sync", self.client, None, limit, **options)
        self.model = entry.build("reference", None, limit, **options)

    def cost(self, cost: int) -> int:
        return min(cost, self.limiter.limit)

    @rule(ms=st.integers(-300, 600) | st.integers(-3000, 4000))
    def move_the_clock(self, ms):
        self.now_ms += ms
        self.clock.set_ms(self.now_ms)

    @rule(identity=st.sampled_from(["a", "b"]), cost=st.integers(1, 8))
    def check(self, identity, cost):
        cost = self.cost(cost)
        got, want = self.limiter.check(identity, cost), self.model.check(identity, cost)
        assert outcome(got) == outcome(want), (got, want)

    @rule(identity=st.sampled_from(["a", "b"]), cost=st.integers(1, 8))
    def peek(self, identity, cost):
        cost = self.cost(cost)
        key = self.limiter.key_for(identity)
        before = (self.client.dump(key), self.client.execute_command("PEXPIRETIME", key))
        got, want = self.limiter.peek(identity, cost), self.model.peek(identity, cost)
        assert outcome(got) == outcome(want), (got, want)
        after = (self.client.dump(key), self.client.execute_command("PEXPIRETIME", key))
        assert after == before

    @rule(identity=st.sampled_from(["a", "b"]))
    def reset(self, identity):
        self.limiter.reset(identity)
        self.model.reset(identity)
        assert not self.client.exists(self.limiter.key_for(identity))

    def teardown(self):
        for key in self.client.scan_iter(match=self.prefix + ":*", count=1000):
            self.client.delete(key)


def _run(client: Any) -> None:
    run_machine(PeekResetMachine, client, examples=120, steps=40)


def test_peek_and_reset_match_the_model_embedded():
    _run(fakeredis.FakeRedis())


def test_peek_and_reset_match_the_model_real(real_redis_url):
    client = redis.Redis.from_url(real_redis_url)
    try:
        _run(client)
    finally:
        client.close()


def test_the_model_peek_changes_no_state():
    model = algorithms.SLIDING_LOG.build("reference", 1, 2, clock=ManualClock(100.0))
    assert model.peek("a").allowed and model.state == {}
    model.check("a")
    kept = {k: list(v) for k, v in model.state.items()}
    assert model.peek("a", 2).allowed is False and model.state == kept
    assert model.reset("a") is True and model.state == {} and model.reset("a") is False


# -- near-cache, failures, NOSCRIPT, bad input ------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_peek_and_the_near_cache(kind, backend_url, prefix):
    """A peek answers from the near-cache as a check would (the same decision); a
    rejection it got from Redis is remembered (a rejected check wrote nothing either);
    an admission it got forgets nothing (it added no entry); a reset forgets the cache."""
    backend, url = backend_url
    client, admin = clients_for(kind, backend, url)
    clock = ManualClock(1_000_000.0)
    options = dict(window_ms=1000, limit=2, prefix=prefix, clock=clock, near_cache=True)
    lim = make_limiter(kind, algorithms.COMPACT_LOG, client, **options)
    fresh = make_limiter(kind, algorithms.COMPACT_LOG, client, **options)
    try:
        await check(lim, "a")
        await check(lim, "a")
        rejected = await check(lim, "a")
        assert not rejected.allowed and lim.near_cache.hits == 0
        clock.advance(0.1)
        cached = await peek(lim, "a")
        assert lim.near_cache.hits == 1 and not cached.allowed
        assert cached.retry_after_ms == rejected.retry_after_ms - 100
        # Another process's limiter learns the rejection from its peek.
        said = await peek(fresh, "a")
        assert outcome(said) == outcome(cached) and len(fresh.near_cache) == 1
        assert outcome(await check(fresh, "a")) == outcome(said)
        assert fresh.near_cache.hits == 1  # answered from what the peek learnt
        # A reset forgets this limiter's cached rejection: the next check asks Redis.
        assert await reset(lim, "a") is True
        assert len(lim.near_cache) == 0
        assert (await check(lim, "a")).allowed
    finally:
        await close(client)
        admin.close()


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("on_error", ["raise", "allow", "deny"])
async def test_outage_peek_follows_the_failure_policy_and_reset_raises(kind, on_error):
    url = f"redis://127.0.0.1:{dead_port()}/0"
    client = ratelimit.connect_sync(url) if kind == "sync" else ratelimit.connect(url)
    lim = algorithms.GCRA.build(kind, client, 1, 5, on_error=on_error, timeout=0.5)
    try:
        if on_error == "raise":
            with pytest.raises(RateLimiterUnavailable):
                await peek(lim, "a")
        else:
            decision = await peek(lim, "a")
            assert decision.degraded and decision.allowed == (on_error == "allow")
            if on_error == "deny":
                assert decision.retry_after >= 1
        # A reset that did nothing must not look done, whatever the policy.
        with pytest.raises(RateLimiterUnavailable, match="could not reset"):
            await reset(lim, "a")
    finally:
        await close(client)


@pytest.mark.parametrize("kind", KINDS)
async def test_peek_survives_a_flushed_script_cache(kind, real_redis_url, prefix):
    client, admin = clients_for(kind, "real", real_redis_url)
    lim = make_limiter(kind, algorithms.SLIDING_LOG, client, window_ms=1000, limit=2,
                       prefix=prefix, clock=ManualClock(1_000_000.0))  # fmt: skip
    try:
        await check(lim, "a")
        admin.script_flush()
        said = await peek(lim, "a")
        assert said.allowed and said.remaining == 0 and not said.degraded
        assert admin.script_exists(lim._peek_script.sha) == [True]  # loaded again
        assert lim.resends == 0  # NOSCRIPT is not a resend
    finally:
        await close(client)
        admin.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_bad_input_is_a_value_error(kind):
    client = fakeredis.FakeRedis() if kind == "sync" else fakeredis.FakeAsyncRedis()
    lim = algorithms.FIXED_WINDOW.build(kind, client, 1, 5)
    for identity, cost, word in [("a", 0, "cost"), ("a", 6, "cost"), ("", 1, "identity")]:
        with pytest.raises(ValueError, match=word):
            await peek(lim, identity, cost)
    with pytest.raises(ValueError, match="identity"):
        await reset(lim, "")
    assert (await peek(lim, "a")).remaining == 4  # nothing was charged


# -- Redis Cluster -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_peek_and_reset_on_a_cluster(kind, cluster):
    # What is tested is what peek and reset do on a cluster, not how fast: a generous
    # timeout keeps a busy machine's slow answer from reading as an outage.
    connect = ratelimit.connect_sync if kind == "sync" else ratelimit.connect
    client = connect(cluster.url, timeout=10)
    prefix = f"test:{uuid.uuid4().hex[:12]}"
    try:
        for entry in ENTRIES:
            clock = ManualClock(1_000_000.0)
            lim = entry.build(kind, client, 1, 3, prefix, clock=clock, timeout=10)
            who = [f"user-{i}" for i in range(6)]  # spread over the masters
            for name in who:
                node = cluster.slot_owner(ratelimit_slot(lim.key_for(name)))
                with cluster.nodes[node].admin(timeout=5) as admin:
                    for _ in range(3):
                        assert (await check(lim, name)).allowed
                    key = lim.key_for(name)
                    before = (admin.dump(key), admin.execute_command("PEXPIRETIME", key))
                    said = await peek(lim, name)
                    assert not said.allowed and not said.degraded
                    assert (admin.dump(key), admin.execute_command("PEXPIRETIME", key)) == before
                    assert outcome(await check(lim, name)) == outcome(said)
                    assert await reset(lim, name) is True
                    assert not admin.exists(key)
                    assert (await peek(lim, name)).remaining == 2
    finally:
        await close(client)


def ratelimit_slot(key: str) -> int:
    from redis.crc import key_slot

    return key_slot(key.encode())


async def test_peeks_made_together_on_one_client_all_answer(client, prefix):
    """Peeks never join an auto-pipelined batch; made alongside checks they still all
    answer, and the checks' batch decides as before."""
    lim = ratelimit.FixedWindowLimiter(client, 60, 5, prefix, clock=ManualClock(1_000_000.0))
    results = await asyncio.gather(
        *[lim.check("a") for _ in range(3)], *[lim.peek("a") for _ in range(3)]
    )
    assert sum(d.allowed for d in results[:3]) == 3
    assert all(not d.degraded for d in results)
    assert (await lim.peek("a")).remaining == 5 - 3 - 1  # three admitted, one peeked


# -- a full Redis ------------------------------------------------------------------------


def test_on_a_full_redis_peeks_still_decide_and_reset_frees():
    """Under `noeviction` with memory full, a check gets the failure policy (its script
    may write), while a peek, declared read-only, still gets Redis's decision, and a
    reset (UNLINK, which frees memory) still works."""
    from tests.core import test_full_redis as full

    server = full.start_server("noeviction")
    admin = server.client()
    client = server.client()
    try:
        clock = ManualClock(full.T0)
        limiters = {e.name: full.make(e.name, "sync", client, clock, on_error="allow")
                    for e in ENTRIES}  # fmt: skip
        for lim in limiters.values():
            for _ in range(full.BEFORE):
                assert lim.check("a").allowed
        full.fill(admin)
        full.squeeze(admin)
        for name, lim in limiters.items():
            refused = lim.check("a")
            assert refused.degraded, name  # the check's script may write: refused
            said = lim.peek("a")
            assert not said.degraded and said.remaining == full.LIMIT - full.BEFORE - 1, name
            assert lim.reset("a") is True and not admin.exists(lim.key_for("a"))
            assert lim.peek("a").remaining == full.LIMIT - 1
    finally:
        client.close()
        admin.close()
        server.close()
