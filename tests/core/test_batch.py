"""check_many: one pipelined round trip, the same decisions as checks in sequence."""

from __future__ import annotations

import random

import fakeredis
import pytest
import redis

import ratelimit
import ratelimit.sync
from ratelimit import algorithms
from ratelimit.clock import ManualClock

NAMES = [a.class_name for a in algorithms.ALGORITHMS]


def batch(seed: int, n: int = 60) -> tuple[list[str], list[int]]:
    rng = random.Random(seed)
    return [rng.choice("abc") for _ in range(n)], [rng.randint(1, 3) for _ in range(n)]


@pytest.mark.parametrize("name", NAMES)
async def test_async_batch_decides_like_a_sequence(name, client, prefix):
    identities, costs = batch(1)
    clock = ManualClock(1_796_000_000.5)
    cls = getattr(ratelimit, name)
    batched = cls(client, 1, 10, prefix=f"{prefix}:b", clock=clock)
    sequential = cls(client, 1, 10, prefix=f"{prefix}:s", clock=clock)
    expected = [await sequential.check(w, c) for w, c in zip(identities, costs, strict=True)]
    assert await batched.check_many(identities, costs) == expected
    assert sum(d.allowed for d in expected) not in (0, len(expected))  # both answers occur


@pytest.mark.parametrize("name", NAMES)
def test_sync_batch_decides_like_a_sequence(name, sync_client, prefix):
    identities, costs = batch(2)
    clock = ManualClock(1_796_000_000.5)
    cls = getattr(ratelimit.sync, name)
    batched = cls(sync_client, 1, 10, prefix=f"{prefix}:b", clock=clock)
    sequential = cls(sync_client, 1, 10, prefix=f"{prefix}:s", clock=clock)
    expected = [sequential.check(w, c) for w, c in zip(identities, costs, strict=True)]
    assert batched.check_many(identities, costs) == expected


async def test_one_round_trip_per_batch(monkeypatch):
    client = fakeredis.FakeAsyncRedis()
    limiter = ratelimit.SlidingWindowLimiter(client, 1, 10)
    executed = []
    pipeline_class = type(client.pipeline())
    original = pipeline_class.execute

    async def counting(self, *args, **kwargs):
        executed.append(len(self.command_stack))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(pipeline_class, "execute", counting)
    decisions = await limiter.check_many([f"id-{i}" for i in range(100)])
    assert len(decisions) == 100 and all(d.allowed for d in decisions)
    # A server that lacks the script answers NOSCRIPT to every call and runs none: the
    # calls go again behind a SCRIPT LOAD, once. After that, one round trip a batch.
    assert executed == [100, 101]
    executed.clear()
    decisions = await limiter.check_many([f"id-{i}" for i in range(100)])
    assert all(d.allowed for d in decisions) and executed == [100]


async def test_a_bad_request_stops_the_whole_batch_before_redis():
    client = fakeredis.FakeAsyncRedis()
    limiter = ratelimit.SlidingWindowLimiter(client, 1, 10, on_error="allow")
    with pytest.raises(ValueError, match="cost"):
        await limiter.check_many(["a", "b", "c"], [1, 11, 1])
    with pytest.raises(ValueError, match="identity"):
        await limiter.check_many(["a", ""])
    with pytest.raises(ValueError, match="costs must be one int or one per identity"):
        await limiter.check_many(["a", "b"], [1])
    assert await client.dbsize() == 0
    assert await limiter.check_many([]) == []


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_the_failure_policy_answers_every_request(on_error):
    down = redis.Redis(host="127.0.0.1", port=1)  # nothing listens there
    limiter = ratelimit.sync.SlidingWindowLimiter(down, 1, 10, on_error=on_error, timeout=0.3)
    decisions = limiter.check_many(["a", "b", "c"])
    assert len(decisions) == 3 and all(d.degraded for d in decisions)
    assert all(d.allowed == (on_error == "allow") for d in decisions)


async def test_raise_policy_raises_once_for_the_batch():
    down = redis.asyncio.Redis(host="127.0.0.1", port=1)
    limiter = ratelimit.SlidingWindowLimiter(down, 1, 10, timeout=0.3)
    with pytest.raises(ratelimit.RateLimiterUnavailable):
        await limiter.check_many(["a", "b"])
    await down.aclose()
