"""The planner (ratelimit.lab.planner): limits as people write them, the one-pass plan
held to brute force (the reference models' Python `run`, request by request, and
counts over the whole trace), the Redis plan's arithmetic, the server time's source,
and the JSON document's documented fields."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit import algorithms, keys
from ratelimit.lab import capacity, memory, planner, reference
from ratelimit.lab.planner.measures import _LiveKeys
from ratelimit.lab.planner.planning import _key_bytes

ROOT = Path(__file__).resolve().parents[2]
TABLE = memory.load_table(memory.STORED_TABLE)
GIB = 2**30
T0 = 1_796_000_000.0  # a whole second (and minute, hour, day) in Unix time
KEY_OVERHEAD = 64  # chapter 6's shard: bytes per key MEMORY USAGE leaves out
MODELS = {a.name: getattr(reference, a.class_name) for a in algorithms.ALGORITHMS}
# How many windows a key lives after it is written, per algorithm (the scripts' TTLs;
# GCRA's is window * burst / limit, and the burst defaults to the limit).
TTL_WINDOWS = {"log": 1, "fw": 1, "swc": 2, "gcra": 1}
BENCH = capacity.server_time_from_bench(ROOT / "bench" / "record.json")
BENCH_CHOICE = planner.ServerTimeChoice("bench", BENCH)


# --- limits as people write them ---------------------------------------------------------


def test_parse_limit_is_the_library_grammar_as_a_pair():
    # The grammar and its refusals are tested in tests/core/test_rates.py.
    assert planner.parse_limit("100/min") == (100, 60.0)
    assert planner.parse_limit("3/500ms") == (3, 0.5)
    with pytest.raises(ValueError, match="100/min"):
        planner.parse_limit("10/fortnight")


@pytest.mark.parametrize(
    ("limit", "window_s", "text"),
    [
        (100, 60, "100/min"),
        (10, 1, "10/s"),
        (5, 7200, "5/2h"),
        (3, 0.5, "3/500ms"),
        (1, 86400, "1/d"),
    ],
)
def test_format_limit_writes_what_parse_limit_reads(limit, window_s, text):
    assert planner.format_limit(limit, window_s) == text
    assert planner.parse_limit(text) == (limit, float(window_s))


# --- brute force ------------------------------------------------------------------------


def brute_keys(times_ms: np.ndarray, identities: np.ndarray, lifetime_ms: int) -> int:
    """The most identities with a request in (t - L, t], over every request time t."""
    best = 0
    for t in np.unique(times_ms):
        inside = (times_ms > t - lifetime_ms) & (times_ms <= t)
        best = max(best, len(set(identities[inside])))
    return best


def brute_window_max(times_ms: np.ndarray, weights: np.ndarray, window_ms: int) -> int:
    """The most weight in any window (t - W, t], t over the stamps."""
    return max(
        (int(weights[(times_ms > t - window_ms) & (times_ms <= t)].sum()) for t in times_ms),
        default=0,
    )


def brute_decisions(trace: pd.DataFrame, algorithm: str, limit: int, window_ms: int) -> np.ndarray:
    """`allowed` per row, each identity's rows decided in table order by the model's
    Python `run` (the executable specification)."""
    model = MODELS[algorithm](window_ms=window_ms, limit=limit)
    allowed = np.zeros(len(trace), dtype=bool)
    ms = np.floor(trace["time"].to_numpy() * 1000).astype(np.int64)
    for who, rows in trace.groupby("identity", sort=False).indices.items():
        decided, *_ = model.run(
            keys.identity_bytes(who), ms[rows].tolist(), trace["cost"].to_numpy()[rows].tolist()
        )
        allowed[rows] = decided
    return allowed


def expected_candidate(trace: pd.DataFrame, algorithm: str, limit: int, window_ms: int, top: int):
    """Every figure of one candidate, computed on the whole trace at once."""
    ms = np.floor(trace["time"].to_numpy() * 1000).astype(np.int64)
    fits = trace["cost"].to_numpy() <= limit
    decided = trace[fits]
    allowed = brute_decisions(decided, algorithm, limit, window_ms)
    who = trace["identity"].to_numpy()
    per = pd.DataFrame({"identity": who, "requests": 1, "refused": (~fits).astype(int)})
    per["rejected"] = 0
    per.loc[fits, "rejected"] = (~allowed).astype(int)
    counts = per.groupby("identity").sum()
    admitted_ms, admitted_who = ms[fits][allowed], who[fits][allowed]
    admitted_cost = decided["cost"].to_numpy()[allowed]
    peaks = {
        i: brute_window_max(
            admitted_ms[admitted_who == i], admitted_cost[admitted_who == i], window_ms
        )
        for i in counts.index
    }
    affected = counts[(counts["rejected"] > 0) | (counts["refused"] > 0)]
    affected = affected.reset_index().sort_values(["requests", "identity"], ascending=[False, True])
    lifetime = window_ms * TTL_WINDOWS[algorithm]
    checked_who = who[fits]
    key_peaks = [max(peaks[i], 1) for i in pd.unique(checked_who)]
    return {
        "requests": len(trace),
        "rejected": int((~allowed).sum()),
        "refused": int((~fits).sum()),
        "identities": len(counts),
        "identities_rejected": int((counts["rejected"] > 0).sum()),
        "identities_refused": int((counts["refused"] > 0).sum()),
        "peak_admitted": max(peaks.values()),
        "busiest_affected": [
            (r.identity, r.requests, r.rejected, r.refused, peaks[r.identity])
            for r in affected.head(top).itertuples()
        ],
        "keys": brute_keys(ms[fits], checked_who, lifetime) if fits.any() else 0,
        "peak_checks": brute_window_max(ms[fits], np.ones(int(fits.sum()), dtype=int), 1000),
        "key_peaks": key_peaks,
    }


def small_trace(seed: int, n: int = 400, identities: int = 12, span_s: float = 20.0):
    """Random requests: a few busy identities and many quiet ones, ties in one ms, some
    costs above small limits."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, identities + 1)
    who = rng.choice(identities, size=n, p=weights / weights.sum())
    ms = np.sort(rng.integers(0, int(span_s * 1000), size=n))
    ms[n // 2 : n // 2 + 4] = ms[n // 2]  # several requests in one millisecond
    return pd.DataFrame(
        {
            "time": T0 + ms / 1000,
            "identity": [f"id-{k:02d}" for k in who],
            "cost": rng.choice([1, 1, 1, 2, 3, 7], size=n).astype(np.int64),
            "replica": np.zeros(n, dtype=np.int64),
        }
    )


def in_chunks(trace: pd.DataFrame, sizes: list[int]):
    at = 0
    for size in sizes:
        yield trace.iloc[at : at + size]
        at += size
    if at < len(trace):
        yield trace.iloc[at:]


# --- the streaming key count -------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 60)), min_size=1, max_size=60),
    lifetime=st.integers(1, 25),
    cut=st.lists(st.integers(1, 15), max_size=6),
)
def test_live_keys_is_the_most_identities_with_a_request_within_one_lifetime(data, lifetime, cut):
    gaps, who = [g for _, g in data], [w for w, _ in data]
    times = np.cumsum(np.asarray(gaps, dtype=np.int64) // 4)  # many ties and near ties
    codes = np.asarray(who, dtype=np.int64)
    counter = _LiveKeys(lifetime)
    at = 0
    for size in [*cut, len(times)]:
        counter.add(codes[at : at + size], times[at : at + size])
        at += size
    assert counter.peak == brute_keys(times, codes, lifetime)
    # What stays open is exactly the identities still alive after the last request.
    last = pd.Series(times).groupby(codes).max()
    assert counter.alive == int((last + lifetime > times[-1]).sum())


# --- plan_trace against brute force -----------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_plan_trace_matches_brute_force_for_every_candidate(seed):
    trace = small_trace(seed)
    limits = ["5/s", "20/10s", "6/3s"]
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 60, size=20).tolist()
    plan = planner.plan_trace(in_chunks(trace, sizes), limits, server_time=BENCH_CHOICE, top=4)
    assert [(c.limit_text, c.algorithm) for c in plan.candidates] == [
        (text, name) for text in limits for name in algorithms.NAMES
    ]
    assert plan.log.requests == len(trace) and plan.log.identities == trace["identity"].nunique()
    for c in plan.candidates:
        limit, window_s = planner.parse_limit(c.limit_text)
        want = expected_candidate(trace, c.algorithm, limit, round(window_s * 1000), top=4)
        got = (c.requests, c.rejected, c.refused, c.identities, c.identities_rejected)
        assert got == (
            want["requests"], want["rejected"], want["refused"], want["identities"],
            want["identities_rejected"],
        ), c  # fmt: skip
        assert c.identities_refused == want["identities_refused"]
        assert c.peak_admitted == want["peak_admitted"]
        assert [tuple(vars(a).values()) for a in c.busiest_affected] == want["busiest_affected"]
        assert c.redis is not None
        assert c.redis.keys == want["keys"]
        assert c.redis.peak_checks_per_s == want["peak_checks"]
        assert c.redis.key_lifetime_s == window_s * TTL_WINDOWS[c.algorithm]
        # Memory: the `keys` heaviest keys, each at its identity's peak, plus overhead.
        sizes_ = sorted(
            (capacity.bytes_per_key(TABLE, c.algorithm, p) for p in want["key_peaks"]), reverse=True
        )
        memory_bytes = sum(sizes_[: want["keys"]]) + KEY_OVERHEAD * want["keys"]
        assert c.redis.memory_bytes == pytest.approx(memory_bytes)
        assert c.redis.shards_for_memory == 1
        us = BENCH.us_per_check[c.algorithm]
        assert c.redis.us_per_check == us
        assert c.redis.redis_cpu_cores == pytest.approx(want["peak_checks"] * us / 1e6)
        assert c.redis.shards_for_checks == math.ceil(want["peak_checks"] / (1e6 / us * 0.5))


def test_some_candidates_reject_and_some_refuse():
    """The brute-force comparison above is not vacuous on its traces."""
    trace = small_trace(1)
    plan = planner.plan_trace(trace, ["5/s", "6/3s"], server_time=BENCH_CHOICE)
    assert all(0 < c.rejected < c.requests for c in plan.candidates)
    refused = {c.limit_text: c.refused for c in plan.candidates}
    assert refused["5/s"] == int((trace["cost"] > 5).sum()) > 0
    assert refused["6/3s"] == int((trace["cost"] > 6).sum()) > 0
    fw = next(c for c in plan.candidates if c.algorithm == "fw")
    log = next(c for c in plan.candidates if c.algorithm == "log")
    assert log.peak_admitted <= log.limit < fw.peak_admitted  # the boundary burst


def test_chunking_changes_nothing():
    trace = small_trace(4, n=600)
    whole = planner.plan_trace(trace, ["4/s", "30/min"], server_time=BENCH_CHOICE)
    ones = planner.plan_trace(
        in_chunks(trace, [1] * 600), ["4/s", "30/min"], server_time=BENCH_CHOICE
    )
    assert whole.to_dict() == ones.to_dict()


def test_a_late_request_counts_where_it_appears_for_keys_but_is_decided_at_its_time():
    # b's second request is logged 5 s before a request already read: it is decided at
    # its own time, and is alive for the key count from the latest time seen.
    trace = pd.DataFrame(
        {
            "time": T0 + np.array([0.0, 10.0, 5.0]),
            "identity": ["a", "b", "b"],
            "cost": np.ones(3, dtype=np.int64),
        }
    )
    chunks = [trace.iloc[:2], trace.iloc[2:]]
    plan = planner.plan_trace(chunks, ["1/20s"], ["log"], server_time=BENCH_CHOICE)
    (c,) = plan.candidates
    assert c.rejected == 1  # b at 5 s: its request at 10 s is in the window, and later
    assert c.redis.keys == 2  # a (0 s) and b (10 s) within 20 s of each other


def test_requests_costing_more_than_the_limit_are_refused_not_checked():
    trace = pd.DataFrame(
        {
            "time": T0 + np.array([0.0, 0.1, 0.2, 0.3, 0.4]),
            "identity": ["big", "big", "small", "small", "small"],
            "cost": np.array([5, 9, 1, 1, 1], dtype=np.int64),
        }
    )
    plan = planner.plan_trace(trace, ["4/s", "10/s"], ["log"], server_time=BENCH_CHOICE)
    four, ten = plan.candidates
    assert (four.refused, four.identities_refused, four.rejected) == (2, 1, 0)
    assert four.redis.keys == 1 and four.redis.peak_checks_per_s == 3  # "big" never asks Redis
    assert [(a.identity, a.refused) for a in four.busiest_affected] == [("big", 2)]
    # Under 10/s both fit; big's second (5 + 9 > 10) is rejected, and still a check.
    assert (ten.refused, ten.rejected, ten.redis.keys, ten.redis.peak_checks_per_s) == (0, 1, 2, 5)
    assert "cost more than the limit" in plan.table()
    only_big = planner.plan_trace(trace.iloc[:2], ["4/s"], ["gcra"], server_time=BENCH_CHOICE)
    assert only_big.candidates[0].redis is None  # nothing reaches Redis
    assert only_big.to_dict()["candidates"][0]["redis"] is None
    assert "no checks" in only_big.table()


def test_memory_of_big_logs_grows_with_what_each_key_holds():
    # One identity sending 300 requests in 100 s, under 1000/h: its log holds 300
    # members at its peak, past the listpack threshold; an O(1) key stays small.
    trace = pd.DataFrame(
        {
            "time": T0 + np.arange(300) / 3,
            "identity": ["busy"] * 300,
            "cost": np.ones(300, dtype=np.int64),
        }
    )
    plan = planner.plan_trace(trace, ["1000/h"], ["log", "gcra"], server_time=BENCH_CHOICE)
    log, gcra = plan.candidates
    assert log.peak_admitted == 300 and log.redis.keys == 1
    assert log.redis.memory_bytes == capacity.bytes_per_key(TABLE, "log", 300) + KEY_OVERHEAD
    assert gcra.redis.memory_bytes == capacity.bytes_per_key(TABLE, "gcra", 300) + KEY_OVERHEAD
    assert log.redis.memory_bytes > 100 * gcra.redis.memory_bytes


def test_shards_follow_the_shard_options():
    trace = small_trace(5)
    plan = planner.plan_trace(
        trace, ["5/s"], ["log"], server_time=BENCH_CHOICE, headroom=0.9, shard_memory_bytes=4096
    )
    r = plan.candidates[0].redis
    assert r.shards_for_memory == math.ceil(r.memory_bytes / (4096 * 0.1))
    us = BENCH.us_per_check["log"]
    assert r.shards_for_checks == math.ceil(r.peak_checks_per_s / (1e6 / us * 0.1))
    assert r.shards == max(r.shards_for_memory, r.shards_for_checks)
    document = plan.to_dict()["shard"]
    assert document["memory_bytes"] == pytest.approx(4096) and document["headroom"] == 0.9


def test_duplicate_limits_and_algorithms_are_planned_once():
    trace = small_trace(6, n=50)
    plan = planner.plan_trace(
        trace, ["100/min", "100/minute", (100, 60)], ["log", "log"], server_time=BENCH_CHOICE
    )
    assert [(c.limit_text, c.algorithm) for c in plan.candidates] == [("100/min", "log")]


@pytest.mark.parametrize(
    ("limits", "algos", "match"),
    [
        ([], ["log"], "at least one limit"),
        (["10/s"], [], "at least one algorithm"),
        (["10/fortnight"], ["log"], "fortnight"),
        (["2000000/h"], ["log"], "'2000000/h' with algorithm 'log'"),
        (["10/s"], ["leaky"], "unknown algorithm"),
        ([(10, 0.0005)], ["log"], "whole milliseconds"),
    ],
)
def test_bad_candidates_are_refused_before_anything_is_read(limits, algos, match):
    def never():
        raise AssertionError("the trace was read")
        yield

    with pytest.raises(ValueError, match=match):
        planner.plan_trace(never(), limits, algos, server_time=BENCH_CHOICE)


@pytest.mark.parametrize(
    ("options", "match"),
    [({"headroom": 1.0}, "headroom"), ({"shard_memory_bytes": 0}, "shard_memory_bytes"),
     ({"top": -1}, "top")],
)  # fmt: skip
def test_bad_shard_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        planner.plan_trace(small_trace(1, n=5), ["1/s"], server_time=BENCH_CHOICE, **options)


def test_bad_traces_are_refused_with_a_reason():
    trace = small_trace(1, n=20)
    with pytest.raises(ValueError, match="no requests"):
        planner.plan_trace(trace.iloc[:0], ["1/s"], server_time=BENCH_CHOICE)
    with pytest.raises(ValueError, match="sorted by time"):
        planner.plan_trace(trace.iloc[::-1], ["1/s"], server_time=BENCH_CHOICE)
    with pytest.raises(ValueError, match="lacks"):
        planner.plan_trace(trace.drop(columns="cost"), ["1/s"], server_time=BENCH_CHOICE)
    with pytest.raises(ValueError, match="cost"):
        planner.plan_trace(trace.assign(cost=0), ["1/s"], server_time=BENCH_CHOICE)


# --- server time --------------------------------------------------------------------------


def test_without_redis_the_bench_record_is_used_and_the_plan_says_why(tmp_path):
    choice = planner.choose_server_time(["log", "gcra"], redis_url="redis://127.0.0.1:1/0")
    assert choice.kind == "bench"
    assert "no Redis answered at redis://127.0.0.1:1/0" in choice.note
    assert choice.server_time.us_per_check == {
        "log": BENCH.us_per_check["log"], "gcra": BENCH.us_per_check["gcra"]
    }  # fmt: skip
    skipped = planner.choose_server_time(["fw"], measure=False)
    assert skipped.kind == "bench" and "--no-measure" in skipped.note


@pytest.mark.parametrize("redis_url", [None, "", "  "])
def test_no_redis_named_none_is_measured_and_the_plan_says_so(redis_url, monkeypatch):
    from ratelimit.lab.planner import servertime

    def refuse(url, *args):
        raise AssertionError(f"measured on {url}, which nobody named")

    monkeypatch.setattr(servertime, "_measured", refuse)
    if redis_url is None:
        monkeypatch.delenv("REDIS_URL", raising=False)
    else:
        monkeypatch.setenv("REDIS_URL", redis_url)
    choice = planner.choose_server_time(["log"])
    assert choice.kind == "bench"
    assert "no Redis named" in choice.note and "REDIS_URL" in choice.note


def test_without_redis_or_bench_record_the_plan_says_so_and_plans_memory_only(tmp_path):
    missing = tmp_path / "record.json"
    choice = planner.choose_server_time(["log"], measure=False, bench_record=missing)
    assert choice.kind == "none" and str(missing) in choice.note and "make bench" in choice.note
    plan = planner.plan_trace(small_trace(2), ["5/s"], ["log"], server_time=choice)
    r = plan.candidates[0].redis
    assert r.us_per_check is None and r.shards is None and r.shards_for_checks is None
    assert r.shards_for_memory == 1 and r.memory_bytes > 0
    assert "unknown" in plan.table() and "make bench" in plan.table()
    json.dumps(plan.to_dict())


def test_a_bench_record_without_the_cases_is_not_used(tmp_path):
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"date": "today", "server_cost": {"results": {}}}))
    choice = planner.choose_server_time(["log"], measure=False, bench_record=record)
    assert choice.kind == "none" and "make bench" in choice.note


def test_a_password_in_the_redis_url_is_never_shown():
    choice = planner.choose_server_time(["log"], redis_url="redis://me:s3cret@127.0.0.1:1/0")
    assert "s3cret" not in choice.note and "me:***@127.0.0.1:1" in choice.note


@pytest.mark.real_redis
def test_on_a_reachable_redis_the_server_time_is_measured(real_redis_url):
    choice = planner.choose_server_time(["log", "fw"], redis_url=real_redis_url, checks=50)
    assert choice.kind == "measured", choice.note
    assert "measured now" in choice.server_time.source
    assert set(choice.server_time.us_per_check) == {"log", "fw"}
    assert all(us > 0 for us in choice.server_time.us_per_check.values())
    plan = planner.plan_trace(small_trace(3, n=50), ["5/s"], ["fw"], server_time=choice)
    assert plan.to_dict()["server_time"]["kind"] == "measured"


# --- the JSON document -------------------------------------------------------------------


def test_the_json_document_has_exactly_the_documented_fields():
    plan = planner.plan_trace(small_trace(1), ["5/s", "20/10s"], server_time=BENCH_CHOICE)
    document = json.loads(json.dumps(plan.to_dict()))
    schema = planner.SCHEMA
    assert list(document) == list(schema["plan"])
    assert list(document["log"]) == list(schema["log"])
    assert list(document["log"]["problems"]) == list(schema["problems"])
    assert list(document["server_time"]) == list(schema["server_time"])
    assert list(document["shard"]) == list(schema["shard"])
    assert len(document["candidates"]) == 8
    for candidate in document["candidates"]:
        assert list(candidate) == list(schema["candidate"])
        assert list(candidate["redis"]) == list(schema["redis"])
        assert candidate["busiest_affected"]
        for affected in candidate["busiest_affected"]:
            assert list(affected) == list(schema["affected"])
    # Every field is documented in the module docstring.
    for fields in schema.values():
        for name in fields:
            assert f"`{name}`" in planner.__doc__, name


def test_the_json_document_holds_the_plan():
    plan = planner.plan_trace(small_trace(2), ["5/s"], ["swc"], server_time=BENCH_CHOICE)
    (c,) = plan.candidates
    (d,) = plan.to_dict()["candidates"]
    assert (d["limit"], d["window_s"], d["algorithm"], d["label"]) == (5, 1.0, "swc", c.label)
    assert d["rejected_share"] == c.rejected / c.requests
    assert d["identities_rejected_share"] == c.identities_rejected / c.identities
    assert d["peak_admitted_ratio"] == c.peak_admitted / 5
    assert d["redis"]["keys"] == c.redis.keys
    server = plan.to_dict()["server_time"]
    assert server["kind"] == "bench" and server["us_per_check"] == dict(BENCH.us_per_check)


def test_the_table_shows_every_candidate_and_the_busiest_affected():
    trace = small_trace(3)
    plan = planner.plan_trace(trace, ["5/s"], ["log", "fw"], server_time=BENCH_CHOICE, top=3)
    text = plan.table()
    rows = [line.split() for line in text.split("Who is hurt")[1].splitlines()[2:4]]
    for c, row in zip(plan.candidates, rows, strict=True):
        assert row[0] == c.limit_text and " ".join(row[1:3]) == c.label
        assert row[3:5] == [f"{c.rejected:,}", f"{c.rejected / c.requests:.1%}"]
    # The busiest affected under either algorithm, with what each rejected.
    expected = {
        name: expected_candidate(trace, name, 5, 1000, top=len(trace))["busiest_affected"]
        for name in ("log", "fw")
    }
    rejected = {name: {a[0]: a[2] for a in rows} for name, rows in expected.items()}
    requests = {a[0]: a[1] for rows in expected.values() for a in rows}
    refused = {a[0]: a[3] for rows in expected.values() for a in rows}
    assert any(refused.values())  # so the table has its "cost > limit" column
    busiest = sorted(requests, key=lambda who: (-requests[who], who))[:3]
    lines = text.split("Busiest identities affected by 5/s")[1].splitlines()[2:5]
    for who, line in zip(busiest, lines, strict=True):
        cells = line.split()
        assert cells[0] == who
        assert cells[1:] == [
            f"{requests[who]:,}", f"{rejected['log'].get(who, 0):,}",
            f"{rejected['fw'].get(who, 0):,}", f"{refused[who]:,}",
        ]  # fmt: skip


# --- plan_log: the same on a log file ------------------------------------------------------


def clf_line(host: str, user: str, ms: int) -> str:
    """A Common Log Format line at Unix time `ms` (UTC, with milliseconds)."""
    moment = pd.Timestamp(ms, unit="ms", tz="UTC")
    stamp = moment.strftime("%d/%b/%Y:%H:%M:%S.") + f"{ms % 1000:03d} +0000"
    return f'{host} - {user} [{stamp}] "GET /tiles/1 HTTP/1.1" 200 512'


def write_clf(path: Path, trace: pd.DataFrame, shuffle_s: float = 0.0, seed: int = 0) -> Path:
    """The trace as a CLF log (identity as the client address's last octet, and as the
    user), lines moved up to `shuffle_s` out of order (servers merged), plus bad lines."""
    rng = np.random.default_rng(seed)
    ms = np.floor(trace["time"].to_numpy() * 1000).astype(np.int64)
    order = np.argsort(ms + rng.uniform(0, shuffle_s * 1000, size=len(ms)), kind="stable")
    lines = []
    for i in order:
        who = trace["identity"].iloc[i]
        lines.append(clf_line(f"10.0.0.{int(who.split('-')[1])}", who, int(ms[i])))
    lines.insert(3, "this is not a log line")
    lines.insert(10, clf_line("10.0.0.1", "id-01", int(ms[0])).replace("GET", "").replace("[", ""))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("identity", [None, "user"])
def test_plan_log_matches_brute_force_on_the_log_it_reads(tmp_path, identity):
    from ratelimit.lab import accesslog

    trace = small_trace(7, n=500).assign(cost=1)
    log = write_clf(tmp_path / "access.log", trace, shuffle_s=2.0)
    plan = planner.plan_log(
        log, ["5/s", "12/4s"], identity=identity, chunk_lines=37, measure=False, top=3
    )
    read, problems = accesslog.read(log, identity=identity)
    assert len(read) == len(trace) and problems.skipped == 2
    assert plan.log.identity_field == (identity or "host")
    assert plan.log.format == "clf" and plan.log.requests == len(trace)
    assert plan.log.start == pytest.approx(trace["time"].min())
    document = plan.to_dict()["log"]["problems"]
    assert (document["lines"], document["skipped"]) == (len(trace) + 2, 2)
    assert [e["line"] for e in document["examples"]] == [4, 11]
    for c in plan.candidates:
        limit, window_s = planner.parse_limit(c.limit_text)
        want = expected_candidate(read, c.algorithm, limit, round(window_s * 1000), top=3)
        assert (c.rejected, c.identities_rejected, c.peak_admitted) == (
            want["rejected"], want["identities_rejected"], want["peak_admitted"]
        )  # fmt: skip
        assert [tuple(vars(a).values()) for a in c.busiest_affected] == want["busiest_affected"]
        assert (c.redis.keys, c.redis.peak_checks_per_s) == (want["keys"], want["peak_checks"])
    assert sum(c.rejected for c in plan.candidates) > 0
    assert plan.server_time.kind == "bench"


def test_plan_log_counts_a_late_line_and_decides_it(tmp_path):
    lines = [clf_line("10.0.0.1", "a", 1_796_000_000_000 + k * 1000) for k in range(5)]
    lines += [clf_line("10.0.0.2", "b", 1_796_000_000_000 + 900_000)]
    lines += [clf_line("10.0.0.1", "a", 1_796_000_000_500)]  # 15 min behind: late
    log = tmp_path / "merged.log"
    log.write_text("\n".join(lines) + "\n")
    plan = planner.plan_log(log, ["2/5s"], ["log"], measure=False)
    (c,) = plan.candidates
    assert plan.log.requests == 7 and plan.log.problems.late == 1
    assert c.rejected == 4  # a's requests at 2, 3 and 4 s, and the late one at 0.5 s
    assert plan.to_dict()["log"]["problems"]["late_examples"][0]["line"] == 7


def test_plan_log_on_something_that_is_not_a_log_says_so(tmp_path):
    from ratelimit.lab import accesslog

    prose = tmp_path / "notes.txt"
    prose.write_text("Dear diary,\nToday I planned capacity.\n")
    with pytest.raises(accesslog.LogFormatError):
        planner.plan_log(prose, ["1/s"], measure=False)
    bad = tmp_path / "bad.log"
    bad.write_text(clf_line("10.0.0.1", "a", 1_796_000_000_000).replace(" +0000", " +9999") + "\n")
    with pytest.raises(accesslog.LogFormatError):
        planner.plan_log(bad, ["1/s"], measure=False)


@pytest.mark.parametrize("algorithm", algorithms.NAMES)
def test_key_bytes_is_bytes_per_key_at_every_size(algorithm):
    sizes = np.concatenate((np.arange(1, 1_500), [4_999, 65_537, 100_000, 100_001, 3_000_000]))
    got = _key_bytes(TABLE, algorithm, sizes)
    want = [capacity.bytes_per_key(TABLE, algorithm, int(size)) for size in sizes]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert _key_bytes(TABLE, algorithm, np.array([0, 7]))[0] == want[0]  # at least 1
