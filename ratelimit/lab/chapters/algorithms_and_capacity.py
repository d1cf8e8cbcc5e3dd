"""Chapter 5, section 7: how many Redis shards a fleet of API keys needs, per algorithm.

    from ratelimit.lab.chapters import algorithms_and_capacity as explore_capacity
    explore_capacity.figure()                        # the chapter's figure (its parameters)
    explore_capacity.figure(limit=100, headroom=0.3) # another policy

The figure plays a fleet from 1,000 to 100 million active keys through
`ratelimit.lab.capacity.plan_fleet`, with the bytes per key read from chapter 3's stored
table (`ratelimit.lab.capacity.bytes_per_key`). No trace is replayed: the sizing is
arithmetic on the measured table and the per-check costs, as in the chapter, which is
what keeps a redraw well under a second.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import capacity, memory

if TYPE_CHECKING:
    import matplotlib.figure
    import pandas as pd

__all__ = ["US_PER_CHECK", "figure"]

# The chapter's REDIS_US_PER_CHECK: Redis CPU per script call, microseconds.
US_PER_CHECK: Mapping[str, float] = {"log": 21.0, "fw": 7.0, "swc": 8.0, "gcra": 7.0}

_COLORS = {"log": "tab:blue", "fw": "tab:orange", "swc": "tab:green", "gcra": "tab:purple"}
# Label -> (algorithm, line style); the order of the chapter's figure and legend.
_STYLES: dict[str, tuple[str, dict[str, object]]] = {
    "sliding log, keys full": ("log", {"linewidth": 2.5}),
    "sliding log, steady state": ("log", {"linestyle": "--"}),
    "fixed window": ("fw", {"linewidth": 3, "alpha": 0.6}),
    "sliding-window counter": ("swc", {"linewidth": 1.5}),
    "GCRA (token bucket)": ("gcra", {"linestyle": ":", "linewidth": 2}),
}
# The x axis: 241 fleet sizes, log-spaced from 10**3 to 10**8 (as in the chapter).
_KEYS_AXIS = np.unique(np.geomspace(1e3, 1e8, 241).round().astype(int))


@lru_cache(maxsize=4)
def _stored_table(path: str) -> pd.DataFrame:
    """Chapter 3's stored memory table, read once per path (never measured here)."""
    return memory.measured_or_stored(None, path, [1]).table


def figure(
    *,
    active_keys: float = 1_000_000,
    rate_per_key: float = 0.05,
    limit: float = 1_000,
    window_s: int = 3_600,
    headroom: float = 0.5,
    shard_memory_gib: float = 14,
    shard_checks_per_s: float = 50_000,
    us_per_check: Mapping[str, float] = US_PER_CHECK,
    key_overhead_bytes: float = 64,
    table: pd.DataFrame | None = None,
    table_path: str | Path = "data/memory_per_key.csv",
) -> matplotlib.figure.Figure:
    """Redis shards needed against fleet size, one step line per algorithm and sizing.

    The defaults are chapter 5's parameters (CAP_ACTIVE_KEYS, CAP_RATE_PER_KEY,
    CAP_LIMIT, CAP_WINDOW_S, HEADROOM, SHARD_MEMORY_GIB, SHARD_CHECKS_PER_S,
    REDIS_US_PER_CHECK, KEY_OVERHEAD_BYTES). `active_keys` (rounded to a whole key)
    places the dotted marker, and the legend gives each line's shards there;
    `rate_per_key` is requests per second per active key; `limit` (rounded, >= 1)
    requests per `window_s` seconds; `headroom` the share of each shard's memory and
    checks per second kept free. Each line's dot is the most keys one Redis carries.

    `table` is a `memory.memory_table`; without it the table stored at `table_path`
    (relative to the working directory, the notebooks' folder) is read, once.
    Returns the figure without showing it.
    """
    import matplotlib.pyplot as plt

    if table is None:
        table = _stored_table(str(table_path))
    keys = int(round(active_keys))
    limit = max(1, int(round(limit)))
    shard_memory = shard_memory_gib * 2**30
    steady = max(1.0, capacity.log_members(limit, rate_per_key, window_s))
    entries = {"sliding log, keys full": float(limit), "sliding log, steady state": steady}

    def plan(algorithm: str, key_bytes: float, n: int) -> capacity.CapacityPlan:
        return capacity.plan_fleet(
            algorithm,
            active_keys=n,
            rate_per_key=rate_per_key,
            bytes_per_key=key_bytes,
            us_per_check=us_per_check[algorithm],
            shard_memory_bytes=shard_memory,
            shard_checks_per_s=shard_checks_per_s,
            headroom=headroom,
            key_overhead_bytes=key_overhead_bytes,
        )

    fig, ax = plt.subplots(figsize=(9, 4.8))
    for label, (algorithm, style) in _STYLES.items():
        key_bytes = capacity.bytes_per_key(table, algorithm, entries.get(label, limit))
        shards = [plan(algorithm, key_bytes, int(n)).shards for n in _KEYS_AXIS]
        here = plan(algorithm, key_bytes, keys)
        color = _COLORS[algorithm]
        ax.step(
            _KEYS_AXIS,
            shards,
            where="post",
            color=color,
            label=f"{label}: {here.shards:,} shard{'s' if here.shards > 1 else ''}",
            **style,
        )
        ax.plot([here.keys_per_shard], [1], marker="o", color=color)
    ax.axvline(keys, color="grey", linestyle=":", linewidth=1)
    ax.text(
        keys / 1.15,
        0.97,
        f"{keys:,} keys\n(the legend's shards)",
        transform=ax.get_xaxis_transform(),
        fontsize=8,
        color="grey",
        ha="right",
        va="top",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(_KEYS_AXIS[0], _KEYS_AXIS[-1])
    ax.set_xlabel(f"active keys (each {rate_per_key:g} requests/s)")
    ax.set_ylabel("Redis shards needed")
    ax.set_title(
        f"Shards for a limit of {limit:,} per {window_s:,} s "
        f"({shard_memory_gib:g} GiB, {shard_checks_per_s:,.0f} checks/s per shard, "
        f"{headroom:.0%} free)\ndots: the most keys one Redis carries",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig
