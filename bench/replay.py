"""How fast the reference model decides a trace, against the same trace on Redis.

The trace: 1,000 identities with equal popularity, Poisson overall (so Poisson per
identity), about 12 requests/s each against a sliding log of 10 per second. The
model replays all of it; fakeredis and the real Redis replay its first rows (their
rates do not depend on length). Rounds are interleaved, and ratios are taken within a
round. The prefix the Redis backends decide is also decided by the model, and the
decisions are compared, so a fast but wrong model cannot pass unnoticed.
"""

from __future__ import annotations

import statistics
import time

import pandas as pd

from ratelimit import sync
from ratelimit.backends import connect_sync
from ratelimit.lab import reference, traffic
from ratelimit.lab.simulation import replay

IDENTITIES = 1_000
RATE_PER_IDENTITY = 12.0
DECISIONS = ["allowed", "remaining", "retry_after_ms"]


def trace(requests: int, seed: int = 1) -> pd.DataFrame:
    rate = IDENTITIES * RATE_PER_IDENTITY
    return traffic.zipf_fleet(IDENTITIES, rate, requests / rate, exponent=0.0, seed=seed)


def _timed(frame: pd.DataFrame, limiter) -> tuple[float, pd.DataFrame]:
    start = time.perf_counter()
    out = replay(frame, limiter, progress=False)
    return len(frame) / (time.perf_counter() - start), out


def run(rounds: int, requests: int, redis_rows: int, url: str | None) -> dict:
    full = trace(requests)
    head = full.iloc[:redis_rows].reset_index(drop=True)
    backends = {"fakeredis": connect_sync(None, embedded=True)}
    if url is not None:
        backends["real Redis"] = connect_sync(url)
    same = {}
    per_round: list[dict[str, float]] = []
    for _ in range(rounds):
        speeds = {"reference model": _timed(full, reference.SlidingWindowLimiter(1, 10))[0]}
        expected = replay(head, reference.SlidingWindowLimiter(1, 10))
        for name, client in backends.items():
            limiter = sync.SlidingWindowLimiter(client, 1, 10, prefix="bench:replay")
            speeds[name], out = _timed(head, limiter)
            same[name] = bool(out[DECISIONS].equals(expected[DECISIONS]))
        per_round.append(speeds)
    for client in backends.values():
        client.close()
    results = {}
    for name in per_round[0]:
        results[name] = {
            "decisions_per_s": statistics.median(r[name] for r in per_round),
            "model_x": statistics.median(r["reference model"] / r[name] for r in per_round),
        }
    return {
        "trace": f"{len(full):,} requests, {IDENTITIES:,} identities, Poisson, "
        f"sliding log 10/s; Redis backends replay the first {len(head):,}",
        "rounds": rounds,
        "same_decisions_as_model": same,
        "results": results,
    }
