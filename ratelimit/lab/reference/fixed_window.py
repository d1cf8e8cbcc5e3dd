"""Fixed window, as in lua/fixed_window.lua: (window number, admitted cost)."""

from __future__ import annotations

import math

from ratelimit import algorithms

from .base import Outcome, ReferenceLimiter


class FixedWindowLimiter(ReferenceLimiter):
    """One counter per aligned window; counts admitted cost only. The stored window
    never moves backwards: a request stamped before it counts in it."""

    algorithm = algorithms.FIXED_WINDOW

    def run(self, identity: bytes, times_ms: list[int], costs: list[int]) -> Outcome:
        window, limit = self.window_ms, self.limit
        stored, used_in_stored = self.state.get(identity, (None, 0))
        allowed, remaining, retry, reset = [], [], [], []
        skew = self.clock_tolerance_ms
        for now, cost in zip(times_ms, costs, strict=True):
            number = math.floor(now / window)  # float division, as in Lua
            if stored is not None and skew is not None and stored * window > now + skew:
                # A window opened by a host far ahead: its count moves back to the
                # window of the bound (this check's time + skew), if that is earlier.
                stored = max(min(stored, math.floor((now + skew) / window)), number)
            if stored is not None and stored > number:
                number = stored  # a late request (its clock is behind) counts there
            until_next = (number + 1) * window - now
            used = used_in_stored if stored == number else 0
            if used + cost > limit:
                allowed.append(False)
                remaining.append(max(limit - used, 0))
                retry.append(until_next)
            else:
                stored, used_in_stored = number, used + cost
                allowed.append(True)
                remaining.append(limit - used - cost)
                retry.append(0)
            reset.append(until_next)
        self.state[identity] = (stored, used_in_stored)
        return allowed, remaining, retry, reset
