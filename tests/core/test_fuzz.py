"""Fuzzing the key mapping and the model/Lua equivalence.

1. Keys: bounded for any text or bytes, identical on the fast and the generic path,
   free of collisions in a large seeded sample, and placed in a cluster slot that only
   the digest decides (braces in the identity steer nothing).
2. Decisions: hypothesis interleaves several identities and several limiter
   instances (asyncio and sync clients, some sharing keys), random costs and batches,
   with time stepping forward and often standing still; every decision of the Lua
   scripts must equal the reference model's. tests/test_reference.py does this for
   one instance and skewed clocks; here the instances and identities mix.
3. Concurrency: batches of checks run at once with asyncio.gather, so their order
   in Redis is not known; each identity's decisions must then be explained by some
   order of its requests through the model (Redis runs scripts one at a time, so a
   decision no order explains would be a lost update or an over-admission).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import random
import re
import uuid
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

import ratelimit
import ratelimit.sync
from ratelimit import algorithms, keys
from ratelimit.clock import ManualClock
from ratelimit.lab import reference

# Every limiter class, and the sliding log in each of its storages ("<class>/<storage>").
NAMES = [a.class_name for a in algorithms.ALGORITHMS] + [
    f"SlidingWindowLimiter/{storage}"
    for storage in algorithms.LOG_STORAGES
    if algorithms.LOG_STORAGES[storage] is not algorithms.SLIDING_LOG
]
EXCERPT = r"[A-Za-z0-9._@%-]{1," + str(keys.READABLE_CHARS) + "}"
TAG = r"\{(?P<tag>[A-Za-z0-9_-]{22})\}"
SLACK_MS = 600_000  # real-time expiry must not cut a replay short
# The limiters' timeout in the replays: the decisions are under test, not how long they
# take, and a busy machine can stall a test process for over a second (a garbage
# collection while other processes hold both cores), which the default 1 s would turn
# into a degraded answer.
TIMEOUT_S = 60

# --- 1. Keys -----------------------------------------------------------------------------------

ANY_CHAR = st.characters(codec=None) | st.characters(categories=["Cs"])  # lone surrogates too
TEXT = st.text(ANY_CHAR, min_size=1) | st.text(st.sampled_from("{}*?[]\n\x00 %:"), min_size=1)
LONG = st.builds(
    lambda part, n: part * n, st.text(ANY_CHAR, min_size=1, max_size=8), st.integers(1, 3000)
)
IDENTITY = TEXT | st.binary(min_size=1) | LONG


_UNUSED = fakeredis.FakeAsyncRedis()  # key_for sends nothing


def limiter(name: str, **options: Any) -> Any:
    """A Redis limiter, for its keys (nothing is sent)."""
    name, _, storage = name.partition("/")
    if storage:
        options["storage"] = storage
    return getattr(ratelimit, name)(_UNUSED, 1, 10, **options)


@settings(max_examples=400, deadline=None)
@given(
    identity=IDENTITY,
    name=st.sampled_from(NAMES),
    prefix=st.sampled_from(["rl", "p" * 100, "rl:geo-fence.v2"]),
    readable=st.booleans(),
    secret=st.none() | st.binary(min_size=1, max_size=64),
)
def test_key_is_bounded_and_the_same_on_every_path(identity, name, prefix, readable, secret):
    lim = limiter(name, prefix=prefix, readable_keys=readable, key_secret=secret)
    key = lim.key_for(identity)
    generic = keys.make_key(
        prefix,
        lim.algorithm.name,
        identity,
        window_ms=lim.window_ms,
        secret=secret,
        readable=readable,
    )
    assert key == generic  # the hot path builds the same key as the documented one
    head = re.escape(f"{prefix}:{lim.algorithm.name}:{lim.window_ms}:")
    excerpt = f"(?P<excerpt>{EXCERPT}):" if readable else ""
    match = re.fullmatch(head + excerpt + TAG, key)
    assert match, key
    assert match["tag"] == keys.digest(identity, secret)
    assert (
        len(key)
        <= len(prefix)
        + 1
        + len(lim.algorithm.name)
        + 1
        + len(str(lim.window_ms))
        + 1
        + 24
        + 25 * readable
    )
    # A bytes identity and its text form are one identity; nothing else is folded.
    if isinstance(identity, str):
        assert key == lim.key_for(identity.encode("utf-8", "surrogatepass"))


def sample(rng: random.Random, n: int) -> list[str | bytes]:
    """`n` identities of many shapes, most of them near one another."""
    out: list[str | bytes] = []
    quarter = n // 4
    # random bytes, short and long
    out += [rng.randbytes(rng.randint(1, 40)) for _ in range(quarter)]
    # random text over all of unicode, surrogates included
    out += [
        "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randint(1, 6)))
        for _ in range(quarter)
    ]
    # single-bit flips of a few 32-byte API keys
    while len(out) < 3 * quarter:
        base = bytearray(rng.randbytes(32))
        for bit in range(256):
            flipped = bytearray(base)
            flipped[bit // 8] ^= 1 << (bit % 8)
            out.append(bytes(flipped))
    # structured names: counters, braces around counters, prefixes of one long string
    long = "".join(rng.choice("ab{}") for _ in range(2000))
    while len(out) < n:
        i = len(out)
        out += [f"client-{i}", f"{{{i}}}", f"{{client}}-{i}", long[: i % 2000 + 1]]
    return out[:n]


def test_no_collisions_in_two_hundred_thousand_identities():
    identities = sample(random.Random(20261202), 200_000)
    distinct = {keys.identity_bytes(i) for i in identities}
    assert len(distinct) > 150_000  # the sample is mostly distinct inputs
    digests = {keys.digest(i) for i in distinct}
    assert len(digests) == len(distinct)
    secret = b"pepper"
    keyed = {keys.digest(i, secret) for i in list(distinct)[:50_000]}
    assert len(keyed) == 50_000
    # The limiter's fast path agrees on a slice of the sample.
    lim = limiter("SlidingWindowLimiter")
    for identity in identities[::97]:
        assert lim.key_for(identity) == keys.make_key(
            "rl", "logc", identity, window_ms=lim.window_ms
        )


@settings(max_examples=300, deadline=None)
@given(
    identity=TEXT,
    inserts=st.lists(
        st.tuples(st.integers(0, 10_000), st.sampled_from(["{", "}", "{}", "}{", "{x}", "{{"])),
        min_size=1,
        max_size=6,
    ),
    name=st.sampled_from(NAMES),
)
def test_braces_in_the_identity_never_choose_the_slot(identity, inserts, name):
    text = identity
    for position, braces in inserts:
        at = position % (len(text) + 1)
        text = text[:at] + braces + text[at:]
    slot = key_slot(keys.digest(text).encode())
    for options in ({}, {"readable_keys": True}, {"prefix": "other"}):
        key = limiter(name, **options).key_for(text)
        assert key.count("{") == 1 and key.count("}") == 1, key
        assert key_slot(key.encode()) == slot
    # The tag a client wrote is not the tag Redis hashes.
    for tag in re.findall(r"\{([^{}]+)\}", text):
        assert keys.digest(text) != tag


def test_a_client_cannot_pile_its_keys_onto_one_slot():
    """Ten thousand identities that all carry the same hash tag spread over every shard."""
    target = key_slot(b"victim")
    lim = limiter("SlidingWindowLimiter")
    slots = [key_slot(lim.key_for(f"{{victim}}{i}").encode()) for i in range(10_000)]
    assert slots.count(target) <= 5  # about 0.6 expected by chance
    per_third = [sum(1 for s in slots if s * 3 // 16384 == k) for k in range(3)]
    assert min(per_third) > 3_000, per_third
    assert len(set(slots)) > 4_500  # 10,000 draws over 16,384 slots: ~7,400 distinct


# --- 2. Interleavings ----------------------------------------------------------------------------

WEIRD = ["a", "b", "{a}", "}{", "*", "ключ", "🔑", "x" * 300, "\ud800", "a\nb", "\x00"]
WHO = st.sampled_from(WEIRD) | st.text(min_size=1, max_size=6) | st.binary(min_size=1, max_size=6)


@st.composite
def scenarios(draw: Any, gcra: bool, concurrent: bool = False) -> dict[str, Any]:
    """Options, identities, instances (their kind and key group) and timed steps.

    A step is (gap_ms, [(identity, instance, cost, delay), ...]): several requests to
    one instance as a batch (check_many) when run in sequence, or all at once when
    `concurrent`, each task first yielding to the others `delay` times (so that even
    the embedded fakeredis, which serves tasks in the order they start, sees them
    in a shuffled order).
    """
    window_ms = draw(st.sampled_from([1, 7, 100, 1000]) | st.integers(1, 3000))
    limit = draw(st.integers(1, 8))
    options: dict[str, Any] = {"window_ms": window_ms, "limit": limit}
    if gcra:
        options["burst"] = draw(st.integers(1, 2 * limit))
    max_cost = min(limit, options.get("burst", limit))
    identities = draw(st.lists(WHO, min_size=1, max_size=4, unique_by=keys.identity_bytes))
    kinds = ["async"] if concurrent else ["async", "sync"]
    # Two to four instances; group 0 shares keys, group 1 has a prefix of its own.
    instances = draw(
        st.lists(
            st.tuples(st.sampled_from(kinds), st.sampled_from([0, 0, 1])), min_size=2, max_size=4
        )
    )
    request = st.tuples(
        st.integers(0, len(identities) - 1),
        st.integers(0, len(instances) - 1),
        st.integers(1, max_cost),
        st.integers(0, 3),
    )
    gap = st.one_of(st.just(0), st.integers(1, 5), st.integers(0, 2 * window_ms))
    size = 8 if concurrent else 3
    steps = draw(
        st.lists(st.tuples(gap, st.lists(request, min_size=1, max_size=size)), min_size=1,
                 max_size=12 if concurrent else 25)
    )  # fmt: skip
    if not concurrent:  # a batch goes to one instance
        steps = [(g, [(w, reqs[0][1], c, 0) for w, _, c, _ in reqs]) for g, reqs in steps]
    start_ms = draw(st.sampled_from([0, 999, 1_796_000_000_123]))
    return {
        "options": options,
        "identities": identities,
        "instances": instances,
        "steps": steps,
        "start_ms": start_ms,
    }


class World:
    """The limiter instances of a scenario on one Redis, and one model per key group."""

    def __init__(self, name: str, scenario: dict[str, Any], make_client: Callable) -> None:
        self.clock = ManualClock()
        self.run_id = uuid.uuid4().hex[:10]
        name, _, storage = name.partition("/")
        options = {**scenario["options"], **({"storage": storage} if storage else {})}
        self.models = [getattr(reference, name)(clock=self.clock, **options) for _ in range(2)]
        self.instances = []
        for kind, group in scenario["instances"]:
            module = ratelimit if kind == "async" else ratelimit.sync
            self.instances.append(
                (
                    group,
                    getattr(module, name)(
                        make_client(kind),
                        prefix=f"test:fuzz:{self.run_id}:g{group}",
                        clock=self.clock,
                        ttl_slack_ms=SLACK_MS,
                        timeout=TIMEOUT_S,
                        **options,
                    ),
                )
            )

    def keys(self, identities: list) -> list[str]:
        return [lim.key_for(w) for _, lim in self.instances for w in identities]


async def run(limiter: Any, who: list, costs: list[int]) -> list[ratelimit.Decision]:
    if len(who) == 1:
        result: Any = limiter.check(who[0], cost=costs[0])
        return [await result if inspect.isawaitable(result) else result]
    result = limiter.check_many(who, costs)
    return await result if inspect.isawaitable(result) else result


async def sequential(world: World, scenario: dict[str, Any]) -> None:
    """Every step in order: the Lua decisions must equal the model's, field by field."""
    now_ms, identities = scenario["start_ms"], scenario["identities"]
    for step, (gap, requests) in enumerate(scenario["steps"]):
        now_ms += gap
        world.clock.set_ms(now_ms)
        group, lim = world.instances[requests[0][1]]
        who = [identities[w] for w, _, _, _ in requests]
        costs = [c for _, _, c, _ in requests]
        got = await run(lim, who, costs)
        model = world.models[group]
        expected = [model.check(w, cost=c) for w, c in zip(who, costs, strict=True)]
        assert got == expected, f"step {step} at {now_ms} ms: {requests}"
        assert all(d.decided_at_ms == now_ms for d in got)


def explained(model: Any, identity: Any, requests: list[tuple[int, ratelimit.Decision]]) -> bool:
    """True when some order of `requests` (cost, decision seen), all at the model's
    current time, makes the model give every decision seen; the model is then left
    as that order leaves it."""
    if not requests:
        return True
    who = keys.identity_bytes(identity)
    saved = copy.deepcopy(model.state.get(who))
    tried = set()
    for i, (cost, seen) in enumerate(requests):
        if (cost, seen) in tried:  # equal requests with equal answers are interchangeable
            continue
        tried.add((cost, seen))
        if model.check(identity, cost=cost) == seen and explained(
            model, identity, requests[:i] + requests[i + 1 :]
        ):
            return True
        if saved is None:
            model.state.pop(who, None)
        else:
            model.state[who] = copy.deepcopy(saved)
    return False


async def late(limiter: Any, identity: Any, cost: int, delay: int) -> ratelimit.Decision:
    for _ in range(delay):
        await asyncio.sleep(0)
    return await limiter.check(identity, cost=cost)


async def concurrent(world: World, scenario: dict[str, Any]) -> None:
    """Each step's requests at once; each identity's answers must fit some order."""
    now_ms, identities = scenario["start_ms"], scenario["identities"]
    for step, (gap, requests) in enumerate(scenario["steps"]):
        now_ms += gap
        world.clock.set_ms(now_ms)
        got = await asyncio.gather(
            *(late(world.instances[i][1], identities[w], c, d) for w, i, c, d in requests)
        )
        by_key: dict[tuple[int, int], list] = {}
        for (w, i, c, _), decision in zip(requests, got, strict=True):
            by_key.setdefault((world.instances[i][0], w), []).append((c, decision))
        for (group, w), seen in by_key.items():
            model = world.models[group]
            admitted = sum(c for c, d in seen if d.allowed)
            assert admitted <= getattr(model, "burst", model.limit)  # at one instant
            assert explained(model, identities[w], seen), (
                f"step {step} at {now_ms} ms: no order of {seen} fits the model"
            )


def on_fakeredis(kind: str, server: fakeredis.FakeServer) -> Any:
    return (
        fakeredis.FakeAsyncRedis(server=server)
        if kind == "async"
        else fakeredis.FakeRedis(server=server)
    )


def replay_on_fakeredis(name: str, scenario: dict[str, Any], mode: Callable) -> None:
    server = fakeredis.FakeServer()
    world = World(name, scenario, lambda kind: on_fakeredis(kind, server))
    asyncio.run(mode(world, scenario))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_interleaved_instances_and_identities_match_the_model(name, data):
    scenario = data.draw(scenarios(gcra=name == "TokenBucketLimiter"))
    replay_on_fakeredis(name, scenario, sequential)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_concurrent_checks_fit_some_order_of_the_model(name, data):
    scenario = data.draw(scenarios(gcra=name == "TokenBucketLimiter", concurrent=True))
    replay_on_fakeredis(name, scenario, concurrent)


def test_the_order_check_catches_a_wrong_answer():
    """`explained` is not vacuous: an answer no order gives is caught."""
    clock = ManualClock(1_000.0)
    model = reference.SlidingWindowLimiter(1, 2, clock=clock)
    yes = ratelimit.Decision(True, 2, 1, 0, 1000)
    yes_last = ratelimit.Decision(True, 2, 0, 0, 1000)
    no = ratelimit.Decision(False, 2, 0, 1000, 1000)
    assert explained(copy.deepcopy(model), "a", [(1, no), (1, yes_last), (1, yes)])
    assert not explained(copy.deepcopy(model), "a", [(1, yes), (1, yes), (1, yes_last)])
    assert not explained(copy.deepcopy(model), "a", [(1, yes), (1, yes_last), (1, yes_last)])


# --- the same on a real Redis (fewer examples) ---------------------------------------------------


def replay_on_real(name: str, scenario: dict[str, Any], mode: Callable, url: str) -> None:
    """Each instance gets a client (and so connections) of its own."""

    async def main() -> None:
        made: list[Any] = []

        def make_client(kind: str) -> Any:
            client = (redis.asyncio.Redis if kind == "async" else redis.Redis).from_url(url)
            made.append(client)
            return client

        world = World(name, scenario, make_client)
        try:
            await mode(world, scenario)
        finally:
            cleanup = redis.Redis.from_url(url)
            cleanup.delete(*world.keys(scenario["identities"]))
            cleanup.close()
            for client in made:
                closed = client.aclose() if isinstance(client, redis.asyncio.Redis) else None
                if closed is not None:
                    await closed
                else:
                    client.close()

    asyncio.run(main())


REAL = settings(max_examples=12, deadline=None)


@pytest.mark.parametrize("name", NAMES)
@REAL
@given(data=st.data())
def test_interleavings_match_the_model_on_real_redis(name, real_redis_url, data):
    scenario = data.draw(scenarios(gcra=name == "TokenBucketLimiter"))
    replay_on_real(name, scenario, sequential, real_redis_url)


@pytest.mark.parametrize("name", NAMES)
@REAL
@given(data=st.data())
def test_concurrent_checks_fit_the_model_on_real_redis(name, real_redis_url, data):
    scenario = data.draw(scenarios(gcra=name == "TokenBucketLimiter", concurrent=True))
    replay_on_real(name, scenario, concurrent, real_redis_url)
