"""Chapter 4's race, fast enough for sliders: admitted requests per round, non-atomic
log against the Lua script, for `concurrency` requests at once against `limit`.

`figure()` does not talk to Redis. The non-atomic side runs the real teaching code
(`ratelimit.lab.classic.ClassicSlidingLog`) on a small in-memory stand-in for the
embedded backend: the same sorted-set commands, each one costing one turn of the
event loop, as a round trip to fakeredis does. The Lua side is the reference model
(`ratelimit.lab.reference.SlidingWindowLimiter` through `ratelimit.lab.replay`), which the
property tests hold to the script's decisions; a script runs whole, so the requests
of a round are decided one after another. `embedded_counts()` runs the same race on
the embedded fakeredis itself (slower, about 2 s at the chapter's parameters), and
the notebook and tests check that both give the same counts.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

import ratelimit
from ratelimit.lab import reference
from ratelimit.lab.classic import ClassicSlidingLog
from ratelimit.lab.simulation import replay

__all__ = ["NON_ATOMIC", "LUA", "embedded_counts", "figure", "race_counts"]

NON_ATOMIC = "non-atomic"
LUA = "Lua script"


class _LoopStore:
    """Just the sorted-set commands the teaching code sends, kept in dicts. Each
    command first yields to the event loop once, like a round trip to the embedded
    fakeredis, so concurrent checks interleave the way they do there."""

    def __init__(self) -> None:
        self.sets: dict[str, dict[str, float]] = {}

    async def zremrangebyscore(self, key: str, low: Any, high: float) -> int:
        await asyncio.sleep(0)
        members = self.sets.get(key, {})
        gone = [m for m, score in members.items() if score <= high]
        for m in gone:
            del members[m]
        return len(gone)

    async def zcard(self, key: str) -> int:
        await asyncio.sleep(0)
        return len(self.sets.get(key, {}))

    async def zadd(self, key: str, mapping: dict[str, float]) -> int:
        await asyncio.sleep(0)
        members = self.sets.setdefault(key, {})
        new = sum(m not in members for m in mapping)
        members.update(mapping)
        return new

    async def pexpire(self, key: str, ms: int) -> bool:
        await asyncio.sleep(0)  # the replay is shorter than any window: nothing expires
        return key in self.sets

    async def delete(self, *keys: str) -> int:
        return sum(self.sets.pop(k, None) is not None for k in keys)


async def _race(limiter: Any, client: Any, concurrency: int, rounds: int) -> list[int]:
    """Admitted per round: `concurrency` checks in flight at once, a fresh client each."""
    counts = []
    for r in range(rounds):
        who = f"round-{r}"
        outcomes = await asyncio.gather(*(limiter.check(who) for _ in range(concurrency)))
        counts.append(sum(o if isinstance(o, bool) else o.allowed for o in outcomes))
        await client.delete(limiter.key_for(who))
    return counts


def _lua_model_counts(concurrency: int, limit: int, rounds: int, window_s: float) -> list[int]:
    """The Lua limiter's admitted per round, from the reference model: every request of
    a round at the same instant, one fresh identity per round."""
    traffic = pd.DataFrame(
        {
            "time": 0.0,
            "identity": np.repeat([f"round-{r}" for r in range(rounds)], concurrency),
            "cost": 1,
            "replica": 0,
        }
    )
    model = reference.SlidingWindowLimiter(window_s, limit)
    decided = replay(traffic, model, progress=False)
    per_round = decided.groupby("identity", sort=False).allowed.sum()
    return [int(n) for n in per_round]


def race_counts(
    *, concurrency: int = 50, limit: int = 10, rounds: int = 100, window_s: float = 1
) -> dict[str, list[int]]:
    """Requests admitted in each round, per limiter (`NON_ATOMIC`, `LUA`), in memory."""
    store = _LoopStore()
    naive = ClassicSlidingLog(store, window_s, limit, prefix="explore:race")
    lua = _lua_model_counts(concurrency, limit, rounds, window_s)
    # A notebook's kernel (and a slider's callback) already runs an event loop in this
    # thread, where asyncio.run is refused: run the race's own loop in a helper thread.
    with ThreadPoolExecutor(1) as helper:
        naive_counts = helper.submit(asyncio.run, _race(naive, store, concurrency, rounds))
        return {NON_ATOMIC: naive_counts.result(), LUA: lua}


async def embedded_counts(
    *, concurrency: int = 50, limit: int = 10, rounds: int = 100, window_s: float = 1
) -> dict[str, list[int]]:
    """`race_counts` on the embedded fakeredis, with the teaching code and the real
    `ratelimit.SlidingWindowLimiter` (asyncio, one process); `REDIS_URL` is ignored."""
    client = ratelimit.connect(embedded=True)
    prefix = "explore:race"
    limiters = {
        NON_ATOMIC: ClassicSlidingLog(client, window_s, limit, prefix=prefix),
        LUA: ratelimit.SlidingWindowLimiter(client, window_s, limit, prefix=prefix),
    }
    try:
        return {
            name: await _race(limiter, client, concurrency, rounds)
            for name, limiter in limiters.items()
        }
    finally:
        await client.aclose()


def figure(
    *, concurrency: int = 50, limit: int = 10, rounds: int = 100, window_s: float = 1
) -> Figure:
    """Histogram of the requests admitted per round, non-atomic log against the Lua
    script, for `concurrency` requests sent at once against `limit` per `window_s`
    seconds, `rounds` times, as on the embedded backend from one asyncio process."""
    counts = race_counts(
        concurrency=concurrency, limit=limit, rounds=rounds, window_s=window_s
    )
    fig, ax = plt.subplots(figsize=(8, 4))
    bins = np.arange(0, concurrency + 2) - 0.5  # one bin per whole count, 0 .. concurrency
    for name, color in ((NON_ATOMIC, "tab:orange"), (LUA, "tab:blue")):
        ax.hist(counts[name], bins=bins, color=color, alpha=0.8, label=name)
    ax.axvline(limit, color="black", linestyle=":", linewidth=1, label=f"limit ({limit})")
    ax.set_xlim(-0.5, concurrency + 0.5)
    ax.set_ylim(0, rounds * 1.1)
    ax.set_xlabel(f"requests admitted in one round (of {concurrency} sent at once)")
    ax.set_ylabel(f"rounds (of {rounds})")
    ax.set_title(
        f"{concurrency} concurrent requests at a limit of {limit} per {window_s:g} s, "
        f"{rounds} rounds, embedded backend (asyncio)",
        fontsize=10,
    )
    ax.legend(loc="upper center", fontsize=8)
    fig.tight_layout()
    return fig
