"""Figures of a bench run, written as PNG files beside results.json.

- checks.png: every async case as a ratio of EVALSHA `return 1` in the same round,
  hot key and 10k keys side by side, ours and the peers';
- concurrency.png: checks per second against the number of tasks sharing a client;
- server_cost.png: server time per check (INFO commandstats), admit and reject;
- memory.png: exact-log bytes per admitted unit against the limit, each storage and
  the classic recipe's members;
- nearcache.png: an abusive client's decisions per second with and without the
  near-cache, and through the classic recipe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on a CI machine
import matplotlib.pyplot as plt  # noqa: E402

from ratelimit import algorithms  # noqa: E402

from .checks import ARGS_FLOOR_CASE, BARE_SCRIPT_CASE, CLASSIC_REUSED_CASE, FLOORS  # noqa: E402
from .targets import COMPACT_BYTES, EVALSHA_TARGET  # noqa: E402

DECOMPOSITION = (ARGS_FLOOR_CASE, BARE_SCRIPT_CASE)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _checks(checks: dict[str, Any], path: Path) -> Path:
    results = checks["results"]
    base = FLOORS[1]
    names = [n for n in results if n not in FLOORS]
    values = [results[n]["ratios"][base] for n in names]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(names) + 1.6))
    peers = tuple(checks["peers"]) + tuple(checks.get("skipped", {}))

    def color(name: str) -> str:
        if name in DECOMPOSITION:
            return "tab:orange"
        if name.startswith(peers) or name == CLASSIC_REUSED_CASE:
            return "tab:gray"
        return "tab:blue"

    colors = [color(n) for n in names]
    ax.barh(names[::-1], values[::-1], color=colors[::-1])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(
        EVALSHA_TARGET,
        color="tab:red",
        linestyle="--",
        linewidth=0.8,
        label=f"target {EVALSHA_TARGET}x",
    )
    ax.set_xlabel(f"checks per second as a ratio of {base} (same round, median)")
    ax.set_title(
        f"One async check, median of {checks['rounds']} rounds\n"
        "ours blue, peers grey; orange: the floor with a check's arguments, the bare script",
        fontsize=10,
    )
    ax.legend(loc="lower right")
    ax.tick_params(axis="y", labelsize=8)
    return _save(fig, path)


def _concurrency(conc: dict[str, Any], path: Path) -> Path:
    tasks = conc["tasks"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for case in ("PING", "EVALSHA return 1", "SlidingWindowLimiter 10k keys"):
        ys = [conc["results"][f"{case}, {t} tasks"]["checks_per_s"] for t in tasks]
        ax.plot(tasks, ys, marker="o", label=case)
    ax.set_xscale("log")
    ax.set_xticks(tasks, [str(t) for t in tasks])
    ax.set_xlabel("asyncio tasks sharing one client")
    ax.set_ylabel("checks (or PINGs) per second")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput against concurrency (median of rounds)")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _server_cost(cost: dict[str, Any], path: Path) -> Path:
    results = cost["results"]
    names = list(results)
    values = [results[n]["usec_per_check"] for n in names]
    colors = {"floor": "tab:orange", "admit": "tab:blue", "reject": "tab:purple"}
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(names) + 1.6))
    ax.barh(names[::-1], values[::-1], color=[colors[results[n]["kind"]] for n in names][::-1])
    ax.set_xlabel("server time per check, usec (INFO commandstats, median of rounds)")
    ax.set_title(
        f"Server time per check, median of {cost['rounds']} rounds\n"
        "floors orange, admit (10k keys) blue, reject (hot key at its limit) purple",
        fontsize=10,
    )
    ax.tick_params(axis="y", labelsize=8)
    return _save(fig, path)


def _memory(memory: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    logs = [r for r in memory["rows"] if algorithms.get(r["algorithm"]).state_per_unit]
    for variant in dict.fromkeys((r["storage"], r["member_format"]) for r in logs):
        rows = [r for r in logs if (r["storage"], r["member_format"]) == variant]
        storage, member_format = variant
        label = f"storage={storage}" if storage else f'{member_format} "<ms>:<ns>" members'
        ax.plot(
            [r["limit"] for r in rows],
            [r["bytes_per_unit"] for r in rows],
            marker="o",
            label=label,
        )
    threshold = memory["zset_max_listpack_entries"]
    ax.axvline(threshold + 0.5, color="gray", linestyle=":", label=f"listpack limit ({threshold})")
    ax.axhline(
        COMPACT_BYTES,
        color="tab:red",
        linestyle="--",
        linewidth=0.8,
        label=f"target for storage=compact ({COMPACT_BYTES:g} B)",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("limit = admitted units in a full key (log scale)")
    ax.set_ylabel("bytes per admitted unit (MEMORY USAGE / units)")
    ax.set_title(f"Exact-log memory per admitted unit, Redis {memory['redis_version']}")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _nearcache(nc: dict[str, Any], path: Path) -> Path:
    names = list(nc["decisions_per_s"])
    values = [nc["decisions_per_s"][n] for n in names]
    fig, ax = plt.subplots(figsize=(6.5, 2.6))
    colors = ["tab:blue" if n != "classic recipe" else "tab:gray" for n in names]
    ax.barh(names[::-1], values[::-1], color=colors[::-1])
    ax.set_xscale("log")
    ax.set_xlim(left=min(values) / 10)  # log bars need a floor to be read as lengths
    ax.set_xlabel("decisions per second (log scale, median of rounds)")
    ax.set_title(
        f"Abusive client at 10x its limit: near-cache {nc['near_cache_x_classic']:.0f}x "
        "the classic recipe",
        fontsize=10,
    )
    return _save(fig, path)


def write(report: dict[str, Any], directory: Path) -> list[Path]:
    """Every figure the report has data for; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    if "results" in report.get("checks", {}):
        paths.append(_checks(report["checks"], directory / "checks.png"))
    if "results" in report.get("concurrency", {}):
        paths.append(_concurrency(report["concurrency"], directory / "concurrency.png"))
    if "per_round" in report.get("server_cost", {}):
        paths.append(_server_cost(report["server_cost"], directory / "server_cost.png"))
    if "rows" in report.get("memory", {}):
        paths.append(_memory(report["memory"], directory / "memory.png"))
    if "decisions_per_s" in report.get("nearcache", {}):
        paths.append(_nearcache(report["nearcache"], directory / "nearcache.png"))
    return paths
