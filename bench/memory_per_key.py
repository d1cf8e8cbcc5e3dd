"""Memory per key at limits 10, 128, 129, 1,000, 10,000 and 100,000, from the server's
`MEMORY USAGE <key> SAMPLES 0` (every element counted, key name and overhead included).

- The exact log in each of its storages this build has (`checks.ours`: "sorted-set",
  "compact"; a storage the build refuses is skipped with the reason): one full key
  per limit, filled through the limiter itself (`check_many` in batches) with
  `limit` admitted checks of cost 1 at consecutive milliseconds (its clock moves 1 ms
  each time the limiter reads it) in a window long enough that nothing is trimmed,
  in bytes per admitted unit. Every key of the identity counts (a storage may keep
  more than one; they share the identity's hash tag).
- The classic recipe's "<ms>:<perf_counter_ns>" members in a sorted set
  (`ratelimit.lab.memory.probe`), for comparison.
- The O(1) algorithms hold one small value whatever the limit: bytes per key.

128 -> 129 crosses the default `zset-max-listpack-entries`, where a small sorted set
turns into a skiplist.
"""

from __future__ import annotations

import uuid
from typing import Any

from ratelimit import algorithms, sync
from ratelimit.lab.memory import (
    DEFAULT_START_MS,
    DEFAULT_WINDOW_MS,
    listpack_threshold,
    probe,
    redis_version,
)

from .checks import STORAGES, ours

LIMITS = (10, 128, 129, 1_000, 10_000, 100_000)
# The algorithms whose key holds a few numbers whatever the limit.
O1 = tuple(a.name for a in algorithms.ALGORITHMS if not a.state_per_unit)
BATCH = 1_000  # checks per check_many while filling
PREFIX = "rl"  # the limiters' default, as `probe` names its keys


class TickingClock:
    """A clock that moves 1 ms each time it is read, from `start_ms`: every check a
    limiter prepares is stamped 1 ms after the one before."""

    def __init__(self, start_ms: int = DEFAULT_START_MS) -> None:
        self.ms = start_ms - 1

    def __call__(self) -> float:
        self.ms += 1
        return (self.ms + 0.5) / 1000  # the middle of the ms: floors back to it exactly


def _tag(key: str) -> str:
    """The key's hash tag (what every key of one identity shares), else the key."""
    start, end = key.find("{"), key.find("}")
    return key[start : end + 1] if 0 <= start < end else key


def fill_and_measure(client: Any, limiter: Any, identity: str, entries: int) -> dict[str, Any]:
    """Admit `entries` checks of cost 1 for `identity`, measure its keys, delete them."""
    tag = _tag(limiter.key_for(identity))
    try:
        for first in range(0, entries, BATCH):
            decisions = limiter.check_many([identity] * min(BATCH, entries - first))
            if not all(d.allowed for d in decisions):
                raise RuntimeError(f"the limiter rejected a check while filling {entries:,}")
        keys = list(client.scan_iter(match=f"*{tag}*", count=1000))
        if not keys:
            raise RuntimeError(f"no key holds the {entries:,} admitted checks")
        usage = sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)
        encodings = sorted({_text(client.object("encoding", k)) for k in keys})
    finally:
        for k in client.scan_iter(match=f"*{tag}*", count=1000):
            client.delete(k)
    return {"bytes_per_key": usage, "encoding": "+".join(encodings), "keys": len(keys)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _log_rows(client: Any, limit: int) -> tuple[list[dict], dict[str, dict]]:
    # Every key under the limiter's default prefix, as an application's would be named
    # (a random identity per key: nothing shared, nothing left behind).
    mine = ours(
        (sync.SlidingWindowLimiter,),
        client,
        PREFIX,
        None,
        limit,
        shared_prefix=True,
        window_ms=max(DEFAULT_WINDOW_MS, limit),
        clock=TickingClock(),
    )
    rows = []
    for storage in STORAGES:
        found = mine.storages[storage]
        if "skipped" in found:
            continue
        limiter = mine.limiters[found["case"]]
        m = fill_and_measure(client, limiter, f"memory-{uuid.uuid4().hex}", limit)
        rows.append(
            {
                "algorithm": "log",
                "storage": storage,
                "member_format": "",
                "limit": limit,
                "bytes_per_key": m["bytes_per_key"],
                "bytes_per_unit": m["bytes_per_key"] / limit,
                "encoding": m["encoding"],
                "keys": m["keys"],
            }
        )
    return rows, mine.storages


def run(client: Any, limits: tuple[int, ...] = LIMITS) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    storages: dict[str, dict] = {}
    for limit in limits:
        log_rows, storages = _log_rows(client, limit)
        rows += log_rows
        p = probe(client, "log", limit, member_format="classic")
        rows.append(
            {
                "algorithm": "log",
                "storage": "",
                "member_format": "classic",
                "limit": limit,
                "bytes_per_key": p.memory_usage,
                "bytes_per_unit": p.bytes_per_entry,
                "encoding": p.encoding,
                "keys": 1,
            }
        )
        for alg in O1:
            p = probe(client, alg, limit)
            rows.append(
                {
                    "algorithm": alg,
                    "storage": "",
                    "member_format": "",
                    "limit": limit,
                    "bytes_per_key": p.memory_usage,
                    "bytes_per_unit": None,
                    "encoding": p.encoding,
                    "keys": 1,
                }
            )
    return {
        "redis_version": redis_version(client),
        "zset_max_listpack_entries": listpack_threshold(client),
        "window_ms": DEFAULT_WINDOW_MS,
        "log_storages": storages,
        "rows": rows,
    }
