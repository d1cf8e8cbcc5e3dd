"""`TieredLimiter`: several rates on one identity, every tier algorithm and both log
storages, asyncio and sync, on fakeredis, a real Redis and a Redis Cluster.

A hypothesis state machine interleaves checks, peeks, resets and clock moves and holds
every decision (its binding `tier` included) to the reference model
(`ratelimit.lab.reference.TieredLimiter`). The tests after it pin one property each:
a rejection writes nothing in any tier (DUMP and PEXPIRETIME of every tier's key are
unchanged), a peek neither (and its script is read-only to Redis), a reset deletes
every tier's key, a tier's key is the single-rate limiter's, concurrent checks admit
no more than a tier allows, `check_many` decides as checks in sequence, bad input never
reaches Redis, and all of an identity's keys share one cluster slot.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule
from redis.crc import key_slot

import ratelimit
import ratelimit.lab  # noqa: F401  (registers the reference models)
import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable, algorithms, scripts
from ratelimit.clock import ManualClock
from ratelimit.lab import reference
from tests.core.checks import check, check_many, peek, reset
from tests.core.machines import run_machine
from tests.core.test_peek_reset import clients_for, close, dead_port

ENTRIES = [algorithms.get(name) for name in ("logc", "log", "fw", "swc", "gcra")]
IDS = [entry.name for entry in ENTRIES]
KINDS = ["async", "sync"]
T0 = 1_000_000.0  # a whole minute's second: the fixed windows start at whole seconds


def algorithm_of(entry: Any) -> dict[str, Any]:
    """The tiered limiters' `algorithm` and `storage` options that select `entry`."""
    if entry.storage is not None:
        return {"algorithm": "log", "storage": entry.storage}
    return {"algorithm": entry.name}


def tiered(kind: str, entry: Any, client: Any, rates: Any, **options: Any) -> Any:
    cls = ratelimit.TieredLimiter if kind == "async" else ratelimit.sync.TieredLimiter
    return cls(client, rates, **algorithm_of(entry), **options)


def model(entry: Any, rates: Any, **options: Any) -> reference.TieredLimiter:
    return reference.TieredLimiter(rates, **algorithm_of(entry), **options)


def snapshot(admin: Any, keys: list[str]) -> list[tuple[Any, Any]]:
    """What a write or a TTL change to any of `keys` would alter: PEXPIRETIME is
    absolute, so it stays put while time passes unless the TTL is set again."""
    return [(admin.dump(key), admin.execute_command("PEXPIRETIME", key)) for key in keys]


@pytest.fixture(params=["embedded", "real"])
def backend_url(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    if request.param == "real":
        return "real", request.getfixturevalue("real_redis_url")
    return "embedded", None


# -- against the reference model --------------------------------------------------------

# Tiers whose limits all admit the machine's largest cost (3).
RATE_SETS = [("3/s", "5/10s", "8/min"), ("4/s", "6/3s"), ("3/2s", "5/5s", "12/min")]


class Driver:
    """A limiter's calls made alike for either kind: a sync limiter's return their
    result, an asyncio one's are run on an event loop of the driver's own."""

    def __init__(self, kind: str, backend: str, url: str | None) -> None:
        self.loop = asyncio.new_event_loop() if kind == "async" else None
        self.client, self.admin = clients_for(kind, backend, url)

    def __call__(self, result: Any) -> Any:
        return result if self.loop is None else self.loop.run_until_complete(result)

    def close(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(close(self.client))
            self.loop.close()
        else:
            self.client.close()
        self.admin.close()


class TieredMachine(RuleBasedStateMachine):
    """Checks, peeks, resets and clock moves on one tiered limiter and its model."""

    entry: Any = None
    kind = "sync"
    backend = "embedded"
    url: str | None = None

    @initialize(rates=st.sampled_from(RATE_SETS), tolerance=st.sampled_from([None, 0, 300]))
    def start(self, rates, tolerance):
        self.drive = Driver(self.kind, self.backend, self.url)
        self.prefix = "tiers-" + uuid.uuid4().hex[:10]
        self.now_ms = 1_000_000_000
        self.clock = ManualClock()
        self.clock.set_ms(self.now_ms)
        options = dict(prefix=self.prefix, clock=self.clock, clock_tolerance_ms=tolerance)
        self.limiter = tiered(self.kind, self.entry, self.drive.client, rates, **options)
        self.model = model(self.entry, rates, **options)
        assert self.limiter.rates == self.model.rates

    # Mostly forward, across every tier's window; sometimes back (a host behind).
    @rule(ms=st.integers(0, 1500) | st.integers(2000, 40_000) | st.integers(-2000, -1))
    def move_the_clock(self, ms):
        self.now_ms += ms
        self.clock.set_ms(self.now_ms)

    @rule(identity=st.sampled_from(["a", "b"]), cost=st.integers(1, 3))
    def check(self, identity, cost):
        keys = self.limiter.keys_for(identity)
        before = snapshot(self.drive.admin, keys)
        got = self.drive(self.limiter.check(identity, cost))
        want = self.model.check(identity, cost)
        assert got == want, (got, want)
        if not got.allowed:  # a rejection spends nothing, in any tier
            assert snapshot(self.drive.admin, keys) == before

    @rule(identity=st.sampled_from(["a", "b"]), cost=st.integers(1, 3))
    def peek(self, identity, cost):
        keys = self.limiter.keys_for(identity)
        before = snapshot(self.drive.admin, keys)
        got = self.drive(self.limiter.peek(identity, cost))
        want = self.model.peek(identity, cost)
        assert got == want, (got, want)
        assert snapshot(self.drive.admin, keys) == before

    @rule(identity=st.sampled_from(["a", "b"]))
    def reset(self, identity):
        got = self.drive(self.limiter.reset(identity))
        assert got == self.model.reset(identity)
        assert self.drive.admin.exists(*self.limiter.keys_for(identity)) == 0

    def teardown(self):
        drive = getattr(self, "drive", None)
        if drive is None:
            return
        for key in drive.admin.scan_iter(match=self.prefix + ":*", count=1000):
            drive.admin.delete(key)
        drive.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_tiers_match_the_model(entry, kind, backend_url):
    backend, url = backend_url
    machine = type(
        "Machine", (TieredMachine,), {"entry": entry, "kind": kind, "backend": backend, "url": url}
    )
    run_machine(machine, None, examples=25, steps=30)


# -- a rejection spends nothing -----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
async def test_a_rejection_writes_nothing_in_any_tier(kind, entry, backend_url, prefix):
    """Rejected by the short tier, then by the long tier alone (which the short one
    would have admitted): every tier's key is as it was, value and expiry."""
    backend, url = backend_url
    client, admin = clients_for(kind, backend, url)
    clock = ManualClock(T0)
    lim = tiered(kind, entry, client, ["2/s", "3/min"], prefix=prefix, clock=clock)
    mod = model(entry, ["2/s", "3/min"], clock=clock)
    keys = lim.keys_for("u")
    try:
        for _ in range(2):
            assert (await check(lim, "u")).allowed and mod.check("u").allowed
        before = snapshot(admin, keys)
        refused = await check(lim, "u")
        assert not refused.allowed and refused.tier == 0
        assert refused == mod.check("u")
        assert snapshot(admin, keys) == before

        clock.advance(2.5)  # past the short tier's window and the one before it
        admitted = await check(lim, "u")  # the minute's last unit
        assert admitted.allowed and admitted.tier == 1 and admitted.remaining == 0
        assert admitted == mod.check("u")
        clock.advance(2.5)
        assert (await peek(lim.tiers[0], "u")).allowed  # the short tier alone admits
        before = snapshot(admin, keys)
        refused = await check(lim, "u")
        assert not refused.allowed and refused.tier == 1 and refused.limit == 3
        assert refused == mod.check("u")
        assert snapshot(admin, keys) == before
        # The short tier's budget was not spent by the rejected request.
        assert await peek(lim.tiers[0], "u", 2) == mod.tiers[0].peek("u", 2)
        assert (await peek(lim.tiers[0], "u", 2)).allowed
    finally:
        await close(client)
        admin.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_ties_bind_the_first_tier(kind, backend_url, prefix):
    """Fixed windows of 1 s and 2 s that end together: equal remaining on an admit and
    equal waits on a rejection, both bound by the shorter tier, given in either order."""
    backend, url = backend_url
    client, admin = clients_for(kind, backend, url)
    clock = ManualClock(T0)  # a whole even second: both windows start here
    lim = tiered(kind, algorithms.FIXED_WINDOW, client, ["4/2s", "2/s"], prefix=prefix, clock=clock)
    try:
        assert [str(rate) for rate in lim.rates] == ["2/s", "4/2s"]
        assert (await check(lim, "u", 2)).allowed
        clock.advance(1.0)
        admitted = await check(lim, "u", 2)
        assert admitted.allowed and admitted.remaining == 0 and admitted.tier == 0
        assert (await peek(lim.tiers[1], "u")).retry_after_ms == 1000
        refused = await check(lim, "u")
        assert not refused.allowed and refused.retry_after_ms == 1000 and refused.tier == 0
        assert refused.limit == 2
    finally:
        await close(client)
        admin.close()


# -- peek ---------------------------------------------------------------------------------

# ("check" | "peek", cost) or ("advance", ms): an empty key, admits, a rejection by each
# tier, a window boundary of each.
STEPS: list[tuple[str, int]] = [
    ("peek", 1), ("check", 1), ("peek", 2), ("check", 2), ("peek", 1), ("check", 1),
    ("advance", 1900), ("peek", 1), ("check", 1), ("peek", 2), ("check", 2),
    ("advance", 1500), ("peek", 1), ("check", 1), ("advance", 120_000), ("peek", 3),
    ("check", 3),
]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
async def test_a_peek_changes_nothing_and_the_next_check_agrees(kind, entry, backend_url, prefix):
    backend, url = backend_url
    client, admin = clients_for(kind, backend, url)
    clock = ManualClock(T0)
    lim = tiered(kind, entry, client, ["3/s", "4/min"], prefix=prefix, clock=clock)
    keys = lim.keys_for("u")
    tiers_seen: set[tuple[bool, int]] = set()
    try:
        said: Decision | None = None
        for step, n in STEPS:
            if step == "advance":
                clock.advance(n / 1000)
                continue
            if step == "peek":
                before = snapshot(admin, keys)
                said = await peek(lim, "u", n)
                assert not said.degraded and said.tier is not None
                assert snapshot(admin, keys) == before
                assert await peek(lim, "u", n) == said  # twice: still the same
                assert snapshot(admin, keys) == before
                tiers_seen.add((said.allowed, said.tier))
                continue
            done = await check(lim, "u", n)
            assert said is not None
            assert done == said and done.decided_at_ms == said.decided_at_ms, step
            said = None
        # Both tiers bound, admitting and rejecting: every path of the driver ran.
        assert tiers_seen >= {(True, 0), (False, 0), (True, 1), (False, 1)}, tiers_seen
    finally:
        await close(client)
        admin.close()


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_the_peek_script_is_read_only_to_redis(entry, real_redis_url, prefix):
    """On a real Redis the tiers' peek script carries the read-only flag, and the same
    text deciding for real (`dry` = 0) is refused by Redis under that flag."""
    client = redis.Redis.from_url(real_redis_url)
    try:
        lim = tiered("sync", entry, client, ["3/s", "5/min"], prefix=prefix)
        text = lim._peek_script.script
        assert text.startswith(scripts.READ_ONLY_SHEBANG)
        assert lim.script.startswith(scripts.SHEBANG) and lim.script.startswith("#!lua\n")
        assert text.startswith("#!lua flags=no-writes\nlocal dry = 1\n")
        writing = text.replace("local dry = 1\n", "local dry = 0\n", 1)
        keys = lim.keys_for("x")
        args = lim.script_args(int(lim.clock() * 1000), 1)
        with pytest.raises(redis.exceptions.ResponseError, match="(?i)write"):
            client.eval(writing, len(keys), *keys, *args)
        assert client.exists(*keys) == 0
        # The peek itself answers, and leaves no key behind.
        said = lim.peek("x")
        assert said.allowed and said.remaining == 2 and said.tier == 0
        assert client.exists(*keys) == 0
    finally:
        client.close()


# -- reset --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
async def test_reset_deletes_every_tier_key(kind, entry, backend_url, prefix):
    backend, url = backend_url
    client, admin = clients_for(kind, backend, url)
    clock = ManualClock(T0)
    lim = tiered(kind, entry, client, ["2/s", "3/min"], prefix=prefix, clock=clock)
    keys = lim.keys_for("u")
    try:
        assert (await check(lim, "u", 2)).allowed
        clock.advance(2.5)
        assert (await check(lim, "u")).allowed
        assert (await check(lim, "bob")).allowed
        clock.advance(2.5)
        assert not (await check(lim, "u")).allowed  # the minute is spent
        assert admin.exists(*keys) == 2
        assert await reset(lim, "u") is True
        assert admin.exists(*keys) == 0
        first = await check(lim, "u", 2)  # the whole budget of every tier
        assert first.allowed and first.tier == 0 and first.remaining == 0
        assert (await peek(lim.tiers[1], "u")).remaining == 3 - 2 - 1
        assert (await peek(lim.tiers[1], "bob")).remaining == 1  # bob keeps his state
        assert await reset(lim, "nobody") is False
    finally:
        await close(client)
        admin.close()


# -- a tier's key is the single-rate limiter's ---------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
async def test_a_tier_shares_its_key_with_a_single_rate_limiter(kind, entry, backend_url, prefix):
    backend, url = backend_url
    client, admin = clients_for(kind, backend, url)
    clock = ManualClock(T0)
    lim = tiered(kind, entry, client, ["3/s", "10/min"], prefix=prefix, clock=clock)
    mod = model(entry, ["3/s", "10/min"], clock=clock)
    second = entry.build(kind, client, "3/s", prefix=prefix, clock=clock)
    minute = entry.build(kind, client, "10/min", prefix=prefix, clock=clock)
    try:
        assert lim.keys_for("u") == [second.key_for("u"), minute.key_for("u")]
        assert [t.key_for("u") for t in lim.tiers] == lim.keys_for("u")
        # Spent through the single-rate limiter: the tier counts it.
        for _ in range(3):
            assert (await check(second, "u")).allowed and mod.tiers[0].check("u").allowed
        refused = await check(lim, "u")
        assert not refused.allowed and refused.tier == 0
        assert refused == mod.check("u")
        # Spent through the tiers: the single-rate limiters count it.
        clock.advance(2.5)
        assert (await check(lim, "u", 2)) == mod.check("u", 2)
        assert await peek(second, "u") == mod.tiers[0].peek("u")
        assert (await peek(second, "u")).remaining == 0
        assert await peek(minute, "u") == mod.tiers[1].peek("u")
        assert (await peek(minute, "u")).remaining == 10 - 2 - 1
        assert admin.exists(*lim.keys_for("u")) == 2  # no key but the two
    finally:
        await close(client)
        admin.close()


# -- concurrency -----------------------------------------------------------------------------


def _order(decision: Decision) -> tuple[Any, ...]:
    return (decision.allowed, decision.remaining, decision.retry_after_ms, decision.tier or 0)


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
async def test_concurrent_checks_admit_no_more_than_a_tier_allows_async(
    entry, real_redis_url, prefix
):
    """40 checks at once, twice: as many admits as the binding tier has left (10, then
    the minute's 5), and the very decisions the model makes one after the other."""
    clock = ManualClock(T0)
    client = redis.asyncio.Redis.from_url(real_redis_url)
    lim = tiered("async", entry, client, ["10/s", "15/min"], prefix=prefix, clock=clock)
    mod = model(entry, ["10/s", "15/min"], clock=clock)
    try:
        for admits in (10, 5):
            got = await asyncio.gather(*[lim.check("hot") for _ in range(40)])
            want = [mod.check("hot") for _ in range(40)]
            assert sum(d.allowed for d in got) == admits
            assert sorted(got, key=_order) == sorted(want, key=_order)
            clock.advance(1.5)
    finally:
        await client.aclose()


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_concurrent_checks_admit_no_more_than_a_tier_allows_threads(entry, real_redis_url, prefix):
    clock = ManualClock(T0)
    client = redis.Redis.from_url(real_redis_url, max_connections=16)
    lim = tiered("sync", entry, client, ["10/s", "15/min"], prefix=prefix, clock=clock)
    mod = model(entry, ["10/s", "15/min"], clock=clock)
    try:
        with ThreadPoolExecutor(8) as pool:
            for admits in (10, 5):
                got = list(pool.map(lambda _: lim.check("hot"), range(40)))
                want = [mod.check("hot") for _ in range(40)]
                assert sum(d.allowed for d in got) == admits
                assert sorted(got, key=_order) == sorted(want, key=_order)
                clock.advance(1.5)
    finally:
        client.close()


# -- check_many ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
async def test_check_many_decides_as_checks_in_sequence(kind, entry, backend_url, prefix):
    backend, url = backend_url
    client, admin = clients_for(kind, backend, url)
    clock = ManualClock(T0)
    rates = ["3/s", "5/min"]
    batched = tiered(kind, entry, client, rates, prefix=prefix, clock=clock)
    one_by_one = tiered(kind, entry, client, rates, prefix=f"{prefix}:seq", clock=clock)
    mod = model(entry, rates, clock=clock)
    who = ["a", "b", "a", "a", "c", "a", "b", "b", "a"]
    costs = [1, 2, 1, 3, 1, 1, 2, 1, 2]
    try:
        for _ in range(2):  # the second round meets the first round's state
            got = await check_many(batched, who, costs)
            seq = [await check(one_by_one, w, c) for w, c in zip(who, costs, strict=True)]
            assert got == seq == [mod.check(w, c) for w, c in zip(who, costs, strict=True)]
            assert {d.allowed for d in got} == {True, False}
            clock.advance(1.2)
    finally:
        await close(client)
        admin.close()


# -- bad input ---------------------------------------------------------------------------

REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"rates": ["3/s"], "near_cache": True}, "near_cache"),
    ({"rates": ["3/s"], "plain_keys": True}, "plain_keys"),
    ({"rates": ["3/s", "5/1000ms"]}, "one window"),
    ({"rates": [f"{n}/{n}s" for n in range(1, 12)]}, "at most 10 tiers"),
    ({"rates": []}, "at least one rate"),
    ({"rates": ["3/s"], "algorithm": "fw", "storage": "compact"}, "storage applies"),
    ({"rates": ["3/s"], "algorithm": "gcra", "storage": "sorted-set"}, "storage applies"),
    ({"rates": ["3/s"], "algorithm": "log", "storage": "list"}, "storage must be"),
    ({"rates": ["3/s"], "algorithm": "lease"}, "algorithm must be"),
    ({"rates": ["3/s"], "algorithm": "bucket"}, "algorithm"),
]


@pytest.mark.parametrize("kind", KINDS)
async def test_bad_input_is_a_value_error_before_redis(kind):
    """On a client whose every command would fail: a ValueError (not the failure
    policy's RateLimiterUnavailable) means nothing was sent."""
    url = f"redis://127.0.0.1:{dead_port()}/0"
    client = ratelimit.connect_sync(url) if kind == "sync" else ratelimit.connect(url)
    cls = ratelimit.TieredLimiter if kind == "async" else ratelimit.sync.TieredLimiter
    try:
        for options, message in REFUSED:
            with pytest.raises(ValueError, match=message):
                cls(client, **options)
            if "near_cache" not in options:  # the model takes no near-cache
                with pytest.raises(ValueError, match=message):
                    reference.TieredLimiter(**options)
        lim = cls(client, ["10/s", "5/min"], timeout=0.5)
        for identity, cost, word in [("a", 6, "cost"), ("a", 0, "cost"), ("", 1, "identity")]:
            with pytest.raises(ValueError, match=word):
                await check(lim, identity, cost)
            with pytest.raises(ValueError, match=word):
                await peek(lim, identity, cost)
        with pytest.raises(ValueError, match="cost"):
            await check_many(lim, ["a", "b"], [1, 6])
        with pytest.raises(ValueError, match="cost"):
            reference.TieredLimiter(["10/s", "5/min"]).check("a", 6)
        # The same limiter with a good request does reach the dead server.
        with pytest.raises(RateLimiterUnavailable):
            await check(lim, "a", 5)
        with pytest.raises(TypeError, match="rates"):
            lim.with_options(window_seconds=1)
        other = lim.with_options(prefix="other")
        assert type(other) is cls and other.rates == lim.rates
        assert all(key.startswith("other:") for key in other.keys_for("a"))
        assert other.algorithm == lim.algorithm and other.timeout == 0.5
    finally:
        await close(client)


# -- Redis Cluster -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_tiers_on_a_cluster(kind, cluster):
    # What tiers do on a cluster is tested, not how fast: a busy host's slow answer
    # must not read as an outage.
    connect = ratelimit.connect_sync if kind == "sync" else ratelimit.connect
    client = connect(cluster.url, timeout=10)
    prefix = f"test:{uuid.uuid4().hex[:12]}"
    try:
        for entry in ENTRIES:
            clock = ManualClock(T0)
            lim = tiered(kind, entry, client, ["3/s", "5/min"], prefix=prefix, clock=clock,
                         timeout=10)  # fmt: skip
            who = [f"user-{i}" for i in range(6)]  # spread over the masters
            nodes = set()
            for name in who:
                keys = lim.keys_for(name)
                slots = {key_slot(key.encode()) for key in keys}
                assert len(slots) == 1, keys  # one script may touch them all
                node = cluster.slot_owner(slots.pop())
                nodes.add(node)
                with cluster.nodes[node].admin(timeout=5) as admin:
                    for _ in range(3):
                        assert (await check(lim, name)).allowed
                    assert admin.exists(*keys) == 2
                    before = snapshot(admin, keys)
                    said = await peek(lim, name)
                    assert not said.allowed and said.tier == 0 and not said.degraded
                    assert snapshot(admin, keys) == before
                    assert await check(lim, name) == said
                    assert await reset(lim, name) is True
                    assert admin.exists(*keys) == 0
            assert len(nodes) > 1
            many = await check_many(lim, who, 2)
            assert all(d.allowed and d.remaining == 1 and d.tier == 0 for d in many)
            for name in who:
                assert await reset(lim, name) is True
    finally:
        await close(client)


# -- a host a day ahead ------------------------------------------------------------------


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_a_day_ahead_host_locks_no_tier_for_longer_than_its_bound(entry, real_redis_url, prefix):
    """Checks stamped a day ahead, then a host on the real clock: each tier trusts a
    stored time only up to Redis's clock plus the tolerance, which the script reads
    once for every tier and both passes. No wait exceeds the longest window plus the
    tolerance, no key outlives its tier's state by more than the tolerance, and
    requests are admitted again within that bound."""
    tolerance, day_ms = 300, 86_400_000
    rates = ["3/s", "5/2s"]
    client = redis.Redis.from_url(real_redis_url)
    ahead = tiered(
        "sync", entry, client, rates, prefix=prefix,
        clock=lambda: time.time() + day_ms / 1000, clock_tolerance_ms=tolerance,
        ttl_slack_ms=0,
    )  # fmt: skip
    correct = tiered("sync", entry, client, rates, prefix=prefix, clock_tolerance_ms=tolerance)
    try:
        for _ in range(3):
            ahead.check("skewed")
        bound = 2000 + tolerance + 25  # the longest window, the tolerance, and slack
        # The correct host stamps its check before sending it: the wait counts from
        # that stamp, so the time the check took to reach Redis adds to it.
        sent = time.monotonic()
        told = correct.check("skewed")
        lag = (time.monotonic() - sent) * 1000
        assert told.retry_after_ms <= bound + lag and told.reset_after_ms <= bound + lag, (
            told,
            lag,
        )
        # A key lives as long as its tier's state can matter (two windows for the
        # counter), counted from at most the tolerance ahead.
        ttls = [client.pttl(key) for key in correct.keys_for("skewed")]
        most = [tier.state_ttl_ms() + tolerance + 25 for tier in correct.tiers]
        assert all(0 < ttl <= m for ttl, m in zip(ttls, most, strict=True)), (ttls, most)
        began, in_checks = time.monotonic(), 0.0
        while not told.allowed:  # bounded: each wait is the script's own retry
            assert time.monotonic() - began - in_checks < bound / 1000, told
            time.sleep(told.retry_after_ms / 1000)
            sent = time.monotonic()
            told = correct.check("skewed")
            in_checks += time.monotonic() - sent
        assert told.allowed and not told.degraded
    finally:
        client.close()
