"""What the compiled replay (`fastreplay`) and the rolling-window peaks (`windowpeaks`)
share: a pool of per-identity rings of (int64, int64) pairs, the numba helpers that
walk them, and the checks their inputs go through.

Identity k owns pool slots off[k] .. off[k] + cap[k] - 1, a ring of cap[k] (a power of
two, or 0 before its first pair) pairs (key[], val[]); its logical pair j sits at
off[k] + ((head[k] + j) & (cap[k] - 1)), for j < size[k]. A full ring moves to a block
twice its size at the pool's top; the old block is garbage until the pool is compacted
(`compact`), which happens only when the pool is full. An identity's ring starts at two
pairs and doubles when full, so a million identities that each hold a few pairs cost a
few pairs each.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

# Integers up to 2**53 are exact as doubles: the models' int -> float conversions
# round nothing below it, so the compiled arithmetic gives the models' bits.
MAX_EXACT_MS = 2**53
FIRST_RING = 2  # pairs in an identity's first ring (a power of two)
_MIN_POOL = 1024


@njit(cache=True, nogil=True)
def slot(off, cap, head, k, j):
    return off[k] + ((head[k] + j) & (cap[k] - 1))


@njit(cache=True, nogil=True)
def unwrap(off, cap, head, k, n, keys, vals, to_keys, to_vals, start):
    """Copy the first `n` pairs of identity k's ring, in order, to `start` onwards."""
    for j in range(n):
        s = slot(off, cap, head, k, j)
        to_keys[start + j] = keys[s]
        to_vals[start + j] = vals[s]


@njit(cache=True, nogil=True)
def make_room(k, need, off, cap, head, size, keys, vals, top):
    """Give identity k a ring of at least `need` pairs, moving its pairs (False: the
    pool is full, nothing changed)."""
    if cap[k] >= need:
        return True
    new_cap = max(cap[k], FIRST_RING)
    while new_cap < need:
        new_cap *= 2
    start = top[0]
    if start + new_cap > keys.shape[0]:
        return False
    unwrap(off, cap, head, k, size[k], keys, vals, keys, vals, start)
    off[k] = start
    cap[k] = new_cap
    head[k] = 0
    top[0] = start + new_cap
    return True


@njit(cache=True, nogil=True)
def packed_caps(cap, size):
    """Each ring's size once packed: none when empty, halved while a quarter full."""
    out = np.zeros_like(cap)
    for k in range(cap.shape[0]):
        n = size[k]
        if n > 0:
            c = cap[k]
            while c > FIRST_RING and n * 4 <= c:
                c //= 2
            out[k] = c
    return out


@njit(cache=True, nogil=True)
def compact(off, cap, head, size, new_caps, keys, vals, new_keys, new_vals):
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
        unwrap(off, cap, head, k, n, keys, vals, new_keys, new_vals, top)
        off[k] = top
        cap[k] = new_cap
        head[k] = 0
        top += new_cap
    return top


class Pool:
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
        new_caps = packed_caps(self.cap, self.size)
        packed, top = int(new_caps.sum()), int(self.top[0])
        pack = 2 * packed <= top
        length = max(_MIN_POOL, 2 * ((packed if pack else top) + need))
        keys = np.empty(length, dtype=np.int64)
        vals = np.empty(length, dtype=np.int64)
        if pack:
            args = (self.off, self.cap, self.head, self.size, new_caps)
            self.top[0] = compact(*args, self.keys, self.vals, keys, vals)
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
        if n and not make_room(
            k, n, self.off, self.cap, self.head, self.size, self.keys, self.vals, self.top
        ):
            self.grow(4 * n)
            make_room(
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


@njit(cache=True, nogil=True)
def first_after(off, cap, head, keys, k, n, edge):
    """Logical index of identity k's first pair whose key is > edge (n if none)."""
    if n == 0 or keys[slot(off, cap, head, k, 0)] > edge:
        return 0
    lo = 1
    # Usually only a pair or two have left the window: look at those before bisecting.
    while lo < n and lo < 4:
        if keys[slot(off, cap, head, k, lo)] > edge:
            return lo
        lo += 1
    hi = n
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[slot(off, cap, head, k, mid)] > edge:
            hi = mid
        else:
            lo = mid + 1
    return lo


def int_array(name: str, values: Any) -> np.ndarray:
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
