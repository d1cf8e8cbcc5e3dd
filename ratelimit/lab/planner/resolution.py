"""How finely a log stamps its requests (`Resolution`), and the same candidate replayed
with each stamp's requests spread evenly within it (`spread`): common and combined
logs stamp whole seconds, which at windows of a few seconds moves the result."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

RESOLUTIONS_MS = (60_000, 1_000, 100, 10, 1)
"""The resolutions told apart, coarsest first; 1 ms is the plan's own."""
COARSE_SHARE = 10
"""A resolution is coarse for a window when it is longer than window / COARSE_SHARE."""


class Resolution:
    """The coarsest of `RESOLUTIONS_MS` that every stamp seen is a multiple of, fed
    whole-ms times a chunk at a time (before any stamp: the coarsest)."""

    def __init__(self) -> None:
        self._level = 0

    def add(self, times_ms: np.ndarray) -> None:
        times = np.asarray(times_ms, dtype=np.int64)
        while self._level < len(RESOLUTIONS_MS) - 1 and (times % self.ms).any():
            self._level += 1

    @property
    def ms(self) -> int:
        return RESOLUTIONS_MS[self._level]


def is_coarse(resolution_ms: int, window_ms: int) -> bool:
    """Whether stamps `resolution_ms` apart are too coarse to plan a window on."""
    return resolution_ms * COARSE_SHARE > window_ms


def resolution_text(resolution_ms: int) -> str:
    if resolution_ms >= 60_000:
        return f"{resolution_ms // 60_000} min"
    if resolution_ms >= 1_000:
        return f"{resolution_ms // 1_000} s"
    return f"{resolution_ms} ms"


def spread(times_ms: np.ndarray, resolution_ms: int) -> np.ndarray:
    """`times_ms` with the requests sharing one stamp spread evenly over the
    `resolution_ms` that follow it, in their order: the j-th of n at
    stamp + floor((2j + 1) x resolution / 2n), the middles of n equal slices.
    Deterministic, and the order of the requests is kept."""
    times = np.asarray(times_ms, dtype=np.int64)
    return Stamps([times], resolution_ms).spreading()(times)


class Stamps:
    """How many requests share each stamp, counted over `blocks` of times (read once),
    so that `spread` can place each request of a stamp at its place among all of that
    stamp's requests while the times come again a block at a time."""

    def __init__(self, blocks: Iterable[np.ndarray], resolution_ms: int) -> None:
        self.resolution_ms = resolution_ms
        stamps, counts = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        for block in blocks:
            found, found_counts = np.unique(np.asarray(block, dtype=np.int64), return_counts=True)
            stamps, where = np.unique(np.concatenate((stamps, found)), return_inverse=True)
            counts = np.bincount(where, np.concatenate((counts, found_counts)), len(stamps))
            counts = counts.astype(np.int64)
        self._stamps, self._counts = stamps, counts

    def spreading(self) -> Callable[[np.ndarray], np.ndarray]:
        """A function that spreads (see `spread`) the blocks of times counted, given to
        it again one block at a time, in the same order."""
        before = np.zeros(len(self._stamps), dtype=np.int64)  # of each stamp, so far

        def place(block: np.ndarray) -> np.ndarray:
            times = np.asarray(block, dtype=np.int64)
            if not len(times):
                return times.copy()
            at = np.searchsorted(self._stamps, times)
            order = np.argsort(at, kind="stable")
            ordered = at[order]
            starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
            sizes = np.diff(np.append(starts, len(ordered)))
            j = np.empty_like(times)
            j[order] = np.arange(len(ordered)) - np.repeat(starts, sizes) + before[ordered]
            before[ordered[starts]] += sizes
            return times + ((2 * j + 1) * self.resolution_ms) // (2 * self._counts[at])

        return place


@dataclass(frozen=True)
class Spread:
    """One candidate as planned, and replayed with the stamps spread (`spread`)."""

    resolution_ms: int
    rejected: int
    rejected_spread: int | None  # None: the requests were not kept to replay
    identities_rejected: int
    identities_rejected_spread: int | None

    def to_dict(self) -> dict[str, Any]:
        from .results import SCHEMA

        return {name: getattr(self, name) for name in SCHEMA["stamps"]}
