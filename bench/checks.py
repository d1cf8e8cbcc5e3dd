"""One async check, as ratios against floors and peers measured in the same rounds.

Every case shares one asyncio client (peers: the same URL and settings) and runs in
interleaved rounds (`rounds.py`). Cases:

- floors: PING and EVALSHA of `return 1`;
- our four limiters on one hot key and on 10,000 keys (a large limit keeps every
  check on the admit path, the one that writes);
- the peers (`peers.py`) on the same two key patterns;
- what building a limiter per request costs: the classic recipe with one reused
  object, and our sliding log built anew for every request;
- `check_many` of 100 (one pipelined round trip), counted as 100 checks;
- where a sliding-log check's time goes beyond the floor: EVALSHA `return 1` sent
  with a check's KEYS and ARGV (client-side packing), and the sliding-log script
  called bare with those arguments (plus its server-side work), before our limiter
  code wraps it.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from ratelimit import (
    FixedWindowLimiter,
    SlidingWindowCounterLimiter,
    SlidingWindowLimiter,
    TokenBucketLimiter,
)
from ratelimit.lab.classic import ClassicSlidingLog
from ratelimit.scripts import source

from . import peers as peer_mod
from . import rounds
from .cleanup import delete_prefix

LIMIT = 1_000_000  # per second: every check in a run is admitted
KEYS = 10_000
BATCH = 100
FLOORS = ("PING", "EVALSHA return 1")
OURS = (SlidingWindowLimiter, FixedWindowLimiter, SlidingWindowCounterLimiter, TokenBucketLimiter)
BATCH_CASE = f"SlidingWindowLimiter check_many({BATCH}), 10k keys"
PER_REQUEST_CASE = "SlidingWindowLimiter, new object per request, 10k keys"
CLASSIC_REUSED_CASE = "classic recipe, one object reused, 10k keys"
ARGS_FLOOR_CASE = "EVALSHA return 1 with a check's KEYS/ARGV, 10k keys"
BARE_SCRIPT_CASE = "sliding-log script called bare, 10k keys"


def hot(name: str) -> str:
    return f"{name} hot key"


def spread(name: str) -> str:
    return f"{name} 10k keys"


class Identities:
    """client-0 .. client-9999 in turn, carrying on across rounds, so that a case
    really cycles through all 10,000 keys rather than the first n of them."""

    def __init__(self) -> None:
        self._next = itertools.count()

    def __call__(self) -> str:
        return f"client-{next(self._next) % KEYS}"


def _pair(check: peer_mod.Checker) -> tuple[rounds.AsyncCase, rounds.AsyncCase]:
    async def on_hot(i: int) -> Any:
        return await check("hot")

    identity = Identities()

    async def on_spread(i: int) -> Any:
        return await check(identity())

    return rounds.sequential(on_hot), rounds.sequential(on_spread)


def make_cases(
    client: Any, prefix: str, peers: dict[str, peer_mod.Peer]
) -> dict[str, rounds.AsyncCase]:
    noop = client.register_script("return 1")

    async def ping(i: int) -> Any:
        return await client.ping()

    async def evalsha(i: int) -> Any:
        return await noop()

    cases = {"PING": rounds.sequential(ping), "EVALSHA return 1": rounds.sequential(evalsha)}
    for cls in OURS:
        limiter = cls(client, 1, LIMIT, prefix=f"{prefix}:{cls.__name__}")
        cases[hot(cls.__name__)], cases[spread(cls.__name__)] = _pair(limiter.check)
    for name, peer in peers.items():
        cases[hot(name)], cases[spread(name)] = _pair(peer.check)

    classic = ClassicSlidingLog(client, 1, LIMIT, prefix=f"{prefix}:classic-reused")
    ids_classic, ids_per_request, ids_batch = Identities(), Identities(), Identities()

    async def classic_reused(i: int) -> Any:
        return await classic.check_transaction(ids_classic())

    async def ours_per_request(i: int) -> Any:
        limiter = SlidingWindowLimiter(client, 1, LIMIT, prefix=f"{prefix}:per-request")
        return await limiter.check(ids_per_request())

    batcher = SlidingWindowLimiter(client, 1, LIMIT, prefix=f"{prefix}:batch")

    async def batch(i: int) -> Any:
        return await batcher.check_many([ids_batch() for _ in range(BATCH)])

    # The script's KEYS and ARGV as prelude.lua documents them: now ms, window ms,
    # limit, cost, TTL slack; keys as our limiter names them.
    log = SlidingWindowLimiter(client, 1, LIMIT, prefix=f"{prefix}:bare")
    bare = client.register_script(source("sliding_log"))
    ids_args, ids_bare = Identities(), Identities()

    async def args_floor(i: int) -> Any:
        return await noop(keys=[log.key_for(ids_args())], args=[_now_ms(), 1000, LIMIT, 1, 0])

    async def bare_script(i: int) -> Any:
        return await bare(keys=[log.key_for(ids_bare())], args=[_now_ms(), 1000, LIMIT, 1, 0])

    cases[ARGS_FLOOR_CASE] = rounds.sequential(args_floor)
    cases[BARE_SCRIPT_CASE] = rounds.sequential(bare_script)
    cases[CLASSIC_REUSED_CASE] = rounds.sequential(classic_reused)
    cases[PER_REQUEST_CASE] = rounds.sequential(ours_per_request)
    cases[BATCH_CASE] = rounds.sequential(batch, checks_per_call=BATCH)
    return cases


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _check_admits(peers: dict[str, peer_mod.Peer]) -> None:
    """Each peer must be measured on its admit path, like ours."""
    for name, peer in peers.items():
        if not peer.admitted(await peer.check("admission-probe")):
            raise RuntimeError(f"{name} rejected a check of a {LIMIT}/s limit; fix the setup")


async def run(
    client: Any, url: str | None, n_rounds: int, n: int, warmup: int = 50
) -> dict[str, Any]:
    """Measure the async cases; `client` is ours, `url` lets the peers open their own."""
    prefix = f"bench:{os.getpid()}:checks"
    peers, skipped = peer_mod.build(client, url, prefix, LIMIT)
    try:
        await _check_admits(peers)
        cases = make_cases(client, prefix, peers)
        per_round = await rounds.run_async(cases, n_rounds, n, warmup)
    finally:
        await peer_mod.close_all(peers)
        await delete_prefix(client, prefix)
    return {
        "rounds": n_rounds,
        "checks_per_case_per_round": n,
        "limit": f"{LIMIT:,} per second (every check admitted)",
        "baselines": list(FLOORS),
        "peers": {name: {"counterpart": p.counterpart} for name, p in peers.items()},
        "skipped": skipped,
        "per_round": per_round,
        "results": rounds.summarize(per_round, FLOORS),
    }
