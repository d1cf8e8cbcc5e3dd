"""`make bench` in quick mode: structure, ratios, skips with reasons, the classic recipe,
the near-cache part, and how the targets are judged (including FAIL rows, whose
explanations must be computed from the run's own figures). The targets' arithmetic on
synthetic reports is in test_targets.py, the server-cost arithmetic in
test_server_cost.py, the README's tables in test_readme.py.

No timing is asserted here (that is what `make bench` reports, as ratios); these tests
check that the bench measures what it says and reports it consistently.
"""

from __future__ import annotations

import json
import statistics
import sys

import fakeredis
import pytest
import redis

from bench import __main__ as cli
from bench import checks, cluster, peers, rounds, server_cost, suite, sync_checks, targets
from ratelimit.devtools.process import free_port
from tests.conftest import _missing  # skips, or fails under CI=true

PEER_NAMES = set(peers.COUNTERPARTS)
PACKAGE_PEERS = PEER_NAMES - {"classic recipe"}
PARTS_OF_ROWS = {"async": "checks", "sync": "sync", "server_cost": "server_cost"}


def quick(*parts: str) -> suite.Options:
    options = suite.Options.quick()
    options.parts = set(parts)
    return options


def assert_consistent(part: dict) -> None:
    """Medians, ratios and rounds of one part agree with each other."""
    per_round = part["per_round"]
    assert len(per_round) == part["rounds"]
    for name, r in part["results"].items():
        assert r["rounds"] == [row[name] for row in per_round]
        assert r["checks_per_s"] == pytest.approx(statistics.median(r["rounds"]))
        assert all(v > 0 for v in r["rounds"])
        for base, value in r["ratios"].items():
            quotients = [row[name] / row[base] for row in per_round]
            assert r["round_ratios"][base] == pytest.approx(quotients)
            assert value == pytest.approx(statistics.median(quotients))


def test_summarize_takes_the_median_of_same_round_quotients() -> None:
    per_round = [{"A": 100.0, "B": 50.0}, {"A": 300.0, "B": 100.0}, {"A": 90.0, "B": 90.0}]
    out = rounds.summarize(per_round, ["A"])
    assert out["B"]["checks_per_s"] == 90.0
    # 0.5, 1/3, 1.0 -> 0.5 (the quotient of the medians, 90/100, would pair rounds up wrongly)
    assert out["B"]["ratios"]["A"] == pytest.approx(0.5)
    assert out["A"]["ratios"]["A"] == 1.0


async def test_cases_count_their_checks() -> None:
    calls = []

    async def op(i: int) -> None:
        calls.append(i)

    assert await rounds.sequential(op, checks_per_call=10)(100) > 0
    assert calls == list(range(10))
    calls.clear()
    await rounds.concurrent(op, 4)(40)
    assert sorted(calls) == list(range(40))


def assert_targets_judged(report: dict) -> None:
    """Every judged target's verdict follows from its value and threshold, and every
    same-round ratio is the median of its part's per-round quotients."""
    names = [t["target"] for t in report["targets"]]
    assert len(names) == len(set(names))  # one row per target
    for t in report["targets"]:
        assert t["verdict"] in {"PASS", "FAIL", "SKIP", "INFO"}
        if t["verdict"] == "SKIP":
            assert t["pass"] is None and t["skipped"].startswith("skipped:")
            continue
        if t["verdict"] == "INFO":
            assert t["threshold"] is None and t["pass"] is None
        else:
            meets = {
                ">=": t["value"] >= t["threshold"],
                "<=": t["value"] <= t["threshold"],
                "==": t["value"] == t["threshold"],
            }[t["op"]]
            assert t["pass"] == meets == (t["verdict"] == "PASS")
        part = report.get(PARTS_OF_ROWS.get(t.get("part", "async"), ""))
        if "case" in t and part and t["against"] in part["per_round"][0]:
            want = rounds.ratio(part["per_round"], t["case"], t["against"])
            assert t["ratio"] == pytest.approx(want)


def test_quick_run_on_fakeredis_reports_everything_or_why_not(monkeypatch) -> None:
    monkeypatch.delenv(cluster.ENV, raising=False)
    monkeypatch.setattr(cluster, "STATE_FILES", ())  # whatever make cluster-up left here
    report = suite.run(
        quick("checks", "sync", "concurrency", "cluster", "cost", "memory", "nearcache"),
        url=None,
    )
    c = report["checks"]
    assert_consistent(c)
    assert_consistent(report["sync"])
    assert_consistent(report["concurrency"])
    names = set(c["results"])
    for cls in checks.OURS:
        assert {checks.hot(cls.__name__), checks.spread(cls.__name__)} <= names
    assert {"PING", "EVALSHA return 1", checks.BATCH_CASE, checks.PER_REQUEST_CASE} <= names
    assert {checks.ARGS_FLOOR_CASE, checks.BARE_SCRIPT_CASE, checks.CLASSIC_REUSED_CASE} <= names
    # The recipe runs on any client; the packaged peers need a server URL, and say so.
    assert checks.spread("classic recipe") in names
    assert set(c["skipped"]) == PACKAGE_PEERS
    assert all(
        reason.startswith("skipped:") and "fakeredis" in reason for reason in c["skipped"].values()
    )
    for part in ("server_cost", "memory"):
        assert report[part]["skipped"].startswith("skipped:")
    assert report["cluster"]["skipped"].startswith("skipped: no cluster")
    # The near-cache part runs on fakeredis too, in quick mode's small size.
    nc = report["nearcache"]
    assert_consistent_nearcache(nc, suite.Options.quick())
    # Every target is judged on a same-round ratio of its own part, or skipped with the
    # reason: the peers need a server URL, server time INFO commandstats and memory
    # MEMORY USAGE, which fakeredis lacks.
    assert_targets_judged(report)
    rows = report["targets"]
    skipped = {t["target"]: t["skipped"] for t in rows if t["verdict"] == "SKIP"}
    storage_rows = [n for n in skipped if f"{checks.LOG} storage=" in n]
    peer_rows = [n for n in skipped if " check, 10k keys: " in n and n not in storage_rows]
    assert len(peer_rows) == 2 * len(targets.ALGORITHM_PEERS)  # async and sync
    assert all("fakeredis" in skipped[n] for n in peer_rows)
    assert sum("server time" in n for n in skipped) == 5
    assert any(n.startswith("memory per admitted unit") for n in skipped)
    for t in rows:
        if "near-cache" in t["target"] and "case" in t:
            want = rounds.ratio(nc["per_round"], t["case"], t["against"])
            assert t["ratio"] == pytest.approx(want)
    nc_rows = [t for t in rows if "near-cache" in t["target"] or "locally" in t["target"]]
    assert [t["verdict"] for t in nc_rows[1:]] == ["PASS", "PASS"]  # exact, no calls
    # The sync part measures our limiters on fakeredis too; its peers say why not.
    assert set(report["sync"]["skipped"]) == PACKAGE_PEERS
    assert checks.spread(sync_checks.name("SlidingWindowLimiter")) in report["sync"]["results"]
    json.dumps(report)  # what results.json holds


def assert_consistent_nearcache(nc: dict, options: suite.Options) -> None:
    per_round = nc["per_round"]
    assert len(per_round) == nc["rounds"] == options.nearcache_rounds
    assert nc["checks_per_case_per_round"] == options.nearcache_checks
    medians = {k: statistics.median(r[k] for r in per_round) for k in per_round[0]}
    assert nc["decisions_per_s"] == pytest.approx(medians)
    assert nc["near_cache_x_classic"] == pytest.approx(
        rounds.ratio(per_round, "near-cache", "classic recipe")
    )
    ex = nc["exactness"]
    assert ex["checks"] == 1000 * options.nearcache_trace_s
    # At 10x the limit, all but the first `limit` of each second are rejections, and
    # the near-cache must answer most of them without Redis, and answer them right.
    assert ex["all_identical"] and ex["identical_decisions"] == ex["checks"]
    assert ex["locally_rejected"] > ex["checks"] // 2
    assert ex["redis_calls_per_local_rejection"] == 0


@pytest.mark.real_redis
def test_quick_run_on_real_redis_with_peers(real_redis_url: str) -> None:
    report = suite.run(quick("checks", "sync", "cost", "memory", "nearcache"), url=real_redis_url)
    c = report["checks"]
    assert_consistent(c)
    assert_consistent(report["sync"])
    assert_consistent_nearcache(report["nearcache"], suite.Options.quick())
    assert_targets_judged(report)
    # Both peer packages are in the bench extra (and the lock): all peers run, on redis-py 8,
    # async and sync (the sync part has no classic recipe).
    assert c["skipped"] == {} and report["sync"]["skipped"] == {}
    assert set(c["peers"]) == PEER_NAMES
    assert set(report["sync"]["peers"]) == PACKAGE_PEERS
    for peer in PEER_NAMES:
        assert checks.hot(peer) in c["results"] and checks.spread(peer) in c["results"]
    for peer in PACKAGE_PEERS:
        assert checks.spread(sync_checks.name(peer)) in report["sync"]["results"]
    assert redis.__version__.startswith("8.")
    # Ours against the best peer of the same algorithm, async and sync: judged on 10k
    # keys, shown on the hot key; a miss gets the split into server and client time.
    judged = [
        t
        for t in report["targets"]
        if " check, 10k keys: " in t["target"] and t["threshold"] == targets.PEER_TARGET
    ]
    assert len(judged) == 2 * len(targets.ALGORITHM_PEERS)
    assert all("INFO commandstats" in t["why"][0] for t in judged if not t["pass"])
    # Server cost: one script call per check for ours, MULTI + EXEC for the recipe; every
    # admit check admitted, every reject check rejected (its key full beforehand).
    cost = report["server_cost"]
    results = cost["results"]
    log = results[server_cost.admit("SlidingWindowLimiter")]
    assert log["commands"]["evalsha"]["calls_per_check"] == 1
    recipe = results[server_cost.admit("classic recipe")]
    assert recipe["top_level_commands_per_check"] == 2
    assert recipe["commands"]["zadd"]["nested"] is True
    assert results[server_cost.NOOP]["commands"]["evalsha"]["calls_per_check"] == 1
    incr = results[server_cost.INCR]["commands"]
    assert incr["incr"]["calls_per_check"] == incr["pexpire"]["calls_per_check"] == 1
    assert len(cost["per_round"]) == cost["rounds"] == suite.Options.quick().cost_rounds
    for name, r in results.items():
        want = 0.0 if r["kind"] == "reject" else 1.0
        assert r["admitted_per_check"] == want, name
        assert r["usec_per_check"] == pytest.approx(statistics.median(r["rounds"]))
    for peer in PACKAGE_PEERS:
        assert server_cost.admit(peer) in results and server_cost.reject(peer) in results
    server_rows = [t for t in report["targets"] if t.get("part") == "server_cost"]
    assert {t["op"] for t in server_rows} == {"<="}
    assert len([t for t in server_rows if t["threshold"] is not None]) == 5
    # Memory: our members are smaller than the classic strings at every limit.
    rows = {
        (r["storage"] or r["member_format"], r["limit"]): r
        for r in report["memory"]["rows"]
        if r["algorithm"] == "log"
    }
    for limit in suite.Options.quick().memory_limits:
        assert (
            rows["sorted-set", limit]["bytes_per_unit"] < rows["classic", limit]["bytes_per_unit"]
        )
    mem = [t for t in report["targets"] if "storage=sorted-set (" in t["target"]]
    assert len(mem) == len(suite.Options.quick().memory_limits)
    assert all(t["verdict"] == "INFO" for t in mem)
    # Nothing is left behind on the shared server.
    client = redis.Redis.from_url(real_redis_url)
    try:
        assert not list(client.scan_iter(match=f"bench:{suite.os.getpid()}:*", count=1000))
    finally:
        client.close()


def test_missing_peer_packages_are_skipped_with_a_reason(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "limits", None)
    monkeypatch.setitem(sys.modules, "throttled.asyncio", None)
    found, skipped = peers.build(fakeredis.FakeAsyncRedis(), "redis://127.0.0.1:1/0", "p", 10)
    assert set(found) == {"classic recipe"}
    assert set(skipped) == PACKAGE_PEERS
    for name, reason in skipped.items():
        package = name.split()[0]
        assert reason.startswith("skipped:") and f"{package} is not installed" in reason


async def test_cluster_is_skipped_with_a_reason(monkeypatch) -> None:
    monkeypatch.delenv(cluster.ENV, raising=False)
    monkeypatch.setattr(cluster, "STATE_FILES", ())  # whatever make cluster-up left here
    assert "no cluster" in (await cluster.run(1, 10))["skipped"]
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    out = await cluster.run(1, 10, url=nobody)
    assert out["skipped"].startswith("skipped:") and "did not answer" in out["skipped"]


def test_cli_writes_results_and_figures(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(suite, "pick_url", lambda: None)
    out = tmp_path / "bench" / "results.json"
    argv = ["--quick", "--only", "checks", "concurrency", "nearcache", "--out", str(out)]
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    assert {"date", "machine", "checks", "concurrency", "nearcache", "targets"} <= set(report)
    assert set(report["timings_s"]) == {"checks", "concurrency", "nearcache"}
    for figure in ("checks.png", "concurrency.png", "nearcache.png"):
        assert (out.parent / figure).read_bytes().startswith(b"\x89PNG")
    printed = capsys.readouterr().out
    assert "targets" in printed and "EVALSHA return 1" in printed and "skipped:" in printed
    assert "near-cache on embedded fakeredis" in printed
    # Every target's verdict is printed, and the file holds exactly what was printed.
    for t in report["targets"]:
        assert f"{t['verdict']:10} {t['target']}" in printed
    # The file holds exactly the summary, which follows the progress lines printed as it ran.
    written = (out.parent / "summary.txt").read_text()
    assert printed.endswith(written)
    said = printed[: -len(written)].splitlines()
    assert said[0].startswith("[bench] a --quick smoke run")
    assert all(line.startswith("[bench") for line in said)
    assert [line.split(": ")[0] for line in said if line.endswith(": started")] == [
        "[bench 1/3] checks",
        "[bench 2/3] concurrency",
        "[bench 3/3] nearcache",
    ]


async def test_cluster_run_on_a_local_cluster(tmp_path, monkeypatch) -> None:
    from ratelimit.devtools.cluster import LocalCluster

    if not LocalCluster.available():
        _missing("redis-server / redis-cli are not installed; the cluster bench needs them")
    with LocalCluster() as local:
        # Found as `make cluster-up` records it, with no URL given or in the environment.
        state = tmp_path / "state.json"
        state.write_text(json.dumps({"url": local.url, "pids": local.pids}))
        monkeypatch.delenv(cluster.ENV, raising=False)
        monkeypatch.setattr(cluster, "STATE_FILES", (state,))
        out = await cluster.run(2, 30)
        assert out["url"] == local.url and "skipped" not in out
        assert str(state) in out["source"]
        assert_consistent(out)
        assert set(out["results"]) == {
            cluster.FLOOR,
            checks.hot("SlidingWindowLimiter"),
            checks.spread("SlidingWindowLimiter"),
        }
        sizes = []
        for node in local.nodes:
            with node.admin() as admin:
                sizes.append(admin.dbsize())
        assert sizes == [0] * len(local.nodes)  # the run deleted its keys on every shard


def synthetic_checks(bare: float, ours: float, rounds_n: int = 3) -> dict:
    """A checks part with fixed per-round speeds: EVALSHA at 5,000/s, the bare script
    at `bare` of it, our check at `ours` of it."""
    row = {
        "EVALSHA return 1": 5000.0,
        checks.ARGS_FLOOR_CASE: 4500.0,
        checks.BARE_SCRIPT_CASE: 5000.0 * bare,
        checks.spread("SlidingWindowLimiter"): 5000.0 * ours,
        checks.BATCH_CASE: 5000.0 * ours * 4,
    }
    per_round = [dict(row) for _ in range(rounds_n)]
    return {
        "per_round": per_round,
        "results": rounds.summarize(per_round, ["EVALSHA return 1"]),
        "peers": {},
        "skipped": {},
    }


def test_evalsha_target_failure_is_explained_from_the_same_run() -> None:
    cost = {
        "results": {
            "EVALSHA return 1": {"usec_per_check": 2.0},
            checks.spread("SlidingWindowLimiter"): {"usec_per_check": 12.0},
        }
    }
    rows = targets.judge({"checks": synthetic_checks(bare=0.8, ours=0.7), "server_cost": cost})
    main, python, batch = rows[:3]
    assert main["verdict"] == "FAIL" and main["value"] == pytest.approx(0.7)
    assert main["threshold"] == targets.EVALSHA_TARGET  # the target is not redefined
    # Python overhead alone: ours against the same script called bare.
    assert python["verdict"] == "INFO" and python["value"] == pytest.approx(0.7 / 0.8)
    assert batch["verdict"] == "PASS" and batch["value"] == pytest.approx(4.0)
    why = " ".join(main["why"])
    # 200 us per `return 1`; +10 us of server time caps a client at 200/210.
    assert "reaches 0.80x" in why and "0.90x" in why and f"{200 / 210:.2f}x" in why
    assert "out of reach" in why and "+10.0 us" in why
    # When the bare script clears the line, the gap is named as our own code.
    rows = targets.judge({"checks": synthetic_checks(bare=0.9, ours=0.7)})
    why = " ".join(rows[0]["why"])
    assert "the gap is the limiter's Python code" in why and "not measured" in why
    assert targets.judge({"checks": synthetic_checks(bare=0.9, ours=0.86)})[0]["verdict"] == "PASS"


def test_cluster_url_from_the_environment_or_make_cluster_up(tmp_path, monkeypatch) -> None:
    state = tmp_path / "state.json"
    monkeypatch.delenv(cluster.ENV, raising=False)
    assert cluster.find_url((state,))[0] is None
    state.write_text(json.dumps({"url": "redis+cluster://127.0.0.1:7001,127.0.0.1:7002"}))
    url, source = cluster.find_url((state,))
    assert url == "redis+cluster://127.0.0.1:7001,127.0.0.1:7002" and str(state) in source
    monkeypatch.setenv(cluster.ENV, "redis+cluster://127.0.0.1:7100")
    assert cluster.find_url((state,)) == ("redis+cluster://127.0.0.1:7100", f"${cluster.ENV}")
    monkeypatch.delenv(cluster.ENV)
    state.write_text("{not json")
    url, reason = cluster.find_url((state,))
    assert url is None and "unreadable" in reason


async def test_a_stale_state_file_is_skipped_with_a_reason(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(cluster.ENV, raising=False)
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"url": f"redis://127.0.0.1:{free_port()}/0"}))
    monkeypatch.setattr(cluster, "STATE_FILES", (state,))
    out = await cluster.run(1, 10)
    assert out["skipped"].startswith("skipped:") and "did not answer" in out["skipped"]
    assert str(state) in out["skipped"]
