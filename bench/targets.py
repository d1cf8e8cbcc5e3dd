"""The performance targets of the limiter, judged on one run's figures.

- one async sliding-log check on 10,000 keys >= 0.85x a bare EVALSHA `return 1`;
- ahead of every peer by >= 1.1x, each against our limiter of the same algorithm,
  on the hot key and on 10,000 keys;
- `check_many` of 100 >= 3x 100 sequential checks (checks per second);
- an abusive client at 10x its limit through the near-cache >= 5x the decisions per
  second of the classic recipe, with identical decisions and ~0 Redis calls per
  locally rejected check;
- sliding-log memory <= 20 bytes per member up to the small-set (listpack)
  threshold, <= 100 beyond it.

Throughput targets are medians of same-round ratios. Every row has a verdict: PASS,
FAIL, SKIP (not measured here, with the reason), EXPLAINED (over the line by a cost
that the row's own arithmetic, from this run's figures, shows is fixed per key, not
per member), or INFO (a figure shown beside a target, not a target). A FAIL may carry
`why`: lines computed from the same run that say where the limit really is.
"""

from __future__ import annotations

import statistics
from typing import Any

from . import rounds
from .checks import (
    ARGS_FLOOR_CASE,
    BARE_SCRIPT_CASE,
    BATCH_CASE,
    hot,
    spread,
)

EVALSHA_TARGET = 0.85
PEER_TARGET = 1.1
BATCH_TARGET = 3.0
NEARCACHE_TARGET = 5.0
LOCAL_CALLS_TARGET = 0.01  # "~0" Redis calls per locally rejected check
LISTPACK_BYTES = 20.0
SKIPLIST_BYTES = 100.0
SKIPLIST_LIMITS = (1_000, 100_000)  # judged as they are; threshold + 1 is explained

EVALSHA = "EVALSHA return 1"
LOG = "SlidingWindowLimiter"


def _quartiles(each: list[float]) -> list[float]:
    # The spread of the same-round ratios says how far to trust a pass near the line.
    if len(each) < 2:
        return [each[0], each[0]] if each else []
    q1, _, q3 = statistics.quantiles(each, n=4)
    return [q1, q3]


def _ratio_row(
    name: str, per_round: rounds.Rounds, case: str, base: str, need: float | None
) -> dict[str, Any]:
    value = rounds.ratio(per_round, case, base)
    row: dict[str, Any] = {
        "target": name,
        "case": case,
        "against": base,
        "ratio": value,
        "value": value,
        "unit": "x",
        "quartiles": _quartiles([r[case] / r[base] for r in per_round]),
        "op": ">=",
        "threshold": need,
    }
    if need is None:
        return {**row, "verdict": "INFO", "pass": None}
    ok = value >= need
    return {**row, "verdict": "PASS" if ok else "FAIL", "pass": ok}


def _skip(name: str, reason: str) -> dict[str, Any]:
    return {"target": name, "verdict": "SKIP", "pass": None, "skipped": reason}


def _server_usec(cost: dict[str, Any] | None, case: str) -> float | None:
    if not cost or "results" not in cost or case not in cost["results"]:
        return None
    return cost["results"][case]["usec_per_check"]


def _evalsha_why(
    checks: dict[str, Any], cost: dict[str, Any] | None, python_ratio: float
) -> list[str]:
    """Where a check's time goes beyond `return 1`, from this run's own cases."""
    per_round = checks["per_round"]
    results = checks["results"]
    bare = rounds.ratio(per_round, BARE_SCRIPT_CASE, EVALSHA)
    args = rounds.ratio(per_round, ARGS_FLOOR_CASE, EVALSHA)
    why = [
        f"the same script called bare (no limiter code) reaches {bare:.2f}x "
        f"of {EVALSHA}; sending a check's KEYS/ARGV to `return 1` alone: {args:.2f}x",
    ]
    script_us = _server_usec(cost, spread(LOG))
    noop_us = _server_usec(cost, EVALSHA)
    if script_us is not None and noop_us is not None:
        period_us = 1e6 / results[EVALSHA]["checks_per_s"]
        extra = script_us - noop_us
        cap = period_us / (period_us + extra)
        why.append(
            f"server time per call (INFO commandstats): the script {script_us:.1f} us, "
            f"`return 1` {noop_us:.1f} us; +{extra:.1f} us on a {period_us:.0f} us "
            f"round trip caps any client of this script at {cap:.2f}x from the server alone"
        )
    else:
        why.append("server time per call not measured in this run (no server-cost part)")
    if bare < EVALSHA_TARGET:
        why.append(
            f"so {EVALSHA_TARGET}x is out of reach for this script here: its own ceiling, "
            f"called bare, is {bare:.2f}x; our check reaches {python_ratio:.2f}x of that "
            f"ceiling (the limiter's Python code)"
        )
    else:
        why.append(
            f"the script itself clears the line ({bare:.2f}x): the gap is the limiter's "
            f"Python code, {python_ratio:.2f}x of the bare script"
        )
    return why


def _peer_why(
    checks: dict[str, Any], cost: dict[str, Any] | None, ours: str, peer: str
) -> list[str]:
    """Time per check, ours against the peer's, split into server and client time."""
    results = checks["results"]
    ours_us = 1e6 / results[ours]["checks_per_s"]
    peer_us = 1e6 / results[peer]["checks_per_s"]
    line = f"per check (median rates): ours {ours_us:.0f} us, the peer {peer_us:.0f} us"
    ours_server, peer_server = _server_usec(cost, ours), _server_usec(cost, peer)
    if ours_server is None or peer_server is None:
        return [line + "; server time not measured in this run"]
    server = ours_server - peer_server
    return [
        line + f"; server time (INFO commandstats) ours {ours_server:.1f} us, "
        f"the peer {peer_server:.1f} us: {server:+.1f} us of the {ours_us - peer_us:+.0f} us "
        "difference is on the server, the rest on the client"
    ]


def _checks_targets(checks: dict[str, Any], cost: dict[str, Any] | None) -> list[dict]:
    per_round = checks["per_round"]
    main = _ratio_row(
        "sliding log, 10k keys vs bare EVALSHA `return 1`",
        per_round,
        spread(LOG),
        EVALSHA,
        EVALSHA_TARGET,
    )
    python = _ratio_row(
        "sliding log, 10k keys vs the same script called bare (Python overhead alone)",
        per_round,
        spread(LOG),
        BARE_SCRIPT_CASE,
        None,
    )
    if not main["pass"]:
        main["why"] = _evalsha_why(checks, cost, python["ratio"])
    rows = [
        main,
        python,
        _ratio_row(
            "check_many(100) vs 100 sequential checks",
            per_round,
            BATCH_CASE,
            spread(LOG),
            BATCH_TARGET,
        ),
    ]
    for peer, info in checks["peers"].items():
        ours = info["counterpart"]
        for pattern in (hot, spread):
            row = _ratio_row(
                f"{pattern(ours)} vs {peer}", per_round, pattern(ours), pattern(peer), PEER_TARGET
            )
            if not row["pass"]:
                row["why"] = _peer_why(checks, cost, pattern(ours), pattern(peer))
            rows.append(row)
    for peer, reason in checks["skipped"].items():
        rows.append(_skip(f"ahead of {peer}", reason))
    return rows


def _nearcache_targets(nc: dict[str, Any]) -> list[dict]:
    name = "near-cache, abuser at 10x its limit, vs the classic recipe"
    if "skipped" in nc:
        return [_skip(name, nc["skipped"])]
    if "per_round" in nc:
        row = _ratio_row(name, nc["per_round"], "near-cache", "classic recipe", NEARCACHE_TARGET)
    else:
        value = nc["near_cache_x_classic"]
        row = {
            "target": name,
            "ratio": value,
            "value": value,
            "unit": "x",
            "op": ">=",
            "threshold": NEARCACHE_TARGET,
            "verdict": "PASS" if value >= NEARCACHE_TARGET else "FAIL",
            "pass": value >= NEARCACHE_TARGET,
        }
    ex = nc["exactness"]
    same = ex["all_identical"]
    per_local = ex["redis_calls_per_local_rejection"]
    rows = [
        row,
        {
            "target": "near-cache decisions identical to the uncached limiter, 10x trace",
            "value": ex["identical_decisions"],
            "unit": f"/{ex['checks']:,} identical",
            "op": "==",
            "threshold": ex["checks"],
            "verdict": "PASS" if same else "FAIL",
            "pass": same,
        },
    ]
    calls_name = "Redis calls per locally rejected check"
    if per_local is None:
        rows.append(_skip(calls_name, "skipped: no check was rejected locally"))
    else:
        ok = per_local <= LOCAL_CALLS_TARGET
        rows.append(
            {
                "target": f"{calls_name} ({ex['locally_rejected']:,} such checks)",
                "value": per_local,
                "unit": " calls",
                "op": "<=",
                "threshold": LOCAL_CALLS_TARGET,
                "verdict": "PASS" if ok else "FAIL",
                "pass": ok,
            }
        )
    return rows


def _log_rows(memory: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {
        r["limit"]: r
        for r in memory["rows"]
        if r["algorithm"] == "log" and r["member_format"] == "script"
    }


def _memory_row(
    rows: dict[int, dict[str, Any]], limit: int, need: float, encoding: str, same: list[int]
) -> dict[str, Any]:
    """One limit's bytes per member against `need`; over it, split off the fixed cost
    using the bytes per member of the largest key of the same encoding (`same`)."""
    explain_by = max(same)
    r = rows[limit]
    value = r["bytes_per_member"]
    row: dict[str, Any] = {
        "target": f"sliding-log memory at limit {limit:,} ({r['encoding']})",
        "value": value,
        "unit": " B/member",
        "op": "<=",
        "threshold": need,
        "bytes_per_key": r["bytes_per_key"],
    }
    if value <= need:
        return {**row, "verdict": "PASS", "pass": True}
    if explain_by == limit:
        why = [f"no larger {encoding} key measured to split fixed from per-member cost"]
        return {**row, "verdict": "FAIL", "pass": False, "why": why}
    per_member = rows[explain_by]["bytes_per_member"]
    fixed = r["bytes_per_key"] - limit * per_member
    why = [
        f"{r['bytes_per_key']:,} B for {limit:,} members = {limit:,} x {per_member:.1f} B "
        f"(bytes per member at {explain_by:,}, the largest {encoding} key) "
        f"+ {fixed:,.0f} B fixed per key",
        f"that fixed part is {fixed / limit:.1f} B/member at {limit:,}, "
        + ", ".join(f"{fixed / n:.2f} at {n:,}" for n in sorted(same) if n > limit),
    ]
    if per_member <= need:
        why.append(f"per member, without the fixed part: {per_member:.1f} B <= {need:g}")
        return {**row, "verdict": "EXPLAINED", "pass": False, "why": why}
    return {**row, "verdict": "FAIL", "pass": False, "why": why}


def _memory_targets(memory: dict[str, Any]) -> list[dict]:
    if "skipped" in memory:
        return [_skip("sliding-log memory per member", memory["skipped"])]
    threshold = memory["zset_max_listpack_entries"]
    rows = _log_rows(memory)
    small = [n for n in rows if n <= threshold]
    large = [n for n in rows if n > threshold]
    out = []
    for limit in sorted(rows):
        if limit <= threshold:
            out.append(_memory_row(rows, limit, LISTPACK_BYTES, "listpack", small))
        else:
            out.append(_memory_row(rows, limit, SKIPLIST_BYTES, "skiplist", large))
    for limit in (threshold, *SKIPLIST_LIMITS):
        if limit not in rows:
            out.append(
                _skip(f"sliding-log memory at limit {limit:,}", "skipped: not measured in this run")
            )
    return out


def judge(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target the report has figures for (a SKIP row with the reason otherwise)."""
    rows: list[dict[str, Any]] = []
    if "checks" in report:
        rows += _checks_targets(report["checks"], report.get("server_cost"))
    if "nearcache" in report:
        rows += _nearcache_targets(report["nearcache"])
    if "memory" in report:
        rows += _memory_targets(report["memory"])
    return rows
