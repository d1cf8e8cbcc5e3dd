"""The lab's command line (`python -m ratelimit.lab`), end to end in a subprocess: the
plan of a log with bad lines, the example log, and every kind of bad input getting one
clear message and the documented exit status, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ratelimit.lab import planner, samplelog

T0_MS = 1_796_000_000_000  # 2026-11-30 00:53:20 UTC, a whole second


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "RATELIMIT_PROGRESS": "0"}
    return subprocess.run(
        [sys.executable, "-m", "ratelimit.lab", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def clf(host: str, ms: int) -> str:
    """A Common Log Format line at Unix time `ms`, in UTC with milliseconds."""
    import datetime

    moment = datetime.datetime.fromtimestamp(ms // 1000, tz=datetime.UTC)
    stamp = moment.strftime("%d/%b/%Y:%H:%M:%S") + f".{ms % 1000:03d} +0000"
    return f'{host} - - [{stamp}] "GET /v1/tiles/1/2/3.png HTTP/1.1" 200 512'


@pytest.fixture
def small_log(tmp_path: Path) -> Path:
    """Three clients over 3 s: one at 40 a second, one at 8, one at 1; and two bad
    lines, at lines 5 and 9."""
    lines = []
    for k in range(120):
        lines.append(clf("192.0.2.1", T0_MS + k * 25))
        if k % 5 == 0:
            lines.append(clf("2001:db8::7", T0_MS + k * 25 + 3))
        if k % 40 == 0:
            lines.append(clf("198.51.100.9", T0_MS + k * 25 + 7))
    lines.insert(4, "GET / HTTP/1.1 this is not a log line")
    lines.insert(8, clf("192.0.2.1", T0_MS).replace("[", "<"))
    path = tmp_path / "access.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_clean_failure(result: subprocess.CompletedProcess, status: int, *words: str) -> None:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for word in words:
        assert word in result.stderr, result.stderr


def test_plan_prints_the_table_reports_bad_lines_and_writes_json(small_log, tmp_path):
    result = run(
        "plan", str(small_log), "--limit", "10/s", "--json", "out.json", "--no-measure",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Who is hurt" in out and "Redis plan" in out
    rows = [line.split(None, 1) for line in out.split("Who is hurt")[1].splitlines()[2:6]]
    assert [row[0] for row in rows] == ["10/s"] * 4
    labels = ("sliding log", "fixed window", "sliding-window", "GCRA")
    for row, label in zip(rows, labels, strict=True):
        assert row[1].startswith(label)
    assert "192.0.2.1" in out  # the busiest client is rejected
    assert "server time per check: `make bench` of" in out and "--no-measure" in out
    # The bad lines, with their line numbers and reasons, on stderr.
    assert "2 of " in result.stderr and "lines skipped" in result.stderr
    assert "line 5 (" in result.stderr and "line 9 (" in result.stderr
    document = json.loads((tmp_path / "out.json").read_text())
    assert list(document) == list(planner.SCHEMA["plan"])
    assert [e["line"] for e in document["log"]["problems"]["examples"]] == [5, 9]
    # The command reports what the library plans.
    library = planner.plan_log(small_log, ["10/s"], measure=False).to_dict()
    assert document == json.loads(json.dumps(library))
    hurt = {c["algorithm"]: c for c in document["candidates"]}
    assert hurt["log"]["identities_rejected"] == 1 and hurt["log"]["rejected"] > 0
    assert hurt["log"]["busiest_affected"][0]["identity"] == "192.0.2.1"
    assert hurt["log"]["redis"]["keys"] == 3
    assert document["server_time"]["kind"] == "bench"


def test_plan_recommends_the_limit_the_library_recommends(small_log, tmp_path):
    # Three clients: at 34% one client may be affected, at "none" nothing is recommended.
    result = run(
        "plan", str(small_log), "--limit", "10/s", "--affect", "34%", "--json", "out.json",
        "--no-measure", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "out.json").read_text())
    library = planner.plan_log(small_log, ["10/s"], measure=False, affect=0.34)
    assert document == json.loads(json.dumps(library.to_dict()))
    assert document["affect"] == 0.34 and len(document["recommended"]) == 4
    for r in library.recommended:
        assert r.identities_affected <= 1
        assert any(r.label in line and r.limit_text in line for line in result.stdout.splitlines())
    result = run("plan", str(small_log), "--affect", "none", "--no-spread", "--json",
                 "none.json", "--no-measure", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "none.json").read_text())["recommended"] == []
    assert "Recommended" not in result.stdout


def test_plan_writes_the_tables_as_csv_and_the_figures(small_log, tmp_path):
    result = run(
        "plan", str(small_log), "--limit", "10/s", "--csv", "tables", "--plot", "plan.png",
        "--json", "out.json", "--no-measure", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    from ratelimit.lab.planner import export

    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == sorted(
        f"{name}.csv" for name in export.CSV_TABLES
    )
    document = json.loads((tmp_path / "out.json").read_text())
    rows = (tmp_path / "tables" / "candidates.csv").read_text().splitlines()
    assert len(rows) == 1 + len(document["candidates"])
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"
    assert "Wrote the figures to plan.png" in result.stderr
    # A figure format matplotlib cannot write is refused before the log is read.
    result = run("plan", str(small_log), "--plot", "plan.nope", "--no-measure", cwd=tmp_path)
    assert_clean_failure(result, 2, "plan.nope", ".png")
    assert result.stdout == ""


@pytest.mark.parametrize("bad", ["10/fortnight", "0/s", "-5/min", "abc", "10/0s"])
def test_a_limit_that_does_not_parse_exits_2_naming_the_option(small_log, tmp_path, bad):
    result = run("plan", str(small_log), f"--limit={bad}", "--no-measure", cwd=tmp_path)
    assert_clean_failure(result, 2, "--limit", repr(bad), "100/min")
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("option", "value", "word"),
    [("--shard-memory", "lots", "14GiB"), ("--headroom", "1", "headroom"), ("--top", "-3", "top"),
     ("--algorithm", "leaky", "gcra"), ("--affect", "150%", "share of clients"),
     ("--reorder", "-1", "seconds")],
)  # fmt: skip
def test_other_bad_options_exit_2_with_a_message(small_log, tmp_path, option, value, word):
    result = run("plan", str(small_log), f"{option}={value}", "--no-measure", cwd=tmp_path)
    assert_clean_failure(result, 2, option, word)


def test_a_log_and_the_example_together_are_refused(small_log, tmp_path):
    result = run("plan", str(small_log), "--example", "--no-measure", cwd=tmp_path)
    assert_clean_failure(result, 2, "not both")


@pytest.mark.parametrize(
    ("name", "content", "word"),
    [
        ("binary.log", bytes(range(256)) * 40, "binary.log"),
        ("notes.txt", b"Dear diary,\nToday I planned capacity.\n", "notes.txt"),
        ("empty.log", b"", "empty.log"),
    ],
)
def test_a_file_that_is_not_a_log_exits_1_with_one_clear_line(tmp_path, name, content, word):
    (tmp_path / name).write_bytes(content)
    result = run("plan", name, "--no-measure", cwd=tmp_path)
    assert_clean_failure(result, 1, "error:", word)
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_missing_log_unknown_field_and_unwritable_json_exit_1(small_log, tmp_path):
    missing = run("plan", "nowhere.log", "--no-measure", cwd=tmp_path)
    assert_clean_failure(missing, 1, "nowhere.log", "no such file")
    field = run("plan", str(small_log), "--identity", "x-api-key", "--no-measure", cwd=tmp_path)
    assert_clean_failure(field, 1, "x-api-key")
    unwritable = run(
        "plan", str(small_log), "--json", "no/such/folder/out.json", "--no-measure", cwd=tmp_path
    )
    assert_clean_failure(unwritable, 1, "no/such/folder/out.json")


def test_example_log_writes_the_lab_example(tmp_path):
    result = run("example-log", "example.log", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    expected = samplelog.write_example(tmp_path / "expected.log")
    assert (tmp_path / "example.log").read_bytes() == expected.read_bytes()
    assert "example.log" in result.stderr


def test_plan_without_a_log_plans_the_example_and_says_so(tmp_path):
    result = run("plan", "--no-measure", "--json", "plan.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "No LOG given" in result.stderr and "example-log" in result.stderr
    assert "the lab's example log" in result.stdout
    document = json.loads((tmp_path / "plan.json").read_text())
    log = document["log"]
    assert log["example"] is True and log["identity_field"] == "user"
    assert log["cost"] == "example_cost"
    bad_lines = sorted([*samplelog.EXAMPLE_BAD_LINES, log["problems"]["lines"]])
    assert [e["line"] for e in log["problems"]["examples"]] == bad_lines
    assert {c["limit_text"] for c in document["candidates"]} == {"100/min"}
    assert not list(tmp_path.glob("*.log"))  # the example was written elsewhere, and removed


def test_help_documents_the_example_and_the_server_time():
    result = subprocess.run(
        [sys.executable, "-m", "ratelimit.lab", "plan", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for phrase in ("--limit", "--json", "example log", "INFO commandstats", "make bench",
                   "--no-measure", "--headroom", "--shard-memory", "Exit status"):  # fmt: skip
        assert phrase in text, phrase


@pytest.mark.real_redis
def test_plan_measures_server_time_on_a_reachable_redis(small_log, tmp_path, real_redis_url):
    result = run(
        "plan", str(small_log), "--limit", "10/s", "--algorithm", "log", "--redis", real_redis_url,
        "--json", "out.json", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "server time per check: measured now on" in result.stdout
    server = json.loads((tmp_path / "out.json").read_text())["server_time"]
    assert server["kind"] == "measured" and server["source"].startswith("measured now")
    assert set(server["us_per_check"]) == {"log"} and server["note"] == ""


def test_reorder_sets_how_late_a_line_may_be_and_still_be_decided_in_order(tmp_path):
    """One line logged 2 s after a later one: within the default window it is put back
    in order; with --reorder 1 it is decided late, and the JSON counts it."""
    lines = [clf("192.0.2.1", T0_MS + k * 100) for k in range(40)]
    lines.insert(30, clf("192.0.2.1", T0_MS + 800))  # 2.2 s earlier than the line before
    log = tmp_path / "late.log"
    log.write_text("\n".join(lines) + "\n")
    late = {}
    for reorder in ("300", "1"):
        out = tmp_path / f"plan-{reorder}.json"
        result = run("plan", str(log), "--reorder", reorder, "--no-measure", "--json", str(out),
                     cwd=tmp_path)  # fmt: skip
        assert result.returncode == 0, result.stderr
        late[reorder] = json.loads(out.read_text())["log"]["problems"]["late"]
    assert late == {"300": 0, "1": 1}
