"""Compiled replay: the reference models' decisions at tens of millions a second.

The reference models (`ratelimit.lab.reference`) are the readable statement of each
algorithm; this module decides exactly as their `run` does, compiled with numba, so a
log of hundreds of millions of requests replays in about a minute. Property tests
(tests/lab/test_fastreplay.py) hold every decision, and the state left behind, to
the models'.

    codes = Codes()
    replayer = Replayer("log", limit=100, window_ms=60_000)
    for chunk in chunks:                      # state carries over from chunk to chunk
        allowed, remaining, retry = replayer.decide(
            codes.encode(chunk["identity"]), chunk_ms, chunk["cost"].to_numpy()
        )

Rows are decided in the order given (the replay's decision order); identities are
dense codes 0..n-1 (`Codes`), which may grow from call to call.

Each algorithm's kernel, and the class that holds its state, is registered with the
algorithm's entry (`ratelimit.algorithms.register`, part "replay") when this module is
imported; `Replayer` reaches it through `algorithms.get(...).part("replay")`.

Exactness. The models' arithmetic is Python's: integers, and IEEE doubles where the
Lua scripts use floats. The kernels do the same operations in the same order on int64
and float64 (no fastmath), which gives the same bits as long as every integer a model
turns into a float is exact as a double: times within +-2**53 ms (any time
`timebase.seconds_to_ms` makes), and, for the sliding-window counter, limit x window
below 2**53. Anything outside that gets a ValueError, never a different decision.

Memory. The sliding log keeps (stamp, units) pairs, one per distinct millisecond an
identity was admitted at, in a ring per identity carved out of one shared pool that
grows by doubling (`ratelimit.lab.rings`), so a million identities that each send a
few requests cost a few pairs each, whatever the limit. A ring never holds more pairs
than the model's list holds stamps (at most the limit). The other three algorithms
keep two or three numbers per identity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from numba import njit

from ratelimit import algorithms

from .reference.gcra import EPSILON as _GCRA_EPSILON
from .rings import FIRST_RING, MAX_EXACT_MS, Pool, first_after, int_array, make_room, slot

__all__ = ["Codes", "Replayer", "MAX_EXACT_MS"]


# ---------------------------------------------------------------- the four kernels
#
# Each decides rows start.. of (codes, times, costs) into (allowed, remaining, retry)
# and returns the row it stopped at: the end, or (the log) a row whose identity needs
# a bigger ring than the pool has room for, decided after the pool has grown. `seen`
# marks identities that were decided at least once (the model then holds their state).


@njit(cache=True, nogil=True)
def _log_kernel(
    codes, times, costs, start, limit, window,
    off, cap, head, size, below, keys, ends, top, seen,
    allowed, remaining, retry,
):  # fmt: skip
    # Pairs are (stamp, units admitted by this identity up to and including it): the
    # units in a run of pairs are a difference of two ends. below[k]: the end of the
    # last pair dropped (the units before the first pair held).
    for i in range(start, codes.shape[0]):
        k = codes[i]
        now = times[i]
        cost = costs[i]
        n = size[k]
        at = now
        if n > 0:
            newest = keys[slot(off, cap, head, k, n - 1)]
            if newest > now:
                at = newest
        edge = at - window
        first = first_after(off, cap, head, keys, k, n, edge)
        base = below[k] if first == 0 else ends[slot(off, cap, head, k, first - 1)]
        count = 0
        if n > 0:
            count = ends[slot(off, cap, head, k, n - 1)] - base
        if count + cost > limit:
            # The model reads stamps[start + count + cost - limit - 1]: the unit with
            # that rank among those in the window, found by its running total.
            unit = base + count + cost - limit
            lo = first
            hi = n - 1
            while lo < hi:
                mid = (lo + hi) >> 1
                if ends[slot(off, cap, head, k, mid)] >= unit:
                    hi = mid
                else:
                    lo = mid + 1
            seen[k] = True
            allowed[i] = False
            remaining[i] = max(limit - count, 0)
            retry[i] = keys[slot(off, cap, head, k, lo)] + window - now
            continue
        # Admitted: drop the pairs that left the window, then add `cost` units at `at`.
        kept = n - first
        merge = kept > 0 and keys[slot(off, cap, head, k, n - 1)] == at
        # A full ring (nothing left the window, so kept == n) moves to a bigger one;
        # if the pool has no room, stop here, untouched, and resume once it has grown.
        if not merge and kept + 1 > cap[k]:
            if not make_room(k, kept + 1, off, cap, head, size, keys, ends, top):
                return i
        seen[k] = True
        if first:
            below[k] = base
            head[k] = (head[k] + first) & (cap[k] - 1)
            size[k] = kept
        if merge:
            ends[slot(off, cap, head, k, kept - 1)] += cost
        else:
            s = slot(off, cap, head, k, kept)
            keys[s] = at
            ends[s] = base + count + cost
            size[k] = kept + 1
        allowed[i] = True
        remaining[i] = limit - count - cost
        retry[i] = 0
    return codes.shape[0]


@njit(cache=True, nogil=True)
def _fw_kernel(
    codes, times, costs, start, limit, window,
    has, stored, used_in, seen, allowed, remaining, retry,
):  # fmt: skip
    for i in range(start, codes.shape[0]):
        k = codes[i]
        now = times[i]
        cost = costs[i]
        seen[k] = True
        number = math.floor(now / window)  # float division, as in the model and Lua
        if has[k] and stored[k] > number:
            number = stored[k]  # a late request counts in the stored window
        until_next = (number + 1) * window - now
        used = used_in[k] if has[k] and stored[k] == number else 0
        if used + cost > limit:
            allowed[i] = False
            remaining[i] = max(limit - used, 0)
            retry[i] = until_next
        else:
            has[k] = True
            stored[k] = number
            used_in[k] = used + cost
            allowed[i] = True
            remaining[i] = limit - used - cost
            retry[i] = 0
    return codes.shape[0]


@njit(cache=True, nogil=True)
def _swc_estimate(t, window, has, w, c, p):
    """The model's estimate_at(t) for state (w, c, p)."""
    number = math.floor(t / window)
    cur = 0
    prev = 0
    if has:
        if number == w:
            cur = c
            prev = p
        elif number == w + 1:
            prev = c
    elapsed = t - number * window
    return prev * ((window - elapsed) / window) + cur


@njit(cache=True, nogil=True)
def _swc_kernel(
    codes, times, costs, start, limit, window,
    has, ws, cs, ps, seen, allowed, remaining, retry,
):  # fmt: skip
    for i in range(start, codes.shape[0]):
        k = codes[i]
        now = times[i]
        cost = costs[i]
        seen[k] = True
        h = has[k]
        w = ws[k]
        c = cs[k]
        p = ps[k]
        number = math.floor(now / window)
        if not h or number > w + 1 or number < w:
            cur = 0
            prev = 0
        elif number == w:
            cur = c
            prev = p
        else:
            cur = 0
            prev = c
        estimate = prev * ((window - (now - number * window)) / window) + cur
        if estimate + cost > limit:
            elapsed = now - number * window
            if cur + cost <= limit:
                wait = math.ceil(window - elapsed - (limit - cost - cur) * window / prev)
            else:
                wait = math.ceil(2 * window - elapsed - (limit - cost) * window / cur)
            wait = max(wait, 1)
            while _swc_estimate(now + wait, window, h, w, c, p) + cost > limit:
                wait += 1
            while wait > 1 and _swc_estimate(now + wait - 1, window, h, w, c, p) + cost <= limit:
                wait -= 1
            allowed[i] = False
            remaining[i] = max(math.floor(limit - estimate), 0)
            retry[i] = wait
            continue
        has[k] = True
        ws[k] = number
        cs[k] = cur + cost
        ps[k] = prev
        allowed[i] = True
        remaining[i] = math.floor(limit - estimate - cost)
        retry[i] = 0
    return codes.shape[0]


@njit(cache=True, nogil=True)
def _gcra_kernel(
    codes, times, costs, start, interval, tolerance, epsilon,
    has, tats, seen, allowed, remaining, retry,
):  # fmt: skip
    for i in range(start, codes.shape[0]):
        k = codes[i]
        now = times[i]
        cost = costs[i]
        seen[k] = True
        tat = float(now)
        if has[k] and not tats[k] < now:
            tat = tats[k]
        new_tat = tat + interval * cost
        allow_at = new_tat - tolerance
        if allow_at - now > epsilon:
            allowed[i] = False
            remaining[i] = max(math.floor((now - (tat - tolerance) + epsilon) / interval), 0)
            retry[i] = math.ceil(allow_at - now - epsilon)
            continue
        has[k] = True
        tats[k] = new_tat
        allowed[i] = True
        remaining[i] = math.floor((now - allow_at + epsilon) / interval)
        retry[i] = 0
    return codes.shape[0]


# ---------------------------------------------------------------- each algorithm's replay
#
# One class per kernel, registered with its algorithms (`algorithms.register`, part
# "replay") at the end of this module: it holds the identities' state in the kernel's
# arrays, runs the kernel, and reads and writes one identity's state in the model's
# format. `Replayer` reaches it through the algorithm's entry.


def _grown(array: np.ndarray, have: int, grown: int) -> np.ndarray:
    new = np.zeros(grown, dtype=array.dtype)
    new[:have] = array[:have]
    return new


class _LogReplay:
    """The sliding log (either storage: they decide alike): a ring of (stamp, units up
    to it) pairs per identity, in a shared pool, and the units below the first pair."""

    algorithm = algorithms.SLIDING_LOG

    def __init__(self, model: Any) -> None:
        self.limit, self.window_ms = model.limit, model.window_ms
        self._pool = Pool()
        self._below = np.zeros(0, dtype=np.int64)

    def reserve(self, have: int, grown: int) -> None:
        self._below = _grown(self._below, have, grown)
        self._pool.identities(grown)

    def run(self, codes, times, costs, seen, out) -> None:
        start, n, p = 0, codes.shape[0], self._pool
        while True:
            start = _log_kernel(
                codes, times, costs, start, self.limit, self.window_ms,
                p.off, p.cap, p.head, p.size, self._below, p.keys, p.vals, p.top,
                seen, *out,
            )  # fmt: skip
            if start == n:
                return
            p.grow(2 * int(p.cap[codes[start]]) + FIRST_RING)

    def state(self, k: int) -> Any:
        stamps, ends = self._pool.pairs(k)
        units = np.diff(ends, prepend=self._below[k])
        return np.repeat(stamps, units).tolist()

    def set_state(self, k: int, value: Any) -> None:
        stamps = np.asarray([] if value is None else value, dtype=np.int64)
        if stamps.size and (np.diff(stamps) < 0).any():
            raise ValueError("a sliding log's stamps must be in order")
        keys, units = np.unique(stamps, return_counts=True)
        self._below[k] = 0
        self._pool.set_pairs(k, keys, np.cumsum(units, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self._pool.nbytes + self._below.nbytes


class _FixedWindowReplay:
    """The fixed window: per identity, whether it holds a window, its number and the
    units used in it."""

    algorithm = algorithms.FIXED_WINDOW
    _arrays: tuple[str, ...] = ("_has", "_window", "_used")

    def __init__(self, model: Any) -> None:
        self.limit, self.window_ms = model.limit, model.window_ms
        self._has = np.zeros(0, dtype=np.bool_)
        self._window = np.zeros(0, dtype=np.int64)
        self._used = np.zeros(0, dtype=np.int64)

    def reserve(self, have: int, grown: int) -> None:
        for attr in self._arrays:
            setattr(self, attr, _grown(getattr(self, attr), have, grown))

    def run(self, codes, times, costs, seen, out) -> None:
        state = (self._has, self._window, self._used, seen)
        _fw_kernel(codes, times, costs, 0, self.limit, self.window_ms, *state, *out)

    def state(self, k: int) -> Any:
        return (int(self._window[k]) if self._has[k] else None, int(self._used[k]))

    def set_state(self, k: int, value: Any) -> None:
        window, used = (None, 0) if value is None else tuple(value)
        self._has[k] = window is not None
        self._window[k] = 0 if window is None else window
        self._used[k] = used

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, attr).nbytes for attr in self._arrays)


class _CounterReplay(_FixedWindowReplay):
    """The sliding-window counter: (w, c, p) per identity, as the model keeps it."""

    algorithm = algorithms.SLIDING_WINDOW_COUNTER
    _arrays = ("_has", "_window", "_used", "_previous")

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        if self.limit * self.window_ms >= MAX_EXACT_MS:
            raise ValueError(
                "the sliding-window counter's limit x window_ms must be below 2**53 for "
                f"exact compiled arithmetic, got {self.limit} x {self.window_ms}; "
                "replay with the reference model instead"
            )
        self._previous = np.zeros(0, dtype=np.int64)

    def run(self, codes, times, costs, seen, out) -> None:
        state = (self._has, self._window, self._used, self._previous, seen)
        _swc_kernel(codes, times, costs, 0, self.limit, self.window_ms, *state, *out)

    def state(self, k: int) -> Any:
        return (*super().state(k), int(self._previous[k]))

    def set_state(self, k: int, value: Any) -> None:
        window, used, previous = (None, 0, 0) if value is None else tuple(value)
        super().set_state(k, (window, used))
        self._previous[k] = previous


class _GcraReplay:
    """GCRA: per identity, its TAT (a double) once it has been admitted."""

    algorithm = algorithms.GCRA

    def __init__(self, model: Any) -> None:
        # The model's own expressions, so the floats are the same.
        self._interval = model.window_ms / model.limit
        self._tolerance = self._interval * model.burst
        self._has = np.zeros(0, dtype=np.bool_)
        self._tat = np.zeros(0, dtype=np.float64)

    def reserve(self, have: int, grown: int) -> None:
        self._has = _grown(self._has, have, grown)
        self._tat = _grown(self._tat, have, grown)

    def run(self, codes, times, costs, seen, out) -> None:
        _gcra_kernel(
            codes, times, costs, 0, self._interval, self._tolerance, _GCRA_EPSILON,
            self._has, self._tat, seen, *out,
        )  # fmt: skip

    def state(self, k: int) -> Any:
        return float(self._tat[k]) if self._has[k] else None

    def set_state(self, k: int, value: Any) -> None:
        self._has[k] = value is not None
        self._tat[k] = 0.0 if value is None else float(value)

    @property
    def nbytes(self) -> int:
        return self._has.nbytes + self._tat.nbytes


# ---------------------------------------------------------------- the public classes


class Replayer:
    """One algorithm's compiled replay, with every identity's state carried across
    `decide` calls: the decisions of `ratelimit.lab.reference`'s model with the same
    options, request for request.

    `algorithm` is "log", "fw", "swc" or "gcra" (or anything `algorithms.get` takes);
    options are checked exactly as the model checks them.
    """

    def __init__(
        self, algorithm: Any, limit: int, window_ms: int, *, burst: int | None = None
    ) -> None:
        found = algorithms.get(algorithm)
        options: dict[str, Any] = {"limit": limit, "window_ms": window_ms}
        if burst is not None:
            if "burst" not in found.extra_options:
                having = [a.name for a in algorithms.ALGORITHMS if "burst" in a.extra_options]
                raise ValueError(f"burst applies to {', '.join(having)} only, not {found.name!r}")
            options["burst"] = burst
        # The model validates the options (one home for those rules).
        model = found.build("reference", **options)
        replay = found.part("replay")
        self.algorithm: str = replay.algorithm.name  # the compact log replays as the log
        self.limit: int = model.limit
        self.window_ms: int = model.window_ms
        self.burst: int | None = getattr(model, "burst", None)
        self.max_cost: int = min(self.limit, self.burst or self.limit)
        self._replay = replay(model)
        self._n = 0
        self._seen = np.zeros(0, dtype=np.bool_)

    @classmethod
    def for_model(cls, model: Any) -> Replayer:
        """The replayer that decides as the reference model `model` (its options)."""
        burst = getattr(model, "burst", None)
        return cls(model.algorithm, model.limit, model.window_ms, burst=burst)

    # -- identities

    def _reserve(self, n: int) -> None:
        if n <= self._n:
            return
        have = self._seen.shape[0]
        if n > have:
            grown = max(n, 2 * have, 16)
            new = np.zeros(grown, dtype=np.bool_)
            new[:have] = self._seen
            self._seen = new
            self._replay.reserve(have, grown)
        self._n = n

    def __len__(self) -> int:
        """Identity codes known so far (one more than the largest seen)."""
        return self._n

    # -- deciding

    def decide(
        self, codes: Any, times_ms: Any, costs: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Decide requests in the order given: (allowed, remaining, retry_after_ms).

        `codes` are identity codes (>= 0), `times_ms` whole-ms times, `costs` from 1 to
        the limit (and the burst); one value per request in each.
        """
        codes = int_array("codes", codes)
        times = int_array("times_ms", times_ms)
        costs = int_array("costs", costs)
        n = codes.shape[0]
        if times.shape[0] != n or costs.shape[0] != n:
            raise ValueError(
                f"codes, times_ms and costs must have one value per request, got "
                f"{n}, {times.shape[0]} and {costs.shape[0]}"
            )
        allowed = np.zeros(n, dtype=np.bool_)
        remaining = np.zeros(n, dtype=np.int64)
        retry = np.zeros(n, dtype=np.int64)
        if n == 0:
            return allowed, remaining, retry
        if codes.min() < 0:
            raise ValueError("codes must be >= 0")
        if times.min() <= -MAX_EXACT_MS or times.max() >= MAX_EXACT_MS:
            raise ValueError("times_ms must be within +-2**53 ms (exact as doubles)")
        if costs.min() < 1 or costs.max() > self.max_cost:
            bound = "the limit" if self.burst is None else "the limit and the burst"
            raise ValueError(f"costs must be between 1 and {bound} ({self.max_cost})")
        self._reserve(int(codes.max()) + 1)
        self._replay.run(codes, times, costs, self._seen, (allowed, remaining, retry))
        return allowed, remaining, retry

    # -- state, in the model's format

    def seen(self) -> np.ndarray:
        """Codes decided at least once (the model holds state for each, see `state`)."""
        return np.flatnonzero(self._seen[: self._n])

    def state(self, code: int) -> Any:
        """Identity `code`'s state as the model keeps it in `model.state`: the log's list
        of stamps, fw's (window, used), swc's (w, c, p), gcra's TAT; None where the model
        would hold no entry (never decided; gcra before its first admission)."""
        k = int(code)
        if k < 0 or k >= self._n or not self._seen[k]:
            return None
        return self._replay.state(k)

    def set_state(self, code: int, value: Any) -> None:
        """Give identity `code` the state `value`, in the model's format (see `state`);
        None forgets it."""
        k = int(code)
        if k < 0:
            raise ValueError("codes must be >= 0")
        self._reserve(k + 1)
        self._seen[k] = value is not None
        self._replay.set_state(k, value)

    @property
    def nbytes(self) -> int:
        """Bytes held for identities' state (arrays and the log's pool)."""
        return self._seen.nbytes + self._replay.nbytes


class Codes:
    """Stable dense codes for identities across chunks: the first identity seen is 0,
    the next new one 1, and so on; an identity keeps its code."""

    def __init__(self) -> None:
        self._index: dict[Any, int] = {}
        self._names: list[Any] = []
        # The categories last met (a reader keeps one until it meets a new name) and
        # the code of each, -1 where none is given yet.
        self._categories: Any = None
        self._category_names: list[Any] = []
        self._by_category = np.zeros(0, dtype=np.int64)

    def encode(self, identities: Iterable[Any]) -> np.ndarray:
        """Codes for `identities` (a column, array or list), int64, new ones appended."""
        if isinstance(identities, pd.Series | pd.Index):
            if isinstance(identities.dtype, pd.CategoricalDtype):
                return self._encode_categorical(identities.array)
            values = identities.to_numpy(dtype=object)
        elif isinstance(identities, np.ndarray):
            if identities.ndim != 1:
                raise ValueError(f"identities must be one-dimensional, got {identities.shape}")
            values = identities.astype(object, copy=False)
        else:
            items = list(identities)
            values = np.empty(len(items), dtype=object)
            values[:] = items
        local, uniques = pd.factorize(values)
        if (local < 0).any():
            raise ValueError("identities must not be missing (None or NaN)")
        index = self._index
        mapping = np.empty(len(uniques), dtype=np.int64)
        for j, who in enumerate(uniques):
            code = index.get(who)
            mapping[j] = self._new(who) if code is None else code
        return mapping[local]

    def _new(self, who: Any) -> int:
        """The next code, given to `who`."""
        code = self._index[who] = len(self._names)
        self._names.append(who)
        return code

    def _encode_categorical(self, column: Any) -> np.ndarray:
        """`encode` for a categorical column, by its codes (no text is hashed): the
        same codes, new identities numbered in the order they first appear."""
        local = np.asarray(column.codes, dtype=np.int64)
        if len(local) and local.min() < 0:
            raise ValueError("identities must not be missing (None or NaN)")
        if column.categories is not self._categories:
            # A reader only ever appends categories: look up the new ones alone.
            self._categories = column.categories
            names, known = self._categories.tolist(), self._category_names
            kept = len(known) if names[: len(known)] == known else 0
            looked_up = [self._index.get(w, -1) for w in names[kept:]]
            self._by_category = np.concatenate(
                [self._by_category[:kept], np.array(looked_up, dtype=np.int64)]
            )
            self._category_names = names
        codes = self._by_category[local]
        fresh = codes < 0
        if fresh.any():
            found, first = np.unique(local[fresh], return_index=True)
            for category in found[np.argsort(first, kind="stable")].tolist():
                self._by_category[category] = self._new(self._category_names[category])
            codes = self._by_category[local]
        return codes

    def __len__(self) -> int:
        return len(self._names)

    def identity(self, code: int) -> Any:
        """The identity behind `code`."""
        return self._names[int(code)]

    def identities(self) -> list[Any]:
        """Every identity, in code order."""
        return list(self._names)


algorithms.register("replay", _LogReplay, *algorithms.LOG_STORAGES.values())
algorithms.register("replay", _FixedWindowReplay, algorithms.FIXED_WINDOW)
algorithms.register("replay", _CounterReplay, algorithms.SLIDING_WINDOW_COUNTER)
algorithms.register("replay", _GcraReplay, algorithms.GCRA)
