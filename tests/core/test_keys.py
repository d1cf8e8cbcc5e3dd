"""Keys are bounded, collision-free, not readable, and their cluster slot is not steerable."""

from __future__ import annotations

import fakeredis
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

import ratelimit
from ratelimit import keys

IDENTITIES = [
    "alice",
    "x" * 10_000,
    "line\nbreak\r\n",
    "{tag}",
    "}{",
    "{a}{b}",
    "a*b?c[d]",
    "ключ-🔑-キー",
    "\x00\x01\xff",
    "sk_live_0123456789abcdef",
    b"\x00\xff{bytes}",
    "\ud800",  # a lone surrogate: still a valid, distinct identity
]


def limiter(**kwargs):
    return ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 10, **kwargs)


@pytest.mark.parametrize("identity", IDENTITIES, ids=range(len(IDENTITIES)))
def test_key_is_bounded_and_hides_the_identity(identity):
    key = limiter().key_for(identity)
    assert len(key) <= len("rl:logc:1000:{}") + 22
    raw = identity if isinstance(identity, str) else identity.decode("latin-1")
    if len(raw) >= 4:
        assert raw not in key


def test_keys_differ_for_every_identity_listed():
    made = {limiter().key_for(i) for i in IDENTITIES}
    assert len(made) == len(IDENTITIES)


@given(st.lists(st.text(min_size=1) | st.binary(min_size=1), min_size=2, max_size=50, unique=True))
def test_no_collisions_in_random_samples(identities):
    as_bytes = {keys.identity_bytes(i) for i in identities}
    made = {keys.digest(i) for i in identities}
    assert len(made) == len(as_bytes)


@given(st.text(min_size=1))
def test_slot_comes_from_the_digest_only(identity):
    """Whatever braces the identity holds, the hash tag is the digest."""
    key = limiter().key_for(identity)
    tag = keys.digest(identity)
    assert key.endswith("{" + tag + "}")
    assert key_slot(key.encode()) == key_slot(tag.encode())
    assert key_slot(key.encode()) == key_slot(limiter(prefix="other").key_for(identity).encode())


def test_ten_thousand_identities_spread_over_slots():
    slots = [key_slot(limiter().key_for(f"client-{i}").encode()) for i in range(10_000)]
    per_third = [sum(1 for s in slots if s * 3 // 16384 == k) for k in range(3)]
    assert min(per_third) > 3_000, per_third


def test_secret_changes_every_key():
    plain, keyed = limiter(), limiter(key_secret=b"s3cret")
    assert plain.key_for("alice") != keyed.key_for("alice")
    assert keyed.key_for("alice") == limiter(key_secret=b"s3cret").key_for("alice")


def test_readable_keys_are_opt_in_escaped_and_still_bounded():
    readable = limiter(readable_keys=True)
    assert "alice" in readable.key_for("alice")
    key = readable.key_for("evil\n{tag}*" + "y" * 10_000)
    assert "\n" not in key and key.count("{") == 1 and len(key) < 80
    assert readable.key_for("a b") != readable.key_for("a%20b")


def test_algorithms_and_prefixes_never_share_keys():
    client = fakeredis.FakeAsyncRedis()
    made = {
        cls(client, 1, 10, prefix=p).key_for("alice")
        for cls in (
            ratelimit.SlidingWindowLimiter,
            ratelimit.FixedWindowLimiter,
            ratelimit.SlidingWindowCounterLimiter,
            ratelimit.TokenBucketLimiter,
        )
        for p in ("rl", "rl:geofence")
    }
    assert len(made) == 8


async def test_no_raw_identity_in_the_keyspace(client, prefix):
    secret = "sk_live_SECRET_API_KEY_0123456789"
    for cls in (
        ratelimit.SlidingWindowLimiter,
        ratelimit.FixedWindowLimiter,
        ratelimit.SlidingWindowCounterLimiter,
        ratelimit.TokenBucketLimiter,
    ):
        await cls(client, 1, 10, prefix=prefix).check(secret)
    found = [k async for k in client.scan_iter(match=f"{prefix}:*")]
    assert len(found) == 4
    for key in found:
        assert b"SECRET" not in key
        kind = await client.type(key)
        if kind == b"zset":
            values = [m for m, _ in await client.zrange(key, 0, -1, withscores=True)]
        elif kind == b"hash":
            values = list((await client.hgetall(key)).values()) + list(await client.hkeys(key))
        else:
            values = [await client.get(key)]
        assert all(b"SECRET" not in v for v in values)


@pytest.mark.parametrize("secret", [None, b"s3cret"])
def test_the_fast_key_path_builds_the_documented_key(secret):
    """`key_for`'s hot path skips `keys.make_key`'s generic checks: it must still
    build the very same key, for any text."""
    from ratelimit import keys

    limiter = ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 1, 10, key_secret=secret)
    for identity in ["a", "alice", "évé", "\ud800x", "{tag}\n", "x" * 10_000, "🙂" * 3]:
        expected = keys.make_key("rl", "logc", identity, window_ms=1000, secret=secret)
        assert limiter.key_for(identity) == expected
    with pytest.raises(ValueError, match="must not be empty"):
        limiter.key_for("")
