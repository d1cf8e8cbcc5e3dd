"""How fast a replay decides a trace: the compiled replay against the Python reference
models, and the model against the same trace on Redis.

The trace: 1,000 identities with equal popularity, Poisson overall (so Poisson per
identity), about 12 requests/s each against 10 per second. A second trace has 100,000
identities with Zipf popularity (a few heavy hitters, a long quiet tail).

Per algorithm and round: the compiled kernel on prepared arrays (identity codes,
whole-ms times, costs, in decision order: `fastreplay.Replayer.decide`) on both
traces, the end-to-end `simulation.replay` (table in, table out, identities factorized,
compiled) and the same replay through the Python model (`compiled=False`); ratios are
taken within a round. The compiled decisions (kernel and replay) are compared with the
model's, once before the rounds, so a fast but wrong kernel cannot pass unnoticed.
Cloudflare's experiment (400 million requests replayed through a sliding log) is priced
at the measured rates.

fakeredis and the real Redis replay the first rows of the trace through the sliding
log (their rates do not depend on length); those decisions are compared with the
model's too.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import numpy as np
import pandas as pd

from ratelimit import algorithms, sync
from ratelimit.backends import connect_sync
from ratelimit.lab import reference, traffic
from ratelimit.lab.fastreplay import Codes, Replayer
from ratelimit.lab.simulation import replay
from ratelimit.lab.timebase import seconds_to_ms

IDENTITIES = 1_000
RATE_PER_IDENTITY = 12.0
ZIPF_IDENTITIES = 100_000
ZIPF_RATE_PER_IDENTITY = 2.0  # on average: the head sends thousands a second, the tail ~0
LIMIT, WINDOW_S = 10, 1
DECISIONS = ["allowed", "remaining", "retry_after_ms"]
CLOUDFLARE_REQUESTS = 400_000_000  # Cloudflare's sliding-window experiment
KERNEL_REPEATS = 3  # per round: the best of three (a kernel call is a few ms)
NAMES = [a.name for a in algorithms.ALGORITHMS]


def trace(requests: int, seed: int = 1) -> pd.DataFrame:
    rate = IDENTITIES * RATE_PER_IDENTITY
    return traffic.zipf_fleet(IDENTITIES, rate, requests / rate, exponent=0.0, seed=seed)


def zipf_trace(requests: int, seed: int = 2) -> pd.DataFrame:
    rate = ZIPF_IDENTITIES * ZIPF_RATE_PER_IDENTITY
    return traffic.zipf_fleet(ZIPF_IDENTITIES, rate, requests / rate, seed=seed)


def prepared(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(decision order, codes, ms, costs): what a kernel takes, as `replay` prepares it."""
    order = np.argsort(frame["time"].to_numpy(), kind="stable")
    codes = Codes().encode(frame["identity"].to_numpy(dtype=object)[order])
    ms = seconds_to_ms(frame["time"].to_numpy()[order])
    return order, codes, ms, frame["cost"].to_numpy()[order].astype(np.int64)


def model(name: str) -> Any:
    return algorithms.get(name).build("reference", WINDOW_S, LIMIT)


def _kernel(name: str, arrays: tuple[np.ndarray, ...]) -> float:
    """Decisions per second of a fresh replayer on `arrays` (best of a few)."""
    best = 0.0
    for _ in range(KERNEL_REPEATS):
        replayer = Replayer(name, LIMIT, WINDOW_S * 1000)
        start = time.perf_counter()
        replayer.decide(*arrays)
        best = max(best, len(arrays[0]) / (time.perf_counter() - start))
    return best


def _timed(frame: pd.DataFrame, limiter, **options) -> tuple[float, pd.DataFrame]:
    gc.collect()  # the garbage of the replay before is not this one's to collect
    start = time.perf_counter()
    out = replay(frame, limiter, progress=False, **options)
    return len(frame) / (time.perf_counter() - start), out


def _same_kernel(decided: tuple, by_model: pd.DataFrame, order: np.ndarray) -> bool:
    return all(
        np.array_equal(values, by_model[column].to_numpy()[order])
        for values, column in zip(decided, DECISIONS, strict=True)
    )


def _same_as_models(full: pd.DataFrame, arrays: tuple, order: np.ndarray) -> dict[str, bool]:
    """Per algorithm: do the kernel and the compiled replay decide as the Python model?
    Checked once, before the timed rounds, which then keep no decisions around."""
    same = {}
    for name in NAMES:
        decided = Replayer(name, LIMIT, WINDOW_S * 1000).decide(*arrays)
        fast = replay(full, model(name), progress=False)
        slow = replay(full, model(name), progress=False, compiled=False)
        same[name] = bool(
            fast[DECISIONS].equals(slow[DECISIONS]) and _same_kernel(decided, slow, order)
        )
    return same


def _compiled_round(full: pd.DataFrame, arrays: tuple, zipf_arrays: tuple) -> dict[str, float]:
    speeds: dict[str, float] = {}
    for name in NAMES:
        speeds[f"{name} kernel"] = _kernel(name, arrays)
        speeds[f"{name} kernel zipf"] = _kernel(name, zipf_arrays)
        speeds[f"{name} replay"] = _timed(full, model(name))[0]
    # The Python models after every compiled run: the millions of objects they make and
    # drop leave the allocator in a state that would slow the compiled runs after them.
    for name in NAMES:
        speeds[f"{name} model"] = _timed(full, model(name), compiled=False)[0]
    return speeds


def _compiled_results(per_round: list[dict[str, float]], same: dict[str, bool]) -> dict:
    def median(case: str) -> float:
        return statistics.median(r[case] for r in per_round)

    def ratio(case: str, base: str) -> float:
        return statistics.median(r[case] / r[base] for r in per_round)

    out = {}
    for name in NAMES:
        out[name] = {
            "kernel_per_s": median(f"{name} kernel"),
            "kernel_zipf_per_s": median(f"{name} kernel zipf"),
            # The slower trace's rate, per round: what the 10-million target judges.
            "kernel_slower_per_s": [
                min(r[f"{name} kernel"], r[f"{name} kernel zipf"]) for r in per_round
            ],
            "replay_per_s": median(f"{name} replay"),
            "model_per_s": median(f"{name} model"),
            "kernel_x_model": ratio(f"{name} kernel", f"{name} model"),
            "replay_x_model": ratio(f"{name} replay", f"{name} model"),
            "same_decisions": same[name],
        }
    return out


def run(rounds: int, requests: int, redis_rows: int, url: str | None) -> dict:
    full = trace(requests)
    zipf = zipf_trace(requests)
    order, *arrays = prepared(full)
    _, *zipf_arrays = prepared(zipf)
    head = full.iloc[:redis_rows].reset_index(drop=True)
    backends = {"fakeredis": connect_sync(None, embedded=True)}
    if url is not None:
        backends["real Redis"] = connect_sync(url)
    same: dict[str, bool] = {}
    same_compiled = _same_as_models(full, tuple(arrays), order)
    per_round: list[dict[str, float]] = []
    compiled_rounds: list[dict[str, float]] = []
    for _ in range(rounds):
        compiled_rounds.append(_compiled_round(full, tuple(arrays), tuple(zipf_arrays)))
        # The Python sliding-log model, as measured just above, against Redis.
        speeds = {"reference model": compiled_rounds[-1]["log model"]}
        expected = replay(head, reference.SlidingWindowLimiter(WINDOW_S, LIMIT), compiled=False)
        for name, client in backends.items():
            limiter = sync.SlidingWindowLimiter(client, WINDOW_S, LIMIT, prefix="bench:replay")
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
    compiled = _compiled_results(compiled_rounds, same_compiled)
    log = compiled["log"]
    return {
        "trace": f"{len(full):,} requests, {IDENTITIES:,} identities, Poisson, "
        f"sliding log {LIMIT}/s; Redis backends replay the first {len(head):,}",
        "rounds": rounds,
        "same_decisions_as_model": same,
        "results": results,
        "compiled": {
            "trace": f"{len(full):,} requests, {IDENTITIES:,} identities at "
            f"{RATE_PER_IDENTITY:g}/s each, limit {LIMIT}/s",
            "zipf_trace": f"{len(zipf):,} requests, {ZIPF_IDENTITIES:,} identities, Zipf "
            f"(exponent 1.1), {zipf['identity'].nunique():,} of them active, limit {LIMIT}/s",
            "algorithms": compiled,
            "cloudflare": {
                "requests": CLOUDFLARE_REQUESTS,
                "kernel_s": CLOUDFLARE_REQUESTS / log["kernel_per_s"],
                "replay_s": CLOUDFLARE_REQUESTS / log["replay_per_s"],
                "model_s": CLOUDFLARE_REQUESTS / log["model_per_s"],
            },
            "per_round": compiled_rounds,
        },
    }
