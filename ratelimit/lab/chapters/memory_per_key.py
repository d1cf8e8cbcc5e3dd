"""Chapter 3's explore figure: what a fleet of API keys costs in Redis, per algorithm.

    from ratelimit.lab.chapters import memory_per_key
    from ratelimit.lab.plotting import explorer
    memory_per_key.figure()                               # 10 million keys at limit 1,000
    memory_per_key.figure(active_keys=10**5, limit=128)   # another fleet and limit
    explorer(memory_per_key.figure, **memory_per_key.SLIDERS)

The bytes per key come from the table chapter 3 stored the last time it measured a real
Redis (`notebooks/data/memory_per_key.csv`), through `ratelimit.lab.memory`: no Redis is
needed, and the figure is the same on every machine.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import memory

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = ["SERIES", "SLIDERS", "STORED_TABLE", "figure"]

# The chapter's stored table: relative to the notebooks' folder (where the chapters run),
# else found beside this package in a source checkout.
STORED_TABLE = Path("data/memory_per_key.csv")
_CHECKOUT_TABLE = Path(__file__).resolve().parents[3] / "notebooks" / STORED_TABLE

# (algorithm, member format) -> bar label, as in the chapter's tables and figures.
SERIES = {
    ("log", "script"): "sliding log,\nour members",
    ("log", "classic"): "sliding log,\nclassic members",
    ("fw", ""): "fixed window",
    ("swc", ""): "sliding-window\ncounter",
    ("gcra", ""): "GCRA\n(token bucket)",
}

# The explore section's controls (ipywidgets abbreviations; a dict is a drop-down).
SLIDERS: dict[str, Any] = {
    "active_keys": {f"{10**e:,}": 10**e for e in range(3, 9)},
    "limit": [10, 100, 128, 129, 1_000, 10_000],
}

_LOG_COLOR, _O1_COLOR = "tab:red", "tab:blue"


@cache
def _load(path: Path, mtime_ns: int) -> pd.DataFrame:
    """The stored table, read once per file version (redraws must stay fast)."""
    return memory.load_table(path)


def _table(table: str | Path | pd.DataFrame | None) -> pd.DataFrame:
    if table is not None and not isinstance(table, str | Path):
        return table
    if table is None:
        found = [p for p in (STORED_TABLE, _CHECKOUT_TABLE) if p.exists()]
        if not found:
            raise FileNotFoundError(
                f"no stored memory table at {STORED_TABLE} (run from notebooks/) "
                f"or {_CHECKOUT_TABLE}; pass table=... explicitly"
            )
        path = found[0]
    else:
        path = Path(table)
    path = path.resolve()
    return _load(path, path.stat().st_mtime_ns)


def _binary_tick(value: float, _position: Any) -> str:
    """A tick label such as "32 KiB" or "1 TiB" (ticks are powers of two)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    power = 0
    while power < len(units) - 1 and value >= 1024 ** (power + 1):
        power += 1
    return f"{value / 1024**power:g} {units[power]}"


def figure(
    *,
    active_keys: int = 10**7,
    limit: int = 1_000,
    table: str | Path | pd.DataFrame | None = None,
) -> Figure:
    """Bars of a fleet's Redis memory per algorithm, from the measured bytes per key.

    - `active_keys`: API keys holding a key right now, each full (at its limit): the
      worst case the chapter sizes for (its largest fleet, 10 million, by default).
    - `limit`: the per-key limit; it must be one the table measured (the chapter's
      largest fleet limit, 1,000, by default).
    - `table`: a `ratelimit.lab.memory` table, or the path of a stored one; by default the
      chapter's `data/memory_per_key.csv`.

    Total = `active_keys` x MEMORY USAGE of one full key (`memory.fleet_memory`), a
    lower bound (the server's own bookkeeping comes on top). The y axis is logarithmic:
    the sliding log and the O(1) algorithms differ by up to a factor of 10,000.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    data = _table(table)
    fleet = memory.fleet_memory(data, [active_keys], [limit])
    totals = fleet.set_index(["algorithm", "member_format"]).total_bytes
    version = data.redis_version.iloc[0]

    fig, ax = plt.subplots(figsize=(8, 4.5))
    names, heights, colors = [], [], []
    for (algorithm, member_format), name in SERIES.items():
        names.append(name)
        heights.append(int(totals[algorithm, member_format]))
        colors.append(_LOG_COLOR if algorithm == "log" else _O1_COLOR)
    bars = ax.bar(names, heights, color=colors)
    ax.bar_label(bars, labels=[memory.format_bytes(h) for h in heights], fontsize=8)
    # Legend entries for the two families (one handle each).
    bars[0].set_label("sliding log: grows with the limit")
    bars[2].set_label("O(1): the same at every limit")
    ax.set_yscale("log")
    ax.set_ylim(min(heights) / 3, max(heights) * 6)
    # Ticks at 1 KiB, 32 KiB, 1 MiB, 32 MiB, ...: powers of 32, in binary units.
    ax.yaxis.set_major_locator(LogLocator(base=32))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(_binary_tick))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel("algorithm (Redis data structure per API key)")
    ax.set_ylabel("fleet memory, sum of MEMORY USAGE (bytes, log scale)")
    ax.set_title(f"{active_keys:,} active API keys, each full at limit {limit:,} (Redis {version})")
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    return fig
