"""Request costs for cost-weighted limits: a geofence look-up is charged by its area.

    from ratelimit.costs import geofence_cost
    geofence_cost(300)     # 1: a look-up within 500 m
    geofence_cost(1000)    # 4: four times the area of the free disc

Pass the cost to `limiter.check(identity, cost)`, or to `ratelimit.http.rate_limit`
as `cost=`. The lab's geofence traffic prices its look-ups with the same function.
"""

from __future__ import annotations

import math

from . import validation

__all__ = ["GEOFENCE_FREE_RADIUS_M", "GEOFENCE_MAX_COST", "geofence_cost"]

GEOFENCE_FREE_RADIUS_M = 500.0
"""Geofence look-ups up to this radius (metres) cost 1; larger ones cost by area."""

GEOFENCE_MAX_COST = 10
"""The default cap: the cost of every look-up beyond 1.5 km."""


def geofence_cost(radius_m: float, max_cost: int = GEOFENCE_MAX_COST) -> int:
    """Budget units for a geofence look-up of `radius_m` metres.

    1 up to `GEOFENCE_FREE_RADIUS_M` (500 m); above it the cost follows the area
    searched, `ceil((radius_m / 500) ** 2)` (2 just above 500 m, 4 at 1 km, 9 at
    1.5 km), capped at `max_cost` (>= 1; the default 10 is reached just above 1.5 km).
    A limiter must allow at least `max_cost` per window, or the largest look-ups
    could never pass. A negative, NaN or infinite radius raises ValueError.
    """
    radius_m = validation.non_negative("radius_m", radius_m)
    max_cost = validation.count("max_cost", max_cost)
    ratio = radius_m / GEOFENCE_FREE_RADIUS_M
    return min(max(math.ceil(ratio * ratio), 1), max_cost)  # ratio * ratio: as numpy squares
