"""A benchmark figure judged against its target, as a row with its verdict (PASS,
FAIL, SKIP, INFO: see `bench.targets`). `bench.targets` and the parts that judge their
own figures (`concurrency`, `http_latency`, `soak`) build their rows here; this module
imports no part of the benchmark but `rounds`, so the parts never import `targets`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from . import rounds


def quartiles(each: Sequence[float]) -> list[float]:
    """The first and third quartiles of `each` (both the one value, when it is alone)."""
    # The spread of the same-round ratios says how far to trust a pass near the line.
    if len(each) < 2:
        return [each[0], each[0]] if each else []
    q1, _, q3 = statistics.quantiles(each, n=4)
    return [q1, q3]


def judged(row: dict[str, Any], need: float | None, op: str = ">=") -> dict[str, Any]:
    """`row` judged: its `value` against `need` by `op` (INFO when `need` is None)."""
    row = {**row, "op": op, "threshold": need}
    if need is None:
        return {**row, "verdict": "INFO", "pass": None}
    ok = row["value"] >= need if op == ">=" else row["value"] <= need
    return {**row, "verdict": "PASS" if ok else "FAIL", "pass": ok}


def ratios_row(
    name: str,
    each: Sequence[float],
    need: float | None,
    op: str = ">=",
    **fields: Any,
) -> dict[str, Any]:
    """A row judged on the median of same-round ratios `each`."""
    value = statistics.median(each)
    row = {"target": name, **fields, "ratio": value, "value": value, "unit": "x"}
    return judged({**row, "quartiles": quartiles(each)}, need, op)


def ratio_row(
    name: str,
    per_round: rounds.Rounds,
    case: str,
    base: str,
    need: float | None,
    op: str = ">=",
) -> dict[str, Any]:
    """`case` / `base` in every round, judged on the median against `need`."""
    each = [r[case] / r[base] for r in per_round]
    return ratios_row(name, each, need, op, case=case, against=base)


def best_row(
    name: str,
    per_round: rounds.Rounds,
    case: str,
    bases: Sequence[str],
    need: float | None,
    part: str,
) -> dict[str, Any]:
    """`case` against the fastest of `bases` in each round (checks per second)."""
    each = [r[case] / max(r[b] for b in bases) for r in per_round]
    against = bases[0] if len(bases) == 1 else f"the best of {', '.join(bases)}"
    return ratios_row(name, each, need, case=case, against=against, part=part)


def skip(name: str, reason: str) -> dict[str, Any]:
    """A SKIP row for target `name`, saying why."""
    return {"target": name, "verdict": "SKIP", "pass": None, "skipped": reason}


def answered_row(name: str, ok: int, sent: int, part: str) -> dict[str, Any]:
    """A count target: every one of `sent` requests answered 200 (`ok` were)."""
    return {
        "target": name,
        "value": ok,
        "unit": f"/{sent:,} answered 200",
        "op": "==",
        "threshold": sent,
        "verdict": "PASS" if ok == sent else "FAIL",
        "pass": ok == sent,
        "part": part,
    }
