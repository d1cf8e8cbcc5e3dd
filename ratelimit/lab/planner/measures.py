"""Measures kept while a log streams by: the most identities whose keys are alive at
one instant (`_LiveKeys`)."""

from __future__ import annotations

import numpy as np
from numba import njit

_NEVER = np.iinfo(np.int64).min // 4  # "no request yet": far below any t - L


def _grown(values: np.ndarray, size: int, fill: int = 0) -> np.ndarray:
    """`values` extended to at least `size` entries (doubling), new ones `fill`."""
    if len(values) >= size:
        return values
    out = np.full(max(size, 2 * len(values)), fill, dtype=values.dtype)
    out[: len(values)] = values
    return out


@njit(cache=True, nogil=True)
def _live_kernel(codes, times, life, last, before, after, state):
    """Stream requests through the live-key count. The live identities form a list in
    the order their keys expire (`before`/`after` link them, -1 ends the list):
    times never go back, so an identity that writes again moves to the list's end.
    state: [first, last in the list, alive, peak]."""
    first, final, alive, peak = state[0], state[1], state[2], state[3]
    for i in range(codes.shape[0]):
        c, t = codes[i], times[i]
        while first >= 0 and last[first] + life <= t:  # keys expired by t
            nxt = after[first]
            before[first] = after[first] = -2  # -2: not in the list
            first = nxt
            if first >= 0:
                before[first] = -1
            else:
                final = -1
            alive -= 1
        if before[c] == -2:  # not live: every key expired by t has left the list
            alive += 1
        elif c != final:  # unlink it: it moves to the end
            if before[c] >= 0:
                after[before[c]] = after[c]
            else:
                first = after[c]
            before[after[c]] = before[c]
        else:
            last[c] = t
            continue
        before[c], after[c] = final, -1
        if final >= 0:
            after[final] = c
        else:
            first = c
        final = c
        last[c] = t
        if alive > peak:
            peak = alive
    state[0], state[1], state[2], state[3] = first, final, alive, peak


class _LiveKeys:
    """The most identities alive at one instant, over a stream of requests in time
    order: identity i is alive at t while its last request at or before t is later
    than t - L; the maximum is attained at a request's time.

    Streamed (compiled): the live identities are kept in the order their keys expire,
    which, as times never go back, is the order of their last requests; a request
    first drops the identities whose keys expired by its time, then puts its own at
    the end. The state is two links and a time per identity.
    """

    def __init__(self, lifetime_ms: int) -> None:
        self.lifetime = lifetime_ms
        self.last = np.full(0, _NEVER, dtype=np.int64)
        self._before = np.full(0, -2, dtype=np.int64)
        self._after = np.full(0, -2, dtype=np.int64)
        self._state = np.array([-1, -1, 0, 0], dtype=np.int64)  # first, last, alive, peak

    @property
    def alive(self) -> int:
        """Identities alive after the last request."""
        return int(self._state[2])

    @property
    def peak(self) -> int:
        return int(self._state[3])

    def add(self, codes: np.ndarray, times: np.ndarray) -> None:
        """One chunk: `times` whole ms, non-decreasing and not before earlier chunks."""
        if len(times) == 0:
            return
        size = int(codes.max()) + 1
        self.last = _grown(self.last, size, _NEVER)
        self._before = _grown(self._before, size, -2)
        self._after = _grown(self._after, size, -2)
        _live_kernel(
            np.ascontiguousarray(codes, dtype=np.int64),
            np.ascontiguousarray(times, dtype=np.int64),
            self.lifetime, self.last, self._before, self._after, self._state,
        )  # fmt: skip
