"""The bench's dask part (`bench/logplan_dask.py`) at a tiny size: every engine plans the
same generated log set to the same plan, and the report's medians and ratios agree with
its runs. No timing is asserted."""

from __future__ import annotations

import pytest

from bench import logplan_dask


@pytest.mark.timeout(600)  # six plans in their own processes, four of them on a cluster
def test_tiny_dask_part_reports_every_engine_and_their_ratios() -> None:
    lines = 6_000
    report = logplan_dask.run(lines=lines, files=3, identities=300, rounds=1)
    assert set(report["engines"]) == set(logplan_dask.ENGINES)
    for engine in report["engines"].values():
        assert engine["lines_per_s"] * engine["seconds"] == pytest.approx(lines)
        assert engine["peak_tree_rss_bytes"] >= engine["peak_rss_bytes"] > 0
        assert 0 < engine["fixed_seconds"] and engine["lines_per_s_beyond_fixed"] > 0
    seconds = {name: e["seconds"] for name, e in report["engines"].items()}
    one_round = seconds["dask, 1 worker"] / seconds["dask, 2 workers"]
    assert abs(report["two_workers_over_one"] - one_round) < 1e-9
    assert report["same_plan"] and report["files"] == 3
    printed = logplan_dask.summary_lines(report)
    assert any(line.startswith("dask, 2 workers") for line in printed)
