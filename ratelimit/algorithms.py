"""The four algorithms: which Lua script each runs and the tag in its Redis keys."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Algorithm:
    name: str  # appears in keys, so two algorithms on one prefix never share a key
    script: str  # file stem under ratelimit/lua/
    exact: bool  # never admits more than the limit in any rolling window
    max_limit: int = 10**9


# The log stores one member per unit of cost; its script has 2^23 member slots, and a
# million members already take about 100 MB for one key.
SLIDING_LOG_MAX_LIMIT = 1_000_000


SLIDING_LOG = Algorithm("log", "sliding_log", exact=True, max_limit=SLIDING_LOG_MAX_LIMIT)
FIXED_WINDOW = Algorithm("fw", "fixed_window", exact=False)
SLIDING_WINDOW_COUNTER = Algorithm("swc", "sliding_window_counter", exact=False)
GCRA = Algorithm("gcra", "gcra", exact=False)
