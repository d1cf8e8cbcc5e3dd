"""Limits as people write them: "100/min" read (`parse_limit`) and written back
(`format_limit`), with the library's grammar (`ratelimit.rates`)."""

from __future__ import annotations

from typing import Any

from ratelimit import validation
from ratelimit.rates import Rate, parse_rate


def parse_limit(text: str) -> tuple[int, float]:
    """A limit as written by people, "100/min", as (requests, window in seconds):
    `parse_limit("100/min") == (100, 60.0)`. The grammar and its errors are
    `ratelimit.parse_rate`'s, the one every limiter reads."""
    rate = parse_rate(text)
    return rate.limit, rate.window_ms / 1000


def format_limit(limit: int, window_s: float) -> str:
    """A limit as people write it: `format_limit(100, 60) == "100/min"`."""
    return str(Rate(limit, round(window_s * 1000)))


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
