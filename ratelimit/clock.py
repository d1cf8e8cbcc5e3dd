"""Where a limiter reads the time: the host's clock, an injected one, or Redis's."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Literal

Clock = Callable[[], float] | Literal["redis"]

REDIS = "redis"

# 2^50 ms, about 35,000 years: far below 2^53, where doubles stop counting every ms.
MAX_ABS_MS = 2**50


def validate(clock: object) -> Clock:
    """Accept a zero-argument callable returning seconds, or the string "redis"."""
    if clock == REDIS or callable(clock):
        return clock  # type: ignore[return-value]
    raise ValueError(f'clock must be a callable returning seconds or "redis", got {clock!r}')


def to_ms(seconds: float) -> int:
    """Seconds as a float -> whole milliseconds, rounded down like Redis's TIME."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        raise ValueError(f"clock must return seconds as a number, got {seconds!r}")
    if not math.isfinite(seconds):
        raise ValueError(f"clock returned a non-finite time: {seconds!r}")
    ms = math.floor(seconds * 1000)
    # Lua computes in doubles: beyond this, sums of times and windows stop being exact
    # milliseconds (a clock in nanoseconds read as seconds would get there).
    if abs(ms) > MAX_ABS_MS:
        raise ValueError(
            f"clock returned {seconds!r} s, beyond +-{MAX_ABS_MS // 1000} s; "
            "it must return seconds (e.g. time.time, not time.time_ns)"
        )
    return ms


def now_ms(clock: Clock) -> int | None:
    """Current time in ms from `clock`, or None when Redis's clock is to be used."""
    if clock == REDIS:
        return None
    return to_ms(clock())  # type: ignore[operator]


DEFAULT: Clock = time.time


class ManualClock:
    """A virtual clock for simulations and tests: time moves only when told to.

    >>> clock = ManualClock(1000.0); clock.advance(0.25); clock()
    1000.25
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def set(self, seconds: float) -> None:
        self.now = float(seconds)

    def set_ms(self, ms: int) -> None:
        """Set the time so that `to_ms` reads back exactly `ms`.

        (ms / 1000 * 1000 can land a hair below ms and floor to ms - 1; the middle
        of the millisecond is safe from that rounding.)
        """
        self.now = (ms + 0.5) / 1000
