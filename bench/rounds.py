"""Interleaved rounds: every case once per round (A B C ... C A B ...), medians over rounds.

A case is a function that does about `n` checks and returns checks per second, so a
sequential loop, a pipelined batch and N concurrent tasks all fit the same scheme.
Because a busy machine drifts, each ratio is taken between two cases of the same
round, and the reported ratio is the median of those per-round ratios. Many short
rounds pair a case with its baseline more tightly than a few long ones (a burst of
load from another process then spoils a few rounds, not every one), and the order is
shuffled in each round.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from . import progress

Op = Callable[[int], Awaitable[Any]]  # one async call; its argument is the call's index
SyncOp = Callable[[int], Any]
AsyncCase = Callable[[int], Awaitable[float]]  # n -> checks per second
SyncCase = Callable[[int], float]
Rounds = list[dict[str, float]]  # one {case: checks/s} per round


def sequential(op: Op, checks_per_call: int = 1) -> AsyncCase:
    """`n` checks as one awaited call after another (`checks_per_call` per call)."""

    async def case(n: int) -> float:
        calls = max(1, n // checks_per_call)
        start = time.perf_counter()
        for i in range(calls):
            await op(i)
        return calls * checks_per_call / (time.perf_counter() - start)

    return case


def concurrent(op: Op, tasks: int) -> AsyncCase:
    """`n` checks spread over `tasks` asyncio tasks sharing whatever `op` uses."""

    async def worker(first: int, calls: int) -> None:
        for i in range(first, first + calls):
            await op(i)

    async def case(n: int) -> float:
        per_task = max(1, n // tasks)
        start = time.perf_counter()
        await asyncio.gather(*(worker(t * per_task, per_task) for t in range(tasks)))
        return per_task * tasks / (time.perf_counter() - start)

    return case


def sequential_sync(op: SyncOp) -> SyncCase:
    """`n` blocking calls one after another."""

    def case(n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            op(i)
        return n / (time.perf_counter() - start)

    return case


def _orders(names: list[str], rounds: int, seed: int) -> list[list[str]]:
    """A fresh random order per round, so no case always follows the same neighbour."""
    rng = random.Random(seed)
    return [rng.sample(names, len(names)) for _ in range(rounds)]


async def run_async(
    cases: Mapping[str, AsyncCase], rounds: int, n: int, warmup: int, seed: int = 0
) -> Rounds:
    """Warm every case up (scripts loaded, connections open), then `rounds` rounds."""
    for case in cases.values():
        await case(warmup)
    per_round = []
    for order in _orders(list(cases), rounds, seed):
        speeds = {name: await cases[name](n) for name in order}
        per_round.append({name: speeds[name] for name in cases})
        progress.round_done(len(per_round), rounds)
    return per_round


def run_sync(
    cases: Mapping[str, SyncCase], rounds: int, n: int, warmup: int, seed: int = 0
) -> Rounds:
    for case in cases.values():
        case(warmup)
    per_round = []
    for order in _orders(list(cases), rounds, seed):
        speeds = {name: cases[name](n) for name in order}
        per_round.append({name: speeds[name] for name in cases})
        progress.round_done(len(per_round), rounds)
    return per_round


def ratio(per_round: Rounds, case: str, baseline: str) -> float:
    """Median over rounds of case / baseline, both measured in the same round."""
    return statistics.median(r[case] / r[baseline] for r in per_round)


def summarize(
    per_round: Rounds, baselines: Sequence[str] | Mapping[str, Sequence[str]]
) -> dict[str, dict[str, Any]]:
    """Per case: median checks/s, every round, and the median same-round ratio against
    each of its baselines (one list for all cases, or a list per case)."""
    out: dict[str, dict[str, Any]] = {}
    for name in per_round[0]:
        bases = baselines[name] if isinstance(baselines, Mapping) else baselines
        out[name] = {
            "checks_per_s": statistics.median(r[name] for r in per_round),
            "rounds": [r[name] for r in per_round],
            "ratios": {b: ratio(per_round, name, b) for b in bases},
            "round_ratios": {b: [r[name] / r[b] for r in per_round] for b in bases},
        }
    return out
