"""The bench's http and soak parts in quick mode: the shape of what they report and
the invariants between their figures (percentiles, counts, medians of same-round
ratios, verdicts), never their speed. Both start their own redis-server and uvicorn
workers and must stop them: no child process of this test outlives the part."""

from __future__ import annotations

import json
import os
import statistics

import pytest

from bench import http_latency, readme, soak, suite, summary, targets
from ratelimit.devtools.demo_server import child_pids
from ratelimit.devtools.server import RedisServer
from tests.conftest import _missing  # skips, or fails under CI=true

ROUTES = set(http_latency.ROUTES)


@pytest.fixture
def servers_allowed() -> None:
    if not RedisServer.available():
        _missing("redis-server is not installed; the http and soak parts start their own")
    pytest.importorskip("uvicorn")


def assert_verdicts_follow(rows: list[dict]) -> None:
    for t in rows:
        assert t["verdict"] in {"PASS", "FAIL", "INFO"}, t
        if t["verdict"] == "INFO":
            assert t["threshold"] is None and t["pass"] is None
            continue
        meets = {
            ">=": t["value"] >= t["threshold"],
            "<=": t["value"] <= t["threshold"],
            "==": t["value"] == t["threshold"],
        }[t["op"]]
        assert t["pass"] == meets == (t["verdict"] == "PASS"), t


def test_quick_http_part_measures_both_routes_in_the_same_rounds(servers_allowed) -> None:
    o = suite.Options.quick()
    before = set(child_pids(os.getpid()))
    report = http_latency.run(o.http_rounds, o.http_requests, o.http_workers, o.http_connections)
    assert set(child_pids(os.getpid())) <= before  # Redis and uvicorn were stopped
    assert "skipped" not in report, report
    assert report["workers"] == o.http_workers and report["connections"] == o.http_connections
    per_round = report["per_round"]
    assert len(per_round) == report["rounds"] == o.http_rounds
    for row in per_round:
        assert set(row) == ROUTES
        for r in row.values():
            assert r["p99_ms"] >= r["p50_ms"] > 0 and r["per_s"] > 0
            # Every request answered, and admitted: the limit is never reached.
            assert r["statuses"] == {"200": o.http_requests}
    for route, r in report["routes"].items():
        for q in ("p50_ms", "p99_ms"):
            assert r[q] == pytest.approx(statistics.median(x[route][q] for x in per_round))
        assert r["statuses"] == {"200": o.http_rounds * o.http_requests}
    for q in ("p50", "p99"):
        limited = [x["limited"][f"{q}_ms"] for x in per_round]
        unlimited = [x["unlimited"][f"{q}_ms"] for x in per_round]
        ratios = [a / b for a, b in zip(limited, unlimited, strict=True)]
        assert report[f"{q}_ratio"] == pytest.approx(statistics.median(ratios))
        added = [a - b for a, b in zip(limited, unlimited, strict=True)]
        assert report[f"{q}_added_ms"] == pytest.approx(statistics.median(added))
    pooled = report["pooled"]
    for route in ROUTES:
        assert pooled[route]["p99_ms"] >= pooled[route]["p50_ms"] > 0
        # A pooled percentile lies within the range of the rounds' own.
        for q in ("p50_ms", "p99_ms"):
            each = [x[route][q] for x in per_round]
            assert min(each) <= pooled[route][q] <= max(each)
    for q in ("p50", "p99"):
        limited, unlimited = pooled["limited"][f"{q}_ms"], pooled["unlimited"][f"{q}_ms"]
        assert pooled[f"{q}_added_ms"] == pytest.approx(limited - unlimited)
        assert pooled[f"{q}_ratio"] == pytest.approx(limited / unlimited)
    rows = targets.judge({"http": report})
    assert [t["verdict"] for t in rows[:2]] + [rows[3]["verdict"]] == ["INFO", "INFO", "PASS"]
    assert rows[0]["value"] == report["p50_ratio"] and rows[1]["value"] == report["p99_ratio"]
    # Requests per second, limited over unlimited: judged on the same-round median.
    speeds = [x["limited"]["per_s"] / x["unlimited"]["per_s"] for x in per_round]
    assert rows[2]["value"] == pytest.approx(statistics.median(speeds))
    assert rows[2]["threshold"] == http_latency.THROUGHPUT_TARGET and rows[2]["op"] == ">="
    assert rows[3]["value"] == rows[3]["threshold"] == o.http_rounds * o.http_requests
    assert_verdicts_follow(rows)
    json.dumps(report)
    # Printed and rendered like the other parts.
    printed = "\n".join(summary.lines({**_head(), "http": report, "targets": rows}))
    assert "added by the limiter" in printed and f"{report['p50_added_ms']:+.2f} ms" in printed
    record = readme.record_of({"http": report})
    assert "per_round" not in record["http"]
    text = readme.render(record)
    assert f"{report['p50_added_ms']:+.2f} ({report['p50_ratio']:.2f}x)" in text
    assert readme.render(readme.record_of(record)) == text


def test_quick_soak_reports_memory_before_at_peak_and_after_expiry(servers_allowed) -> None:
    o = suite.Options.quick()
    before = set(child_pids(os.getpid()))
    report = soak.run(o.soak_seconds, o.soak_rate, o.soak_window_s, o.http_workers)
    assert set(child_pids(os.getpid())) <= before
    assert "skipped" not in report, report
    n = report["requests"]
    statuses = {int(k): v for k, v in report["statuses"].items()}
    assert n > 0 and set(statuses) <= {200, 429} and sum(statuses.values()) == n
    # Each key gets REQUESTS_PER_KEY requests and a limit below that: at most one
    # rejection per full key, whatever the timing.
    assert report["api_keys"] == -(-n // soak.REQUESTS_PER_KEY)
    assert statuses.get(429, 0) <= n // soak.REQUESTS_PER_KEY
    memory = report["memory"]
    assert set(memory) == {"redis_used_memory", "redis_keys", "workers_rss"}
    for name, m in memory.items():
        assert m["peak"] >= m["baseline"] >= 0 and m["after"] >= 0, name
    keys = memory["redis_keys"]
    assert keys["baseline"] == 0 and keys["peak"] > 0
    assert report["keys_expired_after_s"] is not None and keys["after"] == 0
    assert memory["redis_used_memory"]["baseline"] > 0 and memory["workers_rss"]["baseline"] > 0
    by_worker = report["rss_by_worker"]
    assert len(by_worker["baseline"]) == len(by_worker["after"]) == o.http_workers
    assert sum(by_worker["baseline"].values()) == memory["workers_rss"]["baseline"]
    rows = targets.judge({"soak": report})
    assert len(rows) == 3 and all(t["part"] == "soak" for t in rows)
    assert_verdicts_follow(rows)
    for row, name in zip(rows, ("redis_used_memory", "workers_rss"), strict=False):
        m = memory[name]
        assert row["value"] == pytest.approx(m["after"] / m["baseline"])
        assert row["threshold"] == 1 + report["tolerance"][name]
    assert rows[2]["value"] == 0 and rows[2]["verdict"] == "PASS"
    json.dumps(report)
    printed = "\n".join(summary.lines({**_head(), "soak": report, "targets": rows}))
    assert "Redis used_memory" in printed and "keys in Redis" in printed
    text = readme.render(readme.record_of({"soak": report}))
    assert "Redis `used_memory`" in text and ("**met**" in text or "**not met**" in text)


def test_skipped_parts_say_why_in_every_row() -> None:
    why = "skipped: redis-server is not installed (a private one is needed)"
    rows = http_latency.targets({"skipped": why}) + soak.targets({"skipped": why})
    assert len(rows) == 6 and all(t["verdict"] == "SKIP" and t["skipped"] == why for t in rows)
    text = readme.render({"http": {"skipped": why}, "soak": {"skipped": why}})
    assert f"HTTP, the demo app under uvicorn workers: {why}" in text
    assert f"soak, API keys churning: {why}" in text
    assert "HTTP, the demo app under uvicorn workers: not measured in this run." in readme.render(
        {}
    )


def _head() -> dict:
    return {"backend": "b", "machine": "m", "date": "d"}
