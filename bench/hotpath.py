"""Where the time of one async sliding-log check goes on the client (cProfile).

Profiles `n` sequential checks on 10,000 keys and keeps the functions with the most
own time, so a change to the Python hot path can be judged by what it removed.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import time
from typing import Any

from ratelimit import SlidingWindowLimiter

from .checks import LIMIT, Identities
from .cleanup import delete_prefix


async def run(client: Any, n: int, top: int = 15) -> dict[str, Any]:
    prefix = f"bench:{os.getpid()}:profile"
    limiter = SlidingWindowLimiter(client, 1, LIMIT, prefix=prefix)
    identity = Identities()
    for _ in range(50):
        await limiter.check(identity())
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(n):
        await limiter.check(identity())
    profiler.disable()
    elapsed = time.perf_counter() - start
    await delete_prefix(client, prefix)
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{os.path.basename(file)}:{line}({func})",
                "calls_per_check": ncalls / n,
                "own_us_per_check": 1e6 * tottime / n,
                "cum_us_per_check": 1e6 * cumtime / n,
            }
        )
    rows.sort(key=lambda r: -r["own_us_per_check"])
    return {
        "checks": n,
        "us_per_check_profiled": 1e6 * elapsed / n,
        "profiled_us_per_check": 1e6 * total / n,
        "top_by_own_time": rows[:top],
    }
