"""Timestamp resolution (ratelimit.lab.planner.resolution): the log's stamp unit found,
candidates whose window it is too coarse for flagged, and replayed with the stamps
spread within their unit, held to the reference models on the spread times."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit.lab import planner
from ratelimit.lab.planner import resolution
from tests.lab.test_planner import BENCH_CHOICE, T0, brute_decisions, in_chunks


def stamped_trace(seed: int, unit_ms: int, n: int = 600, identities: int = 10):
    """Requests over ten minutes from a whole minute, their true ms times cut down to a
    multiple of `unit_ms` as a log would write them."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, identities + 1)
    who = rng.choice(identities, size=n, p=weights / weights.sum())
    ms = np.sort(rng.integers(0, 600_000, size=n)) // unit_ms * unit_ms
    return pd.DataFrame(
        {
            "time": (T0 - T0 % 60) + ms / 1000,
            "identity": [f"s{k}" for k in who],
            "cost": np.ones(n, dtype=np.int64),
        }
    )


@pytest.mark.parametrize("unit_ms", resolution.RESOLUTIONS_MS)
def test_the_resolution_is_the_coarsest_unit_every_stamp_fits(unit_ms):
    trace = stamped_trace(1, unit_ms)
    ms = np.floor(trace["time"].to_numpy() * 1000).astype(np.int64)
    # What the data says, from the stamps: the largest unit dividing every one.
    want = max(u for u in resolution.RESOLUTIONS_MS if (ms % u == 0).all())
    plan = planner.plan_trace(
        in_chunks(trace, [50] * 12), ["10/min"], ["log"], server_time=BENCH_CHOICE, affect=None
    )
    assert plan.log.resolution_ms == want
    assert plan.to_dict()["log"]["resolution_ms"] == want


def test_one_finer_stamp_anywhere_makes_the_resolution_finer():
    trace = stamped_trace(2, 1_000)
    trace.loc[len(trace) - 1, "time"] += 0.25  # the last request, a quarter second on
    plan = planner.plan_trace(in_chunks(trace, [100] * 6), ["10/min"], ["log"],
                              server_time=BENCH_CHOICE)  # fmt: skip
    assert plan.log.resolution_ms == 10


@settings(max_examples=60, deadline=None)
@given(
    stamps=st.lists(st.integers(0, 8), min_size=1, max_size=60),
    unit=st.sampled_from([10, 100, 1_000]),
)
def test_spread_places_the_requests_of_a_stamp_evenly_in_their_order(stamps, unit):
    times = np.array(stamps, dtype=np.int64) * unit  # any order: late lines included
    got = resolution.spread(times, unit)
    for stamp in set(times.tolist()):
        rows = np.flatnonzero(times == stamp)
        n = len(rows)
        assert got[rows].tolist() == [stamp + (2 * j + 1) * unit // (2 * n) for j in range(n)]
        assert (got[rows] >= stamp).all() and (got[rows] < stamp + unit).all()


def test_coarse_candidates_are_flagged_and_replayed_with_the_stamps_spread():
    trace = stamped_trace(3, 1_000, n=900)
    plan = planner.plan_trace(trace, ["2/s", "6/5s", "30/min"], server_time=BENCH_CHOICE)
    assert plan.log.resolution_ms == 1_000
    ms = np.floor(trace["time"].to_numpy() * 1000).astype(np.int64)
    spread_trace = trace.assign(time=resolution.spread(ms, 1_000) / 1000)
    moved = 0
    for c in plan.candidates:
        window_ms = round(c.window_s * 1000)
        if window_ms >= 10_000:  # whole seconds are fine for windows of 10 s and more
            assert c.stamps is None and c.to_dict()["stamps"] is None
            continue
        s = c.stamps
        assert s is not None and s.resolution_ms == 1_000
        assert (s.rejected, s.identities_rejected) == (c.rejected, c.identities_rejected)
        allowed = brute_decisions(spread_trace, c.algorithm, c.limit, window_ms)
        rejected_who = spread_trace["identity"].to_numpy()[~allowed]
        assert s.rejected_spread == int((~allowed).sum()), c.algorithm
        assert s.identities_rejected_spread == len(set(rejected_who))
        moved += s.rejected_spread != s.rejected
    assert moved  # the spread changes some result on this trace
    document = json.loads(json.dumps(plan.to_dict()))
    for d in document["candidates"]:
        if d["stamps"] is not None:
            assert list(d["stamps"]) == list(planner.SCHEMA["stamps"])
    table = plan.table()
    assert "stamped every 1 s" in table and "spread evenly" in table
    assert (
        "6/5s" in table.split("spread evenly")[1]
        and "30/min" not in table.split("spread evenly")[1].split("Recommended")[0]
    )


def test_fine_stamps_flag_nothing():
    trace = stamped_trace(4, 1)
    plan = planner.plan_trace(trace, ["2/s"], server_time=BENCH_CHOICE)
    assert plan.log.resolution_ms == 1
    assert all(c.stamps is None for c in plan.candidates)
    assert "spread evenly" not in plan.table() and "1 ms or finer" in plan.table()


def test_without_kept_requests_the_flag_stays_and_the_replay_is_left_out():
    trace = stamped_trace(5, 1_000)
    plan = planner.plan_trace(trace, ["2/s"], ["log"], server_time=BENCH_CHOICE, affect=None,
                              spread_coarse=False)  # fmt: skip
    (c,) = plan.candidates
    assert c.stamps is not None and c.stamps.rejected == c.rejected
    assert c.stamps.rejected_spread is None and "(not replayed)" in plan.table()
