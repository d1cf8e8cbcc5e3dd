"""Checks on limiter parameters: bad input gets a ValueError naming the parameter."""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

MAX_WINDOW_MS = 366 * 24 * 3600 * 1000  # a year: longer windows are a configuration slip
MAX_LIMIT = 10**9
MAX_PREFIX_LENGTH = 100
_GLOB_OR_CONTROL = re.compile(r"[*?\[\]\\\x00-\x1f\x7f]")


def _integer(name: str, value: object) -> int:
    """`value` as an int: any integer type (numpy's too), never a bool, float or str."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    return int(value)


def positive_int(name: str, value: object, maximum: int) -> int:
    """Return `value` as an int if it is an integer in [1, maximum], else raise ValueError."""
    value = _integer(name, value)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def non_negative_int(name: str, value: object, maximum: int) -> int:
    """Return `value` as an int if it is an integer in [0, maximum], else raise ValueError."""
    value = _integer(name, value)
    if value == 0:
        return 0
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return positive_int(name, value, maximum)


def window_ms(window_seconds: Any, window_ms: Any) -> int:
    """Resolve the window from exactly one of `window_seconds` and `window_ms`."""
    if (window_seconds is None) == (window_ms is None):
        raise ValueError("give exactly one of window_seconds and window_ms")
    if window_ms is not None:
        return positive_int("window_ms", window_ms, MAX_WINDOW_MS)
    return positive_int("window_seconds", window_seconds, MAX_WINDOW_MS // 1000) * 1000


def limit(value: object, maximum: int = MAX_LIMIT) -> int:
    if value is None:
        raise ValueError("limit is required")
    return positive_int("limit", value, maximum)


def cost(value: object, limit: int) -> int:
    """A request's cost: an integer from 1 to the limit (a larger one could never pass)."""
    value = positive_int("cost", value, MAX_LIMIT)
    if value > limit:
        raise ValueError(f"cost must be <= limit ({limit}), got {value}")
    return value


def prefix(value: object) -> str:
    """Key prefix: short text without braces (they would steer Redis Cluster slots),
    glob characters or control characters."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"prefix must be a non-empty string, got {value!r}")
    if len(value) > MAX_PREFIX_LENGTH:
        raise ValueError(f"prefix must be at most {MAX_PREFIX_LENGTH} characters")
    if "{" in value or "}" in value:
        raise ValueError(f"prefix must not contain braces (Redis Cluster hash tags): {value!r}")
    if _GLOB_OR_CONTROL.search(value):
        # Keys are found (and cleaned up) by SCAN MATCH "<prefix>:*": a pattern character
        # in the prefix would match, and delete, the keys of other prefixes.
        raise ValueError(
            "prefix must not contain glob characters (* ? [ ] \\) or control characters: "
            f"{value!r}"
        )
    return value


def on_error(value: object) -> str:
    if value not in ("raise", "allow", "deny"):
        raise ValueError(f'on_error must be "raise", "allow" or "deny", got {value!r}')
    return value


def timeout(value: object) -> float:
    """Seconds a check may wait for Redis: a finite positive number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"timeout must be a number of seconds, got {value!r}")
    if not 0 < value <= 3600:
        raise ValueError(f"timeout must be > 0 and <= 3600 seconds, got {value}")
    return float(value)


# Simulation and planning parameters (rates, durations, shares) may be fractional;
# these checks give them the same clear messages as the limiter's own.


def number(name: str, value: object) -> float:
    """A finite real number, as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def positive(name: str, value: object) -> float:
    """A finite number > 0 (rates in requests/s, durations in s)."""
    value = number(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def non_negative(name: str, value: object) -> float:
    """A finite number >= 0."""
    value = number(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def count(name: str, value: object, minimum: int = 1) -> int:
    """An integer (numpy integers too) >= minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def fixed_window_periods(window_ms: int) -> int:
    """P, how many window numbers lua/fixed_window.lua tells apart: enough that two
    windows P/2 or more apart lie more than a year apart (no key, clock skew or replay
    lasts longer). It depends on the window alone, so limiters that differ only in
    their limit read each other's counts."""
    return -(-2 * MAX_WINDOW_MS // window_ms)


def fixed_window_range(window_ms: int, limit: int) -> None:
    """ValueError when lua/fixed_window.lua could not count `limit` exactly in windows of
    `window_ms`: it packs (window number mod P) * M + count into one integer below
    2**53, with M = floor(2**53 / P) and a count of at most 2 * limit. Only rates above
    about 35 million per second fail."""
    if 2 * limit + 1 > 2**53 // fixed_window_periods(window_ms):
        raise ValueError(
            f"a fixed window of {limit} per {window_ms} ms is beyond what the script can "
            "count exactly; use a longer window or a smaller limit"
        )
