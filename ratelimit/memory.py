"""What one limiter key costs in Redis memory: fill a key, ask the server, delete it.

    import redis
    from ratelimit.memory import probe, listpack_threshold

    client = redis.Redis()                        # a real server; fakeredis cannot tell
    probe(client, "log", 128)                     # sliding log, 128 members: listpack
    probe(client, "log", 129)                     # one above the threshold: skiplist
    probe(client, "log", 128, member_format="classic")   # "<ms>:<perf_counter_ns>"
    probe(client, "gcra", 10_000)                 # O(1): one small string whatever the limit
    listpack_threshold(client)                    # zset-max-listpack-entries, e.g. 128

Figures come from the server itself: `MEMORY USAGE <key> SAMPLES 0` (every element
counted, key name and overhead included) and `OBJECT ENCODING <key>`. The embedded
fakeredis has neither command nor Redis's memory layout, so on it `probe` raises
`MemoryNotMeasurableError` instead of inventing a number.

How a sliding-log key is filled: `entries` admitted requests of cost 1 at consecutive
milliseconds, in a window long enough that nothing is trimmed, each decided by the
real sliding-log script on a virtual clock, so the members are exactly the ones it
writes. With `fill="limiter"` every request is one `check` round trip (about 15 s per
100,000 entries); with the default `fill="pipeline"` the same script calls are sent in
pipelined batches.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
import redis.exceptions

from . import algorithms, sync
from .algorithms import Algorithm
from .backends import is_embedded
from .clock import ManualClock

__all__ = [
    "MemoryNotMeasurableError",
    "MemoryProbe",
    "listpack_threshold",
    "probe",
]


class MemoryNotMeasurableError(RuntimeError):
    """The backend cannot report Redis memory (the embedded fakeredis)."""


@dataclass(frozen=True, slots=True)
class MemoryProbe:
    """One measured key."""

    algorithm: str  # "log", "fw", "swc" or "gcra" (as in the key)
    member_format: str | None  # "script" or "classic" for the log, None otherwise
    limit: int
    window_ms: int
    entries: int  # sorted-set members, or units of cost the O(1) state accounts for
    memory_usage: int  # bytes: MEMORY USAGE key SAMPLES 0
    encoding: str  # OBJECT ENCODING: listpack, skiplist, int, embstr, ...
    bytes_per_entry: float  # memory_usage / entries


_SYNC_CLASSES: dict[str, type[sync.SyncLimiter]] = {
    algorithms.SLIDING_LOG.name: sync.SlidingWindowLimiter,
    algorithms.FIXED_WINDOW.name: sync.FixedWindowLimiter,
    algorithms.SLIDING_WINDOW_COUNTER.name: sync.SlidingWindowCounterLimiter,
    algorithms.GCRA.name: sync.TokenBucketLimiter,
}
_ALGORITHMS = {
    a.name: a
    for a in (
        algorithms.SLIDING_LOG,
        algorithms.FIXED_WINDOW,
        algorithms.SLIDING_WINDOW_COUNTER,
        algorithms.GCRA,
    )
}

DEFAULT_WINDOW_MS = 10**9  # ~11.6 days: nothing expires while a key is filled
DEFAULT_START_MS = 1_796_000_000_000  # virtual time of the first entry (a whole second)
_CHUNK = 10_000  # members per pipelined ZADD


def _algorithm(spec: Any) -> Algorithm:
    """An algorithm from its name ("log", "sliding_log", ...), an `Algorithm`, or a
    limiter class or instance (sync or async)."""
    if isinstance(spec, str):
        for a in _ALGORITHMS.values():
            if spec in (a.name, a.script):
                return a
    else:
        found = getattr(spec, "algorithm", spec)
        if isinstance(found, Algorithm) and found.name in _ALGORITHMS:
            return found
    names = ", ".join(repr(n) for n in _ALGORITHMS)
    raise ValueError(f"unknown algorithm {spec!r}: give one of {names} or a limiter class")


def _check_measurable(client: Any) -> None:
    if is_embedded(client) or type(client).__module__.startswith("fakeredis"):
        raise MemoryNotMeasurableError(
            "memory is not measurable on the embedded fakeredis backend: it has no "
            "MEMORY USAGE or OBJECT ENCODING and does not store data the way Redis does. "
            "Connect to a real Redis (REDIS_URL) to measure key sizes."
        )
    if isinstance(client, redis.asyncio.Redis):
        raise TypeError("probe needs a synchronous redis.Redis client, not redis.asyncio")


def _unknown_command(exc: redis.exceptions.ResponseError) -> bool:
    return "unknown command" in str(exc).lower()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def listpack_threshold(client: Any) -> int:
    """The server's `zset-max-listpack-entries` (`zset-max-ziplist-entries` before
    Redis 7): the most members a sorted set may hold and stay a compact listpack."""
    _check_measurable(client)
    for name in ("zset-max-listpack-entries", "zset-max-ziplist-entries"):
        try:
            reply = client.config_get(name)
        except redis.exceptions.ResponseError as exc:
            if _unknown_command(exc):
                raise MemoryNotMeasurableError(
                    f"this server does not answer CONFIG GET ({exc})"
                ) from exc
            raise
        for key, value in reply.items():
            if _text(key) == name:
                return int(_text(value))
    raise RuntimeError("the server reports neither zset-max-listpack-entries nor -ziplist-")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _classic_members(start_ms: int, entries: int) -> list[tuple[str, int]]:
    """(member, score) of the classic recipe: "<ms>:<time.perf_counter_ns()>"."""
    return [(f"{start_ms + i}:{time.perf_counter_ns()}", start_ms + i) for i in range(entries)]


def _zadd_all(client: Any, key: str, members: list[tuple[str, int]]) -> None:
    pipe = client.pipeline(transaction=False)
    for i in range(0, len(members), _CHUNK):
        pipe.zadd(key, dict(members[i : i + _CHUNK]))
    pipe.execute()


def _fill_log(
    client: Any,
    limiter: sync.SyncLimiter,
    identity: str,
    clock: ManualClock,
    entries: int,
    start_ms: int,
    member_format: str,
    fill: str,
) -> None:
    key = limiter.key_for(identity)
    if member_format == "classic":
        _zadd_all(client, key, _classic_members(start_ms, entries))
        client.pexpire(key, limiter.window_ms)
        return
    if fill == "limiter":
        for i in range(entries):
            clock.set_ms(start_ms + i)
            if not limiter.check(identity).allowed:
                raise RuntimeError(f"the limiter rejected entry {i + 1} while filling the probe")
        return
    # The same script calls as `check` makes, pipelined in batches.
    for first in range(0, entries, _CHUNK):
        pipe = client.pipeline(transaction=False)
        for i in range(first, min(first + _CHUNK, entries)):
            clock.set_ms(start_ms + i)
            keys, args = limiter._prepare(identity, 1)
            limiter._script(keys=keys, args=args, client=pipe)
        if not all(reply[0] == 1 for reply in pipe.execute()):
            raise RuntimeError("the sliding-log script rejected a request while filling the probe")


def _fill_constant(
    limiter: sync.SyncLimiter, identity: str, clock: ManualClock, entries: int, start_ms: int
) -> None:
    """One admitted request of cost `entries` (at a whole second: a window start)."""
    clock.set((start_ms + 0.5) / 1000)
    if not limiter.check(identity, entries).allowed:
        raise RuntimeError("the limiter rejected the probe's request")


def probe(
    client: redis.Redis,
    algorithm: Any,
    entries: int,
    *,
    limit: int | None = None,
    member_format: str = "script",
    fill: str = "pipeline",
    window_ms: int = DEFAULT_WINDOW_MS,
    prefix: str = "rl",
    start_ms: int = DEFAULT_START_MS,
) -> MemoryProbe:
    """Fill one fresh key of `algorithm` with `entries`, measure it, delete it.

    - `algorithm`: "log", "fw", "swc", "gcra" (or "sliding_log", ...), an
      `Algorithm`, or a limiter class or instance (only its algorithm is used).
    - `entries`: for the sliding log, admitted requests of cost 1 (= members), at
      consecutive ms from `start_ms`; for the O(1) algorithms, the cost of one
      admitted request, so the state accounts for `entries` units (for the
      sliding-window counter the previous window's count is then 0; its value does
      not change the hash's size class).
    - `limit`: the limiter's limit, default `entries`; must be >= `entries`.
    - `member_format`: the log's members as the script writes them ("script"), or
      "classic" strings "<ms>:<perf_counter_ns>" (always written by pipeline).
    - `fill`: "pipeline" (the script's calls in pipelined batches, fast) or "limiter"
      (every entry through `check`, one round trip each). Only matters for the log.
    - `window_ms`: long by default, so nothing is trimmed or expires during the fill.
    - `prefix`: the key prefix; the identity is random, so the key is new and the
      key name has the same length as the limiter's real keys under that prefix.

    Raises `MemoryNotMeasurableError` on fakeredis. The key is deleted afterwards,
    also when something fails.
    """
    _check_measurable(client)
    alg = _algorithm(algorithm)
    entries = _positive_int("entries", entries)
    limit = entries if limit is None else _positive_int("limit", limit)
    if entries > limit:
        raise ValueError(f"entries ({entries}) must be <= limit ({limit})")
    if member_format not in ("script", "classic"):
        raise ValueError(f'member_format must be "script" or "classic", got {member_format!r}')
    if fill not in ("pipeline", "limiter"):
        raise ValueError(f'fill must be "pipeline" or "limiter", got {fill!r}')
    is_log = alg == algorithms.SLIDING_LOG
    if not is_log and member_format != "script":
        raise ValueError(f"member_format applies to the sliding log only, not {alg.name!r}")
    if member_format == "classic" and fill == "limiter":
        raise ValueError('the limiter never writes classic members: use fill="pipeline"')
    if is_log and window_ms < entries:
        raise ValueError(f"window_ms ({window_ms}) must be >= entries, or entries are trimmed")

    clock = ManualClock()
    limiter = _SYNC_CLASSES[alg.name](
        client, None, limit, prefix=prefix, window_ms=window_ms, clock=clock
    )
    identity = f"memory-probe-{uuid.uuid4().hex}"
    key = limiter.key_for(identity)
    if client.exists(key):
        raise RuntimeError(f"probe key {key!r} already exists; refusing to touch it")
    try:
        if is_log:
            _fill_log(client, limiter, identity, clock, entries, start_ms, member_format, fill)
            held = int(client.zcard(key))
            if held != entries:
                raise RuntimeError(f"probe key holds {held} members, expected {entries}")
        else:
            _fill_constant(limiter, identity, clock, entries, start_ms)
        try:
            usage = client.memory_usage(key, samples=0)
            encoding = _text(client.object("encoding", key))
        except redis.exceptions.ResponseError as exc:
            if _unknown_command(exc):
                raise MemoryNotMeasurableError(
                    f"this server does not answer MEMORY USAGE / OBJECT ENCODING ({exc})"
                ) from exc
            raise
        if usage is None:
            raise RuntimeError(f"probe key {key!r} vanished before it was measured")
    finally:
        client.delete(key)
    return MemoryProbe(
        algorithm=alg.name,
        member_format=member_format if is_log else None,
        limit=limit,
        window_ms=window_ms,
        entries=entries,
        memory_usage=int(usage),
        encoding=encoding,
        bytes_per_entry=int(usage) / entries,
    )
