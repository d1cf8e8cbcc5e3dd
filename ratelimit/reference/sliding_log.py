"""Sliding-window log, as in lua/sliding_log.lua: one sorted list of unit stamps."""

from __future__ import annotations

from bisect import bisect_right, insort

from .. import algorithms
from .base import Outcome, ReferenceLimiter


class SlidingWindowLimiter(ReferenceLimiter):
    """Exact: admits while the cost stamped in (now - window, now] stays within the limit."""

    algorithm = algorithms.SLIDING_LOG

    def run(self, identity: bytes, times_ms: list[int], costs: list[int]) -> Outcome:
        window, limit = self.window_ms, self.limit
        # One stamp per admitted unit of cost, like the sorted set's members.
        stamps: list[int] = self.state.setdefault(identity, [])
        allowed, remaining, retry, reset = [], [], [], []
        for now, cost in zip(times_ms, costs, strict=True):
            edge = now - window
            if stamps and stamps[0] <= edge:
                del stamps[: bisect_right(stamps, edge)]
            count = len(stamps)
            if count + cost > limit:
                allowed.append(False)
                remaining.append(max(limit - count, 0))
                retry.append(stamps[count + cost - limit - 1] + window - now)
                reset.append(stamps[-1] + window - now)
                continue
            if not stamps or now >= stamps[-1]:
                if cost == 1:
                    stamps.append(now)
                else:
                    stamps.extend([now] * cost)
            else:  # a replica whose clock runs behind: keep the list sorted
                for _ in range(cost):
                    insort(stamps, now)
            allowed.append(True)
            remaining.append(limit - count - cost)
            retry.append(0)
            reset.append(stamps[-1] + window - now)
        return allowed, remaining, retry, reset
