"""Per identity, the largest admitted cost in any rolling window, fed a chunk at a time
and compiled with numba (`WindowPeaks`): what `ratelimit.lab.metrics.max_in_window_ms`
computes, without holding the whole trace.

    peaks = WindowPeaks(window_ms=1_000)
    for chunk in chunks:
        peaks.add(codes.encode(chunk["identity"]), chunk_ms, admitted_cost)
    peaks.peaks                               # per identity code
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from ratelimit import validation

from .rings import FIRST_RING, MAX_EXACT_MS, Pool, first_after, int_array, make_room, slot

__all__ = ["WindowPeaks", "DEFAULT_REORDER_MS"]

# WindowPeaks keeps this much history behind each identity's newest stamp by default,
# so a stamp up to five minutes late still counts exactly (logs merged from servers).
DEFAULT_REORDER_MS = 300_000


@njit(cache=True, nogil=True)
def _peaks_kernel(
    codes, times, weights, start, window, horizon,
    off, cap, head, size, keys, vals, top, wstart, wsum, peaks, late,
):  # fmt: skip
    # Per identity: a ring of (stamp, weight) pairs, stamps strictly increasing, that
    # holds every stamp later than newest - window - horizon (horizon < 0: every
    # stamp); wstart/wsum: the first pair and the total in (newest - window, newest].
    for i in range(start, codes.shape[0]):
        k = codes[i]
        t = times[i]
        wt = weights[i]
        if wt == 0:
            continue
        n = size[k]
        newest = keys[slot(off, cap, head, k, n - 1)] if n > 0 else t
        if n > 0 and t == newest:
            vals[slot(off, cap, head, k, n - 1)] += wt
            wsum[k] += wt
            peaks[k] = max(peaks[k], wsum[k])
            continue
        if not make_room(k, n + 1, off, cap, head, size, keys, vals, top):
            return i
        if n == 0 or t > newest:
            s = slot(off, cap, head, k, n)
            keys[s] = t
            vals[s] = wt
            size[k] = n + 1
            n += 1
            j = wstart[k]
            total = wsum[k] + wt
            while keys[slot(off, cap, head, k, j)] <= t - window:
                total -= vals[slot(off, cap, head, k, j)]
                j += 1
            wstart[k] = j
            wsum[k] = total
            peaks[k] = max(peaks[k], total)
            newest = t
        else:
            # A late stamp: insert it in order, then look at every window it falls in,
            # the windows (s - window, s] for held stamps s in [t, t + window).
            if horizon >= 0 and t < newest - horizon:
                late[0] += 1
            pos = first_after(off, cap, head, keys, k, n, t - 1)
            if keys[slot(off, cap, head, k, pos)] == t:
                vals[slot(off, cap, head, k, pos)] += wt
            else:
                for j in range(n, pos, -1):
                    dst = slot(off, cap, head, k, j)
                    src = slot(off, cap, head, k, j - 1)
                    keys[dst] = keys[src]
                    vals[dst] = vals[src]
                s = slot(off, cap, head, k, pos)
                keys[s] = t
                vals[s] = wt
                size[k] = n + 1
                n += 1
                if t <= newest - window:
                    wstart[k] += 1
            if t > newest - window:
                wsum[k] += wt
            lo = pos
            while lo > 0 and keys[slot(off, cap, head, k, lo - 1)] > t - window:
                lo -= 1
            total = 0
            for j in range(lo, pos):
                total += vals[slot(off, cap, head, k, j)]
            for m in range(pos, n):
                stamp = keys[slot(off, cap, head, k, m)]
                if stamp >= t + window:
                    break
                total += vals[slot(off, cap, head, k, m)]
                while keys[slot(off, cap, head, k, lo)] <= stamp - window:
                    total -= vals[slot(off, cap, head, k, lo)]
                    lo += 1
                peaks[k] = max(peaks[k], total)
        if horizon >= 0:
            # Pairs at or before newest - window - horizon can no longer matter.
            drop = 0
            while drop < n and keys[slot(off, cap, head, k, drop)] <= newest - window - horizon:
                drop += 1
            if drop:
                head[k] = (head[k] + drop) & (cap[k] - 1)
                size[k] = n - drop
                wstart[k] -= drop
    return codes.shape[0]


class WindowPeaks:
    """Per identity, the largest total weight (admitted cost) in any rolling window
    (t - window_ms, t], as `ratelimit.lab.metrics.max_in_window_ms` counts it, fed a
    chunk at a time.

    Times may arrive out of order. A stamp up to `reorder_ms` behind its identity's
    newest still counts exactly; one later than that is counted against the history
    still held, so its identity's peak may be too low, and `late` counts such stamps.
    `reorder_ms=None` keeps every stamp: exact whatever the order, memory growing with
    the trace. Otherwise memory per identity is what it sent in the last
    window_ms + reorder_ms.
    """

    def __init__(self, window_ms: int, *, reorder_ms: int | None = DEFAULT_REORDER_MS) -> None:
        self.window_ms = validation.positive_int("window_ms", window_ms, validation.MAX_WINDOW_MS)
        self.reorder_ms = (
            None
            if reorder_ms is None
            else validation.non_negative_int("reorder_ms", reorder_ms, validation.MAX_WINDOW_MS)
        )
        self._pool = Pool()
        self._wstart = np.zeros(0, dtype=np.int64)
        self._wsum = np.zeros(0, dtype=np.int64)
        self._peaks = np.zeros(0, dtype=np.int64)
        self._late = np.zeros(1, dtype=np.int64)
        self._n = 0

    def add(self, codes: Any, times_ms: Any, weights: Any) -> None:
        """Add one chunk: identity codes, whole-ms times, non-negative integer weights."""
        codes = int_array("codes", codes)
        times = int_array("times_ms", times_ms)
        w = np.asarray(weights)
        w = int_array("weights", w.astype(np.int64) if w.dtype == np.bool_ else w)
        n = codes.shape[0]
        if times.shape[0] != n or w.shape[0] != n:
            raise ValueError(
                f"codes, times_ms and weights must have one value per request, got "
                f"{n}, {times.shape[0]} and {w.shape[0]}"
            )
        if n == 0:
            return
        if codes.min() < 0:
            raise ValueError("codes must be >= 0")
        if w.min() < 0:
            raise ValueError("weights must be >= 0")
        if times.min() <= -MAX_EXACT_MS or times.max() >= MAX_EXACT_MS:
            raise ValueError("times_ms must be within +-2**53 ms")
        self._reserve(int(codes.max()) + 1)
        horizon = -1 if self.reorder_ms is None else self.reorder_ms
        p, start = self._pool, 0
        while True:
            start = _peaks_kernel(
                codes, times, w, start, self.window_ms, horizon,
                p.off, p.cap, p.head, p.size, p.keys, p.vals, p.top,
                self._wstart, self._wsum, self._peaks, self._late,
            )  # fmt: skip
            if start == n:
                return
            p.grow(2 * int(p.cap[codes[start]]) + FIRST_RING)

    def _reserve(self, n: int) -> None:
        if n <= self._n:
            return
        have = self._peaks.shape[0]
        if n > have:
            grown = max(n, 2 * have, 16)
            for attr in ("_wstart", "_wsum", "_peaks"):
                new = np.zeros(grown, dtype=np.int64)
                new[:have] = getattr(self, attr)
                setattr(self, attr, new)
            self._pool.identities(grown)
        self._n = n

    @property
    def peaks(self) -> np.ndarray:
        """Per identity code (0..n-1, n the largest code added + 1), its peak."""
        return self._peaks[: self._n].copy()

    @property
    def late(self) -> int:
        """Stamps that arrived more than `reorder_ms` behind their identity's newest."""
        return int(self._late[0])

    @property
    def nbytes(self) -> int:
        """Bytes held: the pool of recent stamps and the per-identity arrays."""
        return self._pool.nbytes + 3 * self._peaks.nbytes
