"""A key the previous version wrote in another type is replaced, not an error.

Earlier versions kept the fixed window and the sliding-window counter in a hash; their
scripts now keep a string. After an upgrade such a key must not answer WRONGTYPE (and
the failure policy) until it expires: the identity's count starts again instead.
"""

from __future__ import annotations

import pytest

import ratelimit

OLD_HASHES = {
    "FixedWindowLimiter": {"w": 1, "n": 5},
    "SlidingWindowCounterLimiter": {"w": 1, "c": 5, "p": 3},
}


@pytest.mark.parametrize("name", OLD_HASHES)
async def test_a_hash_left_by_an_earlier_version_is_replaced(name, client, prefix):
    limiter = getattr(ratelimit, name)(client, 60, 10, prefix=prefix)
    key = limiter.key_for("alice")
    await client.hset(key, mapping=OLD_HASHES[name])
    first = await limiter.check("alice")
    assert first.allowed and not first.degraded and first.remaining == 9
    assert await client.type(key) == b"string"
    assert 0 < await client.pttl(key) <= 120_000
    assert (await limiter.check("alice")).remaining == 8
