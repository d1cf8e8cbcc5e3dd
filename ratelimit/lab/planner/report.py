"""A plan as a report for a terminal (`LogPlan.table`): the log, whom each candidate
hurts, the busiest identities affected, and the Redis plan."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..memory import format_bytes

if TYPE_CHECKING:
    from .results import CandidatePlan, LogPlan


def _utc(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _columns(rows: Sequence[Sequence[str]], right: Iterable[int]) -> list[str]:
    """Rows of cells as aligned text: columns in `right` right-aligned."""
    right = set(right)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days} d"] * bool(days) + [f"{hours} h"] * bool(hours)
    parts += [f"{minutes} min"] * bool(minutes) + [f"{secs} s"] * bool(secs)
    return " ".join(parts[:2]) or "0 s"


def _window(window_ms: int) -> str:
    if window_ms < 1000 or window_ms % 1000:
        return f"{window_ms} ms"
    return _duration(window_ms / 1000)


def _resolution(resolution_ms: int) -> str:
    from .resolution import resolution_text

    text = resolution_text(resolution_ms)
    return f"{text} or finer" if resolution_ms == 1 else text


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _rate(value: float) -> str:
    """A rate to about three significant digits."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value >= 0.001 else f"{value:.1g}"


def _busiest(plan: LogPlan) -> list[str]:
    """Per limit, the busiest identities affected under any algorithm, with what each
    algorithm rejected. Exact from the candidates' own lists: an identity among the
    `top` busiest affected under any algorithm is, under each algorithm that affects
    it, among that algorithm's `top` busiest affected too."""
    out: list[str] = []
    by_limit: dict[str, list[CandidatePlan]] = {}
    for c in plan.candidates:
        by_limit.setdefault(c.limit_text, []).append(c)
    for text, group in by_limit.items():
        top = plan.top
        known = {(c.algorithm, a.identity): a for c in group for a in c.busiest_affected}
        requests = {a.identity: a.requests for a in known.values()}
        refused = {a.identity: a.refused for a in known.values()}
        ranked = sorted(requests, key=lambda who: (-requests[who], who))[:top]
        if not ranked:
            continue
        header = ["identity", "requests", *(c.label for c in group)]
        header += ["cost > limit"] if any(refused.values()) else []
        rows = [header]
        for who in ranked:
            row = [who, f"{requests[who]:,}"]
            row += [f"{known[(c.algorithm, who)].rejected:,}" if (c.algorithm, who) in known
                    else "0" for c in group]  # fmt: skip
            row += [f"{refused[who]:,}"] if len(header) > len(row) else []
            rows.append(row)
        out += ["", f"Busiest identities affected by {text} (requests, and rejected by each)"]
        out += ["  " + line for line in _columns(rows, right=range(1, len(header)))]
    return out


def _recommended(plan: LogPlan) -> list[str]:
    """Per window and algorithm, the spread of per-client peaks and the smallest limit
    that affects at most the given share of clients."""
    if not plan.recommended or plan.affect is None:
        return []
    from .recommend import PERCENTILES, percentile_key

    out = [
        "",
        f"Recommended: the smallest limit per window that rejects (or refuses) at most "
        f"{plan.affect:.2%} of clients; per-client peaks: each client's most requested cost "
        "in one rolling window",
    ]
    names = [percentile_key(q) for q in PERCENTILES] + ["max"]
    rows = [["window", "algorithm", *(n.replace("_", ".") for n in names), "limit",
             "clients affected", "share", "requests rejected"]]  # fmt: skip
    for r in plan.recommended:
        rows.append([
            _window(r.window_ms), r.label,
            *(f"{r.percentiles[n]:,}" for n in names), r.limit_text,
            f"{r.identities_affected:,} of {r.identities:,}",
            _pct(r.identities_affected, r.identities), _pct(r.rejected + r.refused, r.requests),
        ])  # fmt: skip
    out += ["  " + line for line in _columns(rows, right=range(2, len(rows[0])))]
    for r in plan.recommended:  # a share out of reach: say why the limit affects more
        if r.unavoidable:
            out.append(f"  {_window(r.window_ms)} {r.label}: {r.unavoidable_why}")
    return out


def _stamps(plan: LogPlan) -> list[str]:
    """The candidates whose window the stamps are too coarse for, rejected as planned
    and with the stamps spread within their unit."""
    from .resolution import COARSE_SHARE, resolution_text

    coarse = [c for c in plan.candidates if c.stamps is not None]
    if not coarse:
        return []
    unit = resolution_text(plan.log.resolution_ms)
    out = [
        "",
        f"Timestamps: the log stamps its requests every {unit}, coarser than 1/{COARSE_SHARE} "
        "of these windows, which can move the result. Each candidate as planned, and "
        f"replayed with each stamp's requests spread evenly over its {unit}:",
    ]
    rows = [["limit", "algorithm", "rejected", "(spread)", "identities rejected", "(spread)"]]
    for c in coarse:
        s = c.stamps
        assert s is not None
        rows.append([
            c.limit_text, c.label, f"{s.rejected:,}", _paren(s.rejected_spread),
            f"{s.identities_rejected:,}", _paren(s.identities_rejected_spread),
        ])  # fmt: skip
    return out + ["  " + line for line in _columns(rows, right=(2, 3, 4, 5))]


def _paren(value: int | None) -> str:
    return "(not replayed)" if value is None else f"({value:,})"


def _short(c: CandidatePlan) -> str:
    return f"{c.limit_text} {c.algorithm}"


def _when(plan: LogPlan) -> list[str]:
    """Rejected requests per UTC hour of day, one column per candidate."""
    hurt = [c for c in plan.candidates if c.rejected]
    if not hurt:
        return []
    rows = [["hour (UTC)", *(_short(c) for c in hurt)]]
    for hour in range(24):
        if any(c.rejected_by_hour[hour] for c in hurt):
            rows.append([f"{hour:02d}:00", *(f"{c.rejected_by_hour[hour]:,}" for c in hurt)])
    out = ["", "When requests are rejected, by hour of day (UTC; hours with none left out)"]
    return out + ["  " + line for line in _columns(rows, right=range(1, len(rows[0])))]


def _throttled(plan: LogPlan) -> list[str]:
    """Per candidate, the longest throttled stretch and whose."""
    hurt = [c for c in plan.candidates if c.longest_throttled]
    if not hurt:
        return []
    rows = [["limit", "algorithm", "longest", "identity", "from", "until"]]
    for c in hurt:
        t = c.longest_throttled[0]
        rows.append([
            c.limit_text, c.label, _span(t.seconds), t.identity, _utc(t.since) or "-",
            _utc(t.until) or "-",
        ])  # fmt: skip
    out = [
        "",
        "Longest throttled stretch: from a client's first rejected request to its next "
        "admitted one, or one window after its last rejected one if that comes first",
    ]
    return out + ["  " + line for line in _columns(rows, right=(2,))]


def _span(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds < 60 else _duration(seconds)


def _offenders(plan: LogPlan) -> list[str]:
    """Per candidate, the identities it rejects most, with their user agent."""
    out: list[str] = []
    for c in plan.candidates:
        if not c.offenders:
            continue
        agents = any(o.agent is not None for o in c.offenders)
        rows = [["identity", "requests", "rejected", "longest throttled"]
                + ["user agent"] * agents]  # fmt: skip
        for o in c.offenders:
            row = [o.identity, f"{o.requests:,}", f"{o.rejected:,}", _span(o.longest_throttled_s)]
            rows.append(row + [_clip(o.agent or "-")] * agents)
        out += ["", f"Rejected most by {c.limit_text} ({c.label})"]
        out += ["  " + line for line in _columns(rows, right=(1, 2, 3))]
    return out


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _render(plan: LogPlan, *, problems: bool) -> str:
    log = plan.log
    where = "the lab's example log (synthetic traffic)" if log.example else log.path
    out = [
        f"Plan for {where}: format {log.format}, identity: {log.identity_field}, cost: {log.cost}",
        f"  {log.requests:,} requests from {log.identities:,} identities, "
        f"{_utc(log.start)} to {_utc(log.end)} ({_duration(log.duration_s)}), "
        f"stamped every {_resolution(log.resolution_ms)}",
    ]
    if log.where is not None:  # the requests were chosen (`planner.routes`)
        w = log.where
        out.append(
            f"  chosen by {' and '.join(w['conditions'])}: kept {w['kept']:,} of "
            f"{w['requests_read']:,} requests read ({_pct(w['kept'], w['requests_read'])})"
        )
    if problems and log.problems is not None:
        out += ["  " + line for line in log.problems.summary().splitlines()]
    out += ["", "Who is hurt"]
    rows = [["limit", "algorithm", "rejected", "share", "identities rejected", "share",
             "peak admitted / limit", "cost > limit"]]  # fmt: skip
    for c in plan.candidates:
        rows.append([
            c.limit_text, c.label, f"{c.rejected:,}", _pct(c.rejected, c.requests),
            f"{c.identities_rejected:,} of {c.identities:,}",
            _pct(c.identities_rejected, c.identities),
            f"{c.peak_admitted:,} / {c.limit:,} ({c.peak_admitted / c.limit:.2f}x)",
            f"{c.refused:,}",
        ])  # fmt: skip
    out += ["  " + line for line in _columns(rows, right=(2, 3, 4, 5, 6, 7))]
    refused = [c for c in plan.candidates if c.refused]
    for c in refused:
        out.append(
            f"  {c.limit_text}: {c.refused:,} requests ({_pct(c.refused, c.requests)}) from "
            f"{c.identities_refused:,} identities cost more than the limit: the library refuses "
            "them (ValueError), they are neither admitted nor rejected"
        )
    out += _stamps(plan)
    out += _recommended(plan)
    out += _busiest(plan)
    out += _when(plan)
    out += _throttled(plan)
    out += _offenders(plan)
    out += ["", "Redis plan"]
    choice = plan.server_time
    if choice.server_time is not None:
        out.append(f"  server time per check: {choice.server_time.source}")
    else:
        out.append("  server time per check: unknown, so no shards for checks are planned")
    if choice.note:
        out.append(f"  ({choice.note})")
    options = plan.shard.plan_options()
    out.append(
        f"  shards of {format_bytes(options['shard_memory_bytes'])} of data with "
        f"{options['headroom']:.0%} headroom, {options['key_overhead_bytes']:g} B per key "
        "of overhead; memory: each key at its identity's peak"
    )
    rows = [["limit", "algorithm", "keys", "memory", "checks/s at peak", "(mean)", "us/check",
             "Redis CPU", "shards", "(memory, checks)"]]  # fmt: skip
    for c in plan.candidates:
        r = c.redis
        if r is None:
            rows.append([c.limit_text, c.label, "0", "-", "0", "-", "-", "-", "0", "no checks"])
            continue
        cpu = "-" if r.redis_cpu_cores is None else f"{_rate(r.redis_cpu_cores)} cores"
        rows.append([
            c.limit_text, c.label, f"{r.keys:,}", format_bytes(r.memory_bytes),
            f"{r.peak_checks_per_s:,}", f"({_rate(r.mean_checks_per_s)})",
            "-" if r.us_per_check is None else f"{r.us_per_check:.1f}", cpu,
            "-" if r.shards is None else str(r.shards),
            f"({r.shards_for_memory}, {_or_dash(r.shards_for_checks)})",
        ])  # fmt: skip
    out += ["  " + line for line in _columns(rows, right=(2, 3, 4, 5, 6, 7, 8))]
    return "\n".join(out)
