"""Sliding-window counter, as in lua/sliding_window_counter.lua: (w, c, p).

The arithmetic is written in the same order as the Lua, so the floats (IEEE doubles
in both) round the same way and the decisions are identical, not merely close.
"""

from __future__ import annotations

import math

from ratelimit import algorithms

from .base import Outcome, ReferenceLimiter


class SlidingWindowCounterLimiter(ReferenceLimiter):
    """Previous window's count weighted by its overlap, plus the current count."""

    algorithm = algorithms.SLIDING_WINDOW_COUNTER

    def run(self, identity: bytes, times_ms: list[int], costs: list[int]) -> Outcome:
        window, limit = self.window_ms, self.limit
        w, c, p = self.state.get(identity, (None, 0, 0))

        def counts_at(t: int) -> tuple[int, int, int]:
            number = math.floor(t / window)
            if w is None:
                return number, 0, 0
            if number == w:
                return number, c, p
            if number == w + 1:
                return number, 0, c
            return number, 0, 0

        def estimate_at(t: int) -> float:
            number, cur, prev = counts_at(t)
            elapsed = t - number * window
            return prev * ((window - elapsed) / window) + cur

        def reset_at(t: int, cur: int, prev: int) -> int:
            number = math.floor(t / window)
            if cur > 0:
                return (number + 2) * window - t
            if prev > 0:
                return (number + 1) * window - t
            return 0

        allowed, remaining, retry, reset = [], [], [], []
        for now, cost in zip(times_ms, costs, strict=True):
            # counts_at and estimate_at inlined: this is the replay's hot loop.
            number = math.floor(now / window)
            if w is None or number > w + 1 or number < w:
                cur = prev = 0
            elif number == w:
                cur, prev = c, p
            else:
                cur, prev = 0, c
            estimate = prev * ((window - (now - number * window)) / window) + cur
            if estimate + cost > limit:
                elapsed = now - number * window
                if cur + cost <= limit:
                    wait = math.ceil(window - elapsed - (limit - cost - cur) * window / prev)
                else:
                    wait = math.ceil(2 * window - elapsed - (limit - cost) * window / cur)
                wait = max(wait, 1)
                while estimate_at(now + wait) + cost > limit:
                    wait += 1
                while wait > 1 and estimate_at(now + wait - 1) + cost <= limit:
                    wait -= 1
                allowed.append(False)
                remaining.append(max(math.floor(limit - estimate), 0))
                retry.append(wait)
                reset.append(reset_at(now, cur, prev))
                continue
            cur += cost
            w, c, p = number, cur, prev
            allowed.append(True)
            remaining.append(math.floor(limit - estimate - cost))
            retry.append(0)
            reset.append(reset_at(now, cur, prev))
        self.state[identity] = (w, c, p)
        return allowed, remaining, retry, reset
