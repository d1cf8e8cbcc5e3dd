"""The bench's asgi part (`bench/http_inprocess.py`) in quick mode: every case measured in
the same rounds, every request answered 200, and the figures and verdicts derived from
the rounds as the module says, never their speed."""

from __future__ import annotations

import json
import os
import statistics

import pytest
import redis

from bench import __main__ as cli
from bench import http_inprocess as asgi
from bench import readme, suite, summary, targets
from ratelimit.devtools.server import RedisServer
from tests.conftest import _missing  # skips, or fails under CI=true

CASES = {*asgi.ROUTES, asgi.CHECK, asgi.BETWEEN}


@pytest.fixture
def server_allowed() -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("slowapi")
    pytest.importorskip("fastapi_limiter")
    if not RedisServer.available():
        _missing("redis-server is not installed; the asgi part starts its own")


def us(per_round: list[dict[str, float]], case: str) -> list[float]:
    return [1e6 / r[case] for r in per_round]


def test_quick_asgi_part_measures_every_case_in_the_same_rounds(server_allowed) -> None:
    o = suite.Options.quick()
    report = asgi.run(o.asgi_rounds, o.asgi_requests, url=None)
    assert "skipped" not in report, report
    assert report["peers_skipped"] == {}
    per_round = report["per_round"]
    assert len(per_round) == report["rounds"] == o.asgi_rounds
    assert report["requests_per_case_per_round"] == o.asgi_requests
    assert all(set(r) == CASES and all(v > 0 for v in r.values()) for r in per_round)
    # Every request of every route answered 200: warm-up and rounds.
    sent = min(asgi.WARMUP, o.asgi_requests) + o.asgi_rounds * o.asgi_requests
    for case in asgi.ROUTES:
        extra = sent if case == asgi.UNLIMITED else 0  # the unlimited route, then a check
        assert report["statuses"][case] == {"200": sent + extra}, case
    # Medians of per-round microseconds, and of same-round differences and quotients.
    for case in CASES:
        assert report["us_per_request"][case] == pytest.approx(
            statistics.median(us(per_round, case))
        )
    unlimited = us(per_round, asgi.UNLIMITED)
    ours = [a - b for a, b in zip(us(per_round, asgi.LIMITED), unlimited, strict=True)]
    assert report["added_us"][asgi.LIMITED]["median"] == pytest.approx(statistics.median(ours))
    check = us(per_round, asgi.CHECK)
    assert report["added_x_check"]["median"] == pytest.approx(
        statistics.median(a / c for a, c in zip(ours, check, strict=True))
    )
    slowapi = [a - b for a, b in zip(us(per_round, asgi.SLOWAPI), unlimited, strict=True)]
    assert report["added_x_peer"][asgi.SLOWAPI]["median"] == pytest.approx(
        statistics.median(a / s for a, s in zip(ours, slowapi, strict=True))
    )
    rows = targets.judge({"asgi": report})
    by_name = {t["target"]: t for t in rows}
    assert len(by_name) == len(rows) == 5 and all(t["part"] == "asgi" for t in rows)
    judged = [t for t in rows if t["verdict"] in {"PASS", "FAIL"}]
    assert [t["threshold"] for t in judged] == [
        asgi.CHECK_ADDED_TARGET,
        asgi.PEER_ADDED_TARGET,
        sum(sum(c.values()) for c in report["statuses"].values()),
    ]
    for t in judged:
        meets = {"<=": t["value"] <= t["threshold"], "==": t["value"] == t["threshold"]}[t["op"]]
        assert t["pass"] == meets == (t["verdict"] == "PASS")
    assert rows[-1]["verdict"] == "PASS"  # every request answered 200
    assert rows[0]["value"] == pytest.approx(report["added_x_check"]["median"])
    json.dumps(report)
    head = {"backend": "b", "machine": "m", "date": "d", "targets": rows}
    printed = "\n".join(summary.lines({**head, "asgi": report}))
    assert "HTTP in process" in printed and asgi.FASTAPI_LIMITER in printed
    assert f"{report['added_x_check']['median']:.2f}x a bare check" in printed
    readme.render(readme.record_of({"asgi": report, "targets": rows}))  # renders


def test_the_cli_runs_the_asgi_part_alone(server_allowed, tmp_path, monkeypatch) -> None:
    out = tmp_path / "results.json"
    monkeypatch.setattr(suite, "pick_url", lambda: None)
    assert cli.main(["--quick", "--only", "asgi", "--no-plot", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["timings_s"]) == {"asgi"} and "per_round" in report["asgi"]
    names = [t["target"] for t in report["targets"]]
    assert sum(n.startswith("HTTP in process") for n in names) == 5


def test_it_leaves_no_key_on_a_shared_server(real_redis_url, monkeypatch) -> None:
    pytest.importorskip("fastapi")
    monkeypatch.setattr(RedisServer, "available", staticmethod(lambda: False))
    report = asgi.run(1, 10, url=real_redis_url)
    assert "shared" in report["server"]
    client = redis.Redis.from_url(real_redis_url)
    try:
        assert not list(client.scan_iter(match=f"bench:{os.getpid()}:asgi*", count=1000))
    finally:
        client.close()


def test_a_skipped_part_says_why_in_every_row() -> None:
    why = "skipped: no redis-server and no Redis URL (the peers need one)"
    rows = asgi.targets({"skipped": why})
    assert len(rows) == 5 and all(t["verdict"] == "SKIP" and t["skipped"] == why for t in rows)
    assert asgi.summary_lines({"skipped": why}) == [f"HTTP in process: {why}"]


def test_a_missing_peer_is_skipped_with_its_reason() -> None:
    per_round = [
        {asgi.UNLIMITED: 5000.0, asgi.LIMITED: 2500.0, asgi.CHECK: 10_000.0, asgi.BETWEEN: 2000.0}
        for _ in range(3)
    ]
    why = "skipped: slowapi is not installed (No module named 'slowapi')"
    report = {
        "per_round": per_round,
        "statuses": {asgi.UNLIMITED: {"200": 10}, asgi.LIMITED: {"200": 9, "429": 1}},
        "peers_skipped": {asgi.SLOWAPI: why, asgi.FASTAPI_LIMITER: why},
        **asgi.summarize(per_round),
    }
    rows = {t["target"]: t for t in asgi.targets(report)}
    verdicts = [t["verdict"] for t in rows.values()]
    assert verdicts == ["PASS", "INFO", "SKIP", "SKIP", "FAIL"]
    # 200 us unlimited, 400 us limited, 100 us a check, 500 us unlimited then a check.
    check_row, between_row, *_, answered = rows.values()
    assert check_row["value"] == pytest.approx(2.0) and check_row["added_us"] == 200
    assert between_row["value"] == pytest.approx(200 / 300)
    assert answered["value"] == 19 and answered["threshold"] == 20
