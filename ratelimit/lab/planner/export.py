"""A plan's tables as CSV files (`write_csv`) and its figures as one image file
(`write_figure`), what `plan --csv DIR` and `plan --plot FILE` write."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from .results import LogPlan

CSV_TABLES = (
    "candidates", "recommended", "rejected_by_hour", "longest_throttled", "offenders",
    "busiest_affected",
)  # fmt: skip
"""The CSV files `write_csv` writes (each NAME.csv)."""


def tables(plan: LogPlan) -> dict[str, pd.DataFrame]:
    """The plan's tables, one row per item, named as in `CSV_TABLES`. Candidates: the
    JSON candidate's plain fields, and the Redis plan's prefixed `redis_`; per-candidate
    lists carry `limit_text` and `algorithm`."""
    document = plan.to_dict()
    candidates: list[dict[str, Any]] = []
    listed: dict[str, list[dict[str, Any]]] = {name: [] for name in CSV_TABLES[2:]}
    for c in document["candidates"]:
        key = {"limit_text": c["limit_text"], "algorithm": c["algorithm"]}
        row = {k: v for k, v in c.items() if not isinstance(v, list | dict)}
        row.update({f"redis_{k}": v for k, v in (c["redis"] or {}).items()})
        candidates.append(row)
        listed["rejected_by_hour"] += [
            {**key, "hour_utc": hour, "rejected": n} for hour, n in enumerate(c["rejected_by_hour"])
        ]
        for name in ("longest_throttled", "offenders", "busiest_affected"):
            listed[name] += [{**key, **entry} for entry in c[name]]
    recommended = [
        {
            **{k: v for k, v in r.items() if k != "peaks"},
            **{f"peak_{k}": v for k, v in r["peaks"].items()},
        }
        for r in document["recommended"]
    ]
    frames = {"candidates": pd.DataFrame(candidates), "recommended": pd.DataFrame(recommended)}
    frames.update({name: pd.DataFrame(rows) for name, rows in listed.items()})
    return {name: frames[name] for name in CSV_TABLES}


def write_csv(plan: LogPlan, folder: str | Path) -> list[Path]:
    """Write each of `tables(plan)` to `folder`/NAME.csv (the folder is made if need
    be); returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables(plan).items():
        path = folder / f"{name}.csv"
        frame.to_csv(path, index=False)
        written.append(path)
    return written


def write_figure(plan: LogPlan, path: str | Path) -> Path:
    """`plots.plan_figure(plan)` saved to `path`, in the format its suffix names (.png,
    .svg, .pdf, ...). ValueError for a suffix matplotlib cannot write."""
    from .plots import plan_figure

    path = check_figure_path(path)
    plan_figure(plan).savefig(path, dpi=110)
    return path


def check_figure_path(path: str | Path) -> Path:
    """`path` if matplotlib can write a figure in the format its suffix names, else
    ValueError saying which suffixes it can."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    kinds = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in kinds:
        raise ValueError(
            f"cannot write a figure as {path.name!r}: name a file ending in one of "
            f"{', '.join('.' + k for k in sorted(kinds))}"
        )
    return path
