"""Plain keys (`plain_keys=True`): `<prefix>:<identity>`, the key a person types, for
identities that can stand in a key as they are; anything else is refused before a byte
reaches Redis."""

from __future__ import annotations

import subprocess
import sys

import fakeredis
import pytest
import redis

import ratelimit
import ratelimit.sync
from ratelimit import algorithms, keys

KINDS = ("async", "sync")

BAD_CHARACTERS = [" ", "{", "}", "*", "?", "[", "]", '"', "'", "\\", "\n", "\t", "\xa0", "\x00"]
BAD_IDENTITIES = [
    *((f"a{c}b", f"may not hold {c!r}") for c in BAD_CHARACTERS),
    ("", "must not be empty"),
    ("x" * (keys.PLAIN_MAX_CHARS + 1), f"at most {keys.PLAIN_MAX_CHARS} characters"),
    (b"bytes", "must be str"),
]


def limiter_of(algorithm: algorithms.Algorithm, kind: str, client=None, **options):
    if client is None:
        client = fakeredis.FakeAsyncRedis() if kind == "async" else fakeredis.FakeRedis()
    return algorithm.limiter_class(kind)(client, "10/s", plain_keys=True, **options)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", algorithms.ALGORITHMS, ids=algorithms.NAMES)
def test_a_plain_key_is_the_prefix_and_the_identity(algorithm, kind):
    limiter = limiter_of(algorithm, kind)
    assert limiter.key_for("geofence:key:demo") == "rl:geofence:key:demo"
    assert limiter.with_options(prefix="demo").key_for("u-1@x.org") == "demo:u-1@x.org"
    ipv6 = "geofence:address:2001:db8::/64"  # what the HTTP layer asks about for an IPv6 client
    assert limiter.key_for(ipv6) == "rl:" + ipv6


@pytest.mark.parametrize(("identity", "named"), BAD_IDENTITIES)
def test_an_identity_a_plain_key_cannot_hold_is_refused_naming_why(identity, named):
    limiter = limiter_of(algorithms.SLIDING_LOG, "sync")
    with pytest.raises(ValueError) as caught:
        limiter.key_for(identity)
    assert named in str(caught.value)


async def test_a_refused_identity_writes_nothing(client, prefix):
    limiter = ratelimit.SlidingWindowLimiter(
        client, "2/s", prefix=prefix, plain_keys=True, storage="sorted-set"
    )
    for identity, _ in BAD_IDENTITIES:
        with pytest.raises(ValueError):
            await limiter.check(identity)
        with pytest.raises(ValueError):
            await limiter.check_many(["fine", identity])
    assert [k async for k in client.scan_iter(match=f"{prefix}:*")] == []
    assert (await limiter.check("fine")).allowed
    assert await client.zcard(f"{prefix}:fine") == 1


@pytest.mark.parametrize("algorithm", algorithms.ALGORITHMS, ids=algorithms.NAMES)
def test_a_check_writes_exactly_the_key_a_person_types(algorithm, sync_client, prefix, clock):
    # A clock that stands still: the eleven checks fall in one window of every algorithm.
    limiter = limiter_of(algorithm, "sync", sync_client, prefix=prefix, clock=clock, ttl_slack_ms=0)
    decisions = [limiter.check("geofence:key:demo") for _ in range(11)]
    assert [d.allowed for d in decisions] == [True] * 10 + [False]
    written = sorted(k.decode() for k in sync_client.scan_iter(match=f"{prefix}:*"))
    assert written == [f"{prefix}:geofence:key:demo"]
    assert 0 < sync_client.pttl(written[0]) <= limiter.state_ttl_ms()


@pytest.mark.parametrize(
    "options",
    [
        {"readable_keys": True},
        {"key_secret": b"k" * 16},
    ],
)
def test_plain_keys_with_a_hashed_key_option_are_refused(options):
    with pytest.raises(ValueError, match="plain_keys stores the identity as it is"):
        limiter_of(algorithms.SLIDING_LOG, "async", **options)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_plain_keys_is_true_or_false(value):
    client = fakeredis.FakeRedis()
    with pytest.raises(ValueError, match="plain_keys must be True or False"):
        ratelimit.sync.SlidingWindowLimiter(client, "10/s", plain_keys=value)


def test_route_key_and_the_cli_name_the_plain_key_of_a_route():
    assert (
        keys.route_key("demo", scope="geofence", window_ms=1000, plain=True)
        == "rl:geofence:key:demo"
    )
    out = subprocess.run(
        [sys.executable, "-m", "ratelimit", "key", "demo", "--scope", "geofence",
         "--window-ms", "1000", "--plain-keys"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out == "rl:geofence:key:demo\n"
    with pytest.raises(ValueError, match="may not hold ' '"):
        keys.route_key("de mo", scope="geofence", window_ms=1000, plain=True)


def test_a_plain_key_is_readable_by_redis_cli(real_redis_url, prefix):
    client = redis.Redis.from_url(real_redis_url)
    limiter = ratelimit.sync.SlidingWindowLimiter(
        client, "10/min", prefix=prefix, plain_keys=True, storage="sorted-set"
    )
    for _ in range(3):
        limiter.check("tiles:key:demo")
    port = str(client.connection_pool.connection_kwargs["port"])
    typed = subprocess.run(
        ["redis-cli", "-p", port, "ZCARD", f"{prefix}:tiles:key:demo"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert typed.strip() == "3"
    client.close()
