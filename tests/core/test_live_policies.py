"""Policies change on live keys: a deploy lowers a limit, a second tier shares the
identity, a host's clock runs far ahead.

The state machine below interleaves checks, clock moves and policy changes (limit,
window, algorithm and storage, clock tolerance) on one prefix, and holds every decision
to the reference model given the state that is there: a key is shared exactly by
limiters with the same algorithm, storage and window, so the model keeps one state per
(algorithm, window) and hands it to whichever policy checks next.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

import ratelimit.lab  # noqa: F401  (registers the reference models)
import ratelimit.sync
from ratelimit import algorithms
from ratelimit.clock import ManualClock
from tests.core.machines import run_machine

# Every storage a limiter can keep: the four algorithms and the compact log.
ENTRIES = [algorithms.get(name) for name in ("logc", "log", "fw", "swc", "gcra")]
IDENTITIES = ["alice", "bob"]
WINDOWS_MS = [1000, 2000, 5000]


def outcome(decision: Any) -> tuple[bool, int, int, int]:
    return (
        decision.allowed,
        decision.remaining,
        decision.retry_after_ms,
        decision.reset_after_ms,
    )


class LivePolicies(RuleBasedStateMachine):
    """One prefix, one virtual clock, a policy that changes between checks."""

    client: Any = None

    @initialize(
        entry=st.sampled_from(ENTRIES),
        window_ms=st.sampled_from(WINDOWS_MS),
        limit=st.integers(1, 12),
    )
    def start(self, entry, window_ms, limit):
        self.prefix = "live-" + uuid.uuid4().hex[:10]
        self.now_ms = 1_000_000_000
        self.clock = ManualClock()
        self.clock.set_ms(self.now_ms)
        # (algorithm tag, window) -> the model's per-identity state for that key.
        self.stores: dict[tuple[str, int], dict[bytes, Any]] = {}
        self.use(entry, window_ms, limit, None)

    def use(self, entry, window_ms, limit, tolerance):
        options = dict(
            window_ms=window_ms, prefix=self.prefix, clock=self.clock,
            clock_tolerance_ms=tolerance, on_error="raise",
        )  # fmt: skip
        self.limiter = entry.build("sync", self.client, None, limit, **options)
        self.model = entry.build("reference", None, limit, **options)
        self.model.state = self.stores.setdefault((entry.name, window_ms), {})

    @rule(
        entry=st.sampled_from(ENTRIES),
        window_ms=st.sampled_from(WINDOWS_MS),
        limit=st.integers(1, 12),
        tolerance=st.sampled_from([None, 0, 300, 1000]),
    )
    def change_policy(self, entry, window_ms, limit, tolerance):
        self.use(entry, window_ms, limit, tolerance)

    @rule(limit=st.integers(1, 12))
    def change_the_limit_only(self, limit):
        # The likeliest change in a deploy: same key, another limit.
        entry, window_ms = self.limiter.algorithm, self.limiter.window_ms
        self.use(entry, window_ms, limit, self.limiter.clock_tolerance_ms)

    @rule(ms=st.integers(-200, 400) | st.integers(-3000, 6000))
    def move_the_clock(self, ms):
        # Backwards too: the next check may come from a host whose clock is behind.
        self.now_ms += ms
        self.clock.set_ms(self.now_ms)

    @rule(identity=st.sampled_from(IDENTITIES), n=st.integers(1, 12))
    def burst(self, identity, n):
        # What fills a log before its limit is lowered.
        for _ in range(n):
            self.check(identity, 1)

    @rule(identity=st.sampled_from(IDENTITIES), cost=st.integers(1, 12))
    def check(self, identity, cost):
        cost = min(cost, self.limiter.limit)
        decision = self.limiter.check(identity, cost)
        assert not decision.degraded, decision
        # A lower limit reads a count admitted under a higher one: never below zero.
        assert 0 <= decision.remaining <= self.limiter.limit
        expected = self.model.check(identity, cost)
        assert outcome(decision) == outcome(expected), (self.limiter, decision, expected)

    def teardown(self):
        for key in self.client.scan_iter(match=self.prefix + ":*", count=1000):
            self.client.delete(key)


def _run(client: Any) -> None:
    run_machine(LivePolicies, client, examples=200, steps=50)


# 200 runs of 50 steps: a minute or two on a busy machine, more than the default bound.
@pytest.mark.timeout(600)
def test_policy_changes_on_live_keys_embedded():
    _run(fakeredis.FakeRedis())


@pytest.mark.timeout(600)
def test_policy_changes_on_live_keys_real(real_redis_url):
    client = redis.Redis.from_url(real_redis_url)
    try:
        _run(client)
    finally:
        client.close()


# -- the cases a deployment meets, one by one, on a real Redis ---------------------------


@pytest.mark.parametrize("storage", ["compact", "sorted-set"])
@pytest.mark.parametrize("cost", [1, 2])
def test_a_lowered_limit_is_decided_not_failed(real_redis_url, prefix, storage, cost):
    """Ten checks at 10 per second, then the same identity at 5 per second (a rolling
    deploy): decided like the model, not the failure policy (which would admit)."""
    client = redis.Redis.from_url(real_redis_url)
    clock = ManualClock(1000.0)
    old = ratelimit.sync.SlidingWindowLimiter(
        client, 1, 10, prefix, storage=storage, clock=clock, on_error="allow"
    )
    new = old.with_options(limit=5)
    model = algorithms.get(old).build("reference", 1, 10, clock=clock)
    lowered = model.with_options(limit=5)
    lowered.state = model.state
    try:
        assert new.key_for("hot") == old.key_for("hot")  # the history still counts
        for _ in range(10):
            assert old.check("hot").allowed and model.check("hot").allowed
            clock.advance(0.05)
        for _ in range(4):
            decision = new.check("hot", cost)
            assert not decision.degraded
            assert outcome(decision) == outcome(lowered.check("hot", cost))
            clock.advance(0.3)
    finally:
        client.close()


def test_tiers_on_one_prefix_keep_their_own_keys(real_redis_url, prefix):
    """10 per second and 5 per minute on one identity: the per-second tier neither
    trims the minute's history nor shortens its key's life."""
    client = redis.Redis.from_url(real_redis_url)
    clock = ManualClock(1000.0)
    per_second = ratelimit.sync.SlidingWindowLimiter(client, 1, 10, prefix, clock=clock)
    per_minute = ratelimit.sync.SlidingWindowLimiter(client, 60, 5, prefix, clock=clock)
    try:
        assert per_second.key_for("u") != per_minute.key_for("u")
        admitted = 0
        for _ in range(11):  # 1.1 s, both tiers asked each time, as a route would
            if per_minute.check("u").allowed and per_second.check("u").allowed:
                admitted += 1
            clock.advance(0.1)
        assert admitted == 5
        assert client.pttl(per_minute.key_for("u")) > 60_000  # not the second's TTL
    finally:
        client.close()


# The slack a TTL or a wait may have beyond window + tolerance: a few ms on a quiet
# machine, up to 8 measured on a busy one (two CPU burners beside the suite).
SLACK_MS = 25


def _server_minus_host_ms(client: Any) -> float:
    seconds, micros = client.time()
    return seconds * 1000 + micros / 1000 - time.time() * 1000


@pytest.mark.parametrize("name", ["logc", "log", "fw", "gcra", "swc"])
def test_a_host_a_day_ahead_locks_out_for_at_most_window_plus_tolerance(
    real_redis_url, prefix, name
):
    """One check stamped a day ahead (an NTP step, a VM restored from a snapshot), then
    a host with a correct clock: its wait and the key's TTL stay within the window plus
    the clock tolerance (1 s by default), not a day."""
    client = redis.Redis.from_url(real_redis_url)
    entry = algorithms.get(name)
    # A real host with a wrong clock: real time, so no virtual-clock TTL slack.
    ahead = entry.build(
        "sync", client, 1, 1, prefix, clock=lambda: time.time() + 86_400, ttl_slack_ms=0
    )
    correct = entry.build("sync", client, 1, 1, prefix)
    assert correct.clock_tolerance_ms == 1000
    try:
        assert ahead.check("u").allowed
        decision = correct.check("u")
        # Redis's clock and this host's may differ by a few ms: the bound is Redis's,
        # plus a slack of SLACK_MS for the moments between reading one and the other.
        offset = max(0.0, _server_minus_host_ms(client)) + SLACK_MS
        bound = correct.window_ms + correct.clock_tolerance_ms + offset
        assert not decision.degraded
        assert decision.retry_after_ms <= bound, decision
        assert decision.reset_after_ms <= bound, decision
        assert client.pttl(correct.key_for("u")) <= bound
    finally:
        client.close()


@pytest.mark.parametrize("slack_ms", [0, 1000])
def test_a_check_that_reaches_redis_late_needs_ttl_slack(real_redis_url, prefix, slack_ms):
    """A key's TTL runs on Redis's clock from its last admit, a check's stamp on its
    host's: a check stamped 950 ms after five admits at 5/s, but run once their key's
    TTL is over, finds the state gone without slack and is admitted; with `ttl_slack_ms`
    at least its delay, the key is still there and the check is rejected (as README's
    "Clocks that jump" says)."""
    client = redis.Redis.from_url(real_redis_url)
    clock = ManualClock()
    clock.set_ms(1_000_000_000)
    limiter = ratelimit.sync.SlidingWindowLimiter(
        client, "5/s", prefix=prefix, clock=clock, ttl_slack_ms=slack_ms
    )
    try:
        assert all(limiter.check("late").allowed for _ in range(5))
        key = limiter.key_for("late")
        began = time.monotonic()
        # Wait out the window's part of the TTL: without slack until the key is gone
        # (PTTL -2; a PTTL of 0 is a key with under a millisecond left, still there).
        while (left := client.pttl(key)) > slack_ms or (slack_ms == 0 and left != -2):
            assert time.monotonic() - began < 5, left
            time.sleep(0.01)
        clock.set_ms(1_000_000_950)  # still inside the five admits' window
        decision = limiter.check("late")
        assert decision.allowed == (slack_ms == 0), (slack_ms, decision)
    finally:
        client.close()
