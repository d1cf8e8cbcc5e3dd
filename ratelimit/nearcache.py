"""Rejection near-cache: answer repeat offenders locally, without a Redis round trip.

    limiter = SlidingWindowLimiter(redis, 1, 10, near_cache=True)   # or sync.*

Once Redis rejects a check with "retry in T ms", every further check of the same
identity and cost within T is rejected by the limiter itself. An abusive client
hammering at 10x its limit then costs a dict look-up per request instead of a
round trip. Allowed decisions are never cached, nor degraded ones (Redis did not
answer); an admission by Redis drops the identity's cached rejection (its retry
would be stale); `check_many` always asks Redis.

`peek` uses the cache as `check` does, since it must answer what a check would: a
cached rejection answers it, and a rejection Redis gave it is remembered (the state
it was decided on is the one a rejected check leaves: it writes nothing either). An
admission Redis gave a peek drops nothing: it added no entry, so a cached rejection's
retry is still exact. `reset` drops the identity's cached rejection, in this limiter
only: other processes' caches keep theirs until its retry has passed.

Why the decision is exact (the same answer Redis would give at that moment):

- Sliding log (`algorithm "log"`). A rejection at time t0 means the set held
  count + cost > limit units, and T is the time until the oldest blocking entry
  leaves the window. Entries only leave as time passes, so until t0 + T at least
  limit - cost + 1 of them stay; other processes sharing the key only add entries.
  A check of the same cost is therefore still rejected, and its retry_after_ms
  and reset_after_ms are those of t0 minus the time elapsed. A rejection at cost c
  says nothing about a smaller cost (fewer entries have to leave), and for a larger
  one the blocking entry is a later, unknown one: those checks go to Redis.
- Fixed window (`"fw"`). A rejection holds until the window ends (the counter only
  grows within a window), for the same or any larger cost; retry and reset (both:
  the window's end) stay exact whatever other processes do.
- GCRA and the sliding-window counter are refused (ValueError). GCRA admits once
  the wait is within an EPSILON of zero, and reports the wait rounded up, so the
  ms before the reported retry can already admit; the counter's retry is found by
  stepping a float estimate that is only checked next to the answer, not shown to
  stay over the limit all the way there. A cache holding for all of T could be
  wrong at those edges.

Exact under these conditions:

- Time runs forwards, for every writer of a key: they share one time base (one
  clock, or `clock="redis"`). If it runs backwards (a clock set back, a writer
  whose clock is behind or ahead) the decisions are no longer guaranteed exact:
  e.g. a stamp in an earlier fixed window resets its counter, and a writer whose
  clock is ahead trims the log early. If the limiter's own clock reads earlier
  than a cached rejection, the cache forgets it and asks Redis.
- Clocks: with the app's clock or an injected one (e.g. `ManualClock`) the cache
  reads the limiter's clock, the very `now` the script would get. With
  `clock="redis"` the script's time is unknown locally, so the cache counts T on
  the host's monotonic clock from the moment the request was *sent* (the script
  ran no earlier): the cached rejection ends early rather than late, and the
  retry/reset it reports are counted from the moment the answer *arrived*, so they
  are never too short. This assumes Redis's clock does not run faster than the
  host's over T.
- Other writers admitted since the cached rejection: the decision stays exact
  (still rejected), but Redis would report a later retry/reset for the sliding log
  than the cache does (the cache knows only the state at the rejection).
- `remaining` is the value Redis gave at the rejection. It is exact for cost 1 (0),
  and for the fixed window with no other writers; for the sliding log at cost > 1
  entries older than the blocking one may have left meanwhile, and Redis would
  report a larger `remaining` (still less than the cost).
- Keys expire in real time: as for the limiter itself, a virtual clock must not
  run so far ahead of real time that the key's TTL (plus `ttl_slack_ms`) drops
  entries that are still in the virtual window.

Memory is bounded: at most `max_entries` identities (default 10,000). When full,
expired rejections are dropped first, then the oldest ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import algorithms
from .algorithms import Algorithm
from .decision import Decision

DEFAULT_MAX_ENTRIES = 10_000



@dataclass(slots=True)
class _Rejection:
    cost: int
    until: float  # local ms: the rejection stands while now < until
    anchor: float  # local ms from which retry/reset count down
    retry_ms: int  # retry_after_ms as Redis answered
    reset_ms: int  # reset_after_ms as Redis answered
    remaining: int
    decided_at_ms: int | None  # the script's time of the rejection


def max_entries(value: object) -> int | None:
    """The `near_cache` option: False/None (off), True (default size) or a positive int."""
    if value is None or value is False:
        return None
    if value is True:
        return DEFAULT_MAX_ENTRIES
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 10**8:
        return value
    raise ValueError(
        f"near_cache must be True, False or a maximum number of identities (1 to 10^8), "
        f"got {value!r}"
    )


class NearCache:
    """A limiter's memory of its recent rejections, keyed by Redis key.

    Times are local milliseconds: the limiter's own clock (app or injected), or the
    host's monotonic clock for `clock="redis"` (see the module docstring).
    """

    def __init__(self, algorithm: Algorithm, limit: int, size: int = DEFAULT_MAX_ENTRIES) -> None:
        if algorithm.near_cache is None:
            exact = ", ".join(a.name for a in algorithms.ALGORITHMS if a.near_cache)
            raise ValueError(
                f"near_cache is exact only for algorithms {exact}, "
                f"not {algorithm.name!r}: see ratelimit.nearcache"
            )
        self.algorithm = algorithm
        self.limit = limit
        self.max_entries = size
        self._larger_costs = algorithm.near_cache == "same or larger cost"
        self._entries: dict[str, _Rejection] = {}
        self.hits = 0  # checks answered locally

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: str, cost: int, now: float) -> Decision | None:
        """The cached rejection for this check at local time `now`, or None (ask Redis)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now >= entry.until:
            del self._entries[key]
            return None
        if now < entry.anchor:  # the clock went backwards: let Redis decide
            return None
        if cost != entry.cost and not (self._larger_costs and cost > entry.cost):
            return None
        elapsed = now - entry.anchor
        self.hits += 1
        return Decision(
            False,
            self.limit,
            entry.remaining,
            math.ceil(entry.retry_ms - elapsed),
            math.ceil(entry.reset_ms - elapsed),
            decided_at_ms=None
            if entry.decided_at_ms is None
            else entry.decided_at_ms + math.floor(elapsed),
        )

    def remember(
        self, key: str, cost: int, decision: Decision, sent: float, received: float
    ) -> None:
        """Keep a rejection Redis gave; `sent`/`received`: local ms around the call."""
        if decision.allowed or decision.degraded or decision.retry_after_ms <= 0:
            return
        entries = self._entries
        if entries.pop(key, None) is None and len(entries) >= self.max_entries:
            self._make_room(received)
        entries[key] = _Rejection(  # (re)inserted last: dict order is age order
            cost,
            sent + decision.retry_after_ms,
            received,
            decision.retry_after_ms,
            decision.reset_after_ms,
            decision.remaining,
            decision.decided_at_ms,
        )

    def forget(self, key: str) -> None:
        """Drop a key's rejection: Redis admitted a (smaller) request for it, so the
        rejection still stands but the retry and reset it knows are too early."""
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def _make_room(self, now: float) -> None:
        """Drop expired rejections; if still full, the oldest, down to 7/8 of the cap
        (so that the scan is paid once per max_entries / 8 insertions)."""
        entries = self._entries
        for key in [k for k, e in entries.items() if now >= e.until]:
            del entries[key]
        target = self.max_entries - max(1, self.max_entries // 8)
        if len(entries) > target:
            for key in list(entries)[: len(entries) - target]:
                del entries[key]
