"""The four algorithms, listed once: everything else looks them up here.

    from ratelimit import algorithms
    algorithms.get("log").label                     # "sliding log"
    algorithms.get("gcra").limiter_class("sync")    # ratelimit.sync.TokenBucketLimiter
    [a.name for a in algorithms.ALGORITHMS]         # ["log", "fw", "swc", "gcra"]
    algorithms.log_storage("compact").name          # "logc": the log's default storage

Each `Algorithm` names its tag in Redis keys, its label in tables and figures, its Lua
script, whether it is exact, whether the near-cache may answer for it, and how many
Redis commands its script issues per check; and it carries what differs from one
algorithm to the next: the constants its script reads (`constants`), the state a key
that holds nothing takes (`opener`), and what the rate-limit headers' `t` is for it
(`effective_window_ms`). Nothing else in the library asks which algorithm it has.

The limiter classes carry the same name in `ratelimit` (asyncio) and `ratelimit.sync`,
so `limiter_class` finds either, and `build` makes one (the log in the storage its
entry names). Code outside the library gives an algorithm more parts with `register`:
the lab registers its in-memory reference models (part "reference", which
`limiter_class("reference")` returns) and its compiled replay kernels ("replay").
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from . import clock as clocks
from . import validation
from .scripts import Constant

Kind = Literal["async", "sync", "reference"]

# The library's own limiter modules; any other kind is a part someone registered.
_MODULES: dict[str, str] = {"async": ".limiters", "sync": ".sync"}
_REGISTERED_KINDS = ("reference",)

# Parts registered from outside the library: (part, algorithm tag) -> the part.
_PARTS: dict[tuple[str, str], Any] = {}

Opener = Callable[[int, int], bytes]

# 2^53: integers up to it are exact in a Lua number (a double).
EXACT = 9007199254740992

# The compact log's 6-byte times are offset by 2^47 (lua/compact_log.lua).
COMPACT_OFFSET = 2**47


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
    """One algorithm: its facts (the fields) and its behaviour (the methods, which each
    algorithm's subclass overrides where it differs)."""

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
    # Whether a key holds one entry per admitted unit in its window (its size grows
    # with the limit) rather than a few numbers whatever the limit.
    state_per_unit: bool = False
    # Options its limiters take besides the ones every limiter takes (see policy.py).
    extra_options: tuple[str, ...] = ()

    # -- what the script needs

    def constants(self, policy: Any) -> dict[str, Constant]:
        """What the script reads as constants for `policy` (see lua/prelude.lua and the
        algorithm's own file): the shared ones, then the algorithm's."""
        window = policy.window_ms
        out: dict[str, Constant] = {
            "window": window,
            "limit": policy.limit,
            "ttl_slack": policy.ttl_slack_ms,
            # Text: Redis would format a number argument with %.17g, costly per call.
            "ttl": str(policy.state_ttl_ms() + policy.ttl_slack_ms),
            "L1": policy.max_remaining() + 1,  # radixes of the one-integer reply
            "R": 2 * window + 1,
            # -1: every stored time is trusted (see lua/prelude.lua).
            "skew": -1 if policy.clock_tolerance_ms is None else policy.clock_tolerance_ms,
            # 1: the bound is Redis's clock plus skew; 0: the checking host's own time
            # (an injected clock's times have nothing to do with Redis's).
            "judge": 1 if policy.clock is clocks.DEFAULT else 0,
            # 0: a check; a peek's script is the same with 1 (it writes nothing).
            "dry": 0,
        }
        out.update(self._own_constants(policy))
        return out

    def _own_constants(self, policy: Any) -> dict[str, Constant]:
        return {}

    def opener(self, policy: Any) -> Opener | None:
        """`open(now_ms, cost)`: ARGV[3] of a check sent at `now_ms`, the state a key
        that holds nothing (or only state that has aged out) takes when the check is
        admitted; built once per limiter, called on every check. None when the script
        works the new state out itself."""
        return None

    # -- what the headers say

    def effective_window_ms(self, policy: Any, decision: Any) -> int | None:
        """For an admitted `decision` of a limiter with `policy`: how long the client
        can use no more than the units it has left (the draft's `t`, see
        ratelimit.http); None when this algorithm's state does not say when its
        first unit is back."""
        return None

    # -- limiters and registered parts

    def build(self, kind: Kind, *args: Any, **options: Any) -> Any:
        """A limiter of this algorithm: `limiter_class(kind)(*args, **options)`, with the
        log's `storage` set to this entry's unless `options` names one."""
        if self.storage is not None:
            options.setdefault("storage", self.storage)
        return self.limiter_class(kind)(*args, **options)

    def limiter_class(self, kind: Kind = "async") -> type[Any]:
        """This algorithm's limiter: "async" (`ratelimit`), "sync" (`ratelimit.sync`) or
        "reference" (the lab's in-memory model, once the lab has registered it)."""
        if kind in _MODULES:
            found: type[Any] = getattr(
                importlib.import_module(_MODULES[kind], __package__), self.class_name
            )
            return found
        if kind in _REGISTERED_KINDS:
            return self.part(kind)  # type: ignore[no-any-return]
        kinds = sorted([*_MODULES, *_REGISTERED_KINDS])
        raise ValueError(f"kind must be one of {kinds}, got {kind!r}")

    def part(self, part: str) -> Any:
        """What was registered (`register`) as this algorithm's `part`; LookupError,
        naming who registers it, when nothing was."""
        found = _PARTS.get((part, self.name))
        if found is None:
            raise LookupError(
                f"no {part!r} is registered for algorithm {self.name!r}: the lab registers "
                "its reference models and replay kernels when it is imported (install the "
                "'lab' extra and import the lab first)"
            )
        return found


def register(part: str, value: Any, *entries: Algorithm) -> None:
    """Make `value` the `part` of each algorithm in `entries` (`Algorithm.part`). The
    lab registers its reference models ("reference") and replay kernels ("replay")."""
    for entry in entries:
        _PARTS[part, get(entry).name] = value


# -- each algorithm's behaviour -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlidingLog(Algorithm):
    """The log in a sorted set: its new entries are members, not one value, so the
    script writes them itself (no opener)."""


@dataclass(frozen=True, slots=True)
class CompactLog(Algorithm):
    """The log in a hash of 6-byte times (lua/compact_log.lua)."""

    def opener(self, policy: Any) -> Opener | None:
        # The header of a new log: s (entries ever written) = cost, b = 0, o = now.
        zero = (0).to_bytes(6, "big")

        def log_header(now: int, cost: int) -> bytes:
            if not 0 <= now + COMPACT_OFFSET < 2 * COMPACT_OFFSET:
                return b""  # out of the 6-byte range: the script works it out
            return cost.to_bytes(6, "big") + zero + (now + COMPACT_OFFSET).to_bytes(6, "big")

        return log_header


@dataclass(frozen=True, slots=True)
class FixedWindow(Algorithm):
    """One count per calendar window, packed with the window's number into one integer
    (lua/fixed_window.lua): P window numbers, M = floor(2**53 / P) counts each. Both
    depend on the window alone, so a limit changed on a live key reads its count."""

    def _own_constants(self, policy: Any) -> dict[str, Constant]:
        p = validation.fixed_window_periods(policy.window_ms)
        return {"M": EXACT // p, "P": p}

    def opener(self, policy: Any) -> Opener | None:
        window = policy.window_ms
        p = validation.fixed_window_periods(window)
        m = EXACT // p
        return lambda now, cost: b"%d" % (now // window % p * m + cost)

    def effective_window_ms(self, policy: Any, decision: Any) -> int | None:
        # The whole budget comes back when the window ends.
        return int(decision.reset_after_ms)


@dataclass(frozen=True, slots=True)
class SlidingWindowCounter(Algorithm):
    """This window's count and the previous one's, as "w:c:p"."""

    def opener(self, policy: Any) -> Opener | None:
        window = policy.window_ms
        return lambda now, cost: b"%d:%d:0" % (now // window, cost)


@dataclass(frozen=True, slots=True)
class Gcra(Algorithm):
    """The theoretical arrival time (TAT), a Lua number: one unit every window / limit,
    `burst` of them at once."""

    def _own_constants(self, policy: Any) -> dict[str, Constant]:
        interval = policy.window_ms / policy.limit
        return {"burst": policy.burst, "interval": interval, "tolerance": interval * policy.burst}

    def opener(self, policy: Any) -> Opener | None:
        interval = policy.window_ms / policy.limit
        # The same double the script computes (tat + interval * cost, tat = now), as
        # text that reads back exactly; %.17g, as Redis writes a Lua number, so that a
        # whole TAT is stored as an integer (88 bytes a key, not 120).
        return lambda now, cost: b"%.17g" % (now + interval * cost)

    def effective_window_ms(self, policy: Any, decision: Any) -> int | None:
        # One unit every window / limit; the bucket is full after burst - remaining of
        # them, so the next is due that many intervals, less one, before it is full.
        interval = policy.window_ms / policy.limit
        units_to_full = policy.burst - decision.remaining
        due: float = decision.reset_after_ms - (units_to_full - 1) * interval
        return math.ceil(due)


@dataclass(frozen=True, slots=True)
class Leases(Algorithm):
    """Leases held, in a sorted set scored by expiry: the script names the members
    (the client's lease ids), so no opener."""


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
#   lease acquire: ZREMRANGEBYSCORE, ZCARD, ZSCORE, ZADD, PEXPIRE
#                 rejected: ZREMRANGEBYSCORE, ZCARD, ZSCORE, ZRANGE (first), ZRANGE (last)
#         release: ZREM
#   A peek (the same script with dry = 1) issues the reads of the same path, a GET in
#   place of SET NX GET, and none of the writes (ZREMRANGEBYSCORE, ZADD, HSET, HDEL,
#   DEL, INCRBY, SET, PEXPIRE).
# The log's ZADD NX is repeated when its probe hits a taken member slot: rare (at most
# 10**6 members in 2**23 slots), and not counted.
# Tag, label, Lua script, limiter class; exactness; commands per check as (admit, per
# extra unit of cost, reject, opening a key); near-cache rule; largest limit; whether
# a key grows with the units it holds; the options only its limiters take.
SLIDING_LOG = SlidingLog("log", "sliding log", "sliding_log", "SlidingWindowLimiter",
                         exact=True, commands=ScriptCommands(5, 1, 3, 5), near_cache="same cost",
                         max_limit=SLIDING_LOG_MAX_LIMIT, storage="sorted-set",
                         state_per_unit=True, extra_options=("storage",))  # fmt: skip
FIXED_WINDOW = FixedWindow("fw", "fixed window", "fixed_window", "FixedWindowLimiter",
                           exact=False, commands=ScriptCommands(2, 0, 1, 1),
                           near_cache="same or larger cost",
                           check_range=validation.fixed_window_range)  # fmt: skip
SLIDING_WINDOW_COUNTER = SlidingWindowCounter("swc", "sliding-window counter",
                                              "sliding_window_counter",
                                              "SlidingWindowCounterLimiter", exact=False,
                                              commands=ScriptCommands(2, 0, 1, 1),
                                              ttl_windows=2)  # fmt: skip
GCRA = Gcra("gcra", "GCRA (token bucket)", "gcra", "TokenBucketLimiter",
            exact=False, commands=ScriptCommands(2, 0, 1, 1),
            extra_options=("burst",))  # fmt: skip

ALGORITHMS: tuple[Algorithm, ...] = (SLIDING_LOG, FIXED_WINDOW, SLIDING_WINDOW_COUNTER, GCRA)
NAMES: tuple[str, ...] = tuple(a.name for a in ALGORITHMS)

# The sliding log kept compactly (lua/compact_log.lua): the same decisions as
# SLIDING_LOG, about 6 bytes per admitted unit instead of a sorted-set member.
COMPACT_LOG = CompactLog("logc", "sliding log (compact)", "compact_log", "SlidingWindowLimiter",
                         exact=True, commands=ScriptCommands(3, 0, 1, 3), near_cache="same cost",
                         max_limit=SLIDING_LOG_MAX_LIMIT, storage="compact",
                         state_per_unit=True, extra_options=("storage",))  # fmt: skip
# Concurrency leases (lua/leases.lua): not a rate but how many requests are in flight.
# Its "window" is a lease's lifetime and its "limit" how many leases may be held at
# once; it is kept out of ALGORITHMS, which lists the rate limiters (the lab, its
# reference models and every "each algorithm" test go by that list).
LEASES = Leases("lease", "concurrency leases", "leases", "ConcurrencyLimiter",
                exact=True, commands=ScriptCommands(5, 0, 5, 5), state_per_unit=True)  # fmt: skip

# Where `SlidingWindowLimiter(..., storage=...)` keeps its log.
LogStorage = Literal["compact", "sorted-set"]
LOG_STORAGES: dict[str, Algorithm] = {"sorted-set": SLIDING_LOG, "compact": COMPACT_LOG}
DEFAULT_LOG_STORAGE: LogStorage = "compact"


def log_storage(storage: Any) -> Algorithm:
    """The sliding log's algorithm entry for `storage`; ValueError for anything else."""
    if isinstance(storage, str) and storage in LOG_STORAGES:
        return LOG_STORAGES[storage]
    raise ValueError(f"storage must be one of {', '.join(LOG_STORAGES)}, got {storage!r}")


def get(spec: Any) -> Algorithm:
    """An algorithm from its tag ("log", "fw", "swc", "gcra"), an `Algorithm`, or a
    limiter class or instance of any flavour; ValueError for anything else."""
    known = (*ALGORITHMS, COMPACT_LOG, LEASES)
    if isinstance(spec, str):
        for a in known:
            if spec == a.name:
                return a
    else:
        found = getattr(spec, "algorithm", spec)
        if isinstance(found, Algorithm) and found in known:
            return found
    raise ValueError(f"unknown algorithm {spec!r}: give one of {', '.join(NAMES)}")
