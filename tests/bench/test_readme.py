"""The benchmark tables (the book's Benchmarks page) come from the committed record, never
from a hand: what stands between the page's markers is exactly what bench/readme.py
renders from bench/record.json, and the renderer copes with skipped rows and missing
parts. The README points to the page and quotes none of its figures."""

from __future__ import annotations

import json
import re

import pytest

from bench import __main__ as cli
from bench import readme


def committed_record() -> dict:
    return json.loads(readme.RECORD.read_text())


def test_the_page_holds_the_committed_record_rendered() -> None:
    text = readme.PAGE.read_text()
    assert text.count(readme.BEGIN) == 1 and text.count(readme.END) == 1
    assert readme.section(text) == readme.render(committed_record()), (
        "book/benchmarks.md's tables differ from bench/record.json: run "
        "`make bench-record` after a full `make bench` (never edit them by hand)"
    )


# No decimal figure, rate, ratio, duration or count with a thousands separator.
MEASURED = re.compile(r"\d+\.\d+|\d+(?:,\d{3})+|\d+ ?(?:x|us|s|%|checks/s)\b")


def test_the_prose_around_the_tables_quotes_no_measured_figure() -> None:
    text = readme.PAGE.read_text()
    around = text[: text.index(readme.BEGIN)] + text[text.index(readme.END) :]
    assert MEASURED.findall(around) == []


def test_the_readme_points_to_the_page_and_quotes_none_of_it() -> None:
    text = (readme.ROOT / "README.md").read_text()
    start = text.index("## Benchmarks")
    section = text[start : text.index("\n## ", start + 1)]
    assert readme.BEGIN not in text and "book/benchmarks.md" in section
    assert MEASURED.findall(section) == []


def test_the_record_keeps_exactly_what_the_tables_need() -> None:
    record = committed_record()
    assert readme.record_of(record) == record  # nothing in it that the tables do not read
    assert readme.render(readme.record_of(record)) == readme.render(record)
    assert set(readme.PARTS) <= set(record) and record["targets"]


def test_a_report_renders_as_its_record_does() -> None:
    # The full report (every round, every figure) and its record render alike.
    record = committed_record()
    report = json.loads(json.dumps(record))
    report["checks"]["per_round"] = [{"PING": 1.0}]
    for row in report["targets"]:
        row["why"] = ["from the run's own figures"]
        row["pass"] = None
    report["server_cost"]["results"] = {
        name: {**r, "commands": {}, "rounds": [1.0]}
        for name, r in report["server_cost"]["results"].items()
    }
    assert readme.record_of(report) == record
    assert readme.render(report) == readme.render(record)


def test_missing_parts_say_so_instead_of_failing() -> None:
    text = readme.render({})
    assert text.count(readme.NOT_MEASURED) >= 8
    assert "Targets: not measured in this run." in text
    partial = {
        "date": "2026-01-01 00:00 UTC",
        "duration_s": 12.3,
        "checks": {
            "rounds": 3,
            "checks_per_case_per_round": 10,
            "skipped": {"limits moving window": "skipped: limits is not installed"},
            "log_storages": {"compact": {"skipped": "skipped: storage='compact' is not available"}},
            "results": {
                "EVALSHA return 1": {"checks_per_s": 1000.0, "ratios": {"EVALSHA return 1": 1.0}},
                "SlidingWindowLimiter hot key": {
                    "checks_per_s": 800.0,
                    "ratios": {"EVALSHA return 1": 0.8},
                },
            },
        },
        "server_cost": {"skipped": "skipped: none: embedded fakeredis"},
        "memory": {"skipped": "skipped: none: embedded fakeredis"},
        "cluster": {"skipped": "skipped: no cluster"},
        "nearcache": {"skipped": "skipped: no Redis"},
        "replay": {"skipped": "skipped: no Redis"},
    }
    text = readme.render(partial)
    assert "it took 12 s" in text and "2026-01-01" in text
    # A case measured on one key pattern only leaves the other's cells empty.
    assert "| `SlidingWindowLimiter` |  |  | 800 | 0.80 |" in text
    assert "- limits moving window: skipped: limits is not installed" in text
    assert "storage=compact: skipped: storage='compact' is not available" in text
    assert "server time per check: skipped: none: embedded fakeredis" in text
    assert "memory per key: skipped: none: embedded fakeredis" in text
    assert "| Redis Cluster, sliding log | skipped: no cluster |" in text
    assert "sync check, one at a time: not measured in this run." in text


def test_skip_info_and_failed_rows_in_the_targets_table() -> None:
    rows = [
        {"target": "a | b", "verdict": "SKIP", "skipped": "skipped: not here"},
        {
            "target": "ratio",
            "verdict": "FAIL",
            "value": 0.5,
            "unit": "x",
            "op": ">=",
            "threshold": 1.05,
            "quartiles": [0.4, 0.6],
        },
        {
            "target": "bytes",
            "verdict": "PASS",
            "value": 8.25,
            "unit": " B/unit",
            "op": "<=",
            "threshold": 12.0,
        },  # fmt: skip
        {
            "target": "shown",
            "verdict": "INFO",
            "value": 2.0,
            "unit": "x",
            "op": ">=",
            "threshold": None,
        },  # fmt: skip
        {
            "target": "same",
            "verdict": "PASS",
            "value": 3000,
            "unit": "/3,000 identical",
            "op": "==",
            "threshold": 3000,
        },  # fmt: skip
    ]
    text = readme.render({"targets": rows})
    assert "2 of 3 met" in text  # only PASS and FAIL rows are counted
    assert "| a \\| b |  | skipped: not here |" in text  # a pipe cannot break the table
    assert "| ratio | >= 1.05x | **not met**: 0.50x (rounds' quartiles 0.40-0.60) |" in text
    assert "| bytes | <= 12 B/unit | **met**: 8.25 B/unit |" in text
    assert "| shown |  | shown: 2.00x |" in text
    assert "| same | all 3,000 | **met**: 3,000/3,000 identical |" in text


def test_rewrite_replaces_only_the_marked_section() -> None:
    text = f"# T\n\nbefore\n\n{readme.BEGIN}\nold table\n{readme.END}\n\nafter\n"
    out = readme.rewrite(text, {})
    assert out.startswith(f"# T\n\nbefore\n\n{readme.BEGIN}\n") and out.endswith(
        f"\n{readme.END}\n\nafter\n"
    )
    assert "old table" not in out and readme.section(out) == readme.render({})
    assert readme.rewrite(out, {}) == out
    with pytest.raises(ValueError, match="no"):
        readme.rewrite("no markers here", {})


def test_record_copies_a_full_run_and_refuses_a_partial_one(tmp_path, capsys, monkeypatch) -> None:
    report = json.loads(json.dumps(committed_record()))
    report["per_round_noise"] = [1, 2, 3]
    results = tmp_path / "results.json"
    results.write_text(json.dumps(report))
    record, page = tmp_path / "record.json", tmp_path / "benchmarks.md"
    page.write_text(f"intro\n{readme.BEGIN}\n{readme.END}\nrest\n")
    readme.record(results, record, page)
    assert json.loads(record.read_text()) == committed_record()
    assert readme.section(page.read_text()) == readme.render(committed_record())
    # A --quick run, or one with parts left out, is not recorded.
    for bad in ({**report, "quick": True}, {k: v for k, v in report.items() if k != "memory"}):
        results.write_text(json.dumps(bad))
        with pytest.raises(SystemExit, match="partial run"):
            readme.record(results, record, page)
    # `python -m bench --record` runs nothing and records the latest results.
    results.write_text(json.dumps(report))
    record.unlink()
    monkeypatch.setattr(readme, "RECORD", record)
    monkeypatch.setattr(readme, "PAGE", page)
    monkeypatch.setattr(cli.suite, "run", lambda *a, **k: pytest.fail("--record measured"))
    assert cli.main(["--record", "--out", str(results)]) == 0
    assert json.loads(record.read_text()) == committed_record()
    assert str(record) in capsys.readouterr().out
