"""Limits as people write them: "100/min" read (`parse_limit`) and written back
(`format_limit`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ratelimit import validation

_UNITS_MS: Mapping[str, int] = {
    "ms": 1,
    "s": 1_000, "sec": 1_000, "second": 1_000,
    "min": 60_000, "minute": 60_000,
    "h": 3_600_000, "hour": 3_600_000,
    "d": 86_400_000, "day": 86_400_000,
}  # fmt: skip
_ACCEPTED = (
    "give REQUESTS/WINDOW, e.g. 100/min, 10/s, 1000/10s or 50/5min: REQUESTS a whole "
    f"number from 1 to {validation.MAX_LIMIT:,}, WINDOW a unit (ms, s, sec, second, min, "
    "minute, h, hour, d, day, or a plural) with an optional multiplier"
)
_LIMIT = re.compile(
    r"^\s*(?P<n>[+-]?(?:\d{1,3}(?:[,_]\d{3})+|\d+))\s*/\s*(?P<k>\d+(?:\.\d+)?)?\s*"
    r"(?P<unit>[A-Za-z]+)\s*$"
)


def parse_limit(text: str) -> tuple[int, float]:
    """A limit as written by people, "100/min", as (requests, window in seconds):
    `parse_limit("100/min") == (100, 60.0)`, `parse_limit("1000/10s") == (1000, 10.0)`.

    Units: ms, s, sec, second, min, minute, h, hour, d, day (and plurals), with an
    optional multiplier (5min, 1.5h; the window must be whole milliseconds, at most a
    year). ValueError, naming `text` and what is accepted, for anything else.
    """
    if not isinstance(text, str):
        raise ValueError(f"a limit must be text such as '100/min', got {text!r}")
    found = _LIMIT.match(text)
    if found is None:
        raise ValueError(f"cannot read the limit {text!r}: {_ACCEPTED}")
    unit = found["unit"].lower()
    if unit not in _UNITS_MS and unit.endswith("s") and unit[:-1] in _UNITS_MS:
        unit = unit[:-1]  # "seconds", "mins", "hours"
    if unit not in _UNITS_MS:
        raise ValueError(
            f"cannot read the limit {text!r}: unknown unit {found['unit']!r}; {_ACCEPTED}"
        )
    count = int(found["n"].replace("_", "").replace(",", ""))
    if not 1 <= count <= validation.MAX_LIMIT:
        raise ValueError(
            f"cannot read the limit {text!r}: the number of requests must be from 1 to "
            f"{validation.MAX_LIMIT:,}, got {count:,}; {_ACCEPTED}"
        )
    multiplier = float(found["k"]) if found["k"] is not None else 1.0
    window = multiplier * _UNITS_MS[unit]
    window_ms = round(window)
    if window_ms < 1 or abs(window - window_ms) > 1e-6:
        raise ValueError(
            f"cannot read the limit {text!r}: the window must be a positive whole number "
            f"of milliseconds; {_ACCEPTED}"
        )
    if window_ms > validation.MAX_WINDOW_MS:
        raise ValueError(f"cannot read the limit {text!r}: the window must be at most a year")
    return count, window_ms / 1000


def format_limit(limit: int, window_s: float) -> str:
    """A limit as people write it: `format_limit(100, 60) == "100/min"`."""
    window_ms = round(window_s * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000)):
        if window_ms % size == 0:
            k = window_ms // size
            return f"{limit}/{'' if k == 1 else k}{unit}"
    return f"{limit}/{window_ms}ms"


def _candidate_limit(spec: Any) -> tuple[str, int, int]:
    """(text, limit, window_ms) from "100/min" or a (limit, window_s) pair."""
    if isinstance(spec, str):
        limit, window_s = parse_limit(spec)
        return spec.strip(), limit, round(window_s * 1000)
    if isinstance(spec, tuple) and len(spec) == 2:
        limit = validation.limit(spec[0])
        window_s = validation.positive("window_s", spec[1])
        if abs(window_s * 1000 - round(window_s * 1000)) > 1e-6:
            raise ValueError(f"window_s must be whole milliseconds, got {spec[1]!r}")
        text = format_limit(limit, window_s)
        limit, window_s = parse_limit(text)
        return text, limit, round(window_s * 1000)
    raise ValueError(
        f"a limit must be text such as '100/min' or a (limit, window_s) pair, got {spec!r}"
    )
