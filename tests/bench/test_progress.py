"""`make bench` says what it is doing while it does it, line by line through a pipe, and a
--quick run says its verdicts are a smoke run's."""

from __future__ import annotations

import io
import json
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench import progress, rounds, summary

ROOT = Path(__file__).resolve().parents[2]


def test_parts_are_numbered_and_say_their_rounds_and_time() -> None:
    out = io.StringIO()
    parts = progress.Parts(3, out=out)
    with parts.part("first"):
        rounds.run_sync({"a": lambda n: float(n), "b": lambda n: 2.0 * n}, rounds=3, n=5, warmup=1)
    parts.skip("second", "skipped: no private server")
    with parts.part("third"):
        pass
    rounds.run_sync({"a": lambda n: float(n)}, rounds=2, n=5, warmup=1)  # no part: says nothing
    lines = out.getvalue().splitlines()
    assert lines[:5] == [
        "[bench 1/3] first: started",
        "[bench 1/3] first: round 1/3",
        "[bench 1/3] first: round 2/3",
        "[bench 1/3] first: round 3/3",
        lines[4],
    ]
    assert lines[4].startswith("[bench 1/3] first: done in ") and lines[4].endswith(" s")
    assert lines[5:7] == [
        "[bench 2/3] second: skipped: no private server",
        "[bench 3/3] third: started",
    ]
    assert lines[7].startswith("[bench 3/3] third: done in ")
    assert len(lines) == 8
    assert set(parts.seconds) == {"first", "third"}


def test_a_quiet_part_says_it_is_still_running() -> None:
    out = io.StringIO()
    parts = progress.Parts(1, out=out, heartbeat_s=0.05)
    deadline = time.monotonic() + 20
    with parts.part("soak"):
        # Waits for the heartbeat's line (bounded), instead of sleeping and hoping.
        while "still running" not in out.getvalue():
            assert time.monotonic() < deadline, out.getvalue()
            threading.Event().wait(0.01)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[bench 1/1] soak: started"
    assert any(line.startswith("[bench 1/1] soak: still running, ") for line in lines[1:-1])
    assert lines[-1].startswith("[bench 1/1] soak: done in ")


def test_lines_reach_a_pipe_while_the_part_runs() -> None:
    # The child holds its part open until we write to its stdin: a line we can read before
    # that was flushed as it was written, not at exit.
    code = (
        "import sys\n"
        "from bench import progress\n"
        "parts = progress.Parts(1)\n"
        "with parts.part('replay'):\n"
        "    sys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        ready, _, _ = select.select([child.stdout], [], [], 60)
        assert ready, "no line came through the pipe while the part ran"
        assert child.stdout.readline() == "[bench 1/1] replay: started\n"
        assert child.poll() is None  # still inside the part
        child.stdin.write("go\n")
        child.stdin.close()
        rest = child.stdout.read()
        assert child.wait(60) == 0
        assert rest.startswith("[bench 1/1] replay: done in ")
    finally:
        if child.poll() is None:
            child.kill()


def test_a_quick_run_says_it_is_a_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    cmd = [
        sys.executable,
        "-m",
        "bench",
        "--quick",
        "--only",
        "checks",
        "--no-plot",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"[bench] {summary.SMOKE}"
    # Which Redis, and why that one, before anything is measured on it.
    assert lines[1].startswith("[bench] measuring on the ") and lines[1].endswith(")")
    assert lines[2] == "[bench 1/1] checks: started"
    assert "[bench 1/1] checks: round 2/2" in lines
    assert f"this is {summary.SMOKE}" in lines
    targets = lines.index("targets (ratios: the median of same-round ratios):")
    assert any("--quick" in line and "without --quick" in line for line in lines[targets:])
    assert json.loads(out.read_text())["quick"] is True
    # The summary a full run prints carries no such words.
    full = json.loads(out.read_text()) | {"quick": False}
    assert not any("smoke" in line for line in summary.lines(full))
