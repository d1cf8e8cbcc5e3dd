"""The planner's recommendation (ratelimit.lab.planner.recommend): per-client peaks and
the smallest limit that affects at most a share of clients, held to a brute-force sweep
of every limit decided by the reference models' Python `run`."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit import algorithms
from ratelimit.lab import planner
from ratelimit.lab.planner import plots, recommend
from tests.lab.test_planner import BENCH_CHOICE, T0, brute_decisions, brute_window_max


def crowd_trace(seed: int, n: int = 500, identities: int = 40, span_s: float = 30.0):
    """Many clients of very different appetites (so the peaks spread), a few ties in
    one millisecond, costs mostly 1 with some larger."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, identities + 1) ** 1.2
    who = rng.choice(identities, size=n, p=weights / weights.sum())
    ms = np.sort(rng.integers(0, int(span_s * 1000), size=n))
    ms[n // 3 : n // 3 + 3] = ms[n // 3]
    return pd.DataFrame(
        {
            "time": T0 + ms / 1000,
            "identity": [f"c{k:02d}" for k in who],
            "cost": rng.choice([1, 1, 1, 1, 2, 4], size=n).astype(np.int64),
        }
    )


def brute_affected(trace: pd.DataFrame, algorithm: str, limit: int, window_ms: int):
    """(identities rejected or refused, requests rejected, requests refused) under
    `limit`, from the reference model request by request."""
    fits = trace["cost"].to_numpy() <= limit
    allowed = brute_decisions(trace[fits], algorithm, limit, window_ms)
    who = trace["identity"].to_numpy()
    hurt = set(who[fits][~allowed]) | set(who[~fits])
    return len(hurt), int((~allowed).sum()), int((~fits).sum())


def demand_peaks(trace: pd.DataFrame, window_ms: int) -> dict[str, int]:
    ms = np.floor(trace["time"].to_numpy() * 1000).astype(np.int64)
    who, cost = trace["identity"].to_numpy(), trace["cost"].to_numpy()
    return {i: brute_window_max(ms[who == i], cost[who == i], window_ms) for i in set(who)}


@pytest.mark.parametrize("window_ms", [1_000, 5_000])
def test_the_sliding_log_affects_exactly_the_clients_whose_peak_exceeds_the_limit(window_ms):
    trace = crowd_trace(1)
    peaks = demand_peaks(trace, window_ms)
    for limit in range(1, max(peaks.values()) + 2):
        hurt, _, _ = brute_affected(trace, "log", limit, window_ms)
        assert hurt == sum(p > limit for p in peaks.values()), limit


@pytest.mark.parametrize("seed", [2, 3])
@pytest.mark.parametrize("affect", [0.0, 0.05, 0.2])
def test_the_recommendation_is_the_smallest_limit_a_brute_force_sweep_finds(seed, affect):
    trace = crowd_trace(seed)
    window_ms = 2_000
    plan = planner.plan_trace(trace, ["10/2s"], server_time=BENCH_CHOICE, affect=affect)
    peaks = demand_peaks(trace, window_ms)
    clients = len(peaks)
    allowed = math.floor(affect * clients + 1e-9)
    top = max(peaks.values())
    assert [(r.algorithm, r.window_ms) for r in plan.recommended] == [
        (name, window_ms) for name in algorithms.NAMES
    ]
    for r in plan.recommended:
        sweep = [
            brute_affected(trace, r.algorithm, limit, window_ms) for limit in range(1, 2 * top)
        ]
        hurt = [s[0] for s in sweep]
        # Bisection needs the clients affected to fall as the limit grows: check it.
        assert all(a >= b for a, b in zip(hurt, hurt[1:], strict=False)), r.algorithm
        smallest = 1 + next(i for i, h in enumerate(hurt) if h <= allowed)
        assert r.limit == smallest, r.algorithm
        assert (r.identities_affected, r.rejected, r.refused) == sweep[smallest - 1]
        assert r.identities == clients and r.requests == len(trace)
        assert r.percentiles["max"] == top
    # The sliding log's answer is read off the peaks: the (allowed + 1)-th largest.
    log = next(r for r in plan.recommended if r.algorithm == "log")
    assert log.limit == max(sorted(peaks.values(), reverse=True)[allowed], 1)


def test_the_peak_percentiles_are_observed_peaks():
    trace = crowd_trace(4)
    plan = planner.plan_trace(trace, ["10/s"], ["log"], server_time=BENCH_CHOICE)
    ordered = sorted(demand_peaks(trace, 1_000).values())
    (r,) = plan.recommended
    for q in recommend.PERCENTILES:
        # The smallest peak with at least q% of the clients at or below it.
        want = ordered[math.ceil(q / 100 * len(ordered)) - 1]
        assert r.percentiles[recommend.percentile_key(q)] == want, q
    assert r.percentiles["max"] == ordered[-1]
    assert sorted(plan.client_peaks[1_000].tolist()) == ordered


def test_every_window_and_algorithm_planned_is_recommended_once():
    plan = planner.plan_trace(
        crowd_trace(5), ["10/s", "20/s", "30/5s"], ["gcra", "log"], server_time=BENCH_CHOICE
    )
    assert [(r.algorithm, r.window_ms) for r in plan.recommended] == [
        ("gcra", 1_000), ("log", 1_000), ("gcra", 5_000), ("log", 5_000),
    ]  # fmt: skip


def test_the_json_table_and_schema_carry_the_recommendation():
    plan = planner.plan_trace(crowd_trace(6), ["10/s"], ["log", "fw"], server_time=BENCH_CHOICE,
                              affect=0.1)  # fmt: skip
    document = json.loads(json.dumps(plan.to_dict()))
    assert document["affect"] == 0.1
    for entry, r in zip(document["recommended"], plan.recommended, strict=True):
        assert list(entry) == list(planner.SCHEMA["recommended"])
        assert list(entry["peaks"]) == list(planner.SCHEMA["peaks"])
        assert (entry["algorithm"], entry["window_ms"], entry["limit"]) == (
            r.algorithm, 1_000, r.limit,
        )  # fmt: skip
        assert entry["rejected_share"] == r.rejected / r.requests
        assert entry["identities_affected_share"] == r.identities_affected / r.identities
    table = plan.table()
    assert "Recommended" in table and "10.00% of clients" in table
    for r in plan.recommended:
        assert any(r.label in line and r.limit_text in line for line in table.splitlines())


def test_no_recommendation_when_affect_is_none():
    plan = planner.plan_trace(crowd_trace(6), ["10/s"], server_time=BENCH_CHOICE, affect=None)
    assert plan.recommended == () and plan.to_dict()["recommended"] == []
    assert "Recommended" not in plan.table()
    assert plan.client_peaks == {}  # nor the per-client demand it would start from
    with_it = planner.plan_trace(crowd_trace(6), ["10/s"], server_time=BENCH_CHOICE)
    assert list(with_it.client_peaks) == [1_000]
    same = ("log", "server_time", "shard", "candidates")
    assert {k: plan.to_dict()[k] for k in same} == {k: with_it.to_dict()[k] for k in same}


@pytest.mark.parametrize("bad", [1.0, -0.1, 2])
def test_a_bad_share_of_clients_is_refused(bad):
    with pytest.raises(ValueError, match="share of clients"):
        planner.plan_trace(crowd_trace(6), ["10/s"], server_time=BENCH_CHOICE, affect=bad)


@pytest.mark.parametrize(
    ("text", "share"), [("1%", 0.01), ("0.5%", 0.005), ("0.02", 0.02), (" 0 ", 0.0)]
)
def test_parse_affect_reads_percent_and_shares(text, share):
    assert recommend.parse_affect(text) == pytest.approx(share)


@pytest.mark.parametrize("text", ["100%", "-1%", "x", "1.5", ""])
def test_parse_affect_refuses_what_is_not_a_share(text):
    with pytest.raises(ValueError, match="share of clients"):
        recommend.parse_affect(text)


def test_the_peaks_figure_marks_each_recommended_limit():
    plan = planner.plan_trace(crowd_trace(7), ["10/s", "10/5s"], ["log", "gcra"],
                              server_time=BENCH_CHOICE)  # fmt: skip
    fig = plots.peaks_figure(plan)
    axes = fig.get_axes()
    assert len(axes) == 2
    for ax, window_ms in zip(axes, sorted(plan.client_peaks), strict=True):
        marked = sorted(
            line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"
        )
        assert marked == sorted(r.limit for r in plan.recommended if r.window_ms == window_ms)
        (curve,) = [line for line in ax.get_lines() if line.get_label() == "clients"]
        assert max(curve.get_xdata()) == plan.client_peaks[window_ms].max()


@settings(max_examples=100, deadline=None)
@given(
    drops=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    allowed=st.integers(0, 30),
    start=st.integers(-2, 60),
    high=st.integers(1, 50),
)
def test_smallest_limit_is_what_a_linear_scan_finds(drops, allowed, start, high):
    # A non-increasing count of clients affected: falls by drops[i] at limit i + 1.
    total = sum(drops)

    def affected(limit):
        return total - sum(drops[: limit - 1])

    want = next(limit for limit in range(1, len(drops) + 2) if affected(limit) <= allowed)
    found, asked = recommend.smallest_limit(affected, allowed, start, high)
    assert found == want
    assert asked <= 2 * (len(drops) + 2).bit_length() + 4


def test_a_late_line_still_gets_a_verified_recommendation():
    # A request logged after later ones: the sliding log records it at the newest stamp,
    # so the peaks alone may be off; the replayed search still finds the smallest limit.
    trace = crowd_trace(8, n=300)
    late = trace.iloc[[150]].assign(time=trace["time"].iloc[40])
    trace = pd.concat([trace.drop(index=150), late]).reset_index(drop=True)
    rows = [trace.iloc[: len(trace) - 1], trace.iloc[len(trace) - 1 :]]
    plan = planner.plan_trace(iter(rows), ["10/2s"], ["log"], server_time=BENCH_CHOICE,
                              affect=0.05)  # fmt: skip
    (r,) = plan.recommended
    allowed = math.floor(0.05 * r.identities + 1e-9)
    hurt = [brute_affected(trace, "log", limit, 2_000)[0] for limit in range(1, r.limit + 1)]
    assert hurt[-1] <= allowed and (r.limit == 1 or hurt[-2] > allowed)


def late_log(path, seed: int, n: int = 400, late: int = 8) -> None:
    """A combined log of `crowd_trace`'s requests (cost 1), with `late` lines written
    twenty seconds after their time: beyond a 1 s reorder window, so decided late."""
    from tests.lab.test_plan_distributed import _line

    trace = crowd_trace(seed, n=n)
    rows = [(t, _line(t, who)) for t, who in zip(trace["time"], trace["identity"], strict=True)]
    rng = np.random.default_rng(seed)
    for i in sorted(rng.choice(np.arange(n // 4, n // 2), late, replace=False), reverse=True):
        rows.insert(i + 200, rows.pop(i))
    path.write_text("\n".join(text for _, text in rows) + "\n")


def test_clients_rejected_at_any_limit_are_a_floor_the_recommendation_reports(tmp_path):
    log = tmp_path / "late.log"
    late_log(log, seed=9)
    window_ms, affect = 2_000, 0.0
    plan = planner.plan_log(log, ["10/2s"], measure=False, reorder_s=1.0, affect=affect,
                            progress=False)  # fmt: skip
    assert plan.log.problems.late > 0
    # The requests in the order they were decided: as the reader released them.
    from ratelimit.lab.accesslog import LogReader

    trace = pd.concat(list(LogReader(log, reorder_s=1.0, progress=False)), ignore_index=True)
    trace["cost"] = trace["cost"].astype(np.int64)
    allowed = math.floor(affect * trace["identity"].nunique() + 1e-9)
    floors = {}
    for r in plan.recommended:
        largest = recommend.largest_limit(r.algorithm, window_ms)
        assert 10 < largest <= algorithms.get(r.algorithm).max_limit
        floor = brute_affected(trace, r.algorithm, largest, window_ms)[0]
        floors[r.algorithm] = floor
        top = r.percentiles["max"]
        limits = range(1, top + 2)
        sweep = [brute_affected(trace, r.algorithm, limit, window_ms) for limit in limits]
        target = max(allowed, floor)
        smallest = 1 + next(i for i, s in enumerate(sweep) if s[0] <= target)
        assert r.limit == smallest, r.algorithm
        assert (r.identities_affected, r.rejected, r.refused) == sweep[smallest - 1]
        assert r.unavoidable == (floor if floor > allowed else 0), r.algorithm
        assert (r.unavoidable_why is None) == (r.unavoidable == 0)
    # Late requests are rejected at any limit by some algorithms (not all).
    assert max(floors.values()) > allowed and min(floors.values()) == 0
    doc = plan.to_dict()["recommended"]
    assert [d["unavoidable"] for d in doc] == [r.unavoidable for r in plan.recommended]
    hit = next(r for r in plan.recommended if r.unavoidable)
    assert hit.unavoidable_why in plan.table()
