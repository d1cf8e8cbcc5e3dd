"""Which limit to pick: the spread of per-client peaks in one window, and the smallest
limit that affects at most a given share of clients (`Recommendation`), verified by
replaying the kept requests (`kept.KeptTrace`) with the compiled replayers."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from ratelimit import algorithms as registry
from ratelimit import validation

from .kept import KeptTrace
from .resolution import Stamps

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
"""The percentiles of per-client peaks a recommendation reports (and `max`)."""
_REPLAY_ROWS = 1 << 20  # one replay's decisions are made this many rows at a time


def percentile_key(q: float) -> str:
    """The name of percentile `q` in the JSON: "p50", "p99_9"."""
    return "p" + f"{q:g}".replace(".", "_")


def peak_percentiles(peaks: np.ndarray) -> dict[str, int]:
    """p50 .. p99.9 and max of per-client peaks: observed values (the smallest peak
    with at least q% of clients at or below it), 0 for no clients."""
    if len(peaks) == 0:
        return {**{percentile_key(q): 0 for q in PERCENTILES}, "max": 0}
    values = np.percentile(peaks, PERCENTILES, method="inverted_cdf")
    found = {percentile_key(q): int(v) for q, v in zip(PERCENTILES, values, strict=True)}
    return {**found, "max": int(peaks.max())}


def parse_affect(text: str) -> float:
    """A share of clients as written: "1%" or "0.01" -> 0.01; from 0 to below 1."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise ValueError(
            f"the share of clients to affect must be from 0 to below 100%, e.g. 1% or 0.01, "
            f"got {text!r}"
        )
    return value


@dataclass(frozen=True)
class Outcome:
    """One limit replayed on a kept trace."""

    limit: int
    rejected: int  # requests the limiter rejected
    refused: int  # requests costing more than the limit (never checked)
    identities_affected: int  # identities rejected or refused at least once
    rejected_by_code: np.ndarray  # per identity code


def replay(
    trace: KeptTrace,
    algorithm: str,
    limit: int,
    window_ms: int,
    identities: int,
    stamps: Stamps | None = None,
) -> Outcome:
    """Decide every kept request under `limit` per `window_ms` with `algorithm`'s
    compiled replayer, in the kept order, a block at a time (with the stamps spread
    when `stamps`, counted on this trace's times, is given)."""
    return replay_many(trace, algorithm, [limit], window_ms, identities, stamps)[limit]


def replay_many(
    trace: KeptTrace,
    algorithm: str,
    limits: Iterable[int],
    window_ms: int,
    identities: int,
    stamps: Stamps | None = None,
) -> dict[int, Outcome]:
    """`replay` at each of `limits`, in one pass over the kept requests: each block is
    read once and decided under every limit, the limits in threads of their own (the
    compiled replayers let go of the GIL) on up to as many cores as there are. Each
    limit's requests are decided in the kept order, so the outcomes are `replay`'s."""
    from .. import fastreplay

    wanted = sorted(set(limits))
    replays = {}
    for limit in wanted:
        model = registry.get(algorithm).build("reference", window_ms=window_ms, limit=limit)
        replays[limit] = _Replay(fastreplay.Replayer.for_model(model), identities)
    place = None if stamps is None else stamps.spreading()
    workers = max(1, min(len(wanted), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers, thread_name_prefix="ratelimit-replay") as pool:
        for codes, kept_times, costs in trace.blocks():
            times = kept_times if place is None else place(kept_times)
            # One block at a time for every limit: a limit's blocks stay in order.
            every = replays.values()
            list(pool.map(_Replay.decide, every, repeat(codes), repeat(times), repeat(costs)))
    return {limit: r.outcome(limit) for limit, r in replays.items()}


class _Replay:
    """One limit's replay on a kept trace: its replayer and counts per identity."""

    def __init__(self, replayer: Any, identities: int) -> None:
        self.replayer = replayer
        self.refused_by = np.zeros(identities, dtype=np.int64)
        self.rejected_by = np.zeros(identities, dtype=np.int64)

    def decide(self, codes: np.ndarray, times: np.ndarray, costs: np.ndarray) -> None:
        n = len(self.refused_by)
        fits = costs <= self.replayer.max_cost
        self.refused_by += np.bincount(codes[~fits], minlength=n)
        c, t, k = codes[fits], times[fits], costs[fits]
        for at in range(0, len(c), _REPLAY_ROWS):
            part = slice(at, at + _REPLAY_ROWS)
            allowed = self.replayer.decide(c[part], t[part], k[part])[0]
            self.rejected_by += np.bincount(c[part][~allowed], minlength=n)

    def outcome(self, limit: int) -> Outcome:
        rejected, refused = self.rejected_by, self.refused_by
        affected = int(np.count_nonzero((rejected > 0) | (refused > 0)))
        return Outcome(limit, int(rejected.sum()), int(refused.sum()), affected, rejected)


@dataclass(frozen=True)
class Recommendation:
    """The smallest limit per window for one algorithm that affects (rejects or
    refuses) at most `affect` of the clients, and the spread of per-client peaks."""

    algorithm: str
    window_ms: int
    affect: float  # the share of clients allowed to be affected
    limit: int
    requests: int
    rejected: int
    refused: int
    identities: int
    identities_affected: int
    percentiles: dict[str, int]  # p50 .. p99_9, max of per-client peaks
    replays: int  # limits replayed to find it
    # Clients affected even at the algorithm's largest limit (requests decided late,
    # stamped before what their client's state already holds); the limit then affects
    # at most max(allowed, unavoidable) clients.
    unavoidable: int = 0

    @property
    def unavoidable_why(self) -> str | None:
        """Why some clients are affected at every limit (None: none are)."""
        if not self.unavoidable:
            return None
        largest = largest_limit(self.algorithm, self.window_ms)
        return (
            f"{self.unavoidable:,} clients are rejected even at {largest:,} per window: "
            "requests decided late (stamped before a later one of the same client already "
            "counted) that this algorithm rejects at any limit; a longer reorder window "
            "(reorder_s) decides them in time order"
        )

    @property
    def label(self) -> str:
        return registry.get(self.algorithm).label

    @property
    def limit_text(self) -> str:
        from .limits import format_limit

        return format_limit(self.limit, self.window_ms / 1000)

    def to_dict(self) -> dict[str, Any]:
        from .results import SCHEMA

        values = {
            "window_s": self.window_ms / 1000,
            "limit_text": self.limit_text,
            "label": self.label,
            "rejected_share": self.rejected / self.requests if self.requests else 0.0,
            "refused_share": self.refused / self.requests if self.requests else 0.0,
            "identities_affected_share": (
                self.identities_affected / self.identities if self.identities else 0.0
            ),
            "peaks": dict(self.percentiles),
            "unavoidable_why": self.unavoidable_why,
        }
        return {name: values.get(name, getattr(self, name, None)) for name in SCHEMA["recommended"]}


def largest_limit(algorithm: str, window_ms: int) -> int:
    """The largest limit per `window_ms` that `algorithm` accepts: its `max_limit`, or
    less where its script could not count exactly (the fixed window's short windows)."""
    spec = registry.get(algorithm)

    def accepts(limit: int) -> bool:
        try:
            spec.build("reference", window_ms=window_ms, limit=limit)
        except ValueError:
            return False
        return True

    low, high = 1, spec.max_limit
    if accepts(high):
        return high
    while high - low > 1:  # accepts(low), not accepts(high)
        middle = (low + high) // 2
        low, high = (middle, high) if accepts(middle) else (low, middle)
    return low


def smallest_limit(
    affected: Callable[[int], int],
    allowed: int,
    start: int,
    high: int,
    largest: int = validation.MAX_LIMIT,
) -> tuple[int, int]:
    """The smallest limit L in [1, largest] with affected(L) <= allowed, by bisection
    (affected is non-increasing in L), starting from the bracket [1, high] (high
    doubled until it qualifies) and trying `start` first. Returns (L, evaluations).
    ValueError when not even `largest` qualifies."""
    seen: dict[int, int] = {}

    def ask(limit: int) -> int:
        if limit not in seen:
            seen[limit] = affected(limit)
        return seen[limit]

    high = max(1, min(high, largest))
    while ask(high) > allowed:
        if high >= largest:
            raise ValueError(f"no limit up to {largest} affects so few clients")
        high = min(2 * high, largest)
    low = 0  # affected(low) > allowed, or low == 0 (no limit below 1)
    if 1 <= start <= high:
        if ask(start) <= allowed:
            high = start
            if start == 1 or ask(start - 1) > allowed:
                return start, len(seen)
        else:
            low = start
    while high - low > 1:
        middle = (low + high) // 2
        if ask(middle) <= allowed:
            high = middle
        else:
            low = middle
    return high, len(seen)


def recommend(
    trace: KeptTrace | None,
    algorithm: str,
    window_ms: int,
    demand_peaks: np.ndarray,
    affect: float,
    *,
    replay_limit: Callable[[int], Outcome] | None = None,
    requests: int | None = None,
) -> Recommendation:
    """The recommendation for one algorithm and window. `demand_peaks`: per identity
    code, the most cost it requested in one rolling window (t - W, t]. `replay_limit`
    replays one limit elsewhere instead of on `trace` (the Dask engine sums its
    partitions'), and `requests` then says how many requests there are.

    For the sliding log, an identity is affected under L exactly when its demand peak
    exceeds L (until its first rejection every request was admitted, so the log held
    its demand), so the answer is read from the sorted peaks; it is the search's
    starting guess for every algorithm, and every answer is replayed: L qualifies and
    L - 1 does not (both decided by the compiled replayer).

    A request decided late (stamped before what its client's state already holds) may
    be rejected at every limit by some algorithms (GCRA, the fixed window), so fewer
    clients than allowed may be out of reach. When the busiest client's peak does not
    qualify, the algorithm's largest limit is replayed too: the clients it still
    affects are `unavoidable`, and the answer is the smallest limit affecting at most
    max(allowed, unavoidable) clients (no more than any limit must)."""
    if trace is None and replay_limit is None:
        raise ValueError("recommend needs the kept trace or a replay_limit")
    n = len(demand_peaks)
    allowed = math.floor(affect * n + 1e-9)
    ordered = np.sort(demand_peaks)[::-1]
    from_peaks = int(ordered[allowed]) if allowed < n else 1
    from_peaks = max(from_peaks, 1)
    outcomes: dict[int, Outcome] = {}

    def affected(limit: int) -> int:
        if limit not in outcomes:
            outcomes[limit] = (
                replay_limit(limit)
                if replay_limit is not None
                else replay(trace, algorithm, limit, window_ms, n)  # type: ignore[arg-type]
            )
        return outcomes[limit].identities_affected

    largest = largest_limit(algorithm, window_ms)
    high = min(max(int(ordered[0]) if n else 1, 1), largest)
    # The limits the search asks first (the busiest client's peak, the guess and the
    # limit below it) are replayed up front, on a kept trace together on the cores
    # there are; elsewhere too, so that every engine counts the same replays.
    first = [x for x in (high, from_peaks, from_peaks - 1) if 1 <= x <= largest]
    if replay_limit is None:
        outcomes.update(replay_many(trace, algorithm, first, window_ms, n))  # type: ignore[arg-type]
    else:
        outcomes.update({limit: replay_limit(limit) for limit in first})
    unavoidable = 0
    if affected(high) > allowed:  # beyond every peak: only late requests still hurt
        unavoidable = affected(largest)
    limit, _ = smallest_limit(affected, max(allowed, unavoidable), from_peaks, high, largest)
    found = outcomes[limit]
    if requests is None:
        requests = len(trace)  # type: ignore[arg-type]
    return Recommendation(
        algorithm=registry.get(algorithm).name,
        window_ms=window_ms,
        affect=affect,
        limit=limit,
        requests=requests,
        rejected=found.rejected,
        refused=found.refused,
        identities=n,
        identities_affected=found.identities_affected,
        percentiles=peak_percentiles(demand_peaks),
        replays=len(outcomes),
        unavoidable=unavoidable if unavoidable > allowed else 0,
    )
