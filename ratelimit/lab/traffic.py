"""Seeded synthetic traffic: request traces to replay against the limiters.

Every generator returns a pandas DataFrame with one row per request and the columns

- ``time``: float seconds since the start of the trace, sorted ascending (ties allowed),
- ``identity``: the client (API key) making the request, text,
- ``cost``: int64 >= 1, the units the request takes from the client's budget,
- ``replica``: int64 >= 0, the API replica that handles it,

in this order and with index ``0..n-1``; some generators add columns after these
(``radius_m``, ``clock_offset``). Random generators take ``seed`` and draw from
``numpy.random.default_rng(seed)``: the same seed gives an identical frame (with the
pinned numpy), a different seed a different one. Bad parameters raise ``ValueError``
naming the parameter.

``ratelimit.lab.simulation.replay`` decides each request at ``math.floor(time * 1000)`` ms
(plus ``clock_offset`` where present), so time 0 is a boundary of every fixed window. A
replay that adds its own start time should pick a whole multiple of the window, or
``boundary_attack`` no longer straddles the limiter's boundaries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ratelimit import validation
from ratelimit.costs import geofence_cost

__all__ = [
    "boundary_attack",
    "geofence_mix",
    "merge",
    "on_off",
    "poisson",
    "replica_clocks",
    "skewed_replicas",
    "zipf_fleet",
]

COLUMNS = ("time", "identity", "cost", "replica")
"""The four standard columns, in order."""

FILL_VALUES: dict[str, float] = {"clock_offset": 0.0, "radius_m": math.nan}
"""What `merge` puts in an extra column for rows of a trace that lacks it."""

MAX_EXPECTED_REQUESTS = 50_000_000
"""Refuse traces expected to be larger than this (a few GB): a unit slip, not a plan."""

_NS_PER_S = 10**9


# --- parameter checks ---------------------------------------------------------------


def _identity(value: Any, name: str = "identity") -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _rng(seed: Any) -> np.random.Generator:
    return np.random.default_rng(validation.count("seed", seed, minimum=0))


def _expected(rate: float, duration: float, rate_name: str = "rate") -> None:
    expected = rate * duration
    if expected > MAX_EXPECTED_REQUESTS:
        raise ValueError(
            f"{rate_name} * duration = {expected:.3g} expected requests; "
            f"more than {MAX_EXPECTED_REQUESTS:,} is refused (check the units)"
        )


# --- shared building blocks ---------------------------------------------------------


def _arrivals(rng: np.random.Generator, rate: float, span: float) -> np.ndarray:
    """Poisson process at `rate` per second on [0, span): cumulative exponential gaps.

    Gaps are drawn in chunks a little larger than the expected count, so one chunk
    nearly always suffices; the stream consumed is a function of the parameters only.
    """
    expected = rate * span
    chunk = int(expected + 6.0 * math.sqrt(expected) + 16)
    parts = []
    last = 0.0
    while True:
        times = last + np.cumsum(rng.exponential(1.0 / rate, chunk))
        parts.append(times)
        last = float(times[-1])
        if last >= span:
            break
    times = np.concatenate(parts)
    return times[times < span]


def _frame(
    time: Any,
    identity: Any,
    cost: Any = 1,
    replica: Any = 0,
    extra: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Build a trace: standard columns (scalars broadcast), then `extra`, stably sorted.

    Rows with equal times keep the order they were given in.
    """
    time = np.asarray(time, dtype=np.float64)
    n = len(time)
    ordered = n < 2 or bool(np.all(time[1:] >= time[:-1]))
    order = None if ordered else np.argsort(time, kind="stable")

    def column(values: Any, dtype: Any = None) -> Any:
        if isinstance(values, pd.Series):
            values = values.to_numpy() if dtype is not None else values.array
        elif np.ndim(values) == 0:
            return np.full(n, values, dtype=dtype)
        else:
            values = np.asarray(values, dtype=dtype)
        values = values if dtype is None else np.asarray(values, dtype=dtype)
        return values if order is None else values[order]

    data: dict[str, Any] = {
        "time": column(time),
        "identity": pd.array(column(identity, object), dtype="str"),
        "cost": column(cost, np.int64),
        "replica": column(replica, np.int64),
    }
    for name, values in (extra or {}).items():
        data[name] = column(values)
    return pd.DataFrame(data, index=pd.RangeIndex(n))


def _floor_ms_exact(times_ns: np.ndarray) -> np.ndarray:
    """Seconds as floats for integer ns, nudged by an ulp or two where needed so that
    ``math.floor(t * 1000)`` (float arithmetic) is the true whole millisecond.

    ``ns / 1e9`` is the nearest float, but ``1.001 * 1000`` computes to
    ``1000.9999999999999``: without the nudge that request would be stamped 1000 ms.
    """
    times = times_ns / _NS_PER_S
    want = times_ns // 1_000_000
    for _ in range(8):
        got = np.floor(times * 1000)
        low, high = got < want, got > want
        if not (low.any() or high.any()):
            break
        times = np.where(low, np.nextafter(times, np.inf), times)
        times = np.where(high, np.nextafter(times, -np.inf), times)
    return times


def _evenly(count: int, magnitude: float) -> np.ndarray:
    """`count` values evenly spread over [-magnitude, +magnitude], ascending; [0] for one."""
    if count == 1:
        return np.zeros(1)
    return np.linspace(-magnitude, magnitude, count)


# --- generators ---------------------------------------------------------------------


def poisson(
    rate: float,
    duration: float,
    *,
    identity: str = "client",
    seed: int = 0,
    replicas: int = 1,
) -> pd.DataFrame:
    """One client sending at a steady random rate: a Poisson process.

    Parameters: ``rate`` mean requests per second (> 0); ``duration`` seconds, times lie
    in [0, duration); ``identity`` the client; ``seed``; ``replicas`` (>= 1) API replicas
    that take the requests in turn (request i goes to replica i % replicas). Cost 1.
    """
    rate = validation.positive("rate", rate)
    duration = validation.positive("duration", duration)
    identity = _identity(identity)
    replicas = validation.count("replicas", replicas)
    _expected(rate, duration)
    times = _arrivals(_rng(seed), rate, duration)
    return _frame(times, identity, 1, np.arange(len(times)) % replicas)


def on_off(
    rate_on: float,
    on: float,
    off: float,
    duration: float,
    *,
    identity: str = "client",
    seed: int = 0,
) -> pd.DataFrame:
    """One bursty client: Poisson at ``rate_on`` for ``on`` seconds, then silent for ``off``.

    The cycle starts with an on-phase at time 0 and repeats every ``on + off`` seconds
    until ``duration`` (times in [0, duration)). ``rate_on`` requests per second (> 0),
    ``on`` seconds (> 0), ``off`` seconds (>= 0; 0 gives plain Poisson traffic),
    ``duration`` seconds (> 0). Cost 1, replica 0. The long-run mean rate is
    ``rate_on * on / (on + off)``.
    """
    rate_on = validation.positive("rate_on", rate_on)
    on = validation.positive("on", on)
    off = validation.non_negative("off", off)
    duration = validation.positive("duration", duration)
    identity = _identity(identity)
    period = on + off
    full_cycles, rest = divmod(duration, period)
    on_total = full_cycles * on + min(on, rest)  # seconds of on-phase inside the trace
    _expected(rate_on, on_total, "rate_on")
    # A Poisson process on the concatenated on-phases, then cut into bursts.
    busy = _arrivals(_rng(seed), rate_on, on_total)
    cycle, into = np.divmod(busy, on)
    times = cycle * period + into
    return _frame(times[times < duration], identity)


def boundary_attack(
    limit: int,
    window: float,
    *,
    boundary: float = 1.0,
    spread: float = 0.01,
    identity: str = "attacker",
    cycles: int = 1,
    seed: int = 0,
) -> pd.DataFrame:
    """A client that exploits fixed-window counters: ``limit`` just before a boundary,
    ``limit`` again just after it.

    Each cycle sends ``limit`` requests evenly spaced in [b - spread, b) (the last one at
    ``b - spread / limit``) and ``limit`` more in [b, b + spread) (the first one exactly
    at ``b``), where b is that cycle's boundary. Cycle k (0-based) uses
    ``b = boundary + 2 * k * window``: every burst lands in a window of its own, so a
    fixed-window limiter of ``limit`` per ``window`` whose boundaries include
    ``boundary`` admits all ``2 * limit`` of each cycle within ``2 * spread`` seconds,
    while a sliding log admits only ``limit`` per cycle.

    Parameters: ``limit`` requests per window (>= 1); ``window`` seconds (> 0);
    ``boundary`` seconds (>= spread, so no time is negative); ``spread`` seconds
    (0 < spread <= window); ``cycles`` (>= 1). Deterministic: ``seed`` is checked and
    otherwise ignored. Cost 1, replica 0.

    Times are computed in whole nanoseconds (boundary, spread and window rounded to ns;
    uneven divisions rounded away from the boundary on the early side, towards it on
    the late side), then converted to float and, where float arithmetic would
    misplace them, moved by an ulp or two so that ``math.floor(t * 1000)`` is the
    request's true millisecond (``1.001 * 1000`` computes to ``1000.9999999999999``).
    With the defaults and ``limit=10`` the times floor to 990, 991, ... 999 ms and
    1000, ... 1009 ms. Requests before a boundary are always strictly before it.
    """
    limit = validation.count("limit", limit)
    window = validation.positive("window", window)
    boundary = validation.non_negative("boundary", boundary)
    spread = validation.positive("spread", spread)
    identity = _identity(identity)
    cycles = validation.count("cycles", cycles)
    validation.count("seed", seed, minimum=0)
    if spread > window:
        raise ValueError(f"spread must be <= window ({window!r} s), got {spread!r}")
    if boundary < spread:
        raise ValueError(f"boundary must be >= spread ({spread!r} s), got {boundary!r}")
    spread_ns = round(spread * _NS_PER_S)
    if spread_ns < limit:
        raise ValueError(
            f"spread must leave at least 1 ns per request ({limit} ns), got {spread!r}"
        )
    boundary_ns = round(boundary * _NS_PER_S)
    window_ns = round(window * _NS_PER_S)
    if 2 * limit * cycles > MAX_EXPECTED_REQUESTS:
        raise ValueError(
            f"limit * cycles: 2 * {limit} * {cycles} requests; more than "
            f"{MAX_EXPECTED_REQUESTS:,} is refused (check the units)"
        )
    if boundary_ns + 2 * (cycles - 1) * window_ns + spread_ns >= 2**53:
        raise ValueError("boundary + 2 * (cycles - 1) * window must stay below 2**53 ns (104 days)")

    # Offsets from the boundary in ns, exact in integers: i * spread / limit, split as
    # i * q + i * r / limit to stay within int64 for any limit.
    q, r = divmod(spread_ns, limit)
    i = np.arange(limit, dtype=np.int64)
    after = i * q + (i * r) // limit  # floor: 0 for the first, < spread for the last
    k = limit - i
    before = k * q + (k * r + limit - 1) // limit  # ceil: >= 1 ns, <= spread
    offsets = np.concatenate([-before, after])
    starts = boundary_ns + 2 * window_ns * np.arange(cycles, dtype=np.int64)
    times_ns = (starts[:, None] + offsets[None, :]).ravel()
    times = _floor_ms_exact(times_ns)
    # Strictly before each boundary, whatever the float resolution at this magnitude.
    before_boundary = (np.arange(len(times)) // limit) % 2 == 0
    limits = np.nextafter(np.repeat(starts / _NS_PER_S, 2 * limit), -np.inf)
    times = np.where(before_boundary, np.minimum(times, limits), times)
    return _frame(times, identity)


def zipf_fleet(
    clients: int,
    total_rate: float,
    duration: float,
    *,
    exponent: float = 1.1,
    seed: int = 0,
) -> pd.DataFrame:
    """Many clients with Zipf-distributed popularity, Poisson traffic overall.

    Requests arrive as one Poisson process at ``total_rate`` requests per second over
    [0, duration) seconds; each is sent by client k (1..``clients``) with probability
    proportional to ``1 / k ** exponent`` (``exponent`` >= 0; 0 is uniform). So client
    k's own traffic is Poisson too, at ``total_rate * k**-exponent / H`` with
    ``H = sum(j**-exponent for j in 1..clients)``. Identities are ``"client-00001"``
    (the most popular), ``"client-00002"`` ... zero-padded to at least 5 digits.
    Cost 1, replica 0.
    """
    clients = validation.count("clients", clients)
    total_rate = validation.positive("total_rate", total_rate)
    duration = validation.positive("duration", duration)
    exponent = validation.non_negative("exponent", exponent)
    _expected(total_rate, duration, "total_rate")
    rng = _rng(seed)
    times = _arrivals(rng, total_rate, duration)
    weights = np.arange(1, clients + 1, dtype=np.float64) ** -exponent
    who = rng.choice(clients, size=len(times), p=weights / weights.sum())
    width = max(5, len(str(clients)))
    names = np.array([f"client-{k:0{width}d}" for k in range(1, clients + 1)], dtype=object)
    return _frame(times, names[who])


def geofence_mix(
    rate: float,
    duration: float,
    *,
    seed: int = 0,
    identity: str = "client",
    median_radius_m: float = 150.0,
    radius_sigma: float = 1.0,
    max_radius_m: float = 5000.0,
    max_cost: int = 10,
) -> pd.DataFrame:
    """One client's geofence look-ups ("everything within r metres"), costed by radius.

    Poisson at ``rate`` requests per second over [0, ``duration``) seconds. The radius
    (column ``radius_m``, metres, after the standard columns) is log-normal with median
    ``median_radius_m`` (> 0) and log-space standard deviation ``radius_sigma`` (>= 0),
    cut off at ``max_radius_m`` (> 0): with the defaults about 89% of look-ups are
    within 500 m (cost 1), about 1% beyond 1.5 km (cost 10), and none beyond 5 km. ``cost`` is
    ``ratelimit.costs.geofence_cost(radius_m, max_cost)``. Replica 0.
    """
    rate = validation.positive("rate", rate)
    duration = validation.positive("duration", duration)
    identity = _identity(identity)
    median_radius_m = validation.positive("median_radius_m", median_radius_m)
    radius_sigma = validation.non_negative("radius_sigma", radius_sigma)
    max_radius_m = validation.positive("max_radius_m", max_radius_m)
    max_cost = validation.count("max_cost", max_cost)
    _expected(rate, duration)
    rng = _rng(seed)
    times = _arrivals(rng, rate, duration)
    radius = rng.lognormal(math.log(median_radius_m), radius_sigma, len(times))
    radius = np.minimum(radius, max_radius_m)
    costs = np.fromiter((geofence_cost(r, max_cost) for r in radius), np.int64, len(radius))
    return _frame(times, identity, costs, extra={"radius_m": radius})


def replica_clocks(replicas: int = 3, max_offset: float = 0.05, drift_ppm: float = 0.0):
    """The clocks of ``skewed_replicas``: one row per replica, columns ``replica``,
    ``offset`` (seconds) and ``drift_ppm`` (parts per million).

    Offsets are spread evenly over [-max_offset, +max_offset] and drifts over
    [-drift_ppm, +drift_ppm], both ascending with the replica number: replica 0 is the
    furthest behind and slowest, the last replica the furthest ahead and fastest. A
    single replica keeps true time (offset 0, drift 0).
    """
    replicas = validation.count("replicas", replicas)
    max_offset = validation.non_negative("max_offset", max_offset)
    drift_ppm = validation.non_negative("drift_ppm", drift_ppm)
    if drift_ppm >= 1e6:
        raise ValueError(f"drift_ppm must be < 1,000,000 (a clock that runs), got {drift_ppm}")
    return pd.DataFrame(
        {
            "replica": np.arange(replicas, dtype=np.int64),
            "offset": _evenly(replicas, max_offset),
            "drift_ppm": _evenly(replicas, drift_ppm),
        }
    )


def skewed_replicas(
    rate: float,
    duration: float,
    *,
    replicas: int = 3,
    max_offset: float = 0.05,
    drift_ppm: float = 0.0,
    seed: int = 0,
    identity: str = "client",
) -> pd.DataFrame:
    """One client's Poisson requests served in turn by replicas whose clocks disagree.

    ``rate`` requests per second over [0, ``duration``) seconds; request i goes to
    replica ``i % replicas``. Replica r's clock reads ``true time + offset_r +
    drift_r * 1e-6 * true time``, with the offsets and drifts of
    ``replica_clocks(replicas, max_offset, drift_ppm)``: evenly spread over
    [-max_offset, +max_offset] seconds and [-drift_ppm, +drift_ppm] ppm, replica 0 the
    furthest behind, the last one the furthest ahead (one replica: no skew). Column
    ``clock_offset`` (after the standard ones) is that replica's clock minus true time at
    the request, in seconds; the replica stamps the request at ``time + clock_offset``.
    ``time`` stays true time and the frame is sorted by it. Cost 1.
    """
    rate = validation.positive("rate", rate)
    duration = validation.positive("duration", duration)
    identity = _identity(identity)
    clocks = replica_clocks(replicas, max_offset, drift_ppm)
    _expected(rate, duration)
    times = _arrivals(_rng(seed), rate, duration)
    replica = np.arange(len(times)) % len(clocks)
    offset = clocks["offset"].to_numpy()[replica]
    drift = clocks["drift_ppm"].to_numpy()[replica] * 1e-6
    return _frame(times, identity, 1, replica, extra={"clock_offset": offset + drift * times})


def merge(*frames: pd.DataFrame) -> pd.DataFrame:
    """Interleave several traces into one, sorted by time.

    Ties keep argument order (rows of the first frame first), then each frame's own
    order. Extra columns are kept, after the standard ones in order of first appearance;
    rows from a frame without one get ``clock_offset`` 0.0 (a replica with a true
    clock), ``radius_m`` NaN, and NaN for any other column. No frames: an empty trace.
    """
    for position, frame in enumerate(frames):
        if not isinstance(frame, pd.DataFrame):
            raise ValueError(f"frames[{position}] must be a DataFrame, got {type(frame).__name__}")
        missing = [name for name in COLUMNS if name not in frame.columns]
        if missing:
            raise ValueError(f"frames[{position}] lacks the column(s) {', '.join(missing)}")
    extras: list[str] = []
    for frame in frames:
        extras += [c for c in frame.columns if c not in COLUMNS and c not in extras]
    if not frames:
        return _frame([], [])
    filled = [
        frame.reset_index(drop=True).assign(
            **{name: FILL_VALUES.get(name, math.nan) for name in extras if name not in frame}
        )
        for frame in frames
    ]
    joined = pd.concat(filled, ignore_index=True, sort=False)
    extra = {name: joined[name] for name in extras}
    return _frame(joined["time"], joined["identity"], joined["cost"], joined["replica"], extra)
