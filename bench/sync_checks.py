"""The sync limiters (`ratelimit.sync`) on a blocking client, in their own interleaved
rounds with their own floors (sync PING and EVALSHA `return 1` on the same client)."""

from __future__ import annotations

import os
from typing import Any

from ratelimit import sync

from . import rounds
from .checks import FLOORS, LIMIT, Identities, hot, spread
from .cleanup import delete_prefix_sync

OURS = (
    sync.SlidingWindowLimiter,
    sync.FixedWindowLimiter,
    sync.SlidingWindowCounterLimiter,
    sync.TokenBucketLimiter,
)


def make_cases(client: Any, prefix: str) -> dict[str, rounds.SyncCase]:
    noop = client.register_script("return 1")
    cases = {
        "PING": rounds.sequential_sync(lambda i: client.ping()),
        "EVALSHA return 1": rounds.sequential_sync(lambda i: noop()),
    }
    for cls in OURS:
        limiter = cls(client, 1, LIMIT, prefix=f"{prefix}:{cls.__name__}")
        name = f"sync {cls.__name__}"
        cases[hot(name)] = rounds.sequential_sync(lambda i, lim=limiter: lim.check("hot"))
        ids = Identities()
        cases[spread(name)] = rounds.sequential_sync(
            lambda i, lim=limiter, ids=ids: lim.check(ids())
        )
    return cases


def run(client: Any, n_rounds: int, n: int, warmup: int = 50) -> dict[str, Any]:
    prefix = f"bench:{os.getpid()}:sync"
    try:
        per_round = rounds.run_sync(make_cases(client, prefix), n_rounds, n, warmup)
    finally:
        delete_prefix_sync(client, prefix)
    return {
        "rounds": n_rounds,
        "checks_per_case_per_round": n,
        "baselines": list(FLOORS),
        "per_round": per_round,
        "results": rounds.summarize(per_round, FLOORS),
    }
