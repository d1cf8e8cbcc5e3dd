"""Measures kept while a log streams by: the most identities whose keys are alive at
one instant (`_LiveKeys`)."""

from __future__ import annotations

import numpy as np

_NEVER = np.iinfo(np.int64).min // 4  # "no request yet": far below any t - L


def _grown(values: np.ndarray, size: int, fill: int = 0) -> np.ndarray:
    """`values` extended to at least `size` entries (doubling), new ones `fill`."""
    if len(values) >= size:
        return values
    out = np.full(max(size, 2 * len(values)), fill, dtype=values.dtype)
    out[: len(values)] = values
    return out


class _LiveKeys:
    """The most identities alive at one instant, over a stream of requests in time
    order: identity i is alive at t while its last request at or before t is later
    than t - L. In closed form, the maximum over t of the identities with a request in
    (t - L, t]; it is attained at a request's time.

    Each request k starts a share of its identity's alive time, [t_k, e_k) with e_k
    the identity's next request or t_k + L, whichever is first; these shares never
    overlap, so the identities alive at t are the shares started minus those ended by
    t. A share is still open after a chunk only for an identity's last request, so
    the state is one timestamp per identity (`last`) and a count.
    """

    def __init__(self, lifetime_ms: int) -> None:
        self.lifetime = lifetime_ms
        self.last = np.full(0, _NEVER, dtype=np.int64)
        self.horizon: int | None = None  # the latest time seen
        self.alive = 0  # shares open after the horizon
        self.peak = 0

    def add(self, codes: np.ndarray, times: np.ndarray) -> None:
        """One chunk: `times` whole ms, non-decreasing and not before earlier chunks."""
        n = len(times)
        if n == 0:
            return
        life = self.lifetime
        end_of_chunk = int(times[-1])
        self.last = _grown(self.last, int(codes.max()) + 1, _NEVER)
        order = np.argsort(codes, kind="stable")
        c, t = codes[order], times[order]
        first = np.concatenate(([True], c[1:] != c[:-1]))
        final = np.concatenate((c[1:] != c[:-1], [True]))
        ends = t + life
        ends[:-1] = np.where(final[:-1], ends[:-1], np.minimum(t[1:], ends[:-1]))
        settled = [ends[~final | (ends <= end_of_chunk)]]
        if self.horizon is not None:
            open_before = np.flatnonzero(self.last + life > self.horizon)
            closing = self.last[open_before] + life
            first_here = np.full(len(self.last), np.iinfo(np.int64).max, dtype=np.int64)
            first_here[c[first]] = t[first]
            closing = np.minimum(closing, first_here[open_before])
            settled.append(closing[closing <= end_of_chunk])
        ended = np.sort(np.concatenate(settled))
        started = np.searchsorted(times, times, side="right")
        alive = self.alive + started - np.searchsorted(ended, times, side="right")
        self.peak = max(self.peak, int(alive.max()))
        self.alive += n - len(ended)
        self.last[c[final]] = t[final]
        self.horizon = end_of_chunk
