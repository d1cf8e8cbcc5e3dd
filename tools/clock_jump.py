"""One check from a host a day ahead, then checks from a host with a correct clock.

    python tools/clock_jump.py [--url redis://127.0.0.1:6379/0] [--tolerance-ms 1000]

Prints, per algorithm, what the correct host is told right after the day-ahead check
(retry_after_ms, reset_after_ms), the key's PTTL, and how long (real time) until the
correct host is admitted again. With `--tolerance-ms -1` no tolerance is passed to the
correct host's limiter and it is built on an injected clock, which trusts every stored
time: the behaviour before the tolerance existed (at most `--wait-s` is waited).
Uses a fresh prefix and deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import time
import uuid

import redis

from ratelimit import algorithms

DAY_S = 86_400


def measure(client: redis.Redis, name: str, tolerance_ms: int, wait_s: float) -> dict:
    prefix = f"clockjump:{uuid.uuid4().hex[:8]}"
    entry = algorithms.get(name)
    ahead = entry.build(
        "sync", client, 1, 5, prefix, clock=lambda: time.time() + DAY_S, ttl_slack_ms=0
    )
    if tolerance_ms < 0:
        correct = entry.build(
            "sync", client, 1, 5, prefix, clock=lambda: time.time(), ttl_slack_ms=0
        )
    else:
        correct = entry.build("sync", client, 1, 5, prefix, clock_tolerance_ms=tolerance_ms)
    try:
        for _ in range(5):
            ahead.check("client")
        first = correct.check("client")
        pttl = client.pttl(correct.key_for("client"))
        start, admitted_after = time.monotonic(), None
        decision = first
        while not decision.allowed and time.monotonic() - start < wait_s:
            time.sleep(min(decision.retry_after_ms / 1000, wait_s) or 0.001)
            decision = correct.check("client")
        if decision.allowed:
            admitted_after = round((time.monotonic() - start) * 1000)
        return {
            "algorithm": name,
            "allowed": first.allowed,
            "retry_after_ms": first.retry_after_ms,
            "reset_after_ms": first.reset_after_ms,
            "pttl_ms": pttl,
            "admitted_after_ms": admitted_after,
        }
    finally:
        client.delete(correct.key_for("client"), ahead.key_for("client"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--tolerance-ms", type=int, default=1000)
    parser.add_argument("--wait-s", type=float, default=5.0)
    args = parser.parse_args()
    client = redis.Redis.from_url(args.url)
    print(f"limit 5 per 1 s; 5 checks from a host {DAY_S} s ahead, then a correct host")
    print(f"{'algorithm':10} {'allowed':>7} {'retry_ms':>10} {'reset_ms':>10} "
          f"{'PTTL_ms':>10} {'admitted_after_ms':>18}")  # fmt: skip
    for name in ["logc", *(entry.name for entry in algorithms.ALGORITHMS)]:
        row = measure(client, name, args.tolerance_ms, args.wait_s)
        after = row["admitted_after_ms"]
        print(
            f"{row['algorithm']:10} {row['allowed']!s:>7} {row['retry_after_ms']:>10} "
            f"{row['reset_after_ms']:>10} {row['pttl_ms']:>10} "
            f"{'not within --wait-s' if after is None else after:>18}"
        )
    client.close()


if __name__ == "__main__":
    main()
