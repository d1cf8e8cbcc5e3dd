"""Many access logs planned as one, on the local engine and on Dask: `python -m
ratelimit.lab plan FILES --engine local`, then `--engine dask` on a local cluster of one
worker and of two, on the same generated log set (`files` Common Log Format files of
`lines` lines in all, as from servers whose lines interleave, each from
`samplelog.write_large` with its own seed over the same API keys).

The three plans run in interleaved rounds (their order rotated from round to round),
each in a process of its own, and each engine also plans a tiny log set (`TINY_LINES`
lines, in as many files) in the same round: its seconds are the engine's fixed cost
(starting Python, the imports, and for Dask starting, warming and closing a cluster),
which a long-lived cluster pays once. Reported per engine: the median seconds and lines
per second, lines per second beyond the fixed cost (the median of same-round
`lines / (seconds - fixed)`), the peak resident memory of its largest process
(`ru_maxrss` of the child and its reaped descendants, from `os.wait4`) and the peak
total of the whole process tree (sampled with psutil, so every Dask worker counts), and
the medians of the same-round ratios of seconds (two workers over one, each over the
local engine). Every plan must count every line and the engines must give the same
plan, or the part fails.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ratelimit.lab import samplelog

LIMIT = "100/min"
ENGINES = {
    "local": ["--engine", "local"],
    "dask, 1 worker": ["--engine", "dask", "--workers", "1"],
    "dask, 2 workers": ["--engine", "dask", "--workers", "2"],
}
_SAMPLE_S = 0.2
TINY_LINES = 2_000


def _tree_rss(pid: int) -> int:
    """The resident memory of a process and all its descendants, in bytes."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def _plan(logs: list[Path], engine: list[str], out: Path) -> dict[str, Any]:
    """One `plan` run in a child process: its wall time, peak memory and the plan."""
    command = [
        sys.executable, "-m", "ratelimit.lab", "plan", *map(str, logs), "--limit", LIMIT,
        "--algorithm", "log", "--identity", "user", "--no-measure", "--no-progress",
        "--json", str(out), *engine,
    ]  # fmt: skip
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_tree = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        while not stop.wait(_SAMPLE_S):
            peak_tree = max(peak_tree, _tree_rss(child.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    errors = child.stderr.read().decode(errors="replace") if child.stderr else ""
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"plan {' '.join(engine)} failed: {errors.strip()[-500:]}")
    return {
        "seconds": seconds,
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "peak_tree_rss_bytes": max(peak_tree, usage.ru_maxrss * 1024),
        "plan": json.loads(out.read_text()),
    }


def _write_logs(folder: Path, lines: int, files: int, identities: int) -> list[Path]:
    folder.mkdir(exist_ok=True)
    logs = []
    for i in range(files):
        size = lines // files + (1 if i < lines % files else 0)
        logs.append(
            samplelog.write_large(
                folder / f"server{i}.log",
                size,
                identities=identities,
                seed=i + 1,
                rate=2_000.0 / files,
            )  # fmt: skip
        )
    return logs


def run(
    lines: int = 8_000_000, files: int = 4, identities: int = 100_000, rounds: int = 3
) -> dict[str, Any]:
    """Plan one generated log set on each engine, `rounds` interleaved rounds; see the
    module doc."""
    folder = Path(tempfile.mkdtemp(prefix="bench-logplan-dask-"))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ENGINES}
    fixed: dict[str, list[float]] = {name: [] for name in ENGINES}
    try:
        logs = _write_logs(folder, lines, files, identities)
        tiny = _write_logs(folder / "tiny", TINY_LINES, files, identities)
        size = sum(log.stat().st_size for log in logs)
        names = list(ENGINES)
        reference: dict[int, Any] = {}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                for these, count in ((tiny, TINY_LINES), (logs, lines)):
                    measured = _plan(these, ENGINES[name], folder / "plan.json")
                    plan = measured.pop("plan")
                    if plan["log"]["requests"] != count:
                        raise RuntimeError(
                            f"{name}: the plan counted {plan['log']['requests']:,} of "
                            f"{count:,} lines"
                        )
                    if reference.setdefault(count, plan) != plan:
                        raise RuntimeError(f"{name}: the plan differs from the other engines'")
                    if these is tiny:
                        fixed[name].append(measured["seconds"])
                    else:
                        runs[name].append(measured)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def ratios(top: str, bottom: str) -> float:
        return statistics.median(
            b["seconds"] / t["seconds"] for t, b in zip(runs[top], runs[bottom], strict=True)
        )

    return {
        "limit": LIMIT,
        "algorithm": "log",
        "lines": lines,
        "files": files,
        "bytes": size,
        "identities": identities,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "engines": {
            name: {
                "seconds": statistics.median(m["seconds"] for m in measured),
                "lines_per_s": lines / statistics.median(m["seconds"] for m in measured),
                "per_round_seconds": [round(m["seconds"], 2) for m in measured],
                "fixed_seconds": statistics.median(fixed[name]),
                "lines_per_s_beyond_fixed": statistics.median(
                    lines / max(m["seconds"] - f, 1e-9)
                    for m, f in zip(measured, fixed[name], strict=True)
                ),
                "peak_rss_bytes": max(m["peak_rss_bytes"] for m in measured),
                "peak_tree_rss_bytes": max(m["peak_tree_rss_bytes"] for m in measured),
            }
            for name, measured in runs.items()
        },
        # Speed-ups: the median of same-round ratios of seconds (above 1: faster).
        "two_workers_over_one": ratios("dask, 2 workers", "dask, 1 worker"),
        "two_workers_over_local": ratios("dask, 2 workers", "local"),
        "one_worker_over_local": ratios("dask, 1 worker", "local"),
        "same_plan": True,
    }


def summary_lines(d: dict[str, Any]) -> list[str]:
    """The part's table for `make bench`'s summary."""
    out = [
        f"many logs planned as one: plan --limit {d['limit']} --algorithm {d['algorithm']} on "
        f"{d['files']} files, {d['lines']:,} lines ({d['bytes'] / 1e9:.2f} GB), "
        f"{d['identities']:,} API keys; median of {d['rounds']} interleaved rounds, "
        f"{d['cpus']} CPUs; the Dask runs start and close a local cluster",
        f"{'engine':16} {'seconds':>8} {'lines/s':>11} {'fixed s':>8} {'beyond fixed':>13} "
        f"{'largest process MiB':>20} {'all processes MiB':>18}",
    ]
    for name, e in d["engines"].items():
        out.append(
            f"{name:16} {e['seconds']:>8.1f} {e['lines_per_s']:>11,.0f} "
            f"{e['fixed_seconds']:>8.1f} {e['lines_per_s_beyond_fixed']:>13,.0f} "
            f"{e['peak_rss_bytes'] / 2**20:>20,.0f} {e['peak_tree_rss_bytes'] / 2**20:>18,.0f}"
        )
    out.append(
        "speed-up (same-round ratios): dask 2 workers / 1 worker "
        f"{d['two_workers_over_one']:.2f}x, "
        f"2 workers / local {d['two_workers_over_local']:.2f}x, "
        f"1 worker / local {d['one_worker_over_local']:.2f}x; the same plan from every engine"
    )
    return out
