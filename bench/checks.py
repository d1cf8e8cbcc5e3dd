"""One async check, as ratios against floors and peers measured in the same rounds.

Every case shares one asyncio client (peers: the same URL and settings) and runs in
interleaved rounds (`rounds.py`). Cases:

- floors: PING and EVALSHA of `return 1`;
- our four limiters on one hot key and on 10,000 keys (a large limit keeps every
  check on the admit path, the one that writes); the exact log as the default
  `SlidingWindowLimiter` and in each other storage this build has (`ours`);
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
from dataclasses import dataclass
from typing import Any

from ratelimit import SlidingWindowLimiter, algorithms
from ratelimit.lab.classic import ClassicSlidingLog

from . import peers as peer_mod
from . import rounds
from .cleanup import delete_prefix

LIMIT = 1_000_000  # per second: every check in a run is admitted
KEYS = 10_000
BATCH = 100
FLOORS = ("PING", "EVALSHA return 1")
OURS = tuple(a.limiter_class("async") for a in algorithms.ALGORITHMS)  # the registry's order
LOG = SlidingWindowLimiter.__name__
# The exact log's storages (`SlidingWindowLimiter(..., storage=...)`). A build that
# does not know the option has one log, the sorted set.
STORAGES = ("sorted-set", "compact")
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


def log_name(storage: str | None = None) -> str:
    """Our exact log's case name: the default `SlidingWindowLimiter`, or one storage."""
    return LOG if storage is None else f"{LOG} storage={storage}"


@dataclass
class Ours:
    """Our limiters by name (the default exact log first, then each other storage this
    build has, then the O(1) ones), and what became of each log storage: {"case":
    the name that measures it, "default": whether that is the default limiter} or
    {"skipped": why not}."""

    limiters: dict[str, Any]
    storages: dict[str, dict[str, Any]]


def _storage_of(limiter: Any) -> str | None:
    value = getattr(limiter, "storage", None)
    if value is None:
        value = getattr(limiter, "_options", {}).get("storage")
    return value if isinstance(value, str) else None


def ours(
    classes: tuple[type, ...],
    client: Any,
    prefix: str,
    *args: Any,
    shared_prefix: bool = False,
    **kwargs: Any,
) -> Ours:
    """Build `classes` (a log class first) as `cls(client, *args, prefix=..., **kwargs)`.

    Each limiter gets a prefix of its own under `prefix` (the storages of the log may
    name their keys alike), unless `shared_prefix` (its callers use distinct
    identities; key names then have the length of real ones). Each storage of the log
    is built with `storage=`; one that this build refuses (TypeError or ValueError,
    e.g. before the option exists) is skipped with the reason, and a storage that the
    default limiter already is, is not measured twice. When the build has no
    `storage=` at all, its default log is the sorted set.
    """

    def own(name: str) -> str:
        return prefix if shared_prefix else f"{prefix}:{name}"

    log_cls, *others = classes
    default = log_cls(client, *args, prefix=own(LOG), **kwargs)
    limiters: dict[str, Any] = {log_name(): default}
    storages: dict[str, dict[str, Any]] = {}
    default_storage = _storage_of(default)
    for storage in STORAGES:
        if storage == default_storage:
            storages[storage] = {"case": log_name(), "default": True}
            continue
        try:
            limiter = log_cls(
                client, *args, prefix=own(f"{LOG}-{storage}"), storage=storage, **kwargs
            )
        except (TypeError, ValueError) as exc:
            if storage == "sorted-set" and isinstance(exc, TypeError) and default_storage is None:
                storages[storage] = {"case": log_name(), "default": True}  # the only log
                continue
            storages[storage] = {
                "skipped": f"skipped: storage={storage!r} is not available in this build "
                f"({type(exc).__name__}: {exc})"
            }
            continue
        limiters[log_name(storage)] = limiter
        storages[storage] = {"case": log_name(storage), "default": False}
    for cls in others:
        limiters[cls.__name__] = cls(client, *args, prefix=own(cls.__name__), **kwargs)
    return Ours(limiters, storages)


def _pair(check: peer_mod.Checker) -> tuple[rounds.AsyncCase, rounds.AsyncCase]:
    async def on_hot(i: int) -> Any:
        return await check("hot")

    identity = Identities()

    async def on_spread(i: int) -> Any:
        return await check(identity())

    return rounds.sequential(on_hot), rounds.sequential(on_spread)


def make_cases(
    client: Any, prefix: str, peers: dict[str, peer_mod.Peer], mine: Ours
) -> dict[str, rounds.AsyncCase]:
    noop = client.register_script("return 1")

    async def ping(i: int) -> Any:
        return await client.ping()

    async def evalsha(i: int) -> Any:
        return await noop()

    cases = {"PING": rounds.sequential(ping), "EVALSHA return 1": rounds.sequential(evalsha)}
    for name, limiter in mine.limiters.items():
        cases[hot(name)], cases[spread(name)] = _pair(limiter.check)
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

    # The default log's own script, KEYS and ARGV exactly as its check builds them
    # (`script_args`: the time, the cost, and the state a new key takes), without the
    # rest of the limiter's code; on keys of their own, so that the log's case finds
    # its keys as it left them.
    log = type(mine.limiters[log_name()])(client, 1, LIMIT, prefix=f"{prefix}:bare")
    bare = client.register_script(log.script)
    ids_args, ids_bare = Identities(), Identities()

    async def args_floor(i: int) -> Any:
        return await noop(keys=[log.key_for(ids_args())], args=log.script_args(_now_ms(), 1))

    async def bare_script(i: int) -> Any:
        return await bare(keys=[log.key_for(ids_bare())], args=log.script_args(_now_ms(), 1))

    cases[ARGS_FLOOR_CASE] = rounds.sequential(args_floor)
    cases[BARE_SCRIPT_CASE] = rounds.sequential(bare_script)
    cases[CLASSIC_REUSED_CASE] = rounds.sequential(classic_reused)
    cases[PER_REQUEST_CASE] = rounds.sequential(ours_per_request)
    cases[BATCH_CASE] = rounds.sequential(batch, checks_per_call=BATCH)
    return cases


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _check_admits(peers: dict[str, peer_mod.Peer], mine: Ours) -> None:
    """Each case must be measured on its admit path, ours and the peers'."""
    for name, peer in peers.items():
        if not peer.admitted(await peer.check("admission-probe")):
            raise RuntimeError(f"{name} rejected a check of a {LIMIT}/s limit; fix the setup")
    for name, limiter in mine.limiters.items():
        if not (await limiter.check("admission-probe")).allowed:
            raise RuntimeError(f"{name} rejected a check of a {LIMIT}/s limit; fix the setup")


async def run(
    client: Any, url: str | None, n_rounds: int, n: int, warmup: int = 50
) -> dict[str, Any]:
    """Measure the async cases; `client` is ours, `url` lets the peers open their own."""
    prefix = f"bench:{os.getpid()}:checks"
    peers, skipped = peer_mod.build(client, url, prefix, LIMIT)
    try:
        mine = ours(OURS, client, prefix, 1, LIMIT)
        await _check_admits(peers, mine)
        cases = make_cases(client, prefix, peers, mine)
        per_round = await rounds.run_async(cases, n_rounds, n, warmup)
    finally:
        await peer_mod.close_all(peers)
        await delete_prefix(client, prefix)
    return report(n_rounds, n, peers, skipped, mine.storages, per_round)


def report(
    n_rounds: int,
    n: int,
    peers: dict[str, Any],
    skipped: dict[str, str],
    log_storages: Any,
    per_round: rounds.Rounds,
) -> dict[str, Any]:
    """The part's report, async or sync: its rounds, against the floors, and its peers."""
    return {
        "rounds": n_rounds,
        "checks_per_case_per_round": n,
        "limit": f"{LIMIT:,} per second (every check admitted)",
        "baselines": list(FLOORS),
        "peers": {name: {"counterpart": p.counterpart} for name, p in peers.items()},
        "skipped": skipped,
        "log_storages": log_storages,
        "per_round": per_round,
        "results": rounds.summarize(per_round, FLOORS),
    }
