"""Memory probes on a real Redis: encodings, bytes per member, O(1) keys, clean-up."""

from __future__ import annotations

import fakeredis
import pytest
import redis
import redis.asyncio

import ratelimit
import ratelimit.sync
from ratelimit.memory import MemoryNotMeasurableError, listpack_threshold, probe


@pytest.fixture
def real(real_redis_url):
    client = redis.Redis.from_url(real_redis_url, socket_timeout=10)
    yield client
    client.close()


@pytest.fixture
def threshold(real) -> int:
    value = listpack_threshold(real)
    if value > 10_000:
        pytest.skip(f"zset-max-listpack-entries is {value}; these tests expect a small one")
    return value


def _keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{prefix}:*", count=1000))


def test_listpack_threshold_reads_the_server_config(real):
    reply = real.config_get("zset-max-*-entries")
    expected = reply.get("zset-max-listpack-entries", reply.get("zset-max-ziplist-entries"))
    assert listpack_threshold(real) == int(expected)


def test_encoding_is_listpack_at_the_threshold_and_skiplist_above(real, prefix, threshold):
    at = probe(real, "log", threshold, prefix=prefix)
    above = probe(real, "log", threshold + 1, prefix=prefix)
    assert (at.encoding, above.encoding) == ("listpack", "skiplist")
    assert (at.entries, above.entries) == (threshold, threshold + 1)
    assert above.bytes_per_entry > 3 * at.bytes_per_entry
    assert _keys(real, prefix) == []


@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0])
def test_our_members_are_compact_and_classic_ones_are_not(real, prefix, threshold, fraction):
    n = max(1, int(threshold * fraction))
    ours = probe(real, "log", n, prefix=prefix)
    classic = probe(real, "log", n, prefix=prefix, member_format="classic")
    assert ours.encoding == classic.encoding == "listpack"
    assert ours.member_format == "script" and classic.member_format == "classic"
    if n >= 16:  # small keys are dominated by the fixed overhead
        assert ours.bytes_per_entry <= 20, ours
    assert classic.bytes_per_entry > 1.5 * ours.bytes_per_entry, (ours, classic)
    assert ours.memory_usage == pytest.approx(ours.bytes_per_entry * n)


def test_pipeline_and_limiter_fills_measure_the_same(real, prefix, threshold):
    by_pipeline = probe(real, "log", threshold, prefix=prefix)
    by_limiter = probe(real, "log", threshold, prefix=prefix, fill="limiter")
    assert by_pipeline == by_limiter  # listpack: byte for byte the same content
    above_p = probe(real, "log", threshold + 1, prefix=prefix)
    above_l = probe(real, "log", threshold + 1, prefix=prefix, fill="limiter")
    assert above_p.encoding == above_l.encoding == "skiplist"
    # Skiplist node heights are random, so sizes differ a little between fills.
    assert above_p.memory_usage == pytest.approx(above_l.memory_usage, rel=0.05)


def test_big_logs_are_filled_quickly(real, prefix):
    result = probe(real, "log", 20_000, prefix=prefix)
    assert result.encoding == "skiplist" and result.entries == 20_000
    assert 60 < result.bytes_per_entry < 200
    assert _keys(real, prefix) == []


@pytest.mark.parametrize(
    ("algorithm", "encodings"),
    [("fw", {"listpack"}), ("swc", {"listpack"}), ("gcra", {"int", "embstr"})],
)
def test_o1_keys_do_not_grow_with_the_limit(real, prefix, algorithm, encodings):
    sizes = []
    for limit in (1, 10, 1_000, 100_000, 10**9):
        result = probe(real, algorithm, limit, prefix=prefix)
        assert result.algorithm == algorithm and result.limit == limit
        assert result.encoding in encodings
        assert result.member_format is None
        sizes.append(result.memory_usage)
    assert max(sizes) - min(sizes) <= 16, sizes
    assert max(sizes) < 256, sizes
    assert _keys(real, prefix) == []


def test_o1_keys_with_a_smaller_request_than_the_limit(real, prefix):
    result = probe(real, "gcra", 3, limit=7, window_ms=1000, prefix=prefix)
    assert (result.entries, result.limit, result.window_ms) == (3, 7, 1000)
    assert result.memory_usage < 256


def test_algorithms_can_be_given_as_limiter_classes(real, prefix):
    assert probe(real, ratelimit.sync.TokenBucketLimiter, 5, prefix=prefix).algorithm == "gcra"
    assert probe(real, ratelimit.FixedWindowLimiter, 5, prefix=prefix).algorithm == "fw"
    assert probe(real, "sliding_window_counter", 5, prefix=prefix).algorithm == "swc"


def test_the_key_is_deleted_even_when_measuring_fails(real_redis_url, prefix):
    class Broken(redis.Redis):
        def memory_usage(self, *args, **kwargs):
            raise redis.exceptions.ResponseError("simulated failure")

    client = Broken.from_url(real_redis_url)
    try:
        with pytest.raises(redis.exceptions.ResponseError, match="simulated"):
            probe(client, "log", 10, prefix=prefix)
        assert _keys(client, prefix) == []
    finally:
        client.close()


@pytest.mark.parametrize("make", [fakeredis.FakeRedis, fakeredis.FakeStrictRedis])
def test_fakeredis_is_refused_with_a_clear_error(make):
    client = make()
    with pytest.raises(MemoryNotMeasurableError, match="not measurable on the embedded"):
        probe(client, "log", 10)
    with pytest.raises(MemoryNotMeasurableError, match="not measurable"):
        listpack_threshold(client)
    assert client.keys("*") == []


def test_the_embedded_default_is_refused(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    client = ratelimit.connect_sync()
    assert ratelimit.is_embedded(client)
    with pytest.raises(MemoryNotMeasurableError):
        probe(client, "gcra", 1)


# A client that is never connected: argument checks happen before any I/O.
OFFLINE = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithm": "leaky"}, "unknown algorithm 'leaky'"),
        ({"algorithm": 42}, "unknown algorithm"),
        ({"entries": 0}, "entries must be a positive integer"),
        ({"entries": 2.5}, "entries must be a positive integer"),
        ({"entries": 10, "limit": 5}, r"entries \(10\) must be <= limit \(5\)"),
        ({"member_format": "short"}, "member_format must be"),
        ({"fill": "magic"}, "fill must be"),
        ({"algorithm": "fw", "member_format": "classic"}, "sliding log only"),
        ({"member_format": "classic", "fill": "limiter"}, "never writes classic"),
        ({"entries": 500, "window_ms": 100}, "must be >= entries"),
    ],
)
def test_bad_arguments_are_refused_before_touching_redis(kwargs, message):
    args = {"algorithm": "log", "entries": 10} | kwargs
    with pytest.raises(ValueError, match=message):
        probe(OFFLINE, args.pop("algorithm"), args.pop("entries"), **args)


def test_async_clients_are_refused():
    client = redis.asyncio.Redis(host="127.0.0.1", port=1)
    with pytest.raises(TypeError, match="synchronous"):
        probe(client, "log", 10)
