"""The printed summary of a bench run: one table per part, then the targets."""

from __future__ import annotations

from typing import Any

from . import http_inprocess, logplan_dask
from .checks import FLOORS


def _ratios_table(part: dict[str, Any], bases: list[str], title: str) -> list[str]:
    heads = "".join(f" {('x ' + b.split(',')[0])[:18]:>18}" for b in bases)
    lines = [title, f"{'case':58} {'per s':>9}{heads}"]
    for name, r in part["results"].items():
        cells = "".join(f" {r['ratios'][b]:>18.2f}" for b in bases)
        lines.append(f"{name:58} {r['checks_per_s']:>9,.0f}{cells}")
    return lines


def _skipped(part: dict[str, Any]) -> list[str]:
    out = [f"  {name}: {reason}" for name, reason in part.get("skipped", {}).items()]
    for storage, found in part.get("log_storages", {}).items():
        if "skipped" in found:
            out.append(f"  log storage={storage}: {found['skipped']}")
    return out


SMOKE = (
    "a --quick smoke run (tiny sizes, 2 rounds): it shows that every part runs; its figures "
    "are too small to judge a target, so its PASS and FAIL are not verdicts"
)


def lines(report: dict[str, Any]) -> list[str]:
    out = [f"{report['backend']}; {report['machine']}; {report['date']}"]
    if report.get("quick"):
        out.append(f"this is {SMOKE}")
    if "checks" in report:
        c = report["checks"]
        out += [""] + _ratios_table(
            c,
            list(FLOORS),
            f"async checks: median of {c['rounds']} interleaved rounds, "
            f"{c['checks_per_case_per_round']} checks per case per round; limit {c['limit']}",
        )
        out += _skipped(c)
    if "sync" in report:
        s = report["sync"]
        out += [""] + _ratios_table(
            s, list(FLOORS), f"sync checks (ratios against the sync floors), {s['rounds']} rounds"
        )
        out += _skipped(s)
    if "concurrency" in report:
        k = report["concurrency"]
        out.append("")
        out.append(f"concurrency: tasks sharing one client, {k['rounds']} rounds")
        out.append(f"{'case':58} {'per s':>9} {'x PING same N':>14}")
        for name, r in k["results"].items():
            ratio = next(iter(r["ratios"].values()))
            out.append(f"{name:58} {r['checks_per_s']:>9,.0f} {ratio:>14.2f}")
    if "cluster" in report:
        cl = report["cluster"]
        out.append("")
        if "skipped" in cl:
            out.append(f"cluster: {cl['skipped']}")
        else:
            title = f"cluster at {cl['url']} (from {cl.get('source', 'given')})"
            out += _ratios_table(cl, [next(iter(cl["results"]))], title)
    if "server_cost" in report:
        out += [""] + _server_cost(report["server_cost"])
    if "memory" in report:
        m = report["memory"]
        out.append("")
        if "skipped" in m:
            out.append(f"memory: {m['skipped']}")
        else:
            out.append(
                f"memory per key, Redis {m['redis_version']}, "
                f"zset-max-listpack-entries {m['zset_max_listpack_entries']}"
            )
            out.append(
                f"{'algorithm':22} {'limit':>8} {'bytes/key':>11} {'bytes/unit':>11}  encoding"
            )
            for r in m["rows"]:
                alg = " ".join(x for x in (r["algorithm"], r["storage"], r["member_format"]) if x)
                per = "" if r["bytes_per_unit"] is None else f"{r['bytes_per_unit']:.1f}"
                size = f"{r['limit']:>8,} {r['bytes_per_key']:>11,} {per:>11}"
                out.append(f"{alg:22} {size}  {r['encoding']}")
            out += _skipped(_pick_storages(m))
    if "nearcache" in report:
        out += [""] + _nearcache(report["nearcache"])
    if "replay" in report:
        r = report["replay"]
        if "compiled" in r:
            out += [""] + _compiled(r["compiled"], r["rounds"])
        out += ["", f"replay: {r['trace']}; median of {r['rounds']} rounds"]
        out.append(f"{'backend':40} {'decisions/s':>12} {'model x':>8}")
        for name, v in r["results"].items():
            out.append(f"{name:40} {v['decisions_per_s']:>12,.0f} {v['model_x']:>8.1f}")
        out.append(f"same decisions as the model: {r['same_decisions_as_model']}")
    if "logplan" in report:
        out += [""] + _logplan(report["logplan"])
    if "dask" in report:
        out += [""] + logplan_dask.summary_lines(report["dask"])
    if "http" in report:
        out += [""] + _http(report["http"])
    if "asgi" in report:
        out += [""] + http_inprocess.summary_lines(report["asgi"])
    if "soak" in report:
        out += [""] + _soak(report["soak"])
    if "profile" in report:
        p = report["profile"]
        out += ["", f"cProfile of {p['checks']} sliding-log checks, 10k keys (own time per check)"]
        for row in p["top_by_own_time"][:10]:
            out.append(f"  {row['own_us_per_check']:7.1f} us  {row['function']}")
    if report.get("targets"):
        out += ["", "targets (ratios: the median of same-round ratios):"]
        out += [line for t in report["targets"] for line in _target(t)]
        if report.get("quick"):
            out.append(f"  (from {SMOKE}; run `make bench` without --quick to judge them)")
    if report.get("timings_s"):
        parts = ", ".join(f"{k} {v:.1f}" for k, v in report["timings_s"].items())
        out += ["", f"seconds per part: {parts}"]
    return out


def _logplan(lp: dict[str, Any]) -> list[str]:
    """The access logs planned end to end, with each planning process's peak memory."""
    out = [
        f"access log planned end to end: python -m ratelimit.lab plan --limit {lp['limit']}, "
        f"{lp['identities']:,} API keys; one process per plan",
        f"{'plan':22} {'lines':>12} {'GB':>6} {'seconds':>8} {'lines/s':>11} {'peak RSS MiB':>13}"
        "  arguments",
    ]
    for name, r in lp["runs"].items():
        out.append(
            f"{name:22} {r['lines']:>12,} {r['bytes'] / 1e9:>6.2f} {r['plan_seconds']:>8.1f} "
            f"{r['lines_per_s']:>11,.0f} {r['peak_rss_bytes'] / 2**20:>13,.0f}"
            f"  {r.get('arguments', 'the four algorithms')}"
        )
    out.append(f"peak RSS, big log / small log: {lp['rss_ratio_big_to_small']:.2f}")
    if "rss_ratio_recommended" in lp:
        out.append(f"the same, with the recommendation: {lp['rss_ratio_recommended']:.2f}")
    if "speedup_x" in lp:
        out.append(
            f"one algorithm, against the planner at {lp['runs']['before']['commit'][:7]}: "
            f"{lp['speedup_x']:.2f}x"
        )
    elif "baseline_skipped" in lp:
        out.append(f"no baseline: {lp['baseline_skipped']}")
    return out


def _http(h: dict[str, Any]) -> list[str]:
    """The limited and the unlimited route of the multi-worker app, and their gap."""
    if "skipped" in h:
        return [f"http: {h['skipped']}"]
    out = [
        f"http: the demo app as {h['workers']} uvicorn workers on {h['server']}; median of "
        f"{h['rounds']} interleaved rounds of {h['requests_per_route_per_round']:,} requests "
        f"per route over {h['connections']} connections, {h['api_keys']:,} API keys",
        f"{'route':40} {'p50 ms':>8} {'p99 ms':>8} {'requests/s':>11}  statuses",
    ]
    for name, r in h["routes"].items():
        label = f"{name} {r['path']}"
        statuses = ", ".join(f"{k}: {v:,}" for k, v in r["statuses"].items())
        out.append(
            f"{label:40} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['per_s']:>11,.0f}  {statuses}"
        )
    out.append(
        f"added by the limiter (same-round medians): p50 {h['p50_added_ms']:+.2f} ms "
        f"({h['p50_ratio']:.2f}x), p99 {h['p99_added_ms']:+.2f} ms ({h['p99_ratio']:.2f}x)"
        + (f"; requests/s {h['per_s_ratio']:.2f}x" if "per_s_ratio" in h else "")
    )
    if "pooled" in h:
        p = h["pooled"]
        out.append(
            f"pooled over all rounds: limited p50 {p['limited']['p50_ms']:.2f} ms, p99 "
            f"{p['limited']['p99_ms']:.2f} ms; unlimited p50 {p['unlimited']['p50_ms']:.2f} ms, "
            f"p99 {p['unlimited']['p99_ms']:.2f} ms; added p50 {p['p50_added_ms']:+.2f} ms "
            f"({p['p50_ratio']:.2f}x), p99 {p['p99_added_ms']:+.2f} ms ({p['p99_ratio']:.2f}x)"
        )
    return out


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _soak(k: dict[str, Any]) -> list[str]:
    """Memory before, at the peak of, and after a soak with churning API keys."""
    if "skipped" in k:
        return [f"soak: {k['skipped']}"]
    expired = k["keys_expired_after_s"]
    when = f"{expired:.1f} s after the load" if expired is not None else "NOT ALL by the deadline"
    out = [
        f"soak: {k['seconds']:g} s at {k['rate']:g} requests/s asked "
        f"({k['requests_per_s']:,.0f}/s done, {k['requests']:,} requests), "
        f"{k['api_keys']:,} API keys (a new one every {k['requests_per_key']} requests), "
        f"limit {k['limit']} per {k['window_s']} s, {k['workers']} workers; keys expired " + when,
        f"{'figure':28} {'baseline':>14} {'peak':>14} {'after expiry':>14} {'after x base':>13}",
    ]
    for name, label in (
        ("redis_used_memory", "Redis used_memory"),
        ("workers_rss", "workers' RSS (sum)"),
        ("redis_keys", "keys in Redis"),
    ):
        m = k["memory"][name]
        if name == "redis_keys":
            cells = [f"{m[w]:>14,}" for w in ("baseline", "peak", "after")]
            out.append(f"{label:28} {' '.join(cells)}")
            continue
        cells = [f"{_mib(m[w]):>14}" for w in ("baseline", "peak", "after")]
        ratio = m["after"] / m["baseline"]
        out.append(f"{label:28} {' '.join(cells)} {ratio:>12.3f}x")
    return out


def _compiled(c: dict[str, Any], rounds: int) -> list[str]:
    """The compiled replay beside the Python reference models, per algorithm."""
    out = [
        f"compiled replay vs the Python reference models, median of {rounds} rounds, one core",
        f"  trace: {c['trace']}",
        f"  zipf: {c['zipf_trace']}",
        "  kernel: prepared arrays (codes, ms, costs); replay: simulation.replay, table in "
        "and out; model: the same replay through the Python model",
        f"{'algorithm':10} {'kernel/s':>12} {'kernel/s zipf':>14} {'replay/s':>12} "
        f"{'model/s':>10} {'kernel x':>9} {'replay x':>9}  same decisions",
    ]
    for name, a in c["algorithms"].items():
        out.append(
            f"{name:10} {a['kernel_per_s']:>12,.0f} {a['kernel_zipf_per_s']:>14,.0f} "
            f"{a['replay_per_s']:>12,.0f} {a['model_per_s']:>10,.0f} "
            f"{a['kernel_x_model']:>9.1f} {a['replay_x_model']:>9.1f}  {a['same_decisions']}"
        )
    cf = c["cloudflare"]
    out.append(
        f"Cloudflare's {cf['requests']:,} requests through the sliding log at these rates: "
        f"{cf['kernel_s']:,.1f} s (kernel), {cf['replay_s']:,.1f} s (replay, end to end), "
        f"{cf['model_s']:,.0f} s (Python model)"
    )
    return out


def _server_cost(sc: dict[str, Any]) -> list[str]:
    if "skipped" in sc:
        return [f"server cost: {sc['skipped']}"]
    out = [
        f"server time per check (INFO commandstats) on {sc['server']}; median of "
        f"{sc['rounds']} interleaved rounds, {sc['checks_per_case_per_round']:,} checks per "
        "case per round",
        f"  admit: {sc['admit']}",
        f"  reject: {sc['reject']}",
        f"{'case':58} {'usec':>7} {'top-level cmds':>14} {'admitted':>9}",
    ]
    for name, r in sc["results"].items():
        cmds = r["top_level_commands_per_check"]
        out.append(
            f"{name:58} {r['usec_per_check']:>7.2f} {cmds:>14.2f} {r['admitted_per_check']:>9.1%}"
        )
    peers_and_storages = {"skipped": sc.get("peers_skipped", {}), **_pick_storages(sc)}
    return out + _skipped(peers_and_storages)


def _pick_storages(part: dict[str, Any]) -> dict[str, Any]:
    return {"log_storages": part.get("log_storages", {})}


def _nearcache(nc: dict[str, Any]) -> list[str]:
    if "skipped" in nc:
        return [f"near-cache: {nc['skipped']}"]
    out = [
        f"near-cache on {nc['backend']}: {nc['abuser']}; median of {nc['rounds']} rounds, "
        f"{nc['checks_per_case_per_round']:,} checks per case per round",
        f"{'case':40} {'decisions/s':>12} {'x classic':>10}",
    ]
    ratios = {
        "near-cache": nc["near_cache_x_classic"],
        "no cache": nc["no_cache_x_classic"],
        "classic recipe": 1.0,
    }
    for name, per_s in nc["decisions_per_s"].items():
        out.append(f"{name:40} {per_s:>12,.0f} {ratios.get(name, float('nan')):>10.2f}")
    ex = nc["exactness"]
    calls = ex["redis_calls_per_local_rejection"]
    out.append(
        f"answered locally: {nc['local_share']:.1%} of the near-cache's checks; "
        f"near-cache x no cache: {nc['near_cache_x_no_cache']:.2f}"
    )
    out.append(
        f"exactness, {ex['trace']}: {ex['identical_decisions']:,}/{ex['checks']:,} decisions "
        f"identical to the uncached limiter; {ex['locally_rejected']:,} rejected locally, "
        f"{'n/a' if calls is None else f'{calls:.3f}'} Redis calls per such check"
    )
    return out


def figure(t: dict[str, Any], need: bool = True) -> str:
    """A target row's value with its rounds' quartiles, and (`need`) its threshold."""
    unit = t["unit"]
    if unit == "x":
        text = f"{t['value']:.2f}x"
    elif isinstance(t["value"], float):
        text = f"{t['value']:.2f}{unit}"
    else:
        text = f"{t['value']:,}{unit}"
    need = need and t["threshold"] is not None
    if t.get("quartiles"):
        q1, q3 = t["quartiles"]
        text += f" (rounds' quartiles {q1:.2f}-{q3:.2f}"
        text += f"; need {t['op']} {t['threshold']:g}{unit})" if need else ")"
    elif need and t["op"] != "==":
        text += f" (need {t['op']} {t['threshold']:g}{unit})"
    return text


def _target(t: dict[str, Any]) -> list[str]:
    if t["verdict"] == "SKIP":
        return [f"  SKIP       {t['target']}: {t['skipped']}"]
    lines = [f"  {t['verdict']:10} {t['target']}: {figure(t)}"]
    lines += [f"             - {why}" for why in t.get("why", [])]
    return lines
