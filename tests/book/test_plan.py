"""Chapter 8 on another log: `make plan` fills its parameters cell with papermill, and
the chapter runs on a log that is not the example (a JSON-lines log here), where its
example-only asserts and records stay out of the way."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ratelimit.lab import samplelog

ROOT = Path(__file__).parents[2]
CHAPTER = ROOT / "notebooks" / "08_your_traffic.ipynb"


def _outputs(notebook: dict) -> str:
    texts = []
    for cell in notebook["cells"]:
        for out in cell.get("outputs", []):
            texts.append("".join(out.get("text", "")))
            texts.append("".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(texts)


def _jsonl_log(path: Path) -> int:
    """A JSON-lines log of the example's requests, keyed by `api_key`, times in ISO 8601
    with a +02:00 offset, and one line that is not JSON: returns the requests written."""
    requests = samplelog.example_requests().head(3_000)
    lines = []
    for row in requests.itertuples(index=False):
        local = datetime.fromtimestamp(row.time + 7_200, UTC).replace(tzinfo=None)
        stamp = local.isoformat() + "+02:00"  # the same instant, written at UTC+02:00
        lines.append(json.dumps({"ts": stamp, "api_key": row.identity, "path": "/v1/tiles"}))
    lines.insert(10, "{not json")
    path.write_text("\n".join(lines) + "\n")
    return len(requests)


def test_the_parameters_cell_is_tagged_for_papermill():
    cells = json.loads(CHAPTER.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    source = "".join(tagged[0]["source"])
    for name in ("LOG", "FORMAT", "IDENTITY", "COST", "LIMIT", "SWEEP"):
        assert f"\n{name} = " in f"\n{source}"


def test_make_plan_passes_the_log_and_limit_to_its_tool(tmp_path):
    log = tmp_path / "access.log"
    dry = subprocess.run(
        ["make", "-n", "plan", f"LOG={log}", "LIMIT=30/min", "IDENTITY=api_key"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    command = dry.stdout  # tools/plan_page.py runs papermill, then writes the HTML
    assert "tools/plan_page.py" in command
    assert f'--log "{log}"' in command and '--limit "30/min"' in command
    assert '--identity "api_key"' in command and "--format" not in command


@pytest.mark.timeout(600)
def test_the_chapter_plans_another_log(tmp_path, monkeypatch):
    papermill = pytest.importorskip("papermill")
    log = tmp_path / "api.jsonl"
    sent = _jsonl_log(log)
    out = tmp_path / "08_your_traffic.ipynb"
    monkeypatch.delenv("RATELIMIT_SAVE_MEASUREMENTS", raising=False)  # records off
    papermill.execute_notebook(
        str(CHAPTER),
        str(out),
        parameters={
            "LOG": str(log),
            "IDENTITY": "api_key",
            "LIMIT": "30/min",
            "SWEEP": ["10/min", "30/min"],
        },  # fmt: skip
        cwd=str(CHAPTER.parent),
        progress_bar=False,
        kernel_name="python3",
    )
    text = _outputs(json.loads(out.read_text()))
    assert f"1 of {sent + 1:,} lines skipped: 1 malformed (line 11)" in text
    assert f"{sent:,}" in text and "At 30/min: the sliding log rejects" in text
