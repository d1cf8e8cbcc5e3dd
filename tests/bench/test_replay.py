"""The bench's replay part in quick mode: the compiled replay beside the Python models,
per algorithm, its decisions checked against theirs, Cloudflare's experiment priced,
and the figures carried into the summary, the targets and the README's record.

No timing is asserted (that is what `make bench` reports)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from bench import readme, suite, summary
from bench import replay as bench_replay
from ratelimit.lab import fastreplay


def quick_replay() -> dict:
    options = suite.Options.quick()
    options.parts = {"replay"}
    return suite.run(options, url=None)


def test_compiled_and_python_side_by_side_in_one_run() -> None:
    report = quick_replay()
    part = report["replay"]
    compiled = part["compiled"]
    per_round = compiled["per_round"]
    assert len(per_round) == part["rounds"] == suite.Options.quick().replay_rounds
    assert list(compiled["algorithms"]) == ["log", "fw", "swc", "gcra"]
    for name, a in compiled["algorithms"].items():
        assert a["same_decisions"] is True
        assert a["kernel_per_s"] == pytest.approx(
            statistics.median(r[f"{name} kernel"] for r in per_round)
        )
        assert a["kernel_x_model"] == pytest.approx(
            statistics.median(r[f"{name} kernel"] / r[f"{name} model"] for r in per_round)
        )
        assert a["replay_x_model"] == pytest.approx(
            statistics.median(r[f"{name} replay"] / r[f"{name} model"] for r in per_round)
        )
        assert a["kernel_slower_per_s"] == [
            min(r[f"{name} kernel"], r[f"{name} kernel zipf"]) for r in per_round
        ]
    # The Redis comparison is measured against the Python log model of the same round.
    assert part["results"]["reference model"]["decisions_per_s"] == pytest.approx(
        statistics.median(r["log model"] for r in per_round)
    )
    assert part["same_decisions_as_model"] == {"fakeredis": True}
    cf = compiled["cloudflare"]
    log = compiled["algorithms"]["log"]
    assert cf["kernel_s"] == pytest.approx(400_000_000 / log["kernel_per_s"])
    assert cf["replay_s"] == pytest.approx(400_000_000 / log["replay_per_s"])

    rows = [t for t in report["targets"] if t["target"].startswith("compiled replay")]
    assert len(rows) == 5 and rows[-1]["verdict"] == "PASS"
    for row, name in zip(rows[:4], compiled["algorithms"], strict=True):
        slower = compiled["algorithms"][name]["kernel_slower_per_s"]
        assert row["value"] == pytest.approx(statistics.median(slower) / 1e6)
        assert row["verdict"] == ("PASS" if row["value"] >= 10 else "FAIL")

    printed = "\n".join(summary.lines(report))
    assert "compiled replay vs the Python reference models" in printed
    assert "Cloudflare's 400,000,000 requests" in printed
    record = readme.record_of(report)
    assert "per_round" not in record["replay"]["compiled"]
    assert readme.record_of(record) == record
    rendered = readme.render(record)
    assert "compiled replay vs the Python reference models" in rendered
    assert "Cloudflare's 400 million requests" in rendered and "same decisions" in rendered


def test_a_kernel_that_decides_wrong_does_not_pass_unnoticed(monkeypatch) -> None:
    original = fastreplay.Replayer.decide

    def one_wrong(self, codes, times_ms, costs):
        allowed, remaining, retry = original(self, codes, times_ms, costs)
        if self.algorithm == "swc" and len(allowed):
            allowed = allowed.copy()
            allowed[len(allowed) // 2] = not allowed[len(allowed) // 2]
        return allowed, remaining, retry

    monkeypatch.setattr(fastreplay.Replayer, "decide", one_wrong)
    report = quick_replay()
    same = {n: a["same_decisions"] for n, a in report["replay"]["compiled"]["algorithms"].items()}
    assert same == {"log": True, "fw": True, "swc": False, "gcra": True}
    identical = report["targets"][-1]
    assert identical["verdict"] == "FAIL" and identical["value"] == 3
    assert "decisions differ" in readme.render(readme.record_of(report))


def test_prepared_arrays_are_in_decision_order() -> None:
    frame = bench_replay.trace(2_000).sample(frac=1.0, random_state=1)  # shuffled rows
    order, codes, ms, costs = bench_replay.prepared(frame)
    assert (np.diff(ms) >= 0).all() and len(codes) == len(frame) == len(costs)
    identities = frame["identity"].to_numpy()[order]
    assert all(len(set(identities[codes == c])) == 1 for c in range(50))
