"""Each limiter's script carries its options as constants, and the client works out the
state a new key takes (`ratelimit/algorithms.py`): held here to what the script itself
computes, on fakeredis and a real Redis."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ratelimit
import ratelimit.sync
from ratelimit import algorithms, scripts
from ratelimit.clock import ManualClock

# What the script would write for a key that holds nothing, in Lua, from the same
# constants (its own file's expression where there is one).
LUA_OPENING = {
    "fw": "return tostring(math.floor(now / window) % P * M + cost == tonumber(ARGV[3]))",
    "swc": "return tostring(math.floor(now / window) .. ':' .. cost .. ':0' == ARGV[3])",
    "gcra": "return tostring(now + interval * cost == tonumber(ARGV[3]))",
}
PRELUDE = "local now, cost = tonumber(ARGV[1]), tonumber(ARGV[2])\n"


def limiter(name: str, redis, window_ms: int, limit: int, **options):
    return algorithms.get(name).build("sync", redis, None, limit, window_ms=window_ms, **options)


@pytest.mark.parametrize("name", ["fw", "swc", "gcra"])
@settings(max_examples=60, deadline=None)
@given(
    window_ms=st.integers(1, 10**7),
    limit=st.integers(1, 10**6),
    now=st.integers(0, 2 * 10**12) | st.just(1_796_000_000_123),
    data=st.data(),
)
def test_the_client_works_out_what_the_script_would(name, window_ms, limit, now, data):
    import fakeredis

    try:
        lim = limiter(name, fakeredis.FakeRedis(), window_ms, limit)
    except ValueError:  # a fixed window too fast for exact integers: refused, fine
        return
    cost = data.draw(st.integers(1, lim._max_cost))
    sent = lim.script_args(now, cost)[2]
    code = scripts.header(lim.algorithm.constants(lim)) + PRELUDE + LUA_OPENING[name]
    # The same number (the same double, for GCRA), or the same text.
    assert lim.redis.eval(code, 0, now, cost, sent) == b"true", (sent, now, cost)


def test_the_compact_log_header_is_what_the_script_encodes():
    lim = ratelimit.sync.SlidingWindowLimiter(
        ratelimit.connect_sync(embedded=True), 1, 10, storage="compact", clock=ManualClock(5.0)
    )
    assert lim.check("a", 3).allowed
    stored = lim.redis.hget(lim.key_for("a"), "h")
    sent = lim.script_args(5000, 3)[2]
    assert len(sent) == 18 and stored == sent + sent[12:18] * 3  # s=3, b=0, o=now; 3 entries
    # A time outside the 6-byte range: the client leaves the header to the script.
    assert lim.script_args(-(2**47) - 1, 1)[2] == b""


def test_every_policy_is_its_own_script_and_equal_policies_share_one(client):
    a = ratelimit.FixedWindowLimiter(client, 1, 10)
    assert a.script_sha == ratelimit.FixedWindowLimiter(client, 1, 10, prefix="other").script_sha
    assert a.script_sha != ratelimit.FixedWindowLimiter(client, 1, 11).script_sha
    assert a.script_sha != a.with_options(ttl_slack_ms=5).script_sha
    text = a.script
    assert "local window = 1000\nlocal limit = 10\n" in text and "local ttl = '1000'\n" in text
    assert set(re.findall(r"ARGV\[(\d+)\]", text)) == {"1", "2", "3"}  # time, cost, opening


def test_a_header_refuses_text_that_is_not_digits():
    with pytest.raises(ValueError, match="digits"):
        scripts.header({"ttl": "1000'; redis.call('FLUSHALL') --"})
    assert scripts.header({"a": 3, "b": 0.1, "c": "42"}) == (
        "local a = 3\nlocal b = 0.1\nlocal c = '42'\n"
    )


@pytest.mark.parametrize("name", ["fw", "swc", "gcra", "logc"])
async def test_a_new_key_is_written_with_its_ttl_by_one_command(name, client, prefix, clock):
    """The SET NX GET (or the log's HSET) that opens a key gives it the TTL too, and
    the state is the one the client sent."""
    lim = algorithms.get(name).build("async", client, 1, 10, prefix=prefix, clock=clock)
    clock.set_ms(1_796_000_000_250)
    assert (await lim.check("alice", 2)).allowed
    key = lim.key_for("alice")
    assert 0 < await client.pttl(key) <= lim.state_ttl_ms() + lim.ttl_slack_ms
    sent = lim.script_args(1_796_000_000_250, 2)[2]
    if name == "gcra":  # a whole TAT as an integer, which Redis keeps in fewer bytes
        assert sent == b"1796000000450"
    if name == "logc":
        assert (await client.hget(key, "h"))[:18] == sent
    else:
        assert await client.get(key) == sent


async def test_fixed_window_admits_within_a_window_leave_its_ttl(client, prefix, clock):
    """After the opening SET, an admit only adds its cost (INCRBY keeps the TTL the
    window opened with, which covers that window); a rejection writes nothing."""
    lim = ratelimit.FixedWindowLimiter(client, 1, 3, prefix=prefix, clock=clock)
    clock.set_ms(1_796_000_000_000)
    await lim.check("bob")
    key = lim.key_for("bob")
    first = await client.get(key)
    clock.set_ms(1_796_000_000_900)
    assert (await lim.check("bob", 2)).allowed
    assert int(await client.get(key)) == int(first) + 2
    assert not (await lim.check("bob")).allowed
    assert int(await client.get(key)) == int(first) + 2
    assert 0 < await client.pttl(key) <= 1000 + lim.ttl_slack_ms
