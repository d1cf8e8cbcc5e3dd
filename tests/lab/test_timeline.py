"""When and who (ratelimit.lab.planner.timeline, export, plots): rejections by hour of
day, the longest throttled stretch per client, the offenders with their user agent,
and the CSV and image files, each held to a brute-force count on generated traces."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit.lab import planner
from ratelimit.lab.planner import export, timeline
from tests.lab.test_planner import BENCH_CHOICE, T0, brute_decisions, in_chunks

AGENTS = ("Mozilla/5.0 (X11; Linux x86_64)", "Googlebot/2.1 (+http://www.google.com/bot.html)",
          "curl/8.4.0")  # fmt: skip


def day_trace(seed: int, n: int = 900, identities: int = 15):
    """Requests over three hours across midnight UTC, bursty, each with a user agent
    (every client mostly one)."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, identities + 1)
    who = rng.choice(identities, size=n, p=weights / weights.sum())
    start = T0 - (T0 % 86_400) + 86_400 - 3_600  # 23:00 UTC
    bursts = rng.integers(0, 3 * 3_600_000, size=60)  # each request joins one burst
    ms = np.sort(bursts[rng.integers(0, 60, size=n)] + rng.integers(0, 1_500, size=n))
    usual = rng.integers(0, len(AGENTS), size=identities)
    agent = np.where(rng.random(n) < 0.8, usual[who], rng.integers(0, len(AGENTS), size=n))
    return pd.DataFrame(
        {
            "time": start + ms / 1000,
            "identity": [f"h{k:02d}" for k in who],
            "cost": np.ones(n, dtype=np.int64),
            "agent": np.array(AGENTS, dtype=object)[agent],
        }
    )


def brute_stretches(codes, times, allowed, window):
    """Per code: (longest, start, end) by the definition, request by request."""
    found: dict[int, tuple[int, int, int]] = {}
    runs: dict[int, tuple[int, int]] = {}  # code -> (first rejected, last rejected)

    def close(k, end):
        first, _ = runs.pop(k)
        length = max(end - first, 0)
        if k not in found or length > found[k][0]:
            found[k] = (length, first, end)

    for k, t, ok in zip(codes.tolist(), times.tolist(), allowed.tolist(), strict=True):
        if not ok:
            first, last = runs.get(k, (t, t))
            runs[k] = (first, max(last, t))
        elif k in runs:
            close(k, min(t, runs[k][1] + window))
    for k in list(runs):
        close(k, runs[k][1] + window)
    return found


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 40), st.booleans()), min_size=1, max_size=80
    ),
    window=st.integers(1, 30),
    cut=st.lists(st.integers(1, 20), max_size=5),
)
def test_the_longest_stretch_follows_its_definition(rows, window, cut):
    codes = np.array([r[0] for r in rows], dtype=np.int64)
    times = np.cumsum([r[1] for r in rows]).astype(np.int64)
    allowed = np.array([r[2] for r in rows])
    stretches = timeline.Stretches(window)
    at = 0
    for size in [*cut, len(rows)]:
        stretches.add(codes[at : at + size], times[at : at + size], allowed[at : at + size])
        at += size
    longest, since, until = stretches.longest(6)
    want = brute_stretches(codes, times, allowed, window)
    for k in range(6):
        if k in want:
            assert (longest[k], since[k], until[k]) == want[k], k
        else:
            assert (longest[k], since[k], until[k]) == (0, -1, -1), k


def brute_candidate(trace, algorithm, limit, window_ms):
    allowed = brute_decisions(trace, algorithm, limit, window_ms)
    rejected = trace[~allowed]
    return allowed, rejected


@pytest.mark.parametrize("algorithm", ["log", "fw", "swc", "gcra"])
def test_rejections_by_hour_and_offenders_match_brute_force(algorithm):
    trace = day_trace(1)
    plan = planner.plan_trace(
        in_chunks(trace, [100] * 9), ["3/2s"], [algorithm], server_time=BENCH_CHOICE, top=4
    )
    (c,) = plan.candidates
    allowed, rejected = brute_candidate(trace, algorithm, 3, 2_000)
    hours = pd.to_datetime(rejected["time"], unit="s", utc=True).dt.hour
    want = np.bincount(hours, minlength=24)
    assert c.rejected_by_hour == tuple(want.tolist())
    assert sum(1 for h in want if h) >= 2  # the trace spans midnight: two hours or more
    per = pd.DataFrame({"identity": trace["identity"], "rejected": ~allowed}).groupby("identity")
    table = per["rejected"].agg(["size", "sum"]).reset_index()
    table = table[table["sum"] > 0].sort_values(
        ["sum", "size", "identity"], ascending=[False, False, True]
    )
    usual = (
        trace.groupby("identity")["agent"]
        .agg(lambda a: sorted(a.value_counts().items(), key=lambda x: (-x[1], x[0]))[0][0])
    )  # fmt: skip
    got = [(o.identity, o.requests, o.rejected, o.agent) for o in c.offenders]
    assert got == [
        (r.identity, r.size, r.sum, usual[r.identity]) for r in table.head(4).itertuples()
    ]
    # The longest stretches, by the definition, from the brute-force decisions.
    codes = trace["identity"].map({n: i for i, n in enumerate(sorted(set(trace["identity"])))})
    ms = np.floor(trace["time"].to_numpy() * 1000).astype(np.int64)
    found = brute_stretches(codes.to_numpy(), ms, allowed, 2_000)
    names = sorted(set(trace["identity"]))
    ranked = sorted(found.items(), key=lambda kv: (-kv[1][0], names[kv[0]]))[:4]
    assert len(ranked) == 4 and len(c.offenders) == 4
    assert [(t.identity, t.seconds, t.since, t.until) for t in c.longest_throttled] == [
        (names[k], v[0] / 1000, v[1] / 1000, v[2] / 1000) for k, v in ranked
    ]


def test_without_an_agent_column_offenders_have_no_agent():
    trace = day_trace(2).drop(columns="agent")
    plan = planner.plan_trace(trace, ["3/2s"], ["log"], server_time=BENCH_CHOICE)
    (c,) = plan.candidates
    assert c.offenders and all(o.agent is None for o in c.offenders)
    assert "user agent" not in plan.table()
    with_agent = planner.plan_trace(day_trace(2), ["3/2s"], ["log"], server_time=BENCH_CHOICE)
    assert "user agent" in with_agent.table()
    assert with_agent.candidates[0].offenders[0].agent in with_agent.table()


def test_the_json_table_and_csv_carry_when_and_who(tmp_path):
    plan = planner.plan_trace(day_trace(3), ["3/2s", "20/min"], ["log", "gcra"],
                              server_time=BENCH_CHOICE, top=3)  # fmt: skip
    document = json.loads(json.dumps(plan.to_dict()))
    for c, d in zip(plan.candidates, document["candidates"], strict=True):
        assert sum(d["rejected_by_hour"]) == c.rejected
        for entry in d["longest_throttled"]:
            assert list(entry) == list(planner.SCHEMA["throttled"])
        for entry in d["offenders"]:
            assert list(entry) == list(planner.SCHEMA["offender"])
        assert len(d["offenders"]) == min(3, c.identities_rejected)
    table = plan.table()
    assert "by hour of day (UTC" in table and "Longest throttled stretch" in table
    written = export.write_csv(plan, tmp_path / "tables")
    assert [p.name for p in written] == [f"{n}.csv" for n in export.CSV_TABLES]
    read = {p.stem: pd.read_csv(p) for p in written}
    assert len(read["candidates"]) == len(plan.candidates)
    assert read["candidates"]["rejected"].tolist() == [c.rejected for c in plan.candidates]
    hours = read["rejected_by_hour"].groupby(["limit_text", "algorithm"], sort=False)["rejected"]
    assert hours.sum().tolist() == [c.rejected for c in plan.candidates]
    assert read["offenders"]["identity"].tolist() == [
        o.identity for c in plan.candidates for o in c.offenders
    ]
    assert read["recommended"]["limit"].tolist() == [r.limit for r in plan.recommended]


def test_the_figure_is_written_in_the_format_its_name_asks(tmp_path):
    plan = planner.plan_trace(day_trace(4), ["3/2s"], ["log"], server_time=BENCH_CHOICE)
    png = export.write_figure(plan, tmp_path / "plan.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = export.write_figure(plan, tmp_path / "plan.svg")
    assert b"<svg" in svg.read_bytes()[:2000]
    with pytest.raises(ValueError, match=r"\.png"):
        export.write_figure(plan, tmp_path / "plan.nope")
    assert not (tmp_path / "plan.nope").exists()
