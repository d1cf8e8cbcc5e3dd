"""Identities as dense codes shared by all chunks: a compiled hash table of the raw
values met so far, each counted as `ratelimit.identity.address_identity` counts it."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
from numba import njit

from ratelimit import identity


@njit(cache=True, nogil=True)
def _fnv(buf, lo, hi):
    """64-bit FNV-1a of buf[lo:hi]."""
    h = np.uint64(14695981039346656037)
    for p in range(lo, hi):
        h = (h ^ np.uint64(buf[p])) * np.uint64(1099511628211)
    return h


@njit(cache=True, nogil=True)
def _span_hashes(buf, lo, hi, out):
    for i in range(lo.size):
        out[i] = _fnv(buf, lo[i], hi[i])


@njit(cache=True, nogil=True)
def _find(buf, lo, hi, keys, table, pool, start, length, out):
    """out[i]: the slot whose bytes equal buf[lo[i]:hi[i]], or -1. `table` is an open-
    addressing hash table (linear probing) of slots by hash; equal hashes are told
    apart by their bytes, so a collision costs a probe, never a wrong slot."""
    mask = np.uint64(table.size - 1)
    for i in range(lo.size):
        h = _fnv(buf, lo[i], hi[i])
        j = np.int64(h & mask)
        out[i] = -1
        while table[j] >= 0:
            s = table[j]
            if keys[j] == h and length[s] == hi[i] - lo[i]:
                k = 0
                while k < length[s] and buf[lo[i] + k] == pool[start[s] + k]:
                    k += 1
                if k == length[s]:
                    out[i] = s
                    break
            j = np.int64((j + 1) & (table.size - 1))


@njit(cache=True, nogil=True)
def _insert(keys, table, hashes, slots):
    """Put `slots` into the table under their `hashes`."""
    mask = np.uint64(table.size - 1)
    for i in range(slots.size):
        j = np.int64(hashes[i] & mask)
        while table[j] >= 0:
            j = np.int64((j + 1) & (table.size - 1))
        keys[j] = hashes[i]
        table[j] = slots[i]


_MAYBE_IP = re.compile(r"[0-9A-Fa-f:.]+(%[^\s%]+)?")


class _Identities:
    """Dense codes for identities, shared by all chunks: raw text -> identity -> code.

    A raw value that is an IP address counts as its `identity.address_identity`, so the
    addresses of one IPv6 /64 share one code."""

    def __init__(self, ipv6_prefix: int) -> None:
        self.ipv6_prefix = ipv6_prefix
        self.by_raw: dict[str, int] = {}
        self.by_name: dict[str, int] = {}
        self.names: list[str] = []
        self._array = np.empty(0, dtype=object)
        self._dtype = pd.CategoricalDtype([])
        # Raws met so far, by slot: their bytes (in one pool), hashes and codes, and a
        # hash table of slots.
        self._pool = np.empty(0, dtype=np.uint8)
        self._start = np.empty(0, dtype=np.int64)
        self._length = np.empty(0, dtype=np.int64)
        self._slot_hash = np.empty(0, dtype=np.uint64)
        self._slot_code = np.empty(0, dtype=np.int64)
        self._keys = np.zeros(1024, dtype=np.uint64)
        self._table = np.full(1024, -1, dtype=np.int64)

    def name(self, raw: str) -> str:
        if len(raw) <= 64 and _MAYBE_IP.fullmatch(raw):
            try:
                return identity.address_identity(raw, self.ipv6_prefix)
            except ValueError:
                pass
        return raw

    def codes(self, raws: list[str]) -> np.ndarray:
        out = np.empty(len(raws), dtype=np.int64)
        for i, raw in enumerate(raws):
            code = self.by_raw.get(raw)
            if code is None:
                name = self.name(raw)
                code = self.by_name.setdefault(name, len(self.names))
                if code == len(self.names):
                    self.names.append(name)
                self.by_raw[raw] = code
            out[i] = code
        return out

    def span_codes(self, buf: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Codes of the raw identities `buf[lo[i]:hi[i]]`, found in the hash table of
        the raws seen so far (compiled); only raws never seen go through `codes`."""
        slots = np.empty(len(lo), dtype=np.int64)
        self._find(buf, lo, hi, slots)
        missing = np.flatnonzero(slots < 0)
        while len(missing):
            # One row per new raw, told apart by hash; raws whose hashes collide are
            # added on the next round (each round adds at least one).
            hashes = np.empty(len(missing), dtype=np.uint64)
            _span_hashes(buf, lo[missing], hi[missing], hashes)
            first = np.sort(np.unique(hashes, return_index=True)[1])
            self._add(buf, missing[first], lo, hi, hashes[first])
            found = np.empty(len(missing), dtype=np.int64)
            self._find(buf, lo[missing], hi[missing], found)
            slots[missing] = found
            missing = missing[found < 0]
        return self._slot_code[slots]

    def _find(self, buf: np.ndarray, lo: np.ndarray, hi: np.ndarray, out: np.ndarray) -> None:
        _find(buf, lo, hi, self._keys, self._table, self._pool, self._start, self._length, out)

    def _add(
        self, buf: np.ndarray, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, hashes: np.ndarray
    ) -> None:
        """New slots for the raws at `rows` (whose `hashes` are given): their bytes,
        hashes and codes."""
        pieces = [buf[lo[i] : hi[i]] for i in rows]
        texts = [p.tobytes().decode("utf-8", "backslashreplace") for p in pieces]
        lengths = (hi[rows] - lo[rows]).astype(np.int64)
        slots = len(self._slot_code) + np.arange(len(rows), dtype=np.int64)
        self._start = np.concatenate([self._start, len(self._pool) + np.cumsum(lengths) - lengths])
        self._length = np.concatenate([self._length, lengths])
        self._pool = np.concatenate([self._pool, *pieces])
        self._slot_hash = np.concatenate([self._slot_hash, hashes])
        self._slot_code = np.concatenate([self._slot_code, self.codes(texts)])
        if 2 * len(self._slot_code) > len(self._table):  # keep the table at most half full
            size = 2 ** int(np.ceil(np.log2(4 * len(self._slot_code))))
            self._keys = np.zeros(size, dtype=np.uint64)
            self._table = np.full(size, -1, dtype=np.int64)
            every = np.arange(len(self._slot_code), dtype=np.int64)
            _insert(self._keys, self._table, self._slot_hash, every)
        else:
            _insert(self._keys, self._table, hashes, slots)

    def of(self, codes: np.ndarray, dtype: str = "str") -> Any:
        """The identities of `codes`: their text, or a categorical of the names so far."""
        if dtype == "category":
            if len(self._dtype.categories) < len(self.names):
                self._dtype = pd.CategoricalDtype(self.names)
            return pd.Categorical.from_codes(codes, dtype=self._dtype)
        if len(self._array) < len(self.names):
            self._array = np.array(self.names, dtype=object)
        return pd.array(self._array[codes], dtype="str")


def _factorize(raws: list[Any]) -> tuple[np.ndarray, list[str]]:
    codes, uniques = pd.factorize(pd.Series(raws, dtype=object), use_na_sentinel=False)
    return codes.astype(np.int64), list(uniques)
