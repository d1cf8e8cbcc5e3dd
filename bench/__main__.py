"""`make bench`: every figure a ratio against a baseline measured in the same round.

Parts (see each module): checks (floors, our limiters, peers, check_many), sync,
concurrency, cluster, server cost, memory per key, near-cache, replay, a big access
log planned end to end (logplan), many logs planned as one on the local engine and on
Dask at one and two workers (dask), the limiter's added latency per HTTP request on the
multi-worker demo app (http_latency), what the HTTP layer adds per request in process
against a bare check and the HTTP peers (asgi: http_inprocess) and a soak with API keys
churning (soak). Uses REDIS_URL, else 127.0.0.1:6379 when it answers, else the embedded
fakeredis (and says so). Writes build/bench/results.json, PNG figures and summary.txt (what it
prints: the tables and every target's verdict) beside it.

`--record` measures nothing: it copies what the benchmark tables need from the latest
results (`--out`) into bench/record.json and re-renders the book's Benchmarks page
(book/benchmarks.md) from it (`bench/readme.py`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from . import plot, progress, readme, suite, summary

PARTS = (
    "checks", "sync", "concurrency", "cluster", "cost", "memory", "nearcache", "replay", "logplan",
    "dask", "http", "asgi", "soak",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    d = suite.Options()
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: tiny sizes and 2 rounds, verdicts that judge nothing",
    )
    parser.add_argument("--rounds", type=int, help=f"interleaved rounds (default {d.rounds})")
    parser.add_argument("-n", type=int, help=f"checks per case per round (default {d.n})")
    parser.add_argument("--only", nargs="+", choices=PARTS, help="run only these parts")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="cProfile N sliding-log checks"
    )
    parser.add_argument(
        "--shared-server", action="store_true", help="no private redis-server for cost/memory"
    )
    parser.add_argument("--out", type=Path, default=Path("build/bench/results.json"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--record",
        action="store_true",
        help="run nothing: copy --out into bench/record.json and re-render book/benchmarks.md",
    )
    args = parser.parse_args(argv)
    if args.record:
        readme.record(args.out)
        print(f"recorded {args.out} in {readme.RECORD}; rewrote the tables in {readme.PAGE}")
        return 0

    options = suite.Options.quick() if args.quick else suite.Options()
    if args.quick:
        progress.say(f"[bench] {summary.SMOKE}")
    if args.rounds:
        options.rounds = args.rounds
    if args.n:
        options.n = args.n
    if args.only:
        options.parts = set(args.only)
    options.profile_n = args.profile
    options.private_server = not args.shared_server

    start = time.perf_counter()
    report = suite.run(options)
    report["quick"] = args.quick
    report["duration_s"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    figures = [] if args.no_plot else plot.write(report, args.out.parent)
    text_file = args.out.parent / "summary.txt"
    printed = summary.lines(report) + [
        "",
        f"written to {args.out}, {text_file}" + "".join(f", {p}" for p in figures),
        f"took {report['duration_s']} s",
    ]
    text_file.write_text("\n".join(printed) + "\n")
    print("\n".join(printed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
