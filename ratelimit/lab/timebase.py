"""The lab's side of `ratelimit.clock`: whole-millisecond times for whole arrays.

The limiters stamp a request with `floor(seconds * 1000)` (`ratelimit.clock.to_ms`);
the replay and the metrics convert whole traces the same way, with `seconds_to_ms`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MAX_ABS_MS", "seconds_to_ms"]

# Largest |ms| accepted: far beyond any real clock, and leaves room for `t - window`
# in int64 without overflow.
MAX_ABS_MS = 2**62


def seconds_to_ms(seconds: Any) -> np.ndarray:
    """Float seconds -> int64 ms, `floor(seconds * 1000)` elementwise, as the limiters do.

    Equal, element by element, to `ratelimit.clock.to_ms`. NaN, infinite or absurdly
    large times raise ValueError.
    """
    values = np.asarray(seconds, dtype=np.float64).ravel()
    if not np.isfinite(values).all():
        raise ValueError("timestamps must be finite numbers of seconds (found NaN or inf)")
    ms = np.floor(values * 1000.0)
    if ms.size and np.abs(ms).max() >= MAX_ABS_MS:
        raise ValueError("timestamps are out of range")
    return ms.astype(np.int64)


