"""The four algorithms, listed once: everything else looks them up here.

    from ratelimit import algorithms
    algorithms.get("log").label                     # "sliding log"
    algorithms.get("gcra").limiter_class("sync")    # ratelimit.sync.TokenBucketLimiter
    [a.name for a in algorithms.ALGORITHMS]         # ["log", "fw", "swc", "gcra"]
    algorithms.log_storage("compact").name          # "logc": the log's default storage

Each `Algorithm` names its tag in Redis keys, its label in tables and figures, its Lua
script, whether it is exact, whether the near-cache may answer for it, and how many
Redis commands its script issues per check. The limiter classes carry the same name in
`ratelimit` (asyncio), `ratelimit.sync` and the lab's reference models
(`ratelimit.lab.reference`), so `limiter_class` finds any of the three, and `build`
makes one (the log in the storage its entry names).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from . import validation

Kind = Literal["async", "sync", "reference"]

_MODULES: dict[str, str] = {
    "async": "ratelimit.limiters",
    "sync": "ratelimit.sync",
    "reference": "ratelimit.lab.reference",  # needs the lab's extra (numpy, pandas)
}


@dataclass(frozen=True, slots=True)
class ScriptCommands:
    """Redis commands (`redis.call`s) one check's script issues, per path, besides the
    EVALSHA that runs it. A `clock="redis"` limiter adds one TIME to each path."""

    admit: int  # an admitted request of cost 1, on a key that holds state already
    per_extra_unit: int  # more on the admit path for each unit of cost above 1
    reject: int  # a rejected request, whatever its cost
    opening: int  # an admitted request of cost 1 on a key that holds nothing


@dataclass(frozen=True, slots=True)
class Algorithm:
    name: str  # tag in Redis keys, so two algorithms on one prefix never share a key
    label: str  # how tables and figures name it
    script: str  # file stem under ratelimit/lua/
    class_name: str  # the limiter class, the same name in every flavour
    exact: bool  # never admits more than the limit in any rolling window
    commands: ScriptCommands
    # Whether a cached rejection may answer later checks locally (see ratelimit.nearcache):
    # None (never), "same cost", or "same or larger cost".
    near_cache: str | None = None
    max_limit: int = 10**9
    # Raises ValueError for (window_ms, limit) the script cannot handle exactly.
    check_range: Callable[[int, int], None] | None = None
    # How many windows a check's state can matter for, from the time it was written
    # (the key's TTL, before any slack; GCRA's depends on its burst, see policy.py).
    ttl_windows: int = 1
    # The sliding log's `storage=` option that selects this entry (None: not a log).
    storage: str | None = None

    def build(self, kind: Kind, *args: Any, **options: Any) -> Any:
        """A limiter of this algorithm: `limiter_class(kind)(*args, **options)`, with the
        log's `storage` set to this entry's unless `options` names one."""
        if self.storage is not None:
            options.setdefault("storage", self.storage)
        return self.limiter_class(kind)(*args, **options)

    def limiter_class(self, kind: Kind = "async") -> type[Any]:
        """This algorithm's limiter: "async" (`ratelimit`), "sync" (`ratelimit.sync`) or
        "reference" (the in-memory model in `ratelimit.lab.reference`)."""
        if kind not in _MODULES:
            raise ValueError(f"kind must be one of {sorted(_MODULES)}, got {kind!r}")
        return getattr(importlib.import_module(_MODULES[kind]), self.class_name)


# The log stores one member per unit of cost; its script has 2^23 member slots, and a
# million members already take about 100 MB for one key.
SLIDING_LOG_MAX_LIMIT = 1_000_000

# Commands counted per path in ratelimit/lua/*.lua (tests hold them to INFO commandstats):
#   log   admit:  ZRANGE (newest entry), ZCOUNT, ZREMRANGEBYSCORE, ZADD NX (one per unit of
#                 cost), PEXPIRE          reject: ZRANGE, ZCOUNT, ZRANGEBYSCORE (oldest blocker)
#   logc  admit:  HGET (the head), HSET, PEXPIRE    reject: HGET; more once entries have
#                 left the window of a log longer than one chunk: HGET of the tail chunk
#                 (and of chunks between, a binary search after a long pause), HDEL of
#                 chunks left behind, DEL when all have left
#   fw    admit:  SET NX GET (reads the count; writes only a key that held nothing),
#                 then INCRBY, or SET with PX when it opens a new window
#                                         reject: SET NX GET
#   swc   admit:  SET NX GET, SET (with PX)      reject: SET NX GET
#   gcra  admit:  SET NX GET, SET (with PX)      reject: SET NX GET
#   On a key that holds nothing, the SET NX GET alone admits (fw, swc, gcra).
# The log's ZADD NX is repeated when its probe hits a taken member slot: rare (at most
# 10**6 members in 2**23 slots), and not counted.
# Tag, label, Lua script, limiter class; exactness; commands per check as (admit, per
# extra unit of cost, reject, opening a key); near-cache rule; largest limit.
SLIDING_LOG = Algorithm("log", "sliding log", "sliding_log", "SlidingWindowLimiter",
                        exact=True, commands=ScriptCommands(5, 1, 3, 5), near_cache="same cost",
                        max_limit=SLIDING_LOG_MAX_LIMIT, storage="sorted-set")  # fmt: skip
FIXED_WINDOW = Algorithm("fw", "fixed window", "fixed_window", "FixedWindowLimiter",
                         exact=False, commands=ScriptCommands(2, 0, 1, 1),
                         near_cache="same or larger cost",
                         check_range=validation.fixed_window_range)  # fmt: skip
SLIDING_WINDOW_COUNTER = Algorithm("swc", "sliding-window counter", "sliding_window_counter",
                                   "SlidingWindowCounterLimiter", exact=False,
                                   commands=ScriptCommands(2, 0, 1, 1),
                                   ttl_windows=2)  # fmt: skip
GCRA = Algorithm("gcra", "GCRA (token bucket)", "gcra", "TokenBucketLimiter",
                 exact=False, commands=ScriptCommands(2, 0, 1, 1))  # fmt: skip

ALGORITHMS: tuple[Algorithm, ...] = (SLIDING_LOG, FIXED_WINDOW, SLIDING_WINDOW_COUNTER, GCRA)
NAMES: tuple[str, ...] = tuple(a.name for a in ALGORITHMS)

# The sliding log kept compactly (lua/compact_log.lua): the same decisions as
# SLIDING_LOG, about 6 bytes per admitted unit instead of a sorted-set member.
COMPACT_LOG = Algorithm("logc", "sliding log (compact)", "compact_log", "SlidingWindowLimiter",
                        exact=True, commands=ScriptCommands(3, 0, 1, 3), near_cache="same cost",
                        max_limit=SLIDING_LOG_MAX_LIMIT, storage="compact")  # fmt: skip
# Where `SlidingWindowLimiter(..., storage=...)` keeps its log.
LOG_STORAGES: dict[str, Algorithm] = {"sorted-set": SLIDING_LOG, "compact": COMPACT_LOG}
DEFAULT_LOG_STORAGE = "compact"


def log_storage(storage: Any) -> Algorithm:
    """The sliding log's algorithm entry for `storage`; ValueError for anything else."""
    if isinstance(storage, str) and storage in LOG_STORAGES:
        return LOG_STORAGES[storage]
    raise ValueError(f"storage must be one of {', '.join(LOG_STORAGES)}, got {storage!r}")


def get(spec: Any) -> Algorithm:
    """An algorithm from its tag ("log", "fw", "swc", "gcra"), an `Algorithm`, or a
    limiter class or instance of any flavour; ValueError for anything else."""
    known = (*ALGORITHMS, COMPACT_LOG)
    if isinstance(spec, str):
        for a in known:
            if spec == a.name:
                return a
    else:
        found = getattr(spec, "algorithm", spec)
        if found in known:
            return found
    raise ValueError(f"unknown algorithm {spec!r}: give one of {', '.join(NAMES)}")
