"""Rates as people write them: "10/s", "5/10s", "1000/h", "10 per second".

    parse_rate("5/10s")          # Rate(limit=5, window_ms=10000)
    str(Rate(100, 60_000))       # "100/min"

One grammar for every limiter, the HTTP layer and the lab's planner: REQUESTS, then
"/" or "per", then an optional multiplier and a unit. Units: ms; s, sec, second;
min, minute; h, hour; d, day; month (30 days) and year (360 days), as the `limits`
library counts them, so strings written for slowapi read the same here; plurals too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import validation

_DAY_MS = 86_400_000
_UNITS_MS: Mapping[str, int] = {
    "ms": 1, "millisecond": 1,
    "s": 1_000, "sec": 1_000, "second": 1_000,
    "min": 60_000, "minute": 60_000,
    "h": 3_600_000, "hr": 3_600_000, "hour": 3_600_000,
    "d": _DAY_MS, "day": _DAY_MS,
    "month": 30 * _DAY_MS,
    "year": 360 * _DAY_MS,
}  # fmt: skip
ACCEPTED = (
    "give REQUESTS/WINDOW, e.g. 100/min, 10/s, 1000/10s, 50/5min or '10 per second': "
    f"REQUESTS a whole number from 1 to {validation.MAX_LIMIT:,}, WINDOW a unit (ms, s, "
    "sec, second, min, minute, h, hour, d, day, month, year, or a plural) with an "
    "optional multiplier"
)
_RATE = re.compile(
    r"^\s*(?P<n>[+-]?(?:\d{1,3}(?:[,_]\d{3})+|\d+))\s*(?:/|\s[Pp][Ee][Rr]\s)\s*"
    r"(?P<k>\d+(?:\.\d+)?)?\s*(?P<unit>[A-Za-z]+)\s*$"
)


@dataclass(frozen=True)
class Rate:
    """`limit` requests per window of `window_ms` milliseconds."""

    limit: int
    window_ms: int

    def __post_init__(self) -> None:
        validation.limit(self.limit)
        validation.positive_int("window_ms", self.window_ms, validation.MAX_WINDOW_MS)

    @property
    def window_seconds(self) -> float:
        return self.window_ms / 1000

    def __str__(self) -> str:
        """The rate as people write it, which `parse_rate` reads back: "100/min"."""
        for unit, size in (("d", _DAY_MS), ("h", 3_600_000), ("min", 60_000), ("s", 1_000)):
            if self.window_ms % size == 0:
                k = self.window_ms // size
                return f"{self.limit}/{'' if k == 1 else k}{unit}"
        return f"{self.limit}/{self.window_ms}ms"


def parse_rate(text: str | Rate) -> Rate:
    """The `Rate` that `text` writes ("10/s", "5/10s", "100 per 2 hours"); a `Rate` is
    returned as it is. ValueError, naming `text` and what is accepted, for anything else."""
    if isinstance(text, Rate):
        return text
    if not isinstance(text, str):
        raise ValueError(f"a rate must be text such as '100/min', got {text!r}")
    found = _RATE.match(text)
    if found is None:
        raise ValueError(f"cannot read the rate {text!r}: {ACCEPTED}")
    unit = found["unit"].lower()
    if unit not in _UNITS_MS and unit.endswith("s") and unit[:-1] in _UNITS_MS:
        unit = unit[:-1]  # "seconds", "mins", "hours"
    if unit not in _UNITS_MS:
        raise ValueError(
            f"cannot read the rate {text!r}: unknown unit {found['unit']!r}; {ACCEPTED}"
        )
    count = int(found["n"].replace("_", "").replace(",", ""))
    if not 1 <= count <= validation.MAX_LIMIT:
        raise ValueError(
            f"cannot read the rate {text!r}: the number of requests must be from 1 to "
            f"{validation.MAX_LIMIT:,}, got {count:,}; {ACCEPTED}"
        )
    multiplier = float(found["k"]) if found["k"] is not None else 1.0
    window = multiplier * _UNITS_MS[unit]
    window_ms = round(window)
    if window_ms < 1 or abs(window - window_ms) > 1e-6:
        raise ValueError(
            f"cannot read the rate {text!r}: the window must be a positive whole number "
            f"of milliseconds; {ACCEPTED}"
        )
    if window_ms > validation.MAX_WINDOW_MS:
        raise ValueError(f"cannot read the rate {text!r}: the window must be at most a year")
    return Rate(count, window_ms)


def parse_rates(rates: str | Rate | Iterable[str | Rate]) -> list[Rate]:
    """Several rates: a list of rates, or one text with rates separated by ";"
    ("10/s; 1000/h", as `limits` writes them). At least one."""
    if isinstance(rates, (str, Rate)):
        items: list[Any] = rates.split(";") if isinstance(rates, str) else [rates]
    else:
        try:
            items = list(rates)
        except TypeError:
            raise ValueError(f"rates must be text or a list of rates, got {rates!r}") from None
    parsed = [parse_rate(item) for item in items]
    if not parsed:
        raise ValueError("give at least one rate, e.g. ['10/s', '1000/h']")
    return parsed
