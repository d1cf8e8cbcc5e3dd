"""In-memory reference models: the executable statement of each algorithm.

Same class names, options and `Decision`s as the Redis limiters, minus the client:

    from ratelimit.lab.reference import SlidingWindowLimiter
    limiter = SlidingWindowLimiter(1, 10, clock=ManualClock())
    limiter.check("alice")

Each model mirrors the Lua script of the same name in `ratelimit/lua/`; the
property tests hold them to identical decisions. `TieredLimiter` (lua/tiers.lua) puts
several rates on one identity, each tier the model of the tiers' algorithm:

    TieredLimiter(["10/s", "1000/h"], algorithm="gcra", clock=ManualClock()).check("alice")

Importing this package (as any lab module does) registers each model with its
algorithm, where `ratelimit.algorithms.get(tag).limiter_class("reference")` finds it.
"""

from ratelimit import algorithms

from .base import ReferenceLimiter
from .fixed_window import FixedWindowLimiter
from .gcra import TokenBucketLimiter
from .sliding_log import SlidingWindowLimiter
from .sliding_window_counter import SlidingWindowCounterLimiter
from .tiers import TieredLimiter

__all__ = [
    "FixedWindowLimiter",
    "ReferenceLimiter",
    "SlidingWindowCounterLimiter",
    "SlidingWindowLimiter",
    "TieredLimiter",
    "TokenBucketLimiter",
]

algorithms.register("reference", FixedWindowLimiter, algorithms.FIXED_WINDOW)
algorithms.register("reference", SlidingWindowCounterLimiter, algorithms.SLIDING_WINDOW_COUNTER)
algorithms.register("reference", TokenBucketLimiter, algorithms.GCRA)
# One model for the log in either storage: they decide alike.
algorithms.register("reference", SlidingWindowLimiter, *algorithms.LOG_STORAGES.values())
