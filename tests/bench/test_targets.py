"""The targets (bench/targets.py) judged on synthetic reports: PASS and FAIL on either
side of each line, SKIP with the reason when a figure is missing, INFO beside them.

Per-round figures are chosen so that every same-round ratio is exact in binary
floating point (powers of two), so "exactly on the line" really is on it.
"""

from __future__ import annotations

import pytest

from bench import checks, concurrency, server_cost, targets, verdicts
from bench.checks import hot, spread
from bench.server_cost import INCR, NOOP, admit, reject

LOG = checks.LOG
MW = targets.MOVING_WINDOW
SORTED_DEFAULT = {"sorted-set": {"case": LOG, "default": True}}
NO_COMPACT = {"skipped": "skipped: storage='compact' is not available in this build (TypeError)"}


def by_name(rows: list[dict]) -> dict[str, dict]:
    return {t["target"]: t for t in rows}


def find(rows: list[dict], *words: str) -> dict:
    found = [t for t in rows if all(w in t["target"] for w in words)]
    assert len(found) == 1, (words, [t["target"] for t in rows])
    return found[0]


# Client side: ours against the best peer of the same algorithm --------------------------


def checks_part(speeds: dict[str, list[float]], skipped: dict | None = None, **extra) -> dict:
    """A checks part from per-case speeds per round (floors and the decomposition cases
    at fixed values that leave the other targets alone)."""
    n = len(next(iter(speeds.values())))
    fixed = {
        "EVALSHA return 1": 1024.0,
        checks.ARGS_FLOOR_CASE: 1024.0,
        checks.BARE_SCRIPT_CASE: 1024.0,
        checks.BATCH_CASE: 8192.0,
        spread(LOG): 1024.0,
    }
    per_round = [{**fixed, **{k: v[i] for k, v in speeds.items()}} for i in range(n)]
    peers = {p: {"counterpart": o} for p, o in targets.COUNTERPARTS.items() if spread(p) in speeds}
    return {
        "per_round": per_round,
        "results": {
            k: {"checks_per_s": sorted(r[k] for r in per_round)[n // 2]} for k in per_round[0]
        },
        "peers": peers,
        "skipped": skipped or {},
        **extra,
    }


def test_ours_is_judged_against_the_best_peer_of_its_algorithm_in_each_round() -> None:
    # Counter: the two peers take turns being faster; ours is 1.05x the faster one in
    # rounds 1 and 3, and 1.25x it in round 2: the median of the same-round ratios is 1.05.
    speeds = {
        spread("SlidingWindowCounterLimiter"): [1075.2, 1280.0, 1075.2],
        spread("limits sliding-window counter"): [1024.0, 512.0, 256.0],
        spread("throttled-py sliding window"): [256.0, 1024.0, 1024.0],
        hot("SlidingWindowCounterLimiter"): [512.0] * 3,
        hot("limits sliding-window counter"): [1024.0] * 3,
        hot("throttled-py sliding window"): [256.0] * 3,
        spread(LOG): [1024.0] * 3,  # exactly 1.05x below: 1024 / 1024 = 1.0
        spread("limits moving window"): [1024.0] * 3,
        hot(LOG): [1024.0] * 3,
        hot("limits moving window"): [1024.0] * 3,
    }
    part = checks_part(
        speeds,
        skipped={"throttled-py GCRA": "skipped: throttled-py is not installed (x)"},
        log_storages={**SORTED_DEFAULT, "compact": NO_COMPACT},
    )
    rows = targets._checks_targets(part, None)
    counter = find(rows, "async check, 10k keys", "SlidingWindowCounterLimiter")
    assert counter["threshold"] == targets.PEER_TARGET == 1.05
    assert counter["value"] == pytest.approx(1.05) and counter["verdict"] == "PASS"
    assert counter["against"].startswith("the best of")
    assert counter["quartiles"][0] <= counter["value"] <= counter["quartiles"][1]
    # On the hot key: shown, not judged (512 / 1024).
    counter_hot = find(rows, "async check, hot key", "SlidingWindowCounterLimiter")
    assert counter_hot["verdict"] == "INFO" and counter_hot["value"] == 0.5
    # The log at 1.0x: FAIL, with the split of the time into server and client.
    log = find(rows, "async check, 10k keys", "(default, storage=sorted-set)")
    assert log["verdict"] == "FAIL" and log["value"] == 1.0
    assert "server time not measured" in log["why"][0]
    # The storage this build lacks: a SKIP row with the reason.
    compact = find(rows, "async check, 10k keys", f"{LOG} storage=compact")
    assert compact["verdict"] == "SKIP" and compact["skipped"] == NO_COMPACT["skipped"]
    # A peer that was not measured: SKIP with its reason, never silently dropped.
    gcra = find(rows, "async check, 10k keys", "TokenBucketLimiter")
    assert gcra["verdict"] == "SKIP" and "throttled-py is not installed" in gcra["skipped"]


def test_just_below_the_peer_line_fails() -> None:
    speeds = {
        spread("TokenBucketLimiter"): [1075.0] * 3,  # 1075 / 1024 < 1.05
        spread("throttled-py GCRA"): [1024.0] * 3,
        hot("TokenBucketLimiter"): [1024.0] * 3,
        hot("throttled-py GCRA"): [1024.0] * 3,
    }
    rows = targets._checks_targets(checks_part(speeds), None)
    gcra = find(rows, "async check, 10k keys", "TokenBucketLimiter")
    assert gcra["verdict"] == "FAIL" and gcra["pass"] is False
    assert gcra["against"] == spread("throttled-py GCRA")


def test_the_sync_part_is_judged_on_its_own_cases() -> None:
    speeds = {
        spread("sync TokenBucketLimiter"): [2048.0] * 3,
        spread("sync throttled-py GCRA"): [1024.0] * 3,
        hot("sync TokenBucketLimiter"): [1024.0] * 3,
        hot("sync throttled-py GCRA"): [1024.0] * 3,
    }
    part = checks_part(speeds)
    part["peers"] = {"throttled-py GCRA": {"counterpart": "TokenBucketLimiter"}}
    rows = targets._sync_targets(part, None)
    gcra = find(rows, "sync check, 10k keys", "TokenBucketLimiter")
    assert gcra["verdict"] == "PASS" and gcra["value"] == 2.0
    assert gcra["case"] == spread("sync TokenBucketLimiter") and gcra["part"] == "sync"


def test_a_storage_measured_apart_from_the_default_is_shown_beside_it() -> None:
    speeds = {
        spread(LOG): [1024.0] * 3,
        spread(checks.log_name("compact")): [2048.0] * 3,
        spread("limits moving window"): [1024.0] * 3,
        hot(LOG): [1024.0] * 3,
        hot("limits moving window"): [1024.0] * 3,
    }
    storages = {
        "sorted-set": {"case": LOG, "default": True},
        "compact": {"case": checks.log_name("compact"), "default": False},
    }
    rows = targets._checks_targets(checks_part(speeds, log_storages=storages), None)
    compact = find(rows, "async check, 10k keys", f"{LOG} storage=compact")
    assert compact["verdict"] == "INFO" and compact["value"] == 2.0
    # The default is judged; the sorted set is the default, so it has no row of its own.
    assert not [t for t in rows if f"{LOG} storage=sorted-set" in t["target"]]


# Server side ---------------------------------------------------------------------------


def cost_part(usec: dict[str, list[float]], **extra) -> dict:
    n = len(next(iter(usec.values())))
    per_round = [{k: v[i] for k, v in usec.items()} for i in range(n)]
    results = {
        k: {
            "usec_per_check": sorted(v)[n // 2],
            "commands": {"evalsha": {"calls_per_check": 1.0, "nested": False}},
        }
        for k, v in usec.items()
    }
    return {"rounds": n, "per_round": per_round, "results": results, **extra}


def server_usec(log_admit: float, log_reject: float, fw: float, swc: float) -> dict:
    return {
        NOOP: [1.0] * 3,
        INCR: [8.0] * 3,
        admit(MW): [16.0] * 3,
        reject(MW): [8.0] * 3,
        admit(LOG): [log_admit] * 3,
        reject(LOG): [log_reject] * 3,
        admit("FixedWindowLimiter"): [fw] * 3,
        admit("TokenBucketLimiter"): [8.0] * 3,
        admit("SlidingWindowCounterLimiter"): [swc] * 3,
    }


def test_server_time_targets_at_their_lines() -> None:
    # 14.4 / 16 = 0.9, 8 / 8 = 1.0, 10.4 / 8 = 1.3, 12.8 / 8 = 1.6: on the lines.
    cost = cost_part(server_usec(14.4, 8.0, 10.4, 12.8), log_storages=SORTED_DEFAULT)
    rows = by_name(targets._cost_targets(cost))
    judged = [t for t in rows.values() if t["threshold"] is not None]
    assert len(judged) == 5 and all(t["op"] == "<=" for t in judged)
    assert all(t["verdict"] == "PASS" for t in judged), [t["value"] for t in judged]
    admit_row = find(list(rows.values()), "admit (10k keys)", "(default, storage=sorted-set)")
    assert admit_row["threshold"] == targets.LOG_ADMIT_SERVER == 0.9
    assert admit_row["value"] == pytest.approx(0.9)
    assert admit_row["case"] == admit(LOG) and admit_row["against"] == admit(MW)
    reject_row = find(list(rows.values()), "reject (hot key at its limit)", "(default")
    assert reject_row["threshold"] == 1.0 and reject_row["value"] == 1.0
    gcra = find(list(rows.values()), "TokenBucketLimiter vs INCR + PEXPIRE")
    assert gcra["value"] == 1.0 and gcra["threshold"] == 1.3
    swc = find(list(rows.values()), "SlidingWindowCounterLimiter vs INCR + PEXPIRE")
    assert swc["threshold"] == 1.6


def test_server_time_over_the_line_fails_with_the_figures() -> None:
    cost = cost_part(server_usec(15.0, 9.0, 11.0, 13.0), log_storages=SORTED_DEFAULT)
    rows = targets._cost_targets(cost)
    failed = [t for t in rows if t["verdict"] == "FAIL"]
    assert len(failed) == 4  # GCRA stays at 1.0x
    log = find(rows, "admit (10k keys)", "(default")
    assert "15.0 us" in log["why"][0] and "16.0 us" in log["why"][0]


def test_server_time_is_skipped_with_the_reason() -> None:
    rows = targets._cost_targets({"skipped": "skipped: none: embedded fakeredis"})
    assert len(rows) == 5 and all(t["verdict"] == "SKIP" for t in rows)
    assert all("fakeredis" in t["skipped"] for t in rows)
    # Without the moving window (limits not installed): the log rows say why.
    usec = server_usec(8.0, 8.0, 8.0, 8.0)
    del usec[admit(MW)], usec[reject(MW)]
    reason = "skipped: limits is not installed (No module named 'limits')"
    cost = cost_part(
        usec,
        peers_skipped={MW: reason},
        log_storages={**SORTED_DEFAULT, "compact": NO_COMPACT},
    )
    rows = targets._cost_targets(cost)
    log_rows = [t for t in rows if MW in t["target"]]
    assert [t["verdict"] for t in log_rows] == ["SKIP", "SKIP"]
    assert all(t["skipped"] == reason for t in log_rows)
    assert [t["verdict"] for t in rows if MW not in t["target"]] == ["PASS"] * 3


def test_each_storage_is_reported_beside_the_judged_default() -> None:
    usec = server_usec(16.0, 8.0, 8.0, 8.0)
    usec[admit(checks.log_name("compact"))] = [8.0] * 3
    usec[reject(checks.log_name("compact"))] = [4.0] * 3
    storages = {
        "sorted-set": {"case": LOG, "default": True},
        "compact": {"case": checks.log_name("compact"), "default": False},
    }
    rows = targets._cost_targets(cost_part(usec, log_storages=storages))
    default = find(rows, "admit (10k keys)", "(default, storage=sorted-set)")
    assert default["verdict"] == "FAIL" and default["value"] == 1.0
    compact_admit = find(rows, "admit (10k keys)", f"{LOG} storage=compact")
    compact_reject = find(rows, "reject (hot key at its limit)", f"{LOG} storage=compact")
    assert compact_admit["verdict"] == compact_reject["verdict"] == "INFO"
    assert compact_admit["value"] == compact_reject["value"] == 0.5


# Memory --------------------------------------------------------------------------------


def memory(compact: dict[int, float] | None, sorted_set: dict[int, float]) -> dict:
    rows = []
    for storage, sizes in (("compact", compact or {}), ("sorted-set", sorted_set)):
        for limit, per_unit in sizes.items():
            rows.append(
                {
                    "algorithm": "log",
                    "storage": storage,
                    "member_format": "",
                    "limit": limit,
                    "bytes_per_key": round(per_unit * limit),
                    "bytes_per_unit": per_unit,
                    "encoding": "string",
                }
            )
    storages = {"sorted-set": {"case": LOG, "default": True}}
    storages["compact"] = (
        NO_COMPACT if compact is None else {"case": checks.log_name("compact"), "default": False}
    )
    return {"zset_max_listpack_entries": 128, "log_storages": storages, "rows": rows}


def test_compact_memory_at_every_size_from_128_up() -> None:
    sizes = dict.fromkeys(targets.MEMORY_SIZES, 12.0)
    rows = targets._memory_targets(memory({10: 40.0, **sizes}, {128: 16.7, 129: 116.5}))
    compact = [t for t in rows if "storage=compact" in t["target"]]
    assert len(compact) == 6
    small = find(rows, "memory, 10 admitted units", "storage=compact")
    assert small["verdict"] == "INFO"  # below 128: shown, not judged
    judged = [t for t in compact if t is not small]
    assert all(t["verdict"] == "PASS" and t["threshold"] == 12.0 for t in judged)
    assert all(t["op"] == "<=" and t["unit"] == " B/unit" for t in judged)
    # The sorted set is shown, never judged here.
    sorted_rows = [t for t in rows if "storage=sorted-set" in t["target"]]
    assert [t["verdict"] for t in sorted_rows] == ["INFO", "INFO"]


def test_compact_memory_over_the_line_fails_without_an_escape() -> None:
    sizes = dict.fromkeys(targets.MEMORY_SIZES, 11.0)
    sizes[129] = 12.01  # a fixed cost spread over few units is no excuse here
    rows = targets._memory_targets(memory(sizes, {}))
    verdicts = {t["target"]: t["verdict"] for t in rows}
    assert list(verdicts.values()).count("FAIL") == 1
    assert verdicts[find(rows, "memory, 129 admitted units")["target"]] == "FAIL"
    assert set(verdicts.values()) == {"PASS", "FAIL"}


def test_compact_memory_skips_with_the_reason() -> None:
    rows = targets._memory_targets(memory(None, {128: 16.7}))
    skip = find(rows, "memory per admitted unit", "storage=compact")
    assert skip["verdict"] == "SKIP" and skip["skipped"] == NO_COMPACT["skipped"]
    # Sizes that were not measured (a --quick run) are skipped, not passed.
    rows = targets._memory_targets(memory({128: 8.0, 129: 8.0, 1_000: 8.0}, {}))
    assert [t["verdict"] for t in rows] == ["PASS", "PASS", "PASS", "SKIP", "SKIP"]
    assert all("not measured" in t["skipped"] for t in rows[3:])
    assert targets._memory_targets({"skipped": "skipped: fakeredis"})[0]["verdict"] == "SKIP"


# The whole report ----------------------------------------------------------------------


def test_judge_takes_the_concurrency_parts_own_targets(monkeypatch) -> None:
    part = {"per_round": [{"a": 2.0, "b": 1.0}]}

    def rows_of(k: dict) -> list[dict]:
        return [verdicts.ratio_row("concurrency a vs b", k["per_round"], "a", "b", 1.5)]

    monkeypatch.setattr(concurrency, "targets", rows_of, raising=False)
    rows = targets.judge({"concurrency": part})
    assert [(t["target"], t["verdict"], t["value"]) for t in rows] == [
        ("concurrency a vs b", "PASS", 2.0)
    ]
    monkeypatch.delattr(concurrency, "targets")
    assert targets.judge({"concurrency": part}) == []


def test_a_report_without_a_part_has_no_rows_for_it() -> None:
    assert targets.judge({}) == []
    cost = cost_part(server_usec(8.0, 8.0, 8.0, 8.0), log_storages=SORTED_DEFAULT)
    rows = targets.judge({"server_cost": cost})
    assert rows and all(t["part"] == "server_cost" for t in rows)


# Our limiters and the log's storages ---------------------------------------------------


class Limiter:
    def __init__(self, client, *args, prefix: str = "rl") -> None:
        self.prefix = prefix


class NoStorage(Limiter):
    """A build before `storage=`."""


class WithStorage(Limiter):
    """A build with both storages; the default is the one named `default`."""

    default = "compact"

    def __init__(self, client, *args, prefix: str = "rl", storage: str | None = None) -> None:
        super().__init__(client, prefix=prefix)
        if storage not in (None, "sorted-set", "compact"):
            raise ValueError(f"unknown storage {storage!r}")
        self.storage = storage or self.default


class Counter(Limiter):
    pass


def test_ours_builds_each_storage_this_build_has() -> None:
    mine = checks.ours((NoStorage, Counter), None, "p", 1, 10)
    assert list(mine.limiters) == [LOG, "Counter"]
    assert mine.storages["sorted-set"] == {"case": LOG, "default": True}
    assert mine.storages["compact"]["skipped"].startswith(
        "skipped: storage='compact' is not available in this build (TypeError"
    )
    assert mine.limiters[LOG].prefix == f"p:{LOG}"
    mine = checks.ours((WithStorage,), None, "p", 1, 10)
    # The default is the compact storage: measured once, under the default's name.
    assert list(mine.limiters) == [LOG, checks.log_name("sorted-set")]
    assert mine.storages == {
        "sorted-set": {"case": checks.log_name("sorted-set"), "default": False},
        "compact": {"case": LOG, "default": True},
    }
    assert mine.limiters[checks.log_name("sorted-set")].storage == "sorted-set"
    assert mine.limiters[checks.log_name("sorted-set")].prefix == f"p:{LOG}-sorted-set"
    shared = checks.ours((WithStorage,), None, "rl", 1, 10, shared_prefix=True)
    assert {lim.prefix for lim in shared.limiters.values()} == {"rl"}


def test_server_cost_case_names() -> None:
    assert admit(LOG) == spread(LOG)  # the same names as the throughput cases
    assert reject(LOG) == f"{LOG} hot key at its limit"
    assert server_cost.FLOORS == (NOOP, INCR)
