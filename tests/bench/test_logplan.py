"""The bench's log-planning part (`bench/logplan.py`) at a tiny size: every plan of
`RUNS` runs as a user runs it and counts every line; the targets judge the one-algorithm
speed and the memory ratio; the README's row quotes the runs."""

from __future__ import annotations

import pytest

from bench import logplan, readme, targets


@pytest.mark.timeout(600)  # eight plans, each a process of its own; a cold venv compiles
def test_every_plan_of_the_part_runs_and_is_judged():
    report = logplan.run(lines=4_000, identities=120)
    runs = report["runs"]
    assert list(runs) == [name for name, _, _ in logplan.RUNS]
    for name, which, arguments in logplan.RUNS:
        run = runs[name]
        assert run["lines"] == (4_000 if which == "big" else 400)
        assert run["arguments"] == " ".join(arguments)
        assert run["lines_per_s"] > 0 and run["peak_rss_bytes"] > 0
        assert 0 < run["identities_seen"] <= 120
    assert report["read_ahead_x"] == (
        runs["one algorithm"]["lines_per_s"] / runs["one algorithm, in turn"]["lines_per_s"]
    )
    rows = {row["target"]: row for row in targets._logplan_targets(report)}
    speed = next(row for name, row in rows.items() if "one limit, one algorithm" in name)
    assert speed["threshold"] == targets.LOGPLAN_MILLIONS and speed["verdict"] in ("PASS", "FAIL")
    assert speed["value"] == runs["one algorithm"]["lines_per_s"] / 1e6
    memory = [row for name, row in rows.items() if "bounded memory" in name]
    assert [row["value"] for row in memory] == [
        report["rss_ratio_big_to_small"], report["rss_ratio_recommended"]
    ]
    assert report["rss_ratio_recommended"] == (
        runs["recommended"]["peak_rss_bytes"] / runs["recommended, small"]["peak_rss_bytes"]
    )
    assert all(row["threshold"] == targets.LOGPLAN_RSS_RATIO for row in memory)
    before = runs.get("before")
    if before is None:  # a clone without the baseline's commit: skipped, saying why
        assert logplan.BASELINE[:12] in report["baseline_skipped"]
        assert any(r["verdict"] == "SKIP" for r in targets._logplan_targets(report))
    else:
        assert before["commit"] == logplan.BASELINE
        assert before["rejected"] == runs["one algorithm"]["rejected"]  # the same answer
        assert report["speedup_x"] == runs["one algorithm"]["lines_per_s"] / before["lines_per_s"]
        row = next(row for name, row in rows.items() if "planner before" in name)
        assert row["threshold"] == targets.LOGPLAN_SPEEDUP and row["value"] == report["speedup_x"]
    text = readme._logplan(report)
    assert "reading ahead" in text and "with the recommendation" in text
    assert f"{report['read_ahead_x']:.2f}x" in text
    assert f"{report['rss_ratio_recommended']:.2f}x the small log's" in text
    if before is not None:
        assert f"{report['speedup_x']:.2f}x the planner at {logplan.BASELINE[:7]}" in text
