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
dense codes 0..n-1 (`Codes`), which may grow from call to call. `WindowPeaks` keeps,
per identity, the largest admitted cost in any rolling window, as
`ratelimit.lab.metrics.max_in_window_ms` computes it, without holding the whole trace.

Exactness. The models' arithmetic is Python's: integers, and IEEE doubles where the
Lua scripts use floats. The kernels do the same operations in the same order on int64
and float64 (no fastmath), which gives the same bits as long as every integer a model
turns into a float is exact as a double: times within +-2**53 ms (any time
`timebase.seconds_to_ms` makes), and, for the sliding-window counter, limit x window
below 2**53. Anything outside that gets a ValueError, never a different decision.

Memory. The sliding log keeps (stamp, units) pairs, one per distinct millisecond an
identity was admitted at, in a ring per identity carved out of one shared pool that
grows by doubling: an identity's ring starts at two pairs and doubles when full, so a
million identities that each send a few requests cost a few pairs each, whatever the
limit. A ring never holds more pairs than the model's list holds stamps (at most the
limit). The other three algorithms keep two or three numbers per identity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from numba import njit

from ratelimit import algorithms, validation

from .reference.gcra import EPSILON as _GCRA_EPSILON

__all__ = ["Codes", "Replayer", "WindowPeaks", "MAX_EXACT_MS"]

# Integers up to 2**53 are exact as doubles: the models' int -> float conversions
# round nothing below it, so the compiled arithmetic gives the models' bits.
MAX_EXACT_MS = 2**53
_FIRST_RING = 2  # pairs in an identity's first ring (a power of two)
_MIN_POOL = 1024
# WindowPeaks keeps this much history behind each identity's newest stamp by default,
# so a stamp up to five minutes late still counts exactly (logs merged from servers).
DEFAULT_REORDER_MS = 300_000


# ---------------------------------------------------------------- the pool of rings
#
# Identity k owns pool slots off[k] .. off[k] + cap[k] - 1, a ring of cap[k] (a power
# of two, or 0 before its first pair) pairs (key[], val[]); its logical pair j sits at
# off[k] + ((head[k] + j) & (cap[k] - 1)), for j < size[k]. A full ring moves to a
# block twice its size at the pool's top; the old block is garbage until the pool is
# compacted (`_compact`), which happens only when the pool is full.


@njit(cache=True)
def _slot(off, cap, head, k, j):
    return off[k] + ((head[k] + j) & (cap[k] - 1))


@njit(cache=True)
def _unwrap(off, cap, head, k, n, keys, vals, to_keys, to_vals, start):
    """Copy the first `n` pairs of identity k's ring, in order, to `start` onwards."""
    for j in range(n):
        s = _slot(off, cap, head, k, j)
        to_keys[start + j] = keys[s]
        to_vals[start + j] = vals[s]


@njit(cache=True)
def _make_room(k, need, off, cap, head, size, keys, vals, top):
    """Give identity k a ring of at least `need` pairs, moving its pairs (False: the
    pool is full, nothing changed)."""
    if cap[k] >= need:
        return True
    new_cap = max(cap[k], _FIRST_RING)
    while new_cap < need:
        new_cap *= 2
    start = top[0]
    if start + new_cap > keys.shape[0]:
        return False
    _unwrap(off, cap, head, k, size[k], keys, vals, keys, vals, start)
    off[k] = start
    cap[k] = new_cap
    head[k] = 0
    top[0] = start + new_cap
    return True


@njit(cache=True)
def _packed_caps(cap, size):
    """Each ring's size once packed: none when empty, halved while a quarter full."""
    out = np.zeros_like(cap)
    for k in range(cap.shape[0]):
        n = size[k]
        if n > 0:
            c = cap[k]
            while c > _FIRST_RING and n * 4 <= c:
                c //= 2
            out[k] = c
    return out


@njit(cache=True)
def _compact(off, cap, head, size, new_caps, keys, vals, new_keys, new_vals):
    """Copy every ring into a new pool, unwrapped, packed, at its `new_caps` size.
    Returns the new pool's top."""
    top = 0
    for k in range(off.shape[0]):
        n = size[k]
        if n == 0:
            off[k] = 0
            cap[k] = 0
            head[k] = 0
            continue
        new_cap = new_caps[k]
        _unwrap(off, cap, head, k, n, keys, vals, new_keys, new_vals, top)
        off[k] = top
        cap[k] = new_cap
        head[k] = 0
        top += new_cap
    return top


class _Pool:
    """Rings of (key, value) int64 pairs, one per identity, in one growable pool."""

    def __init__(self) -> None:
        self.off = np.zeros(0, dtype=np.int64)
        self.cap = np.zeros(0, dtype=np.int64)
        self.head = np.zeros(0, dtype=np.int64)
        self.size = np.zeros(0, dtype=np.int64)
        self.keys = np.zeros(_MIN_POOL, dtype=np.int64)
        self.vals = np.zeros(_MIN_POOL, dtype=np.int64)
        self.top = np.zeros(1, dtype=np.int64)

    def identities(self, n: int) -> None:
        """Room for identity codes 0..n-1."""
        have = self.off.shape[0]
        if n > have:
            grown = max(n, 2 * have, 16)
            for name in ("off", "cap", "head", "size"):
                old = getattr(self, name)
                new = np.zeros(grown, dtype=np.int64)
                new[:have] = old
                setattr(self, name, new)

    def grow(self, need: int) -> None:
        """A pool with room for `need` more pairs, and as much again as the rings hold,
        so growth is amortized. It is copied as it is, unless packing the rings (without
        the blocks they moved out of, mostly empty rings shrunk) would halve it."""
        new_caps = _packed_caps(self.cap, self.size)
        packed, top = int(new_caps.sum()), int(self.top[0])
        pack = 2 * packed <= top
        length = max(_MIN_POOL, 2 * ((packed if pack else top) + need))
        keys = np.empty(length, dtype=np.int64)
        vals = np.empty(length, dtype=np.int64)
        if pack:
            args = (self.off, self.cap, self.head, self.size, new_caps)
            self.top[0] = _compact(*args, self.keys, self.vals, keys, vals)
        else:
            keys[:top] = self.keys[:top]
            vals[:top] = self.vals[:top]
        self.keys, self.vals = keys, vals

    def pairs(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Identity k's pairs in order (copies)."""
        n, c = int(self.size[k]), int(self.cap[k])
        if n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        where = self.off[k] + (self.head[k] + np.arange(n)) % c
        return self.keys[where].copy(), self.vals[where].copy()

    def set_pairs(self, k: int, keys: np.ndarray, vals: np.ndarray) -> None:
        """Replace identity k's pairs."""
        n = len(keys)
        self.size[k] = 0
        if n and not _make_room(
            k, n, self.off, self.cap, self.head, self.size, self.keys, self.vals, self.top
        ):
            self.grow(4 * n)
            _make_room(
                k, n, self.off, self.cap, self.head, self.size, self.keys, self.vals, self.top
            )
        self.head[k] = 0
        self.keys[self.off[k] : self.off[k] + n] = keys
        self.vals[self.off[k] : self.off[k] + n] = vals
        self.size[k] = n

    @property
    def nbytes(self) -> int:
        arrays = (self.off, self.cap, self.head, self.size, self.keys, self.vals)
        return sum(a.nbytes for a in arrays)


# ---------------------------------------------------------------- the four kernels
#
# Each decides rows start.. of (codes, times, costs) into (allowed, remaining, retry)
# and returns the row it stopped at: the end, or (the log) a row whose identity needs
# a bigger ring than the pool has room for, decided after the pool has grown. `seen`
# marks identities that were decided at least once (the model then holds their state).


@njit(cache=True)
def _first_after(off, cap, head, keys, k, n, edge):
    """Logical index of identity k's first pair whose key is > edge (n if none)."""
    if n == 0 or keys[_slot(off, cap, head, k, 0)] > edge:
        return 0
    lo = 1
    # Usually only a pair or two have left the window: look at those before bisecting.
    while lo < n and lo < 4:
        if keys[_slot(off, cap, head, k, lo)] > edge:
            return lo
        lo += 1
    hi = n
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[_slot(off, cap, head, k, mid)] > edge:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True)
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
            newest = keys[_slot(off, cap, head, k, n - 1)]
            if newest > now:
                at = newest
        edge = at - window
        first = _first_after(off, cap, head, keys, k, n, edge)
        base = below[k] if first == 0 else ends[_slot(off, cap, head, k, first - 1)]
        count = 0
        if n > 0:
            count = ends[_slot(off, cap, head, k, n - 1)] - base
        if count + cost > limit:
            # The model reads stamps[start + count + cost - limit - 1]: the unit with
            # that rank among those in the window, found by its running total.
            unit = base + count + cost - limit
            lo = first
            hi = n - 1
            while lo < hi:
                mid = (lo + hi) >> 1
                if ends[_slot(off, cap, head, k, mid)] >= unit:
                    hi = mid
                else:
                    lo = mid + 1
            seen[k] = True
            allowed[i] = False
            remaining[i] = max(limit - count, 0)
            retry[i] = keys[_slot(off, cap, head, k, lo)] + window - now
            continue
        # Admitted: drop the pairs that left the window, then add `cost` units at `at`.
        kept = n - first
        merge = kept > 0 and keys[_slot(off, cap, head, k, n - 1)] == at
        # A full ring (nothing left the window, so kept == n) moves to a bigger one;
        # if the pool has no room, stop here, untouched, and resume once it has grown.
        if not merge and kept + 1 > cap[k]:
            if not _make_room(k, kept + 1, off, cap, head, size, keys, ends, top):
                return i
        seen[k] = True
        if first:
            below[k] = base
            head[k] = (head[k] + first) & (cap[k] - 1)
            size[k] = kept
        if merge:
            ends[_slot(off, cap, head, k, kept - 1)] += cost
        else:
            s = _slot(off, cap, head, k, kept)
            keys[s] = at
            ends[s] = base + count + cost
            size[k] = kept + 1
        allowed[i] = True
        remaining[i] = limit - count - cost
        retry[i] = 0
    return codes.shape[0]


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


# ---------------------------------------------------------------- the public classes


def _int_array(name: str, values: Any) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise ValueError(f"{name} must be integers, got dtype {array.dtype}")
    if array.dtype.kind == "u" and array.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} is out of range")
    return np.ascontiguousarray(array, dtype=np.int64)


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
        name = "log" if found is algorithms.COMPACT_LOG else found.name
        options: dict[str, Any] = {"limit": limit, "window_ms": window_ms}
        if name == "gcra":
            options["burst"] = burst
        elif burst is not None:
            raise ValueError(f"burst applies to gcra only, not {name!r}")
        # The model validates the options (one home for those rules).
        model = found.build("reference", **options)
        self.algorithm: str = name
        self.limit: int = model.limit
        self.window_ms: int = model.window_ms
        self.burst: int | None = model.burst if name == "gcra" else None
        self.max_cost: int = min(self.limit, self.burst or self.limit)
        if name == "swc" and self.limit * self.window_ms >= MAX_EXACT_MS:
            raise ValueError(
                "the sliding-window counter's limit x window_ms must be below 2**53 for "
                f"exact compiled arithmetic, got {self.limit} x {self.window_ms}; "
                "replay with the reference model instead"
            )
        if name == "gcra":
            # The model's own expressions, so the floats are the same.
            self._interval = self.window_ms / self.limit
            self._tolerance = self._interval * self.burst
        self._n = 0
        self._seen = np.zeros(0, dtype=np.bool_)
        if name == "log":
            self._pool = _Pool()
            self._below = np.zeros(0, dtype=np.int64)
        else:
            self._has = np.zeros(0, dtype=np.bool_)
            self._a = np.zeros(0, dtype=np.int64 if name != "gcra" else np.float64)
            self._b = np.zeros(0, dtype=np.int64)
            self._c = np.zeros(0, dtype=np.int64)

    @classmethod
    def for_model(cls, model: Any) -> Replayer:
        """The replayer that decides as the reference model `model` (its options)."""
        burst = getattr(model, "burst", None) if model.algorithm is algorithms.GCRA else None
        return cls(model.algorithm, model.limit, model.window_ms, burst=burst)

    # -- identities

    def _reserve(self, n: int) -> None:
        if n <= self._n:
            return
        have = self._seen.shape[0]
        if n > have:
            grown = max(n, 2 * have, 16)
            names = ["_seen", "_below"] if self.algorithm == "log" else ["_seen", "_has"]
            if self.algorithm != "log":
                names += ["_a", "_b", "_c"]
            for attr in names:
                old = getattr(self, attr)
                new = np.zeros(grown, dtype=old.dtype)
                new[:have] = old
                setattr(self, attr, new)
            if self.algorithm == "log":
                self._pool.identities(grown)
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
        codes = _int_array("codes", codes)
        times = _int_array("times_ms", times_ms)
        costs = _int_array("costs", costs)
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
        self._run(codes, times, costs, allowed, remaining, retry)
        return allowed, remaining, retry

    def _run(self, codes, times, costs, allowed, remaining, retry) -> None:
        out = (allowed, remaining, retry)
        if self.algorithm == "fw":
            state = (self._has, self._a, self._b, self._seen)
            _fw_kernel(codes, times, costs, 0, self.limit, self.window_ms, *state, *out)
        elif self.algorithm == "swc":
            state = (self._has, self._a, self._b, self._c, self._seen)
            _swc_kernel(codes, times, costs, 0, self.limit, self.window_ms, *state, *out)
        elif self.algorithm == "gcra":
            _gcra_kernel(
                codes, times, costs, 0, self._interval, self._tolerance, _GCRA_EPSILON,
                self._has, self._a, self._seen, *out,
            )  # fmt: skip
        else:
            start, n, p = 0, codes.shape[0], self._pool
            while True:
                start = _log_kernel(
                    codes, times, costs, start, self.limit, self.window_ms,
                    p.off, p.cap, p.head, p.size, self._below, p.keys, p.vals, p.top,
                    self._seen, *out,
                )  # fmt: skip
                if start == n:
                    return
                p.grow(2 * int(p.cap[codes[start]]) + _FIRST_RING)

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
        if self.algorithm == "log":
            stamps, ends = self._pool.pairs(k)
            units = np.diff(ends, prepend=self._below[k])
            return np.repeat(stamps, units).tolist()
        has = bool(self._has[k])
        if self.algorithm == "gcra":
            return float(self._a[k]) if has else None
        window = int(self._a[k]) if has else None
        if self.algorithm == "fw":
            return (window, int(self._b[k]))
        return (window, int(self._b[k]), int(self._c[k]))

    def set_state(self, code: int, value: Any) -> None:
        """Give identity `code` the state `value`, in the model's format (see `state`);
        None forgets it."""
        k = int(code)
        if k < 0:
            raise ValueError("codes must be >= 0")
        self._reserve(k + 1)
        self._seen[k] = value is not None
        if self.algorithm == "log":
            stamps = np.asarray([] if value is None else value, dtype=np.int64)
            if stamps.size and (np.diff(stamps) < 0).any():
                raise ValueError("a sliding log's stamps must be in order")
            keys, units = np.unique(stamps, return_counts=True)
            self._below[k] = 0
            self._pool.set_pairs(k, keys, np.cumsum(units, dtype=np.int64))
            return
        if self.algorithm == "gcra":
            self._has[k] = value is not None
            self._a[k] = 0.0 if value is None else float(value)
            return
        parts = (None, 0, 0) if value is None else tuple(value)
        self._has[k] = parts[0] is not None
        self._a[k] = 0 if parts[0] is None else parts[0]
        self._b[k] = parts[1]
        if self.algorithm == "swc":
            self._c[k] = parts[2]

    @property
    def nbytes(self) -> int:
        """Bytes held for identities' state (arrays and the log's pool)."""
        if self.algorithm == "log":
            return self._pool.nbytes + self._below.nbytes + self._seen.nbytes
        arrays = (self._seen, self._has, self._a, self._b, self._c)
        return sum(a.nbytes for a in arrays)


class Codes:
    """Stable dense codes for identities across chunks: the first identity seen is 0,
    the next new one 1, and so on; an identity keeps its code."""

    def __init__(self) -> None:
        self._index: dict[Any, int] = {}
        self._names: list[Any] = []

    def encode(self, identities: Iterable[Any]) -> np.ndarray:
        """Codes for `identities` (a column, array or list), int64, new ones appended."""
        if isinstance(identities, pd.Series | pd.Index):
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
        index, names = self._index, self._names
        mapping = np.empty(len(uniques), dtype=np.int64)
        for j, who in enumerate(uniques):
            code = index.get(who)
            if code is None:
                code = index[who] = len(names)
                names.append(who)
            mapping[j] = code
        return mapping[local]

    def __len__(self) -> int:
        return len(self._names)

    def identity(self, code: int) -> Any:
        """The identity behind `code`."""
        return self._names[int(code)]

    def identities(self) -> list[Any]:
        """Every identity, in code order."""
        return list(self._names)


# ---------------------------------------------------------------- rolling-window peaks


@njit(cache=True)
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
        newest = keys[_slot(off, cap, head, k, n - 1)] if n > 0 else t
        if n > 0 and t == newest:
            vals[_slot(off, cap, head, k, n - 1)] += wt
            wsum[k] += wt
            peaks[k] = max(peaks[k], wsum[k])
            continue
        if not _make_room(k, n + 1, off, cap, head, size, keys, vals, top):
            return i
        if n == 0 or t > newest:
            s = _slot(off, cap, head, k, n)
            keys[s] = t
            vals[s] = wt
            size[k] = n + 1
            n += 1
            j = wstart[k]
            total = wsum[k] + wt
            while keys[_slot(off, cap, head, k, j)] <= t - window:
                total -= vals[_slot(off, cap, head, k, j)]
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
            pos = _first_after(off, cap, head, keys, k, n, t - 1)
            if keys[_slot(off, cap, head, k, pos)] == t:
                vals[_slot(off, cap, head, k, pos)] += wt
            else:
                for j in range(n, pos, -1):
                    dst = _slot(off, cap, head, k, j)
                    src = _slot(off, cap, head, k, j - 1)
                    keys[dst] = keys[src]
                    vals[dst] = vals[src]
                s = _slot(off, cap, head, k, pos)
                keys[s] = t
                vals[s] = wt
                size[k] = n + 1
                n += 1
                if t <= newest - window:
                    wstart[k] += 1
            if t > newest - window:
                wsum[k] += wt
            lo = pos
            while lo > 0 and keys[_slot(off, cap, head, k, lo - 1)] > t - window:
                lo -= 1
            total = 0
            for j in range(lo, pos):
                total += vals[_slot(off, cap, head, k, j)]
            for m in range(pos, n):
                stamp = keys[_slot(off, cap, head, k, m)]
                if stamp >= t + window:
                    break
                total += vals[_slot(off, cap, head, k, m)]
                while keys[_slot(off, cap, head, k, lo)] <= stamp - window:
                    total -= vals[_slot(off, cap, head, k, lo)]
                    lo += 1
                peaks[k] = max(peaks[k], total)
        if horizon >= 0:
            # Pairs at or before newest - window - horizon can no longer matter.
            drop = 0
            while drop < n and keys[_slot(off, cap, head, k, drop)] <= newest - window - horizon:
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
        self._pool = _Pool()
        self._wstart = np.zeros(0, dtype=np.int64)
        self._wsum = np.zeros(0, dtype=np.int64)
        self._peaks = np.zeros(0, dtype=np.int64)
        self._late = np.zeros(1, dtype=np.int64)
        self._n = 0

    def add(self, codes: Any, times_ms: Any, weights: Any) -> None:
        """Add one chunk: identity codes, whole-ms times, non-negative integer weights."""
        codes = _int_array("codes", codes)
        times = _int_array("times_ms", times_ms)
        w = np.asarray(weights)
        w = _int_array("weights", w.astype(np.int64) if w.dtype == np.bool_ else w)
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
            p.grow(2 * int(p.cap[codes[start]]) + _FIRST_RING)

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
