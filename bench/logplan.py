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
- `before, small` and `before`: one algorithm on both logs with the planner as it was
  before its reading was made fast (`BASELINE`, extracted from this repository's
  history with `git archive` into the scratch folder), the yardstick of the speed-up
  target, measured in the same run. The small log's plan also compiles its kernels, so
  the big log's is timed warm. Without git or that commit, the two are skipped with
  the reason (`baseline_skipped`).
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


BASELINE = "52aa3ea91bcef1e1445f231893a8572761a5aa3d"
"""The commit whose planner the speed-up is measured against (it had no recommendation
nor spread replay, so it kept nothing per request, as `QUIET` plans do)."""
QUIET = ("--affect", "none", "--no-spread")  # nothing kept per request
FOUR = tuple(a for name in ("log", "fw", "swc", "gcra") for a in ("--algorithm", name))
RUNS = (  # name, log, arguments beyond the limit
    ("small", "small", (*FOUR, *QUIET)),
    ("recommended, small", "small", ("--algorithm", "log")),
    ("before, small", "small", ("--algorithm", "log")),
    ("big", "big", (*FOUR, *QUIET)),
    ("one algorithm", "big", ("--algorithm", "log", *QUIET)),
    ("one algorithm, in turn", "big", ("--algorithm", "log", "--read-ahead", "0", *QUIET)),
    ("recommended", "big", ("--algorithm", "log")),
    ("before", "big", ("--algorithm", "log")),
)  # fmt: skip
_BEFORE = ("before, small", "before")  # the runs of the baseline's code


def _baseline(folder: Path) -> tuple[Path | None, str | None]:
    """`BASELINE`'s tree extracted under `folder`: (its path, None), or (None, why not)."""
    repository = Path(__file__).resolve().parents[1]
    tree = folder / "baseline"
    tree.mkdir()
    try:
        archive = subprocess.run(
            ["git", "-C", str(repository), "archive", BASELINE, "ratelimit"],
            capture_output=True, check=True, timeout=120,
        )  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        errors = getattr(exc, "stderr", b"") or b""
        why = errors.decode(errors="replace").strip() or str(exc)
        return None, f"the baseline {BASELINE[:12]} could not be extracted: {why[:300]}"
    return tree, None


def _plan(
    log: Path, out: Path, arguments: tuple[str, ...], code: Path | None = None
) -> dict[str, Any]:
    """One `plan` run in a child process: its wall time, peak RSS and the plan itself;
    with `code`, the `ratelimit` package under that folder plans instead of this one."""
    command = [
        sys.executable, "-m", "ratelimit.lab", "plan", str(log), "--limit", LIMIT,
        "--identity", "user", "--no-measure", "--no-progress", "--json", str(out), *arguments,
    ]  # fmt: skip
    start = time.perf_counter()
    env = None
    if code is not None:  # first on the path, before the installed package
        env = {**os.environ, "PYTHONPATH": str(code)}
    child = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=code, env=env
    )
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
        baseline, why = _baseline(folder)
        if why is not None:
            results["baseline_skipped"] = why
        written: dict[str, float] = {}
        for name, which, arguments in RUNS:
            if name in _BEFORE and baseline is None:
                continue
            log, size = folder / f"{which}.log", sizes[which]
            if which not in written:
                for other in folder.glob("*.log"):
                    other.unlink()  # one log on disk at a time
                start = time.perf_counter()
                samplelog.write_large(log, size, identities=identities)
                written[which] = time.perf_counter() - start
            code = baseline if name in _BEFORE else None
            measured = _plan(log, folder / "plan.json", arguments, code)
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
                "rejected": [c["rejected"] for c in measured["plan"]["candidates"]],
            }
            if name in _BEFORE:
                results["runs"][name]["commit"] = BASELINE
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    runs = results["runs"]
    results["rss_ratio_big_to_small"] = (
        runs["big"]["peak_rss_bytes"] / runs["small"]["peak_rss_bytes"]
    )
    results["rss_ratio_recommended"] = (
        runs["recommended"]["peak_rss_bytes"] / runs["recommended, small"]["peak_rss_bytes"]
    )
    if "before" in runs:
        results["speedup_x"] = runs["one algorithm"]["lines_per_s"] / runs["before"]["lines_per_s"]
    results["read_ahead_x"] = (
        runs["one algorithm"]["lines_per_s"] / runs["one algorithm, in turn"]["lines_per_s"]
    )
    return results
