"""Everything a caller or a client can send wrong, in three tables.

- `BAD_OPTIONS` (+ `BAD_BURST`): constructor options of wrong type, sign or size, for
  every limiter class: asyncio, sync and the reference models.
- `BAD_CHECKS` and `IDENTITIES`: what one check can get wrong (cost, identity, the
  clock's reading), and identities of every awkward shape that must still work.
- `HTTP_ROWS`: requests with spoofed proxy headers, missing, empty, enormous, binary
  or duplicated API keys.

Each row gets a clear error naming what is wrong, or a correct decision. A refused
check writes nothing to Redis and costs no budget; no key in Redis grows with the
identity, and no raw API key is stored readable (the keyspace is scanned, on the
embedded fakeredis and on a real Redis).

These tables are the one list of bad input; they run against the asyncio and sync
limiters, the reference models, the batch path and a real Redis. (What good options
do is tested in test_policy.py.)
"""

from __future__ import annotations

import inspect
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

import fakeredis
import httpx
import numpy as np
import pytest
import redis
import redis.asyncio
from fastapi import Depends, FastAPI
from redis.crc import key_slot

import ratelimit
import ratelimit.sync
from ratelimit import algorithms, keys, validation
from ratelimit.clock import ManualClock
from ratelimit.devtools.demo_server import DemoServer
from ratelimit.http import MAX_API_KEY_BYTES, PROBLEM_JSON, RateLimitInfo, install, rate_limit
from ratelimit.lab import reference

NAMES = [a.class_name for a in algorithms.ALGORITHMS]
KINDS = {"async": ratelimit, "sync": ratelimit.sync, "model": reference}
LIMIT = 10
DIGEST = re.compile(r"\{[A-Za-z0-9_-]{22}\}")
EXCERPT = re.compile(r"[A-Za-z0-9._@%-]{0," + str(keys.READABLE_CHARS) + "}")


def make(kind: str, name: str, client: Any = None, /, *args: Any, **kwargs: Any) -> Any:
    """A limiter of `kind` ("async", "sync", "model"); models take no client."""
    cls = getattr(KINDS[kind], name)
    if kind == "model":
        return cls(*args, **kwargs)
    if client is None:
        client = fakeredis.FakeAsyncRedis() if kind == "async" else fakeredis.FakeRedis()
    return cls(client, *args, **kwargs)


async def done(result: Any) -> Any:
    """The result of a sync call, or of an async one once awaited."""
    return await result if inspect.isawaitable(result) else result


async def check(limiter: Any, identity: Any, cost: Any = 1) -> ratelimit.Decision:
    return await done(limiter.check(identity, cost=cost))


async def check_many(limiter: Any, identities: list, costs: list) -> list:
    return await done(limiter.check_many(identities, costs))


async def redis_keys(client: Any, prefix: str) -> list[bytes]:
    """Every key under `prefix` (scanned, so it works on any backend and client kind)."""
    if isinstance(client, redis.asyncio.Redis):
        return sorted([k async for k in client.scan_iter(match=f"{prefix}:*", count=10_000)])
    return sorted(client.scan_iter(match=f"{prefix}:*", count=10_000))


async def stored_values(client: Any, key: bytes) -> list[bytes]:
    """Everything stored under `key`: members, scores, fields and values, as bytes."""
    kind = await done(client.type(key))
    if kind == b"zset":
        pairs = await done(client.zrange(key, 0, -1, withscores=True))
        return [m for m, _ in pairs] + [repr(score).encode() for _, score in pairs]
    if kind == b"hash":
        fields = await done(client.hgetall(key))
        return [*fields, *fields.values()]
    if kind == b"string":
        return [await done(client.get(key))]
    raise AssertionError(f"unexpected type {kind!r} under {key!r}")


def key_bound(limiter: Any) -> int:
    """The longest key a limiter may write, whatever the identity."""
    readable = keys.READABLE_CHARS + 1 if limiter.readable_keys else 0
    window = len(str(limiter.window_ms)) + 1
    return len(limiter.prefix) + len(limiter.algorithm.name) + 2 + window + 24 + readable


# --- 1. Options --------------------------------------------------------------------------------

GOOD = {"window_seconds": 1, "limit": LIMIT}


def opt(**overrides: Any) -> dict[str, Any]:
    return {**GOOD, **overrides}


# (id, constructor keywords, message fragment). Every row raises ValueError.
BAD_OPTIONS = [
    # limit
    ("limit-None", opt(limit=None), "limit is required"),
    ("limit-str", opt(limit="10"), "limit must be an integer"),
    ("limit-float", opt(limit=1.5), "limit must be an integer"),
    ("limit-whole-float", opt(limit=10.0), "limit must be an integer"),
    ("limit-True", opt(limit=True), "limit must be an integer"),
    ("limit-False", opt(limit=False), "limit must be an integer"),
    ("limit-0", opt(limit=0), "limit must be >= 1"),
    ("limit-negative", opt(limit=-1), "limit must be >= 1"),
    ("limit-nan", opt(limit=math.nan), "limit must be an integer"),
    ("limit-inf", opt(limit=math.inf), "limit must be an integer"),
    ("limit-Decimal", opt(limit=Decimal(10)), "limit must be an integer"),
    ("limit-Fraction", opt(limit=Fraction(10)), "limit must be an integer"),
    ("limit-huge", opt(limit=10**30), "limit must be <="),
    ("limit-above-max", opt(limit=validation.MAX_LIMIT + 1), "limit must be <="),
    # window_seconds
    ("no-window", opt(window_seconds=None), "exactly one of window_seconds and window_ms"),
    # A string is a rate ("10/s"), which carries its own limit.
    ("window-str", opt(window_seconds="1"), "window_seconds must be an integer, got '1'"),
    ("window-float", opt(window_seconds=0.5), "window_seconds must be an integer"),
    ("window-whole-float", opt(window_seconds=1.0), "window_seconds must be an integer"),
    ("window-True", opt(window_seconds=True), "window_seconds must be an integer"),
    ("window-0", opt(window_seconds=0), "window_seconds must be >= 1"),
    ("window-negative", opt(window_seconds=-1), "window_seconds must be >= 1"),
    ("window-nan", opt(window_seconds=math.nan), "window_seconds must be an integer"),
    ("window-inf", opt(window_seconds=math.inf), "window_seconds must be an integer"),
    ("window-huge", opt(window_seconds=10**30), "window_seconds must be <="),
    (
        "window-above-max",
        opt(window_seconds=validation.MAX_WINDOW_MS // 1000 + 1),
        "window_seconds must be <=",
    ),
    # window_ms
    ("both-windows", opt(window_ms=1000), "exactly one of window_seconds and window_ms"),
    ("window_ms-str", opt(window_seconds=None, window_ms="1000"), "window_ms must be an integer"),
    ("window_ms-float", opt(window_seconds=None, window_ms=1.5), "window_ms must be an integer"),
    ("window_ms-True", opt(window_seconds=None, window_ms=True), "window_ms must be an integer"),
    ("window_ms-0", opt(window_seconds=None, window_ms=0), "window_ms must be >= 1"),
    ("window_ms-negative", opt(window_seconds=None, window_ms=-1), "window_ms must be >= 1"),
    ("window_ms-nan", opt(window_seconds=None, window_ms=math.nan), "window_ms must be an integer"),
    ("window_ms-inf", opt(window_seconds=None, window_ms=math.inf), "window_ms must be an integer"),
    ("window_ms-huge", opt(window_seconds=None, window_ms=10**30), "window_ms must be <="),
    (
        "window_ms-above-max",
        opt(window_seconds=None, window_ms=validation.MAX_WINDOW_MS + 1),
        "window_ms must be <=",
    ),
    # prefix: short text without braces (a brace would steer the cluster slot)
    ("prefix-empty", opt(prefix=""), "prefix must be a non-empty string"),
    ("prefix-None", opt(prefix=None), "prefix must be a non-empty string"),
    ("prefix-int", opt(prefix=7), "prefix must be a non-empty string"),
    ("prefix-bytes", opt(prefix=b"rl"), "prefix must be a non-empty string"),
    ("prefix-tag", opt(prefix="a{b}"), "prefix must not contain braces"),
    ("prefix-open-brace", opt(prefix="rl{"), "prefix must not contain braces"),
    ("prefix-close-brace", opt(prefix="}rl"), "prefix must not contain braces"),
    ("prefix-long", opt(prefix="p" * 101), "prefix must be at most 100 characters"),
    # SCAN MATCH "<prefix>:*" finds a limiter's keys: a pattern in the prefix would
    # match (and a cleanup delete) the keys of other prefixes
    ("prefix-star", opt(prefix="rl*"), "prefix must not contain glob characters"),
    ("prefix-question", opt(prefix="r?"), "prefix must not contain glob characters"),
    ("prefix-bracket", opt(prefix="r[lx]"), "prefix must not contain glob characters"),
    ("prefix-backslash", opt(prefix="r\\l"), "prefix must not contain glob characters"),
    ("prefix-newline", opt(prefix="rl\n"), "prefix must not contain glob characters"),
    ("prefix-NUL", opt(prefix="rl\x00"), "prefix must not contain glob characters"),
    # on_error
    ("on_error-unknown", opt(on_error="ignore"), "on_error must be"),
    ("on_error-case", opt(on_error="RAISE"), "on_error must be"),
    ("on_error-None", opt(on_error=None), "on_error must be"),
    ("on_error-bool", opt(on_error=True), "on_error must be"),
    ("on_error-list", opt(on_error=["raise"]), "on_error must be"),
    # timeout
    ("timeout-0", opt(timeout=0), "timeout must be > 0"),
    ("timeout-negative", opt(timeout=-1), "timeout must be > 0"),
    ("timeout-nan", opt(timeout=math.nan), "timeout must be > 0"),
    ("timeout-inf", opt(timeout=math.inf), "timeout must be > 0"),
    ("timeout-huge", opt(timeout=3601), "timeout must be > 0 and <= 3600"),
    ("timeout-str", opt(timeout="1"), "timeout must be a number"),
    ("timeout-True", opt(timeout=True), "timeout must be a number"),
    ("timeout-None", opt(timeout=None), "timeout must be a number"),
    # clock: a callable returning seconds, or "redis"
    ("clock-int", opt(clock=5), "clock must be a callable"),
    ("clock-None", opt(clock=None), "clock must be a callable"),
    ("clock-float", opt(clock=1.5), "clock must be a callable"),
    ("clock-name-case", opt(clock="REDIS"), "clock must be a callable"),
    ("clock-name", opt(clock="host"), "clock must be a callable"),
    # key_secret: None or 1..64 bytes
    ("secret-str", opt(key_secret="text"), "key_secret"),
    ("secret-empty", opt(key_secret=b""), "key_secret"),
    ("secret-long", opt(key_secret=b"x" * 65), "key_secret"),
    ("secret-int", opt(key_secret=123), "key_secret"),
    ("secret-bytearray", opt(key_secret=bytearray(b"k")), "key_secret"),
    # ttl_slack_ms
    ("slack-negative", opt(ttl_slack_ms=-1), "ttl_slack_ms must be >= 0"),
    ("slack-float", opt(ttl_slack_ms=1.5), "ttl_slack_ms must be an integer"),
    ("slack-str", opt(ttl_slack_ms="0"), "ttl_slack_ms must be an integer"),
    ("slack-True", opt(ttl_slack_ms=True), "ttl_slack_ms must be an integer"),
    ("slack-nan", opt(ttl_slack_ms=math.nan), "ttl_slack_ms must be an integer"),
    ("slack-huge", opt(ttl_slack_ms=validation.MAX_WINDOW_MS + 1), "ttl_slack_ms must be <="),
]

# The token bucket's burst.
BAD_BURST = [0, -1, 1.5, 2.0, "3", True, math.nan, math.inf, 10**30]

# Integer types other than int (numpy.int64, ...) are integers too.
GOOD_INTEGERS = [np.int64(7), np.int32(7), np.uint8(7)]

CLASSES = [(kind, name) for kind in KINDS for name in NAMES]


def class_id(value: tuple[str, str]) -> str:
    return f"{value[0]}.{value[1]}"


@pytest.mark.parametrize(("row", "options", "fragment"), BAD_OPTIONS, ids=lambda v: v)
def test_bad_option_is_refused_and_named(row, options, fragment):
    """Every class (asyncio, sync, model) refuses the option with the same message."""
    server = fakeredis.FakeServer()
    for kind, name in CLASSES:
        client = {
            "async": fakeredis.FakeAsyncRedis(server=server),
            "sync": fakeredis.FakeRedis(server=server),
            "model": None,
        }[kind]
        with pytest.raises(ValueError, match=re.escape(fragment)):
            make(kind, name, client, **options)
    assert fakeredis.FakeRedis(server=server).dbsize() == 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("burst", BAD_BURST, ids=repr)
def test_bad_burst_is_refused_and_named(kind, burst):
    with pytest.raises(ValueError, match="burst must be"):
        make(kind, "TokenBucketLimiter", **opt(burst=burst))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("value", GOOD_INTEGERS, ids=repr)
async def test_numpy_integers_are_integers(kind, value):
    """A limit, window or cost taken from a numpy array is accepted, as a plain int."""
    clock = ManualClock(1_000.0)
    limiter = make(kind, "SlidingWindowLimiter", window_seconds=value, limit=value, clock=clock)
    assert (limiter.limit, limiter.window_ms) == (7, 7000)
    assert type(limiter.limit) is int and type(limiter.window_ms) is int
    decisions = [await check(limiter, "alice", cost=value), await check(limiter, "alice")]
    assert [(d.allowed, d.remaining) for d in decisions] == [(True, 0), (False, 0)]


@pytest.mark.parametrize("value", ["false", "no", "0"])
def test_readable_keys_must_be_a_bool(value):
    with pytest.raises(ValueError, match="readable_keys"):
        reference.SlidingWindowLimiter(1, 10, readable_keys=value)


# --- 2. Checks ---------------------------------------------------------------------------------


def clock_reading(value: Any) -> Any:
    return lambda: value


def broken_clock() -> float:
    raise RuntimeError("the clock broke")


@dataclass(frozen=True)
class BadCheck:
    """One check that must be refused before anything reaches Redis."""

    id: str
    identity: Any = "alice"
    cost: Any = 1
    options: dict[str, Any] = field(default_factory=dict)
    fragment: str = ""
    error: type[Exception] = ValueError


BAD_CHECKS = [
    # cost: an integer from 1 to the limit (and to the burst)
    BadCheck("cost-None", cost=None, fragment="cost must be an integer"),
    BadCheck("cost-str", cost="1", fragment="cost must be an integer"),
    BadCheck("cost-float", cost=1.5, fragment="cost must be an integer"),
    BadCheck("cost-whole-float", cost=2.0, fragment="cost must be an integer"),
    BadCheck("cost-True", cost=True, fragment="cost must be an integer"),
    BadCheck("cost-False", cost=False, fragment="cost must be an integer"),
    BadCheck("cost-0", cost=0, fragment="cost must be >= 1"),
    BadCheck("cost-negative", cost=-1, fragment="cost must be >= 1"),
    BadCheck("cost-nan", cost=math.nan, fragment="cost must be an integer"),
    BadCheck("cost-inf", cost=math.inf, fragment="cost must be an integer"),
    BadCheck("cost-Decimal", cost=Decimal(1), fragment="cost must be an integer"),
    BadCheck("cost-list", cost=[1], fragment="cost must be an integer"),
    BadCheck("cost-above-limit", cost=LIMIT + 1, fragment=f"cost must be <= limit ({LIMIT})"),
    BadCheck("cost-huge", cost=10**30, fragment="cost must be <="),
    BadCheck(
        "cost-above-burst",
        cost=4,
        options={"burst": 3},
        fragment="cost must be <= burst (3)",
    ),
    # the clock's reading
    BadCheck("clock-nan", options={"clock": clock_reading(math.nan)}, fragment="clock"),
    BadCheck("clock-inf", options={"clock": clock_reading(math.inf)}, fragment="clock"),
    BadCheck("clock--inf", options={"clock": clock_reading(-math.inf)}, fragment="clock"),
    BadCheck("clock-str", options={"clock": clock_reading("now")}, fragment="clock"),
    BadCheck("clock-None", options={"clock": clock_reading(None)}, fragment="clock"),
    BadCheck("clock-True", options={"clock": clock_reading(True)}, fragment="clock"),
    BadCheck(  # the clock's own exception reaches the caller unchanged
        "clock-raises",
        options={"clock": broken_clock},
        fragment="the clock broke",
        error=RuntimeError,
    ),
]


@dataclass(frozen=True)
class Identity:
    """An identity: a clear error when `error` is set, else a correct decision."""

    id: str
    value: Any
    error: str | None = None


IDENTITIES = [
    # refused: not text or bytes, or empty
    Identity("empty", "", error="identity must not be empty"),
    Identity("empty-bytes", b"", error="identity must not be empty"),
    Identity("empty-bytearray", bytearray(), error="identity must not be empty"),
    Identity("None", None, error="identity must be str or bytes"),
    Identity("int", 42, error="identity must be str or bytes"),
    Identity("float", 4.2, error="identity must be str or bytes"),
    Identity("list", ["a"], error="identity must be str or bytes"),
    # accepted, each with a budget of its own (tk lists several for the key shape only)
    Identity("plain", "alice"),
    Identity("10kB", "x" * 10_000),
    Identity("10kB-plus-one", "x" * 10_000 + "y"),  # differs from the above at the end only
    Identity("binary", b"\x00\xff\xfe\x80binary"),
    Identity("all-bytes", bytes(range(256))),
    Identity("bytearray", bytearray(b"from a bytearray")),
    Identity("memoryview", memoryview(b"from a memoryview")),
    Identity("newline", "line\nbreak"),
    Identity("crlf", "crlf\r\n"),
    Identity("header-injection", "k\r\nX-Evil: 1"),
    Identity("braces-empty", "{}"),
    Identity("braces-tag", "{x}"),
    Identity("braces-tag-tail", "{x}alice"),
    Identity("braces-reversed", "}{"),
    Identity("braces-two", "{a}{b}"),
    Identity("braces-open", "{{{"),
    Identity("glob-star", "*"),
    Identity("glob-question", "?"),
    Identity("glob-bracket", "["),
    Identity("glob-class", "[a-z]*"),
    Identity("glob-mixed", "a*b?c[d]"),
    Identity("percent", "%41"),  # readable keys escape with %, so this must not look like "A"
    Identity("A", "A"),
    Identity("space", " "),
    Identity("tab", "\t"),
    Identity("NUL", "\x00"),
    Identity("NUL-inside", "a\x00b"),
    Identity("cyrillic", "ключ"),
    Identity("emoji", "🔑"),
    Identity("nfc", "\u00e9"),  # é, composed
    Identity("nfd", "e\u0301"),  # é, decomposed: a different identity, not folded
    Identity("lone-surrogate", "\ud800"),
    Identity("reversed-surrogates", "\udfff\ud800"),
    Identity("rtl-override", "\u202eevil"),
    Identity("colon", "rl:log:{x}"),  # looks like a key of its own
    Identity("api-key", "sk_live_0123456789abcdef"),
]
ACCEPTED = [i for i in IDENTITIES if i.error is None]
REFUSED = [i for i in IDENTITIES if i.error is not None]

ALL_BAD_CHECKS = BAD_CHECKS + [
    BadCheck(f"identity-{i.id}", identity=i.value, fragment=i.error) for i in REFUSED
]


def raw(identity: Any) -> bytes:
    """The identity's bytes, as the limiter hashes them."""
    return keys.identity_bytes(identity)


def for_class(row: BadCheck, name: str) -> tuple[dict[str, Any], Any, str]:
    """The row's options, cost and message for one class: where there is no burst, the
    cost-above-burst row becomes the same mistake against the limit."""
    options = dict(row.options)
    if "burst" in options and name != "TokenBucketLimiter":
        del options["burst"]
        return options, LIMIT + 1, "cost must be <= limit"
    return options, row.cost, row.fragment


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("row", ALL_BAD_CHECKS, ids=lambda r: r.id)
async def test_bad_check_touches_nothing_and_costs_nothing(kind, row, client, sync_client, prefix):
    redis_client = client if kind == "async" else sync_client
    for name in NAMES:
        options, cost, fragment = for_class(row, name)
        where = f"{prefix}:{name}"
        limiter = make(kind, name, redis_client, **opt(prefix=where, **options))
        with pytest.raises(row.error, match=re.escape(fragment)):
            await check(limiter, row.identity, cost)
        # The batch path refuses the same request, and the good one beside it is not sent.
        with pytest.raises(row.error, match=re.escape(fragment)):
            await check_many(limiter, ["bob", row.identity], [1, cost])
        assert await redis_keys(redis_client, where) == [], name
        # A good check afterwards still gets the whole budget (on a clock that stands
        # still, so that no window boundary falls between the checks).
        good = make(kind, name, redis_client, **opt(prefix=where, clock=ManualClock(1_000.0)))
        full = await check(good, "alice", LIMIT)
        assert (full.allowed, full.remaining) == (True, 0), name
        assert not (await check(good, "alice", 1)).allowed, name


@pytest.mark.parametrize("row", ALL_BAD_CHECKS, ids=lambda r: r.id)
def test_bad_check_on_a_model_leaves_no_state(row):
    for name in NAMES:
        options, cost, fragment = for_class(row, name)
        model = make("model", name, **opt(**{"clock": ManualClock(1_000.0), **options}))
        with pytest.raises(row.error, match=re.escape(fragment)):
            model.check(row.identity, cost=cost)
        assert model.state == {}, name
        if "clock" not in row.options:
            whole = getattr(model, "burst", LIMIT)
            full = model.check("alice", cost=whole)
            assert (full.allowed, full.remaining) == (True, 0), name


@pytest.mark.parametrize(
    "seconds",
    [
        pytest.param(time.time() * 1e9, id="time_ns-as-seconds"),
        pytest.param(1e20, id="1e20"),
        pytest.param(-1e20, id="-1e20"),
    ],
)
def test_a_clock_reading_beyond_exact_milliseconds_is_an_error(seconds):
    """Only the model is run here: the counter's Lua script never returns on such times."""
    model = reference.SlidingWindowLimiter(1, 10, clock=clock_reading(seconds))
    with pytest.raises(ValueError, match="clock"):
        model.check("alice")


# --- 3. Identities -----------------------------------------------------------------------------


@pytest.mark.parametrize("readable", [False, True], ids=["hashed", "readable"])
@pytest.mark.parametrize("row", ACCEPTED, ids=lambda r: r.id)
def test_identity_key_shape(row, readable):
    """Bounded, one hash tag (the digest), and no raw identity unless it is a safe excerpt."""
    for name in NAMES:
        limiter = make("model", name, **opt(prefix="p", readable_keys=readable))
        key = limiter.key_for(row.value)
        assert len(key) <= key_bound(limiter)
        head = f"p:{limiter.algorithm.name}:{limiter.window_ms}:"
        assert key.startswith(head)
        rest = key[len(head) :]
        tag = "{" + keys.digest(row.value) + "}"
        assert rest.endswith(tag) and DIGEST.fullmatch(tag)
        assert key.count("{") == 1 and key.count("}") == 1
        assert key_slot(key.encode()) == key_slot(keys.digest(row.value).encode())
        if readable:
            excerpt = rest[: -len(tag) - 1]
            assert rest[len(excerpt)] == ":"
            assert EXCERPT.fullmatch(excerpt), excerpt
            assert excerpt == keys.readable_excerpt(row.value)
        else:
            assert rest == tag
            data = raw(row.value)
            if len(data) >= 4:  # shorter strings can turn up inside a digest by chance
                assert data not in key.encode()


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("readable", [False, True], ids=["hashed", "readable"])
async def test_every_identity_gets_its_own_budget_and_a_bounded_key(
    kind, name, readable, client, sync_client, prefix
):
    redis_client = client if kind == "async" else sync_client
    clock = ManualClock(1_000_000.0)
    limiter = make(
        kind, name, redis_client, 1, 2, prefix=prefix, clock=clock, readable_keys=readable
    )
    for row in ACCEPTED:
        got = [(await check(limiter, row.value)).allowed for _ in range(3)]
        assert got == [True, True, False], row.id  # a shared key would start spent
    distinct = {raw(row.value) for row in ACCEPTED}
    found = await redis_keys(redis_client, prefix)
    assert len(found) == len(distinct) == len(ACCEPTED)
    assert {k.decode() for k in found} == {limiter.key_for(row.value) for row in ACCEPTED}
    for key in found:
        assert len(key) <= key_bound(limiter)
        values = await stored_values(redis_client, key)
        for row in ACCEPTED:
            data = raw(row.value)
            if len(data) >= 4:
                assert all(data not in v for v in values), (row.id, key)
                if not readable:
                    assert data not in key, (row.id, key)


async def test_str_and_its_utf8_bytes_are_one_identity():
    """Documented: text is hashed as UTF-8, so "alice" and b"alice" share a budget."""
    limiter = ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 2)
    assert limiter.key_for("ключ") == limiter.key_for("ключ".encode())
    assert [(await limiter.check(w)).allowed for w in ("alice", b"alice", "alice")] == [
        True,
        True,
        False,
    ]


# --- 4. HTTP -----------------------------------------------------------------------------------

UNTRUSTED = "203.0.113.7"
PROXY = "10.0.0.2"
TRUSTED = ["10.0.0.0/8"]
HTTP_LIMIT = 1000  # no row is rejected for its budget: each answer shows its remaining


@dataclass(frozen=True)
class HttpRow:
    """One request: its peer and raw headers, the status, and who was counted."""

    id: str
    headers: list[tuple[bytes, bytes]]
    status: int
    identity: str | None  # "key:..." / "address:..." when admitted
    peer: str = UNTRUSTED


def xff(*values: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-forwarded-for", v.encode()) for v in values]


def api_key(value: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"x-api-key", value)]


def as_key(value: bytes) -> str:
    """The identity a key header gives: its bytes stripped, read as latin-1."""
    return "key:" + value.strip().decode("latin-1")


BIG_KEY = b"K" * 100_000
CYRILLIC = "ключ-доступа".encode()

HTTP_ROWS = [
    # addresses and X-Forwarded-For
    HttpRow("no-key", [], 200, f"address:{UNTRUSTED}"),
    HttpRow("xff-untrusted-peer", xff("198.51.100.1"), 200, f"address:{UNTRUSTED}"),
    HttpRow(
        "xff-untrusted-many-lines",
        xff(*[f"198.51.100.{i}" for i in range(200)]),
        200,
        f"address:{UNTRUSTED}",
    ),
    HttpRow("xff-untrusted-claims-proxy", xff("10.0.0.9"), 200, f"address:{UNTRUSTED}"),
    HttpRow("xff-trusted", xff("198.51.100.7"), 200, "address:198.51.100.7", PROXY),
    HttpRow(
        "xff-trusted-spoofed-left",
        xff("1.2.3.4, 198.51.100.7"),
        200,
        "address:198.51.100.7",
        PROXY,
    ),
    HttpRow("xff-trusted-chain", xff("198.51.100.7, 10.0.0.9"), 200, "address:198.51.100.7", PROXY),
    HttpRow(
        "xff-trusted-two-lines", xff("1.2.3.4", "198.51.100.8"), 200, "address:198.51.100.8", PROXY
    ),
    HttpRow(
        "xff-long-trusted-chain",
        xff("198.51.100.9, " + "10.0.0.3, " * 2000 + "10.0.0.4"),
        200,
        "address:198.51.100.9",
        PROXY,
    ),
    HttpRow("xff-garbage", xff("garbage"), 200, f"address:{PROXY}", PROXY),
    HttpRow("xff-empty-entries", xff(",, ,"), 200, f"address:{PROXY}", PROXY),
    HttpRow("xff-bad-octet", xff("999.1.1.1"), 200, f"address:{PROXY}", PROXY),
    HttpRow("xff-five-octets", xff("1.2.3.4.5"), 200, f"address:{PROXY}", PROXY),
    HttpRow("xff-NUL", xff("198.51.100.7\x00"), 200, f"address:{PROXY}", PROXY),
    HttpRow("xff-20kB", xff("9" * 20_000), 200, f"address:{PROXY}", PROXY),
    HttpRow("xff-ipv4-mapped", xff("::ffff:198.51.100.7"), 200, "address:198.51.100.7", PROXY),
    HttpRow("xff-ipv6-zone", xff("2001:db8::1%eth0"), 200, "address:2001:db8::/64", PROXY),
    HttpRow("peer-not-an-address", [], 200, "address:testclient", "testclient"),
    # API keys
    HttpRow("key-empty", api_key(b""), 200, f"address:{UNTRUSTED}"),
    HttpRow("key-blank", api_key(b"  \t "), 200, f"address:{UNTRUSTED}"),
    HttpRow("key-padded", api_key(b"  sk_padded_key  "), 200, "key:sk_padded_key"),
    HttpRow("key-plain", api_key(b"sk_padded_key"), 200, "key:sk_padded_key"),
    HttpRow("key-at-max", api_key(b"M" * MAX_API_KEY_BYTES), 200, "key:" + "M" * MAX_API_KEY_BYTES),
    HttpRow("key-over-max", api_key(b"M" * (MAX_API_KEY_BYTES + 1)), 431, None),
    HttpRow("key-100kB", api_key(BIG_KEY), 431, None),
    HttpRow("key-non-ascii", api_key(CYRILLIC), 200, as_key(CYRILLIC)),
    HttpRow(  # 130 characters, 260 bytes: the limit counts bytes
        "key-non-ascii-over-max", api_key("я".encode() * 130), 431, None
    ),
    HttpRow("key-control", api_key(b"k\x00e\x01y\x7f-ctl"), 200, "key:k\x00e\x01y\x7f-ctl"),
    HttpRow("key-newline", api_key(b"key\r\nX-Evil: 1"), 200, "key:key\r\nX-Evil: 1"),
    HttpRow("key-high-bytes", api_key(b"\xff\xfe\x80key"), 200, as_key(b"\xff\xfe\x80key")),
    HttpRow("key-braces", api_key(b"{tag}key"), 200, "key:{tag}key"),
    HttpRow("key-glob", api_key(b"*?[key]"), 200, "key:*?[key]"),
    HttpRow(  # an API key naming an address is still a key: its own budget
        "key-like-address",
        api_key(f"address:{UNTRUSTED}".encode()),
        200,
        f"key:address:{UNTRUSTED}",
    ),
    HttpRow("key-twice", api_key(b"a") + api_key(b"b"), 400, None),
    HttpRow("key-twice-case", [(b"x-api-key", b"a"), (b"X-API-KEY", b"a")], 400, None),
    HttpRow(
        "key-and-xff", api_key(b"sk_with_xff") + xff("198.51.100.1"), 200, "key:sk_with_xff", PROXY
    ),
]
RAW_KEYS = [
    value.strip()
    for row in HTTP_ROWS
    for name, value in row.headers
    if name.lower() == b"x-api-key" and len(value.strip()) >= 4
]


def limited_app(limiter: Any) -> FastAPI:
    app = FastAPI()
    install(app)
    limit = rate_limit(limiter, scope="bad", trusted_proxies=TRUSTED)

    @app.get("/thing")
    async def thing(info: RateLimitInfo = Depends(limit)) -> dict[str, str]:  # noqa: B008
        return {"identity": str(info.identity)}

    return app


async def send(app: FastAPI, row: HttpRow) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=(row.peer, 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://bad") as c:
        return await c.get("/thing", headers=row.headers)


async def test_http_bad_requests(client, prefix):
    """Every row answers its status (never 500); admitted rows are counted against the
    identity they name, one budget each; then the keyspace holds one bounded key per
    identity and no raw API key anywhere."""
    limiter = ratelimit.SlidingWindowLimiter(client, 60, HTTP_LIMIT, prefix=prefix)
    app = limited_app(limiter)
    used: dict[str, int] = {}
    for row in HTTP_ROWS:
        r = await send(app, row)
        assert r.status_code == row.status, (row.id, r.status_code, r.text[:200])
        if row.identity is None:
            assert r.headers["content-type"] == PROBLEM_JSON, row.id
            assert r.json()["status"] == row.status
            continue
        assert r.json()["identity"] == row.identity, row.id
        used[row.identity] = used.get(row.identity, 0) + 1
        remaining = HTTP_LIMIT - used[row.identity]
        assert r.headers["ratelimit"] == f'"bad";r={remaining}', row.id  # a log's 200: no t
    found = await redis_keys(client, prefix)
    assert len(found) == len(used)
    assert {k.decode() for k in found} == {limiter.key_for(f"bad:{identity}") for identity in used}
    assert len(RAW_KEYS) >= 10
    for key in found:
        assert len(key) <= key_bound(limiter)
        assert key_slot(key) == key_slot(DIGEST.search(key.decode()).group()[1:-1].encode())
        values = await stored_values(client, key)
        for secret in RAW_KEYS:
            assert secret not in key and all(secret not in v for v in values), secret[:20]


async def test_http_refused_requests_never_reach_redis():
    """The rows answered 4xx send no command at all."""

    class Spy(fakeredis.FakeAsyncRedis):
        async def execute_command(self, *args, **options):
            self.__dict__.setdefault("sent", []).append(args)
            return await super().execute_command(*args, **options)

    spy = Spy()
    app = limited_app(ratelimit.SlidingWindowLimiter(spy, 1, 10))
    for row in HTTP_ROWS:
        if row.identity is None:
            assert (await send(app, row)).status_code == row.status
    assert spy.__dict__.get("sent", []) == []


def test_ipv6_zone_ids_do_not_split_a_client():
    """With per-address counting (/128), "%eth0" or "%1" after an address is the same host."""
    from starlette.requests import Request

    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 1, 10)
    limit = rate_limit(limiter, trusted_proxies=TRUSTED, ipv6_prefix=128)
    seen = set()
    for value in ("2001:db8::1", "2001:db8::1%1", "2001:db8::1%eth0", "[2001:db8::1%2]:443"):
        headers = [(b"x-forwarded-for", value.encode())]
        request = Request({"type": "http", "headers": headers, "client": (PROXY, 1)})
        seen.add(limit.client_address(request))
    assert seen == {"2001:db8::1"}


def test_a_real_server_refuses_oversized_keys_without_500():
    """Through uvicorn (h11): a key over 256 bytes gets the app's 431, up to 10 kB here.
    At 100 kB the server's own header limit may refuse first: with 400, or by closing
    the connection before the client has finished sending. Never a 500."""
    with DemoServer() as server:
        answers: dict[int, int | str] = {}
        for size in (256, 257, 10_000, 100_000):
            headers = {"x-api-key": "k" * size}
            try:
                r = httpx.get(server.url + "/tiles/0/0/0.png", headers=headers, timeout=10)
                answers[size] = r.status_code
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
                answers[size] = "connection closed"
        assert server.running  # whatever it answered, the server is still up
    assert answers[256] == 200 and answers[257] == 431 and answers[10_000] == 431
    assert answers[100_000] in (400, 431, "connection closed")


def test_http_identity_collisions_across_scopes_are_impossible():
    """Scopes cannot hold ':' so "<scope>:<kind>:<value>" is never ambiguous."""
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 1, 10)
    with pytest.raises(ValueError, match="scope"):
        rate_limit(limiter, scope="a:key")
    a, b = rate_limit(limiter, scope="a"), rate_limit(limiter, scope="a.key")
    assert a.key_for("x") != b.key_for("x") != a.key_for(address="x")
    assert len({a.key_for(f"{uuid.uuid4()}") for _ in range(100)}) == 100
