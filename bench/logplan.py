"""A big access log planned end to end: `python -m ratelimit.lab plan` on a synthetic
Common Log Format file of `lines` lines, and on one a tenth its size, each plan in a
process of its own, all in one run.

Reported per plan: lines, seconds, lines per second, and the planning process's peak
resident memory (`ru_maxrss` of that child alone, from `os.wait4`). The plans (`RUNS`):

- `small` and `big`: one limit, the four algorithms, nothing kept per request
  (`--affect none --no-spread`). Memory is bounded when the big log's peak is about the
  small log's, although it has ten times the lines: the ratio of the two peaks.
- `one algorithm`: the big log, one limit, the sliding log, reading ahead in a thread
  (the default), and `one algorithm, in turn`: the same with `--read-ahead 0`, reading
  and planning taking turns on one core. Their ratio is what the second core gives.
- `recommended, small` and `recommended`: the small and the big log, one algorithm, as
  a plan runs by default: with the recommendation, which keeps every request (20 bytes
  each; beyond a bound in a temporary file) to replay other limits on. The ratio of
  their peaks says whether a default plan's memory is bounded too.

The logs are written by `samplelog.write_large` into a scratch folder and deleted
afterwards; every plan must count every line of its log as a request, or the part fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ratelimit.lab import samplelog

LIMIT = "100/min"


QUIET = ("--affect", "none", "--no-spread")  # nothing kept per request
FOUR = tuple(a for name in ("log", "fw", "swc", "gcra") for a in ("--algorithm", name))
RUNS = (  # name, log, arguments beyond the limit
    ("small", "small", (*FOUR, *QUIET)),
    ("recommended, small", "small", ("--algorithm", "log")),
    ("big", "big", (*FOUR, *QUIET)),
    ("one algorithm", "big", ("--algorithm", "log", *QUIET)),
    ("one algorithm, in turn", "big", ("--algorithm", "log", "--read-ahead", "0", *QUIET)),
    ("recommended", "big", ("--algorithm", "log")),
)  # fmt: skip


def _plan(log: Path, out: Path, arguments: tuple[str, ...]) -> dict[str, Any]:
    """One `plan` run in a child process: its wall time, peak RSS and the plan itself."""
    command = [
        sys.executable, "-m", "ratelimit.lab", "plan", str(log), "--limit", LIMIT,
        "--identity", "user", "--no-measure", "--no-progress", "--json", str(out), *arguments,
    ]  # fmt: skip
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    errors = child.stderr.read().decode(errors="replace") if child.stderr else ""
    if child.returncode != 0:
        raise RuntimeError(f"plan failed ({child.returncode}): {errors.strip()[-500:]}")
    plan = json.loads(out.read_text())
    return {"seconds": seconds, "peak_rss_bytes": usage.ru_maxrss * 1024, "plan": plan}


def run(lines: int = 50_000_000, identities: int = 100_000) -> dict[str, Any]:
    """Plan a log of `lines` lines and one of `lines // 10`; see the module doc."""
    folder = Path(tempfile.mkdtemp(prefix="bench-logplan-"))
    results: dict[str, Any] = {"limit": LIMIT, "identities": identities, "runs": {}}
    sizes = {"small": max(lines // 10, 1), "big": lines}
    try:
        written: dict[str, float] = {}
        for name, which, arguments in RUNS:
            log, size = folder / f"{which}.log", sizes[which]
            if which not in written:
                for other in folder.glob("*.log"):
                    other.unlink()  # one log on disk at a time
                start = time.perf_counter()
                samplelog.write_large(log, size, identities=identities)
                written[which] = time.perf_counter() - start
            measured = _plan(log, folder / "plan.json", arguments)
            requests = measured["plan"]["log"]["requests"]
            if requests != size:
                raise RuntimeError(f"the plan counted {requests:,} requests in {size:,} lines")
            results["runs"][name] = {
                "lines": size,
                "bytes": log.stat().st_size,
                "arguments": " ".join(arguments),
                "write_seconds": round(written[which], 2),
                "plan_seconds": round(measured["seconds"], 2),
                "lines_per_s": size / measured["seconds"],
                "peak_rss_bytes": measured["peak_rss_bytes"],
                "identities_seen": measured["plan"]["log"]["identities"],
            }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    runs = results["runs"]
    results["rss_ratio_big_to_small"] = (
        runs["big"]["peak_rss_bytes"] / runs["small"]["peak_rss_bytes"]
    )
    results["rss_ratio_recommended"] = (
        runs["recommended"]["peak_rss_bytes"] / runs["recommended, small"]["peak_rss_bytes"]
    )
    results["read_ahead_x"] = (
        runs["one algorithm"]["lines_per_s"] / runs["one algorithm, in turn"]["lines_per_s"]
    )
    return results
