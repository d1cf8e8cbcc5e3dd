"""`make bench`: throughput figures, each as a ratio measured side by side in one run.

1. checks: one limiter check against PING and a bare EVALSHA on the same client;
2. replay: the reference model's decisions per second against fakeredis and Redis.

Uses REDIS_URL, else 127.0.0.1:6379 when it answers, else only the embedded
fakeredis (and says so). Writes build/bench/results.json and prints a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path

import redis

from . import checks, replay

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def pick_url() -> str | None:
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    try:
        redis.Redis.from_url(DEFAULT_URL, socket_connect_timeout=0.5).ping()
        return DEFAULT_URL
    except redis.exceptions.RedisError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description="rate-limit lab benchmarks")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", type=int, default=2000, help="check calls per case per round")
    parser.add_argument("--requests", type=int, default=1_000_000, help="replay trace length")
    parser.add_argument("--redis-rows", type=int, default=20_000, help="rows replayed on Redis")
    parser.add_argument("--out", type=Path, default=Path("build/bench/results.json"))
    args = parser.parse_args()
    url = pick_url()
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "backend": "real Redis" if url else "embedded fakeredis (no Redis answered)",
        "checks": asyncio.run(checks.run(args.rounds, args.n, url)),
        "replay": replay.run(max(3, args.rounds // 2), args.requests, args.redis_rows, url),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")

    print(f"{report['backend']}; {report['machine']}; {report['date']}")
    c = report["checks"]
    print(
        f"\nchecks: median of {c['rounds']} interleaved rounds, {c['calls_per_case_per_round']}"
        " sequential async calls per case"
    )
    print(f"{'case (a batch counts its 100 checks)':40} {'per s':>10} {'x PING':>8}")
    for name, r in c["results"].items():
        print(f"{name:40} {r['ops_per_s']:>10,.0f} {r['x_ping']:>8.2f}")
    r = report["replay"]
    print(f"\nreplay: {r['trace']}; median of {r['rounds']} rounds")
    print(f"{'backend':40} {'decisions/s':>12} {'model x':>8}")
    for name, v in r["results"].items():
        print(f"{name:40} {v['decisions_per_s']:>12,.0f} {v['model_x']:>8.1f}")
    print(f"same decisions as the model: {r['same_decisions_as_model']}")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
