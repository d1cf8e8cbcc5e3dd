"""Chapter 8's module: the demand per identity, the near-cache and batching estimates,
and the tables and sensitivity it builds on the planner, each against an independent
count."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from ratelimit import sync  # noqa: E402
from ratelimit.backends import connect_sync  # noqa: E402
from ratelimit.clock import ManualClock  # noqa: E402
from ratelimit.lab import accesslog, planner, reference, samplelog  # noqa: E402
from ratelimit.lab.chapters import your_traffic as yt  # noqa: E402
from ratelimit.lab.simulation import replay  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _trace(rows: list[tuple[float, str, int]]) -> pd.DataFrame:
    times, who, cost = zip(*rows, strict=True)
    return pd.DataFrame(
        {"time": times, "identity": who, "cost": np.array(cost, dtype=np.int64), "replica": 0}
    )


def _hammering(seed: int = 3) -> pd.DataFrame:
    """Three identities: one far above 5 per second, one near it, one far below."""
    rng = np.random.default_rng(seed)
    rows = []
    for who, rate in (("hammer", 40.0), ("near", 6.0), ("calm", 1.0)):
        t = np.cumsum(rng.exponential(1 / rate, size=int(rate * 20)))
        rows += [(round(float(x), 3), who, 1) for x in t if x < 20]
    rows.sort()
    return _trace(rows)


def test_demand_is_each_identitys_busiest_window_counted_by_brute_force():
    trace = _trace(
        [(0.0, "a", 1), (0.5, "a", 2), (0.9, "b", 1), (1.0, "a", 1), (1.6, "a", 1), (3.0, "b", 4)]
    )
    table = yt.demand(trace, window_s=1)
    ms = (trace["time"] * 1000).round().astype(int)
    for who in ("a", "b"):
        mine = trace[trace["identity"] == who]
        stamps = ms[mine.index].to_numpy()
        costs = mine["cost"].to_numpy()
        # (t - W, t] at every stamp t: the busiest window ends on a request
        brute = max(costs[(stamps > t - 1000) & (stamps <= t)].sum() for t in stamps)
        assert table.loc[who, "peak"] == brute
        assert table.loc[who, "requests"] == len(mine)
    assert list(table.index) == ["b", "a"]  # busiest peak first: 4 (one request of cost 4), 3
    assert table.loc["a", "peak"] == 3  # 0.5 s (cost 2) and 1.0 s; 0.0 s is out at t = 1.0
    with pytest.raises(ValueError, match="no requests"):
        yt.demand(trace.iloc[:0], window_s=1)


@pytest.mark.parametrize("algorithm", ["log", "fw"])
def test_near_cache_estimate_equals_the_hits_of_a_real_near_cache(algorithm):
    trace = _hammering()
    models = {"log": reference.SlidingWindowLimiter, "fw": reference.FixedWindowLimiter}
    classes = {"log": sync.SlidingWindowLimiter, "fw": sync.FixedWindowLimiter}
    estimate = yt.near_cache(replay(trace, models[algorithm](1, 5)))
    clock = ManualClock()
    client = connect_sync(None, embedded=True)
    limiter = classes[algorithm](client, 1, 5, clock=clock, near_cache=True)
    for t, who in zip(trace["time"], trace["identity"], strict=True):
        clock.set_ms(int(round(t * 1000)))
        limiter.check(who)
    assert estimate["saved"] == limiter.near_cache.hits > 0
    assert estimate["redis_calls"] == len(trace) - estimate["saved"]


def test_near_cache_refuses_a_replay_the_cache_could_not_have_given():
    trace = _hammering()
    decided = replay(trace, reference.SlidingWindowLimiter(1, 5))
    rejected = np.flatnonzero(~decided["allowed"].to_numpy())
    tampered = decided.copy()
    tampered.loc[rejected[1:], "allowed"] = True  # admitted inside a cached rejection
    with pytest.raises(ValueError, match="not an exact replay"):
        yt.near_cache(tampered)


def test_batching_model_matches_poisson_arrivals_counted_slot_by_slot():
    rng = np.random.default_rng(5)
    rate, seconds = 2_000.0, 50
    arrivals_ms = np.floor(np.cumsum(rng.exponential(1000 / rate, size=int(rate * seconds))))
    slots_per_s = len(np.unique(arrivals_ms[arrivals_ms < seconds * 1000])) / seconds
    model = yt.batching(rate, 1, growth=[1])
    assert model.loc[1, "round trips/s with check_many"] == pytest.approx(slots_per_s, rel=0.02)
    grown = yt.batching(rate, 1, growth=[1, 10, 100])
    assert grown["round trips saved"].is_monotonic_increasing
    assert (grown["round trips/s with check_many"] <= 1000).all()  # one trip per slot at most
    with pytest.raises(ValueError, match="batch_ms"):
        yt.batching(rate, 0, growth=[1])


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    log = yt.example_log(tmp_path_factory.mktemp("example"))
    trace, problems = yt.load(log, identity="user", cost=samplelog.example_cost)
    plan = planner.plan_trace(
        trace, ["50/min", "100/min"], server_time=planner.choose_server_time(measure=False)
    )
    return log, trace, problems, plan


def test_example_log_lands_where_asked_and_loads_with_its_bad_lines(example, tmp_path):
    log, trace, problems, _ = example
    assert log.name == "access.log" and log.exists()
    assert problems.skipped == len(samplelog.EXAMPLE_BAD_LINES) + 1
    facts = yt.overview(trace, problems)
    assert facts["requests"] == f"{len(trace):,}"
    assert facts["bad lines (skipped)"] == str(problems.skipped)


def test_sweep_table_carries_the_planners_counts(example):
    _, trace, _, plan = example
    table = yt.sweep_table(plan)
    assert len(table) == 2 * 4
    row = table[(table["limit"] == "100/min") & (table["algorithm"] == "log")].iloc[0]
    decided = replay(trace, reference.SlidingWindowLimiter(60, 100), compiled=False)
    assert row["rejected"] == (~decided["allowed"]).sum()
    assert row["rejected share"] == pytest.approx(row["rejected"] / len(trace))
    fig = yt.sweep_figure(table)
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 4


def test_redis_table_and_sensitivity_scale_the_plan(example):
    _, _, _, plan = example
    table = yt.redis_table(plan, "100/min")
    assert list(table.columns) == [
        "sliding log",
        "fixed window",
        "sliding-window counter",
        "GCRA (token bucket)",
    ]
    growth = yt.sensitivity(plan, "100/min", growth=[1, 10, 1_000, 100_000])
    for c in plan.candidates:
        if c.limit_text != "100/min":
            continue
        rows = growth[growth["algorithm"] == c.algorithm].set_index("growth")
        assert rows.loc[1, "shards"] == c.redis.shards  # growth 1 is the plan itself
        assert rows.loc[1000, "checks_per_s"] == pytest.approx(1000 * c.redis.peak_checks_per_s)
        assert rows["shards"].is_monotonic_increasing
    first = yt.first_growth_needing(growth, 2)
    assert (first <= 100_000).all()  # 100,000x the example's traffic needs more than one
    with pytest.raises(ValueError, match="no candidate"):
        yt.sensitivity(plan, "7/min")
    yt.sensitivity_figure(growth, "100/min")


def test_shard_crossings_are_where_the_second_shard_starts(example):
    """The bisection's growth against the closed form: at these peaks the checks fill a
    shard first, so the crossing is where the peak checks reach a shard's usable share,
    and just below it one shard still carries the traffic."""
    _, _, _, plan = example
    crossings = yt.shard_crossings(plan, "100/min")
    assert crossings["growth"].is_monotonic_increasing and len(crossings) == 4
    usable = 1 - plan.shard.headroom
    for c in plan.candidates:
        if c.limit_text != "100/min":
            continue
        row = crossings.loc[c.algorithm]
        assert row["needed for"] == "checks"
        exact = row["one shard's checks/s"] * usable / c.redis.peak_checks_per_s
        assert row["growth"] == pytest.approx(exact, rel=1e-8)
        near = yt.sensitivity(plan, "100/min", growth=[row["growth"] * (1 - 1e-6), row["growth"]])
        assert near[near["algorithm"] == c.algorithm]["shards"].tolist() == [1, 2]
    third = yt.shard_crossings(plan, "100/min", shards=3)
    assert (third["growth"] > crossings["growth"].reindex(third.index)).all()
    with pytest.raises(ValueError, match="shards"):
        yt.shard_crossings(plan, "100/min", shards=1)


def test_the_example_log_in_a_temporary_folder_is_removed():
    log = yt.example_log()
    assert log.exists()
    assert yt.remove_example_logs() == [log.parent]
    assert not log.parent.exists() and yt.remove_example_logs() == []


def test_split_networks_finds_the_rotating_client_and_the_planners_difference(example):
    log, _, _, _ = example
    split = yt.split_networks(log, "100/min", cost=samplelog.example_cost)
    assert list(split.index) == ["2001:db8:7:2::/64"]  # heavy-2, four addresses of one /64
    assert split["addresses"].iloc[0] == 4 and split["escaped"].iloc[0] > 0
    server = planner.choose_server_time(measure=False)
    rejected = {}
    for prefix in (64, 128):
        by_host, _ = yt.load(log, identity="host", cost=samplelog.example_cost, ipv6_prefix=prefix)
        plan = planner.plan_trace(by_host, ["100/min"], ["log"], server_time=server)
        rejected[prefix] = plan.candidates[0].rejected
    assert split["escaped"].sum() == rejected[64] - rejected[128]


def _clf(path, rows: list[tuple[str, int]]) -> None:
    """A Common Log Format file written at UTC+05:30: (client, second after the start)."""
    lines = [
        f'{who} - - [{1 + t // 86_400:02d}/Jun/2026:{10 + t // 3600 % 24:02d}:'
        f'{t // 60 % 60:02d}:{t % 60:02d} +0530] "GET /a HTTP/1.1" 200 12'
        for who, t in rows
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def test_a_real_log_counts_clients_by_address_and_is_described_as_itself(tmp_path):
    log = tmp_path / "edge.log"
    rows = [("gw.example.net", 0), ("192.0.2.7", 5), ("gw.example.net", 61), ("192.0.2.7", 3599)]
    _clf(log, rows)
    trace, problems = yt.load(log)  # no identity named: the client field, host names too
    assert sorted(trace["identity"].unique()) == ["192.0.2.7", "gw.example.net"]
    name, origin, kinds = yt.describe(log, trace, problems, example=False, identity=None)
    assert name == "edge.log" and kinds == ""  # nothing skipped, nothing to explain
    # 10:00:00 at +05:30 is 04:30:00 UTC; the last line an hour less a second later.
    assert origin == (
        "edge.log holds requests from 2026-06-01 04:30:00 to 2026-06-01 05:29:59 UTC, "
        "from 2 clients counted by client address."
    )
    log.write_text(log.read_text() + "upstream timed out\n")
    trace, problems = yt.load(log)
    _, _, kinds = yt.describe(log, trace, problems, example=False, identity=None)
    assert problems.skipped == 1 and kinds == ", each skipped and counted by reason above"
    # Host names are clients of their own when the exercise splits networks: nothing escapes.
    assert yt.split_networks(log, "1/min").empty


def test_a_log_with_no_request_to_plan_says_why_in_one_line(tmp_path):
    log = tmp_path / "edge.log"
    _clf(log, [("192.0.2.7", t) for t in range(5)])
    with pytest.raises(accesslog.LogFormatError) as refused:
        yt.load(log, identity="user")  # "-" on every line
    message = str(refused.value)
    assert "\n" not in message and message.startswith("no requests to plan in edge.log: ")
    assert "5 of 5 lines skipped" in message and "no identity" in message


def test_the_example_is_described_with_its_own_servers_offsets(example):
    log, trace, problems, _ = example
    name, origin, kinds = yt.describe(log, trace, problems, example=True, identity="user")
    assert name == "the lab's example log"
    assert all(offset in origin for offset in yt.example_offsets())
    assert "a date that does not exist" in kinds


def test_what_fills_names_what_each_algorithm_runs_out_of(example):
    _, _, _, plan = example
    crossings = yt.shard_crossings(plan, "100/min")
    text = yt.what_fills(crossings)
    first = crossings.iloc[0]
    assert text.endswith(f"the {first['label']}'s keys then hold {first['memory then']}")
    mixed = crossings.assign(**{"needed for": ["checks"] + ["memory"] * (len(crossings) - 1)})
    text = yt.what_fills(mixed)
    assert f"the {mixed['label'].iloc[0]} run out of checks first" in text
    assert ", ".join(mixed["label"].iloc[1:]) + " run out of memory first" in text


def test_recommendation_table_is_read_off_the_demand_and_holds_when_replayed(example):
    _, trace, _, plan = example
    table = yt.recommendation_table(plan)
    assert sorted(table["algorithm"]) == sorted({c.algorithm for c in plan.candidates})
    log = table.set_index("algorithm").loc["log"]
    peaks = yt.demand(trace, 60)["peak"].sort_values(ascending=False).to_numpy()
    allowed = int(plan.affect * len(peaks))
    assert log["limit"] == f"{max(1, peaks[allowed])}/min" and log["peak max"] == peaks[0]
    for _, row in table.iterrows():  # each limit, replayed, affects at most the share
        limit = planner.parse_limit(row["limit"])
        again = planner.plan_trace(trace, [limit], [row["algorithm"]], measure=False, affect=None)
        assert again.candidates[0].identities_rejected == row["clients affected"] <= allowed
    fig = yt.peaks_figure(plan)
    assert len(fig.axes) == 1


def test_routes_for_another_log_are_its_busiest_first_segments():
    paths = ["/api/a?x=1"] * 5 + ["/img/b.png"] * 3 + ["/c"] * 2 + ["/"] * 9
    trace = _trace([(float(i), "who", 1) for i in range(len(paths))]).assign(path=paths)
    assert yt.routes_for(trace, False, "7/min") == [
        "/api/*=7/min,name=api",
        "/img/*=7/min,name=img",
    ]
    assert yt.routes_for(trace, True, "7/min") == list(yt.EXAMPLE_ROUTES)


def test_route_table_counts_each_route_and_the_unplanned(example):
    from ratelimit.lab.planner import routes

    log, _, _, plan = example
    trace, _ = yt.load(log, identity="user", cost=samplelog.example_cost, fields=["path"])
    by_route = routes.plan_routes_trace(
        trace, yt.routes_for(trace, True, "100/min"), ["log"], server_time=plan.server_time
    )
    table = yt.route_table(by_route).set_index("route")
    tiles = trace["path"].str.startswith("/v1/tiles/")
    assert table.loc["tiles", "route_requests"] == tiles.sum()
    assert (
        table.loc["geofence", "route_requests"]
        == trace["path"].str.startswith("/v1/geofence/").sum()
    )
