"""Capacity arithmetic (ratelimit.lab.capacity): hand-computed values, bad input,
scenarios, the server time read from `make bench`'s record and measured on a real Redis,
and the script command counts held to INFO commandstats on a private redis-server."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from ratelimit import algorithms
from ratelimit.clock import ManualClock
from ratelimit.lab import memory
from ratelimit.lab.capacity import (
    Scenario,
    ServerTime,
    bench_case,
    bytes_per_key,
    checks_per_second,
    fleet_memory_bytes,
    keys_per_shard,
    log_members,
    mean_script_commands,
    measure_server_time,
    plan_fleet,
    plan_scenario,
    redis_cpu_cores,
    scenario_bytes_per_key,
    script_commands,
    server_time_from_bench,
    shard_checks_per_second,
    shards_needed,
)

STORED_TABLE = memory.STORED_TABLE
GIB = 2**30


def small_table() -> pd.DataFrame:
    """A hand-made memory table: a few log rows around the listpack step, flat O(1) rows."""
    rows = [
        ("log", "script", 1, 120),
        ("log", "script", 10, 248),
        ("log", "script", 128, 2136),
        ("log", "script", 129, 15864),
        ("log", "script", 1000, 101400),
        ("log", "classic", 10, 536),
        ("log", "classic", 1000, 118224),
        ("fw", "", 1, 104),
        ("fw", "", 1000, 104),
        ("gcra", "", 1, 88),
        ("gcra", "", 1000, 88),
    ]
    table = pd.DataFrame(rows, columns=["algorithm", "member_format", "entries", "bytes_per_key"])
    table["limit"] = table["entries"]
    return table


# Script commands ------------------------------------------------------------------


@pytest.mark.parametrize(
    "algorithm, allowed, cost, expected",
    [
        ("log", True, 1, 5),
        ("log", True, 3, 7),  # one ZADD per unit of cost
        ("log", False, 1, 3),
        ("log", False, 7, 3),  # a rejection writes nothing, whatever the cost
        ("logc", True, 1, 3),  # HGET, HSET, PEXPIRE
        ("logc", True, 40, 3),
        ("logc", False, 1, 1),
        ("fw", True, 1, 2),  # SET NX GET, then INCRBY (or SET when it opens a window)
        ("fw", True, 5, 2),
        ("fw", False, 1, 1),  # SET NX GET only: a rejection writes nothing
        ("swc", True, 1, 2),
        ("swc", False, 2, 1),
        ("gcra", True, 1, 2),
        ("gcra", True, 4, 2),
        ("gcra", False, 1, 1),
    ],
)
def test_script_commands_per_path(algorithm, allowed, cost, expected):
    assert script_commands(algorithm, allowed, cost) == expected
    assert script_commands(algorithm, allowed, cost, redis_clock=True) == expected + 1


@pytest.mark.parametrize(
    "algorithm, cost, expected",
    [("log", 1, 5), ("log", 3, 7), ("logc", 2, 3), ("fw", 1, 1), ("fw", 4, 1), ("swc", 1, 1),
     ("gcra", 2, 1)],
)  # fmt: skip
def test_a_check_that_opens_its_key_issues_fewer_commands(algorithm, cost, expected):
    # fw, swc and gcra: the SET NX GET that reads the key writes a new key's state too.
    assert script_commands(algorithm, True, cost, opens=True) == expected
    assert script_commands(algorithm, False, cost, opens=True) == script_commands(
        algorithm, False, cost
    )


def test_mean_script_commands_weights_the_two_paths():
    assert mean_script_commands("log", 0.5) == 4.0  # (5 + 3) / 2
    assert mean_script_commands("log", 1.0, 2.0) == 6.0  # 5 + one more ZADD
    assert mean_script_commands("gcra", 0.25) == 1.25  # 0.25 * 2 + 0.75 * 1
    assert mean_script_commands("fw", 0.0) == 1.0  # a rejection only reads
    assert mean_script_commands("swc", 0.0) == 1.0
    assert mean_script_commands("swc", 1.0, redis_clock=True) == 3.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: script_commands("token_bucket", True),
        lambda: script_commands("log", 1),
        lambda: script_commands("log", True, 0),
        lambda: script_commands("fw", True, opens=1),
        lambda: script_commands("log", True, 1.5),
        lambda: mean_script_commands("log", 1.5),
        lambda: mean_script_commands("log", -0.1),
        lambda: mean_script_commands("log", 0.5, 0.5),
        lambda: mean_script_commands("fw", math.nan),
    ],
)
def test_script_commands_reject_bad_input(call):
    with pytest.raises(ValueError):
        call()


# Memory ---------------------------------------------------------------------------


def test_log_members_full_and_steady_state():
    assert log_members(1000) == 1000.0
    assert log_members(1000, 0.05, 3600) == pytest.approx(180.0)
    assert log_members(10, 20, 1) == 10.0  # a client over its limit keeps the key full


@pytest.mark.parametrize(
    "call",
    [
        lambda: log_members(0),
        lambda: log_members(10.0),
        lambda: log_members(10, 1.0),
        lambda: log_members(10, None, 60),
        lambda: log_members(10, -1.0, 60),
        lambda: log_members(10, 1.0, 0),
    ],
)
def test_log_members_rejects_bad_input(call):
    with pytest.raises(ValueError):
        call()


def test_bytes_per_key_reads_interpolates_and_extrapolates():
    table = small_table()
    assert bytes_per_key(table, "log", 10) == 248.0  # a measured row
    assert bytes_per_key(table, "log", 5.5) == 184.0  # 120 + (248 - 120) * 4.5 / 9
    assert bytes_per_key(table, "log", 128) == 2136.0  # both sides of the listpack step
    assert bytes_per_key(table, "log", 129) == 15864.0
    assert bytes_per_key(table, "log", 2000) == 202800.0  # 101.4 bytes per member on
    assert bytes_per_key(table, "log", 10, member_format="classic") == 536.0
    assert bytes_per_key(table, "fw", 1) == bytes_per_key(table, "fw", 10**6) == 104.0
    assert bytes_per_key(table, "gcra", 500) == 88.0


def test_bytes_per_key_on_the_stored_table():
    table = memory.load_table(STORED_TABLE)
    rows = table.set_index(["algorithm", "member_format", "entries"]).bytes_per_key
    for algorithm, fmt, entries in [
        ("log", "script", 10),
        ("log", "script", 1000),
        ("swc", "", 10),
    ]:
        assert bytes_per_key(table, algorithm, entries) == rows[algorithm, fmt, entries]


@pytest.mark.parametrize(
    "call",
    [
        lambda t: bytes_per_key(t, "log", 0.5),
        lambda t: bytes_per_key(t, "log", math.inf),
        lambda t: bytes_per_key(t, "tokens", 10),
        lambda t: bytes_per_key(t, "swc", 10),  # no such rows in the table
        lambda t: bytes_per_key(t, "log", 10, member_format="uuid"),
        lambda t: bytes_per_key(t.drop(columns="bytes_per_key"), "log", 10),
        lambda t: bytes_per_key([], "log", 10),
    ],
)
def test_bytes_per_key_rejects_bad_input(call):
    with pytest.raises(ValueError):
        call(small_table())


def test_fleet_memory_bytes():
    assert fleet_memory_bytes(1000, 248) == 248_000
    assert fleet_memory_bytes(1000, 248, key_overhead_bytes=64) == 312_000


@pytest.mark.parametrize(
    "call",
    [
        lambda: fleet_memory_bytes(0, 248),
        lambda: fleet_memory_bytes(10.0, 248),
        lambda: fleet_memory_bytes(True, 248),
        lambda: fleet_memory_bytes(10, 0),
        lambda: fleet_memory_bytes(10, 248, key_overhead_bytes=-1),
        lambda: fleet_memory_bytes(10, "248"),
    ],
)
def test_fleet_memory_bytes_rejects_bad_input(call):
    with pytest.raises(ValueError):
        call()


# Operations and shards ----------------------------------------------------------


def test_checks_cpu_and_shard_throughput():
    assert checks_per_second(1_000_000, 0.05) == 50_000
    assert checks_per_second(10, 0) == 0
    assert redis_cpu_cores(50_000, 21) == pytest.approx(1.05)
    assert shard_checks_per_second(50_000, 21) == pytest.approx(47_619.0476, rel=1e-6)
    assert shard_checks_per_second(50_000, 8) == 50_000  # the measured ceiling binds


def test_shards_needed():
    assert shards_needed(100, 50) == 2
    assert shards_needed(100, 50, 0.5) == 4
    assert shards_needed(101, 50, 0.5) == 5
    assert shards_needed(0, 50) == 1  # even an idle fleet needs one Redis
    assert shards_needed(3 * 0.1, 0.1) == 3  # 3.0000000000000004 is not a fourth shard


@pytest.mark.parametrize(
    "call",
    [
        lambda: checks_per_second(0, 1.0),
        lambda: checks_per_second(10, -1.0),
        lambda: redis_cpu_cores(10, 0),
        lambda: shard_checks_per_second(0, 10),
        lambda: shard_checks_per_second(50_000, -5),
        lambda: shards_needed(-1, 50),
        lambda: shards_needed(100, 0),
        lambda: shards_needed(100, 50, 1.0),
        lambda: shards_needed(100, 50, -0.1),
        lambda: shards_needed(math.nan, 50),
    ],
)
def test_operations_reject_bad_input(call):
    with pytest.raises(ValueError):
        call()


def test_keys_per_shard_takes_the_tighter_resource():
    common = dict(shard_memory_bytes=1e9, shard_checks_per_s=50_000, headroom=0.5)
    # memory: 0.5e9 / (936 + 64) = 500,000 keys; checks: 25,000 / 0.5 = 50,000 keys
    assert keys_per_shard(936, 0.5, key_overhead_bytes=64, **common) == 50_000
    assert keys_per_shard(936, 0.01, key_overhead_bytes=64, **common) == 500_000
    assert keys_per_shard(936, 0, key_overhead_bytes=64, **common) == 500_000
    with pytest.raises(ValueError):
        keys_per_shard(936, 0.5, shard_memory_bytes=0, shard_checks_per_s=50_000)


def test_plan_fleet_by_hand():
    plan = plan_fleet(
        "log",
        active_keys=1_000_000,
        rate_per_key=0.05,
        bytes_per_key=101_400,
        us_per_check=21,
        shard_memory_bytes=16 * GIB,
        shard_checks_per_s=50_000,
        headroom=0.5,
        key_overhead_bytes=64,
    )
    assert plan.bytes_per_key == 101_464
    assert plan.memory_bytes == 101_464_000_000
    assert plan.checks_per_s == 50_000
    assert plan.commands_per_s == 250_000  # 5 per admitted check
    assert plan.redis_cpu_cores == pytest.approx(1.05)
    assert plan.shard_checks_per_s == pytest.approx(1e6 / 21)
    # 101.464e9 / 8 GiB = 11.8 -> 12; 50,000 / 23,809.5 = 2.1 -> 3
    assert (plan.shards_for_memory, plan.shards_for_checks, plan.shards) == (12, 3, 12)
    assert plan.keys_per_shard == 84_659  # floor(8 GiB / 101,464 bytes)

    small = plan_fleet(
        "gcra",
        active_keys=10_000,
        rate_per_key=1.0,
        bytes_per_key=88,
        us_per_check=7,
        shard_memory_bytes=16 * GIB,
        shard_checks_per_s=50_000,
        headroom=0.5,
        commands_per_check=1.5,
    )
    assert (small.shards, small.commands_per_s, small.keys_per_shard) == (1, 15_000, 25_000)


@pytest.mark.parametrize(
    "change",
    [
        {"algorithm": "leaky"},
        {"active_keys": 0},
        {"rate_per_key": -1},
        {"bytes_per_key": 0},
        {"us_per_check": 0},
        {"shard_memory_bytes": -1},
        {"shard_checks_per_s": 0},
        {"headroom": 1},
        {"key_overhead_bytes": -8},
        {"commands_per_check": -1},
    ],
)
def test_plan_fleet_rejects_bad_input(change):
    args = dict(
        algorithm="swc",
        active_keys=1000,
        rate_per_key=1.0,
        bytes_per_key=120,
        us_per_check=8,
        shard_memory_bytes=GIB,
        shard_checks_per_s=50_000,
    )
    args.update(change)
    algorithm = args.pop("algorithm")
    with pytest.raises(ValueError):
        plan_fleet(algorithm, **args)


# The counts against a real Redis --------------------------------------------------



def _inner_commands(client) -> int:
    """Commands counted by INFO commandstats, minus the ones the test itself sends."""
    stats = client.info("commandstats")
    ours = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_script", "cmdstat_config")
    ours += ("cmdstat_info", "cmdstat_client", "cmdstat_hello", "cmdstat_ping")
    return sum(v["calls"] for k, v in stats.items() if not k.startswith(ours))


@pytest.mark.private_redis
@pytest.mark.parametrize("algorithm", [*algorithms.NAMES, algorithms.COMPACT_LOG.name])
@pytest.mark.parametrize("redis_clock", [False, True], ids=["app-clock", "redis-clock"])
def test_counts_match_info_commandstats(private_redis, algorithm, redis_clock):
    client = private_redis.client()
    clock = "redis" if redis_clock else ManualClock(1_000.0)
    # A long window: with the Redis clock, real time passes, and nothing may refill.
    limiter = algorithms.get(algorithm).build("sync", client, 60, 10, clock=clock)
    limiter.check("warm-up")  # loads the script
    client.config_resetstat()
    costs = [1, 3, 1, 2, 4, 1, 1, 5, 1, 2]  # 21 units against a limit of 10: some rejected
    expected = 0
    for i, cost in enumerate(costs):
        decision = limiter.check("client", cost)
        expected += script_commands(
            algorithm, decision.allowed, cost, redis_clock=redis_clock, opens=i == 0
        )
    decisions = {limiter.check("client").allowed for _ in range(3)}
    expected += 3 * script_commands(algorithm, False, redis_clock=redis_clock)
    assert decisions == {False}  # the rejected path is exercised too
    assert _inner_commands(client) == expected
    client.close()


# Scenarios: one traffic assumption for memory and checks -------------------------


def test_scenario_by_hand():
    mixed = Scenario("mixed", 1_000, ((0.9, 0.01), (0.1, 1.0)), peak_factor=2)
    assert mixed.peak_rate_per_key == pytest.approx(2 * (0.9 * 0.01 + 0.1 * 1.0))
    assert mixed.checks_per_second() == pytest.approx(1_000 * 0.218)
    # At 100 per 60 s: 0.02/s puts 1.2 members in a window, 2/s fills the key.
    assert mixed.log_members(100, 60) == [(0.9, pytest.approx(1.2)), (0.1, 100)]
    assert mixed.mean_log_members(100, 60) == pytest.approx(0.9 * 1.2 + 0.1 * 100)
    full = Scenario.every_key_full("full", 10, 1_000, 3_600)
    assert full.rates == ((1.0, 1_000 / 3_600),) and full.mean_log_members(1_000, 3_600) == 1_000
    idle = Scenario.uniform("idle", 10, 0.0)
    assert idle.checks_per_second() == 0 and idle.mean_log_members(10, 1) == 1


@pytest.mark.parametrize(
    "args",
    [
        ("s", 10, ()),
        ("s", 10, ((0.5, 1.0),)),  # shares must sum to 1
        ("s", 10, ((1.0, -1.0),)),
        ("s", 0, ((1.0, 1.0),)),
        ("s", 10, ((1.5, 1.0), (-0.5, 1.0))),
    ],
)
def test_scenario_rejects_bad_input(args):
    with pytest.raises(ValueError):
        Scenario(*args)
    with pytest.raises(ValueError):
        Scenario("s", 10, ((1.0, 1.0),), peak_factor=0)


def test_plan_scenario_takes_memory_and_checks_from_the_same_traffic():
    table = small_table()
    scenario = Scenario("mixed", 1_000, ((0.5, 10 / 60), (0.5, 1.0)))  # 10 and 60 members
    per_key = scenario_bytes_per_key(table, "log", scenario, 60, 60)
    by_hand = 0.5 * bytes_per_key(table, "log", 10) + 0.5 * bytes_per_key(table, "log", 60)
    assert per_key == pytest.approx(by_hand)
    plan = plan_scenario(
        "log",
        scenario,
        limit=60,
        window_s=60,
        table=table,
        us_per_check=50,
        shard_memory_bytes=GIB,
        headroom=0.5,
    )
    assert plan.checks_per_s == pytest.approx(1_000 * (0.5 / 6 + 0.5))
    assert plan.memory_bytes == pytest.approx(1_000 * by_hand)
    assert plan.shard_checks_per_s == 1e6 / 50  # no end-to-end ceiling given: server time
    fw = plan_scenario(
        "fw", scenario, limit=60, window_s=60, table=table, us_per_check=50, shard_memory_bytes=GIB
    )
    assert fw.bytes_per_key == bytes_per_key(table, "fw", 60)


# Server time per check: from make bench's record, or measured ----------------------

RECORD = Path(__file__).resolve().parents[2] / "bench" / "record.json"


def test_server_time_from_bench_reads_the_admit_cases(tmp_path):
    results = {bench_case(a): {"usec_per_check": 10.0 + i} for i, a in enumerate(algorithms.NAMES)}
    record = {"date": "2026-01-01 00:00 UTC", "redis_version": "7.0.15"}
    record["server_cost"] = {"results": results, "rounds": 3, "server": "a private redis-server"}
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    read = server_time_from_bench(path)
    assert dict(read.us_per_check) == {a: 10.0 + i for i, a in enumerate(algorithms.NAMES)}
    assert read.date == "2026-01-01 00:00 UTC"
    assert "make bench" in read.source and "7.0.15" in read.source
    del results[bench_case("gcra")]
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="make bench"):
        server_time_from_bench(path)


def test_the_committed_bench_record_has_every_algorithm():
    read = server_time_from_bench(RECORD)
    assert set(read.us_per_check) == set(algorithms.NAMES)
    assert all(us > 0 for us in read.us_per_check.values())


def test_server_time_rejects_bad_figures():
    with pytest.raises(ValueError):
        ServerTime({"log": 0.0}, "typed in")
    with pytest.raises(ValueError):
        ServerTime({"leaky": 1.0}, "typed in")


def test_measure_server_time_refuses_the_embedded_fake():
    import fakeredis

    with pytest.raises(ValueError, match="commandstats"):
        measure_server_time(fakeredis.FakeRedis(), checks=10)


def test_measure_server_time_on_a_real_redis(real_redis_url, prefix):
    import redis

    client = redis.Redis.from_url(real_redis_url, socket_timeout=10)
    try:
        client.set(f"{prefix}:other:kept", "1")  # someone else's key under another prefix
        measured = measure_server_time(client, checks=300, prefix=f"{prefix}:probe")
        assert set(measured.us_per_check) == set(algorithms.NAMES)
        assert all(0 < us < 10_000 for us in measured.us_per_check.values())
        assert "300 admitted checks" in measured.source
        # Its scratch keys are gone; nothing else was touched.
        assert list(client.scan_iter(match=f"{prefix}:probe:*")) == []
        assert client.get(f"{prefix}:other:kept") == b"1"
        # A prefix that already holds keys is refused: it is not a scratch prefix.
        with pytest.raises(ValueError, match="scratch"):
            measure_server_time(client, checks=10, prefix=f"{prefix}:other")
    finally:
        client.close()
