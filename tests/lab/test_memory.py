"""Memory probes on a real Redis: encodings, bytes per member, the compact log, O(1)
keys, clean-up."""

from __future__ import annotations

import fakeredis
import pandas as pd
import pytest
import redis
import redis.asyncio

import ratelimit
import ratelimit.sync
from ratelimit.lab import memory
from ratelimit.lab.memory import MemoryNotMeasurableError, listpack_threshold, probe


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


def test_the_compact_log_is_one_small_hash(real, prefix, threshold):
    sizes = {
        n: probe(real, "log", n, prefix=prefix, member_format="compact")
        for n in (threshold, threshold + 1, 1_000, 20_000)
    }
    for n, result in sizes.items():
        assert (result.algorithm, result.member_format, result.entries) == ("log", "compact", n)
        assert result.encoding == "hashtable"  # one hash: a header and chunks of 6-byte entries
        assert result.bytes_per_entry <= 12, result
    # Against the sorted set once it is a skiplist: over ten times smaller.
    ours = probe(real, "log", 1_000, prefix=prefix)
    assert ours.bytes_per_entry > 10 * sizes[1_000].bytes_per_entry
    assert _keys(real, prefix) == []


def test_the_compact_log_by_its_algorithm_and_by_its_limiter(real, prefix):
    by_tag = probe(real, "logc", 200, prefix=prefix)
    by_pipeline = probe(real, "log", 200, prefix=prefix, member_format="compact")
    by_limiter = probe(real, "log", 200, prefix=prefix, member_format="compact", fill="limiter")
    assert by_tag == by_pipeline == by_limiter  # the same entries, byte for byte
    with pytest.raises(ValueError, match="compact log has no member_format 'classic'"):
        probe(real, "logc", 10, prefix=prefix, member_format="classic")


def test_big_logs_are_filled_quickly(real, prefix):
    result = probe(real, "log", 20_000, prefix=prefix)
    assert result.encoding == "skiplist" and result.entries == 20_000
    assert 60 < result.bytes_per_entry < 200
    assert _keys(real, prefix) == []


@pytest.mark.parametrize(
    ("algorithm", "encodings"),
    [("fw", {"int"}), ("swc", {"embstr"}), ("gcra", {"int", "embstr"})],
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
    assert probe(real, "swc", 5, prefix=prefix).algorithm == "swc"
    with pytest.raises(ValueError, match="give one of log, fw, swc, gcra"):
        probe(real, "sliding_window_counter", 5, prefix=prefix)  # one naming scheme: the tag


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
    monkeypatch.setattr(ratelimit.backends, "_fallback_announced", False)
    with pytest.warns(ratelimit.EmbeddedRedisWarning):
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
        ({"entries": 0}, "entries must be (an integer|>= 1)"),
        ({"entries": 2.5}, "entries must be (an integer|>= 1)"),
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


# Tables: measure, store, read back, size a fleet ------------------------------------

CSV_HEADER = ",".join(memory.TABLE_COLUMNS)


def _table(rows: list[tuple]) -> pd.DataFrame:
    """A small table as `memory_table` makes it, from (algorithm, format, limit, bytes)."""
    return pd.DataFrame(
        [
            {
                "algorithm": a,
                "member_format": f,
                "limit": n,
                "entries": n,
                "encoding": "listpack",
                "bytes_per_key": b,
                "bytes_per_entry": b / n,
                "redis_version": "7.0.15",
                "listpack_threshold": 128,
            }
            for a, f, n, b in rows
        ]
    ).astype(memory._TABLE_DTYPES)


SMALL = [
    ("log", "script", 10, 248),
    ("log", "script", 1000, 101_656),
    ("log", "classic", 10, 536),
    ("log", "classic", 1000, 118_112),
    ("gcra", "", 10, 88),
    ("gcra", "", 1000, 88),
]


def test_memory_table_measures_every_variant_and_limit(real, prefix, threshold):
    table = memory.memory_table(real, lambda t: [10, t, t + 1, 10], prefix=prefix)
    assert list(table.columns) == list(memory.TABLE_COLUMNS)
    variants = list(dict.fromkeys(zip(table.algorithm, table.member_format, strict=True)))
    assert variants == [
        ("log", "script"),
        ("log", "classic"),
        ("log", "compact"),
        ("fw", ""),
        ("swc", ""),
        ("gcra", ""),
    ]
    assert (
        table.groupby(["algorithm", "member_format"])
        .limit.apply(list)
        .map(lambda v: v == [10, threshold, threshold + 1])
        .all()
    )
    log = table[table.algorithm == "log"].set_index(["member_format", "limit"])
    assert log.loc[("script", threshold), "encoding"] == "listpack"
    assert log.loc[("script", threshold + 1), "encoding"] == "skiplist"
    assert log.loc[("compact", threshold + 1), "encoding"] == "hashtable"
    assert (log.entries == log.index.get_level_values("limit")).all()
    assert (table.bytes_per_entry == table.bytes_per_key / table.entries).all()
    assert set(table.listpack_threshold) == {threshold}
    assert set(table.redis_version) == {memory.redis_version(real)}
    assert _keys(real, prefix) == []


def test_memory_table_takes_a_subset(real, prefix):
    table = memory.memory_table(
        real,
        [5, 3, 5],
        ["gcra", "log"],
        member_formats="classic",
        prefix=prefix,
    )
    assert list(zip(table.algorithm, table.member_format, table.limit, strict=True)) == [
        ("gcra", "", 3),
        ("gcra", "", 5),
        ("log", "classic", 3),
        ("log", "classic", 5),
    ]
    # "logc" stands for the log kept compactly, and only that.
    compact = memory.memory_table(real, [4], ["logc", "fw"], prefix=prefix)
    assert list(zip(compact.algorithm, compact.member_format, strict=True)) == [
        ("log", "compact"),
        ("fw", ""),
    ]


def test_redis_version_is_the_servers(real):
    assert memory.redis_version(real) == real.info("server")["redis_version"]


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (([],), {}, "limits must not be empty"),
        (("10",), {}, "limits must be a sequence"),
        (([10, 0],), {}, "limit must be (an integer|>= 1)"),
        (([2_000_000],), {}, "above the sliding log's maximum"),
        (([10], []), {}, "algorithms must not be empty"),
        (([10], ["leaky"]), {}, "unknown algorithm"),
        (([10],), {"member_formats": ["short"]}, "member_formats must be"),
        (([10],), {"member_formats": []}, "member_formats must be"),
    ],
)
def test_memory_table_refuses_bad_arguments_before_touching_redis(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        memory.memory_table(OFFLINE, *args, **kwargs)


def test_memory_table_refuses_fakeredis():
    with pytest.raises(MemoryNotMeasurableError):
        memory.memory_table(fakeredis.FakeRedis(), [10])


def test_a_saved_table_loads_back_equal(tmp_path):
    table = _table(SMALL)
    path = memory.save_table(table, tmp_path / "deeper" / "t.csv")
    text = path.read_text()
    assert text.splitlines()[0] == CSV_HEADER
    assert "\ngcra,,10,10,listpack,88,8.8,7.0.15,128\n" in text
    assert "\r" not in text
    loaded = memory.load_table(path)
    pd.testing.assert_frame_equal(loaded, table)
    assert loaded.member_format.tolist() == ["script", "script", "classic", "classic", "", ""]


def test_loading_a_table_without_its_columns_fails(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("algorithm,limit\nlog,10\n")
    with pytest.raises(ValueError, match="lacks the column"):
        memory.load_table(path)


def test_measured_or_stored_measures_and_refreshes_the_file(real, prefix, tmp_path):
    path = tmp_path / "data" / "memory.csv"
    path.parent.mkdir()
    path.write_text("stale\n")
    result = memory.measured_or_stored(real, path, [4, 8], ["log", "fw"], prefix=prefix)
    assert (result.source, result.reason) == ("measured", "")
    assert result.table.limit.tolist() == [4, 8] * 4  # three log variants, then fw
    pd.testing.assert_frame_equal(memory.load_table(path), result.table)
    assert _keys(real, prefix) == []


def test_measured_or_stored_can_leave_the_file_alone(real, prefix, tmp_path):
    path = tmp_path / "memory.csv"
    result = memory.measured_or_stored(real, path, [4], "gcra", save=False, prefix=prefix)
    assert result.source == "measured" and not path.exists()


@pytest.mark.parametrize("client", [None, fakeredis.FakeRedis()], ids=["none", "fakeredis"])
def test_measured_or_stored_falls_back_to_the_stored_table(client, tmp_path):
    path = memory.save_table(_table(SMALL), tmp_path / "memory.csv")
    result = memory.measured_or_stored(client, path, [1, 2, 3])
    assert result.source == "stored"
    assert ("fakeredis" in result.reason) if client else ("no Redis server" in result.reason)
    pd.testing.assert_frame_equal(result.table, _table(SMALL))  # as stored, whatever limits


def test_measured_or_stored_without_either_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Redis server .* no stored table at"):
        memory.measured_or_stored(None, tmp_path / "missing.csv", [10])


def test_measured_or_stored_does_not_hide_connection_errors(tmp_path):
    path = memory.save_table(_table(SMALL), tmp_path / "memory.csv")
    with pytest.raises(redis.exceptions.ConnectionError):
        memory.measured_or_stored(OFFLINE, path, [10])


def test_fleet_memory_multiplies_bytes_per_key_by_keys():
    fleet = memory.fleet_memory(_table(SMALL), [10**7, 1_000, 1_000], limits=[1000])
    assert list(fleet.columns) == [
        "algorithm",
        "member_format",
        "limit",
        "bytes_per_key",
        "active_keys",
        "total_bytes",
    ]
    assert fleet.active_keys.tolist() == [1_000, 10**7] * 3
    assert (fleet.limit == 1000).all()
    assert (fleet.total_bytes == fleet.bytes_per_key * fleet.active_keys).all()
    ours = fleet[(fleet.algorithm == "log") & (fleet.member_format == "script")]
    assert ours.total_bytes.tolist() == [101_656_000, 1_016_560_000_000]
    assert fleet.total_bytes.dtype == "int64"
    assert len(memory.fleet_memory(_table(SMALL), [5])) == len(SMALL)  # every limit


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"active_keys": []}, "active_keys must not be empty"),
        ({"active_keys": [0]}, "active_keys must be (an integer|>= 1)"),
        ({"active_keys": [10], "limits": [100]}, r"no log \(script\) key at limit\(s\) \[100\]"),
    ],
)
def test_fleet_memory_refuses_what_it_cannot_answer(kwargs, message):
    with pytest.raises(ValueError, match=message):
        memory.fleet_memory(_table(SMALL), **kwargs)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (88, "88 B"),
        (999, "999 B"),
        (1000, "0.98 KiB"),
        (88_000, "85.9 KiB"),
        (2_480_000_000, "2.31 GiB"),
        (1.02e12, "950 GiB"),
        (1_016_560_000_000, "947 GiB"),
        (1_184_800_000_000, "1.08 TiB"),
    ],
)
def test_format_bytes(n, text):
    assert memory.format_bytes(n) == text


@pytest.mark.parametrize("bad", [-1, float("nan"), "1", True])
def test_format_bytes_refuses_non_counts(bad):
    with pytest.raises(ValueError, match="non-negative number of bytes"):
        memory.format_bytes(bad)


def test_a_server_without_the_commands_cannot_be_measured():
    """A Redis-like server that does not know CONFIG GET (some managed services) gets a
    clear MemoryNotMeasurableError; any other error reply goes through unchanged."""

    class NoConfig(redis.Redis):
        def __init__(self, reply: str) -> None:
            super().__init__()
            self.reply = reply

        def config_get(self, *args, **kwargs):
            raise redis.exceptions.ResponseError(self.reply)

    with pytest.raises(MemoryNotMeasurableError, match="does not answer CONFIG GET"):
        listpack_threshold(NoConfig("ERR unknown command 'CONFIG'"))
    with pytest.raises(redis.exceptions.ResponseError, match="NOPERM"):
        listpack_threshold(NoConfig("NOPERM this user has no permissions"))
