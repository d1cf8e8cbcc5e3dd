"""`make test` times itself, and the README quotes the recorded run, never a typed figure."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("test_record", ROOT / "tools" / "test_record.py")
assert _spec and _spec.loader
test_record = importlib.util.module_from_spec(_spec)
sys.modules["test_record"] = test_record
_spec.loader.exec_module(test_record)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="{errors}" failures="{failures}" skipped="2" tests="40">
</testsuite></testsuites>
"""


def test_the_readme_quotes_the_committed_record() -> None:
    record = json.loads(test_record.RECORD.read_text())
    assert test_record.quoted() == test_record.render(record)
    assert record["exit_code"] == 0 and record["failed"] == 0 and record["passed"] > 0


def _run(tmp_path: Path, errors: int, failures: int, rc: int) -> Path:
    run_dir = tmp_path / "run"
    test_record.start(run_dir)
    (run_dir / "junit.xml").write_text(JUNIT.format(errors=errors, failures=failures))
    result = test_record.finish(rc, run_dir)
    assert result["exit_code"] == rc
    failed = errors + failures
    assert (result["passed"], result["failed"], result["skipped"]) == (38 - failed, failed, 2)
    assert result["seconds"] >= 0 and result["load_at_start"] >= 0
    return run_dir


def test_a_passing_run_is_recorded_and_rendered(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, 0, 0, 0)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{test_record.BEGIN}\nold words\n{test_record.END}\nrest\n")
    target = tmp_path / "record.json"
    sentence = test_record.record(run_dir, target, readme)
    assert "passed 38 tests and skipped 2 in " in sentence
    assert json.loads(target.read_text())["passed"] == 38
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "old words" not in text
    assert test_record.quoted(readme) == sentence


@pytest.mark.parametrize(("errors", "failures", "rc"), [(1, 0, 1), (0, 3, 1), (0, 0, 2)])
def test_a_failed_run_is_refused(tmp_path: Path, errors: int, failures: int, rc: int) -> None:
    run_dir = _run(tmp_path, errors, failures, rc)
    target = tmp_path / "record.json"
    with pytest.raises(SystemExit, match="failed"):
        test_record.record(run_dir, target, tmp_path / "README.md")
    assert not target.exists()


def test_a_run_that_wrote_no_junit_counts_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    test_record.start(run_dir)
    result = test_record.finish(4, run_dir)
    assert (result["passed"], result["failed"]) == (0, 0)
    with pytest.raises(SystemExit):
        test_record.record(run_dir, tmp_path / "record.json", tmp_path / "README.md")
