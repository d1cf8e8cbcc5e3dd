"""When and who, kept while a log streams by: rejections by hour of day (UTC), each
client's longest throttled stretch (`Stretches`), and each client's most frequent user
agent (`Agents`).

A client's throttled stretch is a run of its rejected requests with no admitted one
between them. It starts at the run's first rejected request and ends at the client's
next admitted request, but no later than one window after the run's last rejected
request: a client that stops asking stops counting then (a rejected request leaves no
trace in the sliding log, and by then it would be admitted), so a crawler back the
next morning is not "throttled all night". A run the log ends during ends one window
after its last rejected request too. Requests costing more than the limit are never
decided, so they neither start nor end a stretch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from numba import njit

from .measures import _grown

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
_NONE = np.iinfo(np.int64).min  # no stretch open


def hours_of(times_ms: np.ndarray) -> np.ndarray:
    """Hour of day (0-23, UTC) of each whole-ms Unix time."""
    return (np.asarray(times_ms, dtype=np.int64) % DAY_MS) // HOUR_MS


@njit(cache=True, nogil=True)
def _stretch_kernel(codes, times, allowed, window, start, last, best, best_from, best_until):
    for i in range(codes.shape[0]):
        k = codes[i]
        t = times[i]
        if not allowed[i]:
            if start[k] == _NONE:
                start[k] = t
            last[k] = max(last[k], t) if last[k] != _NONE else t
        elif start[k] != _NONE:
            end = min(t, last[k] + window)
            length = max(end - start[k], 0)  # a late line may end a stretch before it began
            if best_from[k] == _NONE or length > best[k]:
                best[k] = length
                best_from[k] = start[k]
                best_until[k] = end
            start[k] = _NONE
            last[k] = _NONE


class Stretches:
    """Per identity code, its longest throttled stretch (see the module docstring), fed
    the decisions of one candidate a chunk at a time, in decision order."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = int(window_ms)
        self._start = np.zeros(0, dtype=np.int64)  # the open stretch's first rejection
        self._last = np.zeros(0, dtype=np.int64)  # the open stretch's last rejection
        self._best = np.zeros(0, dtype=np.int64)
        self._from = np.zeros(0, dtype=np.int64)
        self._until = np.zeros(0, dtype=np.int64)

    def add(self, codes: np.ndarray, times: np.ndarray, allowed: np.ndarray) -> None:
        if len(codes) == 0:
            return
        n = int(codes.max()) + 1
        self._start, self._last = _grown(self._start, n, _NONE), _grown(self._last, n, _NONE)
        self._best = _grown(self._best, n, 0)
        self._from, self._until = _grown(self._from, n, _NONE), _grown(self._until, n, _NONE)
        _stretch_kernel(
            codes.astype(np.int64), times.astype(np.int64), allowed.astype(np.bool_),
            self.window_ms, self._start, self._last, self._best, self._from, self._until,
        )  # fmt: skip

    def longest(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For codes 0..size-1: (longest ms, its start and its end, ms), start and
        end -1 for identities never throttled."""
        pad = max(size - len(self._best), 0)

        def sized(values: np.ndarray, fill: int) -> np.ndarray:
            return np.concatenate((values[:size], np.full(pad, fill, dtype=np.int64)))

        start, last = sized(self._start, _NONE), sized(self._last, _NONE)
        best, since = sized(self._best, 0), sized(self._from, _NONE)
        until = sized(self._until, _NONE)
        is_open = start != _NONE
        length = np.where(is_open, np.maximum(last + self.window_ms - start, 0), 0)
        wins = is_open & ((since == _NONE) | (length > best))
        best = np.where(wins, length, best)
        since = np.where(wins, start, since)
        until = np.where(wins, last + self.window_ms, until)
        never = since == _NONE
        return best, np.where(never, -1, since), np.where(never, -1, until)


class Agents:
    """Per identity code, how often each user agent was seen (the `agent` column of a
    trace chunk, when there is one), to name each client's most frequent."""

    def __init__(self) -> None:
        self._counts: pd.Series | None = None
        self.seen = False  # any chunk had an agent column

    def add(self, codes: np.ndarray, chunk: Any) -> None:
        if "agent" not in getattr(chunk, "columns", ()):
            return
        self.seen = True
        pairs = pd.DataFrame({"code": codes, "agent": chunk["agent"].to_numpy(dtype=object)})
        # A line without an agent ("" or "-" in a combined log) names none.
        pairs = pairs[~pairs["agent"].isin(["", "-"])].dropna()
        counts = pairs.value_counts()
        self._counts = counts if self._counts is None else self._counts.add(counts, fill_value=0)

    def most_frequent(self) -> dict[int, str]:
        """Code -> its most frequent agent (ties: the first in text order)."""
        if self._counts is None or self._counts.empty:
            return {}
        table = self._counts.rename("n").reset_index()
        table["agent"] = table["agent"].astype(str)
        table = table.sort_values(["code", "n", "agent"], ascending=[True, False, True])
        first = table.drop_duplicates("code")
        return dict(zip(first["code"].astype(int), first["agent"], strict=True))
