"""The four algorithms: which Lua script each runs and the tag in its Redis keys."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Algorithm:
    name: str  # appears in keys, so two algorithms on one prefix never share a key
    script: str  # file stem under ratelimit/lua/
    exact: bool  # never admits more than the limit in any rolling window


SLIDING_LOG = Algorithm("log", "sliding_log", exact=True)
FIXED_WINDOW = Algorithm("fw", "fixed_window", exact=False)
SLIDING_WINDOW_COUNTER = Algorithm("swc", "sliding_window_counter", exact=False)
GCRA = Algorithm("gcra", "gcra", exact=False)
