"""Chapter 5's module: the traces, the contracts and exactness tables, the cost of a
check (both logs and the O(1) algorithms), the counter at scale (Cloudflare's metric and
divergence), the geofence policies, and the figures drawn from them."""

from __future__ import annotations

import functools

import matplotlib

matplotlib.use("Agg")
import ipywidgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from ratelimit import algorithms  # noqa: E402
from ratelimit.costs import GEOFENCE_MAX_COST, geofence_cost  # noqa: E402
from ratelimit.lab import capacity, memory, traffic  # noqa: E402
from ratelimit.lab.chapters import algorithms_and_cost as chapter  # noqa: E402
from ratelimit.lab.plotting import COLORS, explorer  # noqa: E402

LABELS = [a.label for a in algorithms.ALGORITHMS]
COST_LABELS = [chapter.COST_LABELS[a] for a in chapter.COSTED]
# Small versions of the chapter's traces, so that every test runs in well under a second.
SMALL = {
    "duration_s": 60,
    "attack_cycles": 5,
    "fleet_clients": 20,
    "fleet_rate": 40,
    "fleet_duration_s": 30,
}


@pytest.fixture(scope="module")
def table():
    return memory.load_table(memory.STORED_TABLE)


@pytest.fixture(scope="module")
def small_traces():
    return chapter.traces(10, 1, 0, **SMALL)


@pytest.fixture(scope="module")
def replayed(small_traces):
    return chapter.replay_all(small_traces, 10, 1)


@pytest.fixture(scope="module")
def exactness(replayed):
    return chapter.exactness(replayed, 10, 1)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# --- sections 1 and 2 ------------------------------------------------------------------


def test_labels_follow_the_registry():
    assert list(chapter.LABELS) == list(algorithms.NAMES)
    assert list(chapter.LABELS.values()) == LABELS


def test_traces_are_the_five_seeded_traces(small_traces):
    assert list(small_traces) == [
        "boundary attacker",
        "Poisson 1x",
        "Poisson 2x",
        "on/off bursts",
        "Zipf fleet",
    ]
    assert len(small_traces["boundary attacker"]) == 2 * 10 * SMALL["attack_cycles"]
    again = chapter.traces(10, 1, 0, **SMALL)
    assert all(again[name].equals(trace) for name, trace in small_traces.items())
    other = chapter.traces(10, 1, 1, **SMALL)
    assert not other["Poisson 1x"].equals(small_traces["Poisson 1x"])


def test_traces_reject_bad_parameters():
    with pytest.raises(ValueError):
        chapter.traces(0, 1, 0, **SMALL)
    with pytest.raises(ValueError):
        chapter.traces(10, 1, 0, **{**SMALL, "fleet_clients": 0})


def test_trace_table_describes_each_trace(small_traces):
    described = chapter.trace_table(small_traces, 10, 1)
    assert list(described.index) == list(small_traces)
    assert described.loc["boundary attacker", "busiest client, busiest second"] == 20
    assert described.loc["Zipf fleet", "clients"] == SMALL["fleet_clients"]
    assert (described["requests"] == [len(t) for t in small_traces.values()]).all()


def test_busiest_window_of_a_trace_and_of_a_replay():
    trace = pd.DataFrame(
        {"time": [0.1, 0.2, 0.3, 1.5], "identity": "a", "cost": [1, 2, 1, 1], "replica": 0}
    )
    assert chapter.busiest_window(trace, 1) == 4  # cost counts, not requests
    assert chapter.busiest_window(trace.assign(allowed=[True, False, True, True]), 1) == 2


def test_replay_with_uses_the_reference_model(small_traces):
    attack = small_traces["boundary attacker"]
    assert chapter.replay_with("log", attack).allowed.sum() == 10 * SMALL["attack_cycles"]
    assert chapter.replay_with("fw", attack).allowed.all()
    with pytest.raises(ValueError, match="unknown algorithm"):
        chapter.replay_with("leaky", attack)


def test_exactness_measures_against_the_log(exactness, replayed):
    assert list(exactness.index.get_level_values("algorithm")[:4]) == LABELS
    log = exactness.xs("sliding log", level="algorithm")
    assert (log["peak / limit"] == 1.0).all()
    assert (log[[chapter.ADMITTED_NOT_LOG, chapter.REFUSED_NOT_LOG]] == 0).all().all()
    attack = exactness.loc["boundary attacker"]
    assert attack.loc["fixed window", "peak / limit"] == 2.0
    assert attack.loc["fixed window", chapter.ADMITTED_NOT_LOG] == 50.0
    admitted = exactness.loc[("Poisson 2x", "GCRA (token bucket)"), "admitted"]
    assert admitted == replayed["Poisson 2x"]["gcra"].allowed.sum()


def _decided(times, allowed, identity="a", cost=None):
    return pd.DataFrame(
        {
            "time": times,
            "identity": identity,
            "cost": cost or [1] * len(times),
            "allowed": allowed,
        }
    )


def test_contract_measures_by_hand():
    # Fixed window 2 per 1 s: two at 0.9 s and two at 1.1 s keep it (each calendar
    # window holds 2), though a rolling second holds 4: the log's contract breaks.
    times = [0.9, 0.95, 1.1, 1.15]
    burst = _decided(times, [True] * 4)
    assert chapter.contract_measure("fw", burst, 2, 1) == 1.0
    assert chapter.contract_measure("log", burst, 2, 1) == 2.0
    # The counter at 1.1 s: previous window 2 x 0.9 + current 1 = 2.8 > 2.
    assert chapter.contract_measure("swc", burst, 2, 1) == pytest.approx(3.7 / 2)
    # GCRA 2 per 1 s, burst 2: three at once break it, two at once and one 0.5 s later keep it.
    assert chapter.contract_measure("gcra", _decided([0, 0, 0], [True] * 3), 2, 1) == 1.5
    assert chapter.contract_measure("gcra", _decided([0, 0, 0.5], [True] * 3), 2, 1) == 1.0
    # Rejected requests do not count; nothing admitted measures 0.
    assert chapter.contract_measure("log", _decided([0, 0, 0], [True, False, False]), 2, 1) == 0.5
    assert chapter.contract_measure("gcra", _decided([0], [False]), 2, 1) == 0.0


def test_every_algorithm_keeps_its_own_contract(replayed):
    table = chapter.contracts(replayed, 10, 1)
    assert list(table.index) == LABELS
    assert table["own contract: kept"].all()
    assert list(table["own contract"]) == list(chapter.CONTRACTS.values())
    # The GCRA decisions broken by hand: one extra admission breaks its contract.
    gcra = replayed["boundary attacker"]["gcra"].copy()
    gcra.loc[gcra.index[:11], "allowed"] = True
    assert chapter.contract_measure("gcra", gcra, 10, 1) > 1


def test_peaks_is_one_row_per_trace_one_column_per_algorithm(exactness, small_traces):
    peak = chapter.peaks(exactness)
    assert list(peak.index) == list(small_traces)
    assert list(peak.columns) == LABELS
    assert peak.loc["boundary attacker", "fixed window"] == 2.0


# --- section 3 ------------------------------------------------------------------------


def test_stored_table_is_read_not_measured(tmp_path):
    chapter.stored_table.cache_clear()
    stored = chapter.stored_table()
    assert stored.source == "stored"
    assert set(stored.table.algorithm) == set(algorithms.NAMES)
    with pytest.raises(FileNotFoundError):
        chapter.stored_table(tmp_path / "no_such_table.csv")


def test_key_bytes(table):
    sizes = chapter.key_bytes(table, [10, 1_000])
    assert list(sizes.columns) == ["limit 10", "limit 1,000"]
    assert list(sizes.index) == COST_LABELS
    assert sizes.loc["sliding log (sorted set)", "limit 1,000"] == round(
        capacity.bytes_per_key(table, "log", 1000)
    )
    compact = capacity.bytes_per_key(table, "log", 1000, member_format="compact")
    assert sizes.loc["sliding log (compact)", "limit 1,000"] == round(compact)
    assert sizes.loc["sliding log (compact)", "limit 1,000"] * 10 < sizes.iloc[1, 1]
    assert sizes.loc["fixed window"].nunique() == 1
    with pytest.raises(ValueError, match="entries"):
        chapter.key_bytes(table, [0])


def test_predicted_commands_follow_the_registry():
    decided = pd.DataFrame({"allowed": [True, True, False, False, False], "cost": [1, 3, 1, 2, 1]})
    # log: admit 5 (+1 per extra unit), reject 3; gcra: admit 2, reject 1.
    assert chapter.predicted_commands("log", decided) == 5 + (5 + 2) + 3 * 3
    assert chapter.predicted_commands("gcra", decided) == 2 * 2 + 3 * 1
    with pytest.raises(ValueError):
        chapter.predicted_commands("leaky", decided)


def test_script_check_runs_the_real_scripts():
    check = chapter.script_check(10, 1, 0, duration_s=5)
    assert list(check.index) == COST_LABELS
    assert check["same decisions as the model"].all()
    assert (check["admitted"] < check["checks"]).all()
    # The compact log and the sorted set decide alike.
    assert check.iloc[0, :3].equals(check.iloc[1, :3])
    for a in map(algorithms.get, chapter.COSTED):
        row, c = check.loc[chapter.COST_LABELS[a.name]], a.commands
        extra = row["units admitted"] - row["admitted"]
        rejected = row["checks"] - row["admitted"]
        expected = row["admitted"] * c.admit + extra * c.per_extra_unit + rejected * c.reject
        assert row["commands predicted"] == expected
        assert row["commands per check: admit / extra unit / reject"].startswith(f"{c.admit} /")


# --- section 4 ------------------------------------------------------------------------


def test_peak_records_name_the_three_approximations():
    worst = pd.Series({"log": 1.0, "fw": 2.0, "swc": 1.46, "gcra": 1.9})
    records = chapter.peak_records(worst)
    assert [(name, value, fmt) for name, value, fmt, _ in records] == [
        ("peak_fw", 2.0, ".1f"),
        ("peak_swc", 1.46, ".1f"),
        ("peak_gcra", 1.9, ".1f"),
    ]
    assert records[0][3] == "fixed window: worst rolling-second peak / limit"


def test_decision_matrix(exactness, replayed, table):
    matrix = chapter.decision_matrix(exactness, chapter.key_bytes(table), replayed, 10)
    assert list(matrix.index) == COST_LABELS
    assert matrix["own contract: kept"].all()
    # Both logs are judged on the log's decisions; they differ in bytes and commands.
    logs = matrix.loc[["sliding log (compact)", "sliding log (sorted set)"]]
    assert (logs.iloc[:, :4].nunique() == 1).all()
    assert logs["vs exact log: worst peak / limit"].tolist() == [1.0, 1.0]
    assert logs["commands per check, admit / reject"].tolist() == ["3 / 1", "5 / 3"]
    assert matrix.loc["fixed window", "vs exact log: worst peak / limit"] == 2.0
    # Every column judged against the log says so.
    assert all(c.startswith("vs exact log") for c in matrix.columns[1:4])
    assert matrix.loc["GCRA (token bucket)", "commands per check, admit / reject"] == "2 / 1"
    checks = sum(len(by["log"]) for by in replayed.values())
    mean = sum(chapter.predicted_commands("swc", by["swc"]) for by in replayed.values()) / checks
    assert matrix.loc["sliding-window counter", "commands per check, mean"] == round(mean, 2)


def test_matrix_figure_shows_the_tables(exactness, table):
    fig = chapter.matrix_figure(exactness, table, 10, 1)
    peak_ax, false_ax, memory_ax, commands_ax = fig.axes
    heights = [p.get_height() for p in peak_ax.patches]
    assert heights == list(chapter.peaks(exactness).T.to_numpy().ravel())
    assert all(ax.get_title() for ax in fig.axes)
    assert [line.get_label() for line in memory_ax.get_lines()][:5] == COST_LABELS
    counts = [int(p.get_height()) for p in commands_ax.patches[:5]]
    assert counts == [capacity.script_commands(a, True) for a in chapter.COSTED]
    assert "limit 10 per 1 s" in fig._suptitle.get_text()


# --- section 5 ------------------------------------------------------------------------


def _brute_force_errors(trace, limit, window_s):
    """Cloudflare's metric, one request at a time, straight from the definition."""
    rows = []
    ms = [int(t * 1000) for t in trace.time]
    window = window_s * 1000
    for i in range(len(ms)):
        same = [j for j in range(i + 1) if trace.identity.iloc[j] == trace.identity.iloc[i]]
        t = ms[i]
        exact = sum(1 for j in same if t - window < ms[j] <= t)
        start = (t // window) * window
        current = sum(1 for j in same if start <= ms[j] <= t)
        previous = sum(1 for j in same if start - window <= ms[j] < start)
        approx = previous * ((window - (t - start)) / window) + current
        rows.append((exact, approx, approx <= limit < exact, exact <= limit < approx))
    return rows


def test_exact_rate_errors_follow_the_definition():
    trace = traffic.merge(
        traffic.poisson(12, 20, seed=1, identity="a"), traffic.poisson(8, 20, seed=2, identity="b")
    )
    errors = chapter.exact_rate_errors(trace, 10, 1)
    assert list(errors.identity) == list(trace.identity)
    expected = _brute_force_errors(trace, 10, 1)
    assert list(errors.exact) == [e[0] for e in expected]
    assert np.allclose(errors.approx, [e[1] for e in expected])
    assert list(errors.wrongly_allowed) == [e[2] for e in expected]
    assert list(errors.wrongly_limited) == [e[3] for e in expected]
    assert errors.wrongly_allowed.any() and errors.wrongly_limited.any()


def test_exact_rate_errors_by_hand():
    # 10 requests at 0.4 s, then 1 at 1.5 s: the exact rate at 1.5 s is 1 (0.4 s is out of it),
    # the approximation 10 x 0.5 + 1 = 6; at limit 5 that request is wrongly limited.
    trace = pd.DataFrame({"time": [0.4] * 10 + [1.5], "identity": "a", "cost": 1})
    errors = chapter.exact_rate_errors(trace, 5, 1)
    assert errors.exact.iloc[-1] == 1 and errors.approx.iloc[-1] == 6
    assert errors.wrongly_limited.iloc[-1] and not errors.wrongly_allowed.any()


def test_cloudflare_is_cited_by_title_date_and_address():
    assert chapter.CLOUDFLARE.title.startswith("How we built rate limiting")
    assert chapter.CLOUDFLARE.date == "2017-06-07"
    assert chapter.CLOUDFLARE.url.startswith("https://blog.cloudflare.com/")
    assert chapter.CLOUDFLARE.percent == 0.003


def test_counter_per_rate():
    per_rate = chapter.counter_per_rate([0.1, 1, 10], 2_000, 10, 1, 0)
    assert list(per_rate.index) == [0.1, 1, 10]
    assert (per_rate.loc[0.1, [chapter.WRONG_VS_RATE, chapter.DIVERGED]] == 0).all()
    assert per_rate.loc[1, chapter.WRONG_VS_RATE] > 1
    # Far above the limit both rates say "over": no error by Cloudflare's metric, while
    # the two limiters' states keep them apart.
    assert per_rate.loc[10, chapter.WRONG_VS_RATE] == 0
    assert per_rate.loc[10, chapter.DIVERGED] > 5
    both = per_rate["wrongly allowed (%)"] + per_rate["wrongly limited (%)"]
    assert np.allclose(both, per_rate[chapter.WRONG_VS_RATE], atol=1e-3)
    assert per_rate.loc[10, "admitted, counter / log"] < 1.001
    with pytest.raises(ValueError):
        chapter.counter_per_rate([0], 2_000)


@pytest.fixture(scope="module")
def small_fleet():
    return chapter.counter_on_fleet(200, 100, 60, 10, 1, 1.1, 0)


def test_counter_on_fleet_groups_clients_by_rate(small_fleet):
    by_rate = small_fleet.by_rate
    total = by_rate.loc["all clients"]
    assert by_rate.index[-1] == "all clients" and len(by_rate) == 8
    assert total["clients"] == by_rate["clients"].iloc[:-1].sum() == small_fleet.clients
    assert total["share of requests (%)"] == 100
    wrong = small_fleet.wrong["false_admits"] + small_fleet.wrong["false_rejects"]
    assert total[chapter.DIVERGED] == round(100 * wrong / small_fleet.requests, 4)
    parts = total["wrongly allowed (%)"] + total["wrongly limited (%)"]
    assert total[chapter.WRONG_VS_RATE] == pytest.approx(parts, abs=1e-3)
    assert small_fleet.busiest > 1
    assert f"{small_fleet.requests:,} requests from {small_fleet.clients} clients" in (
        small_fleet.summary()
    )


def test_the_counters_records_are_the_tables_numbers(small_fleet):
    per_rate = chapter.counter_per_rate([0.1, 1, 10], 2_000, 10, 1, 0)
    single = {name: (value, fmt) for name, value, fmt, _ in chapter.per_rate_records(per_rate)}
    assert single == {
        "single_cloudflare_max_pct": (per_rate[chapter.WRONG_VS_RATE].max(), ".1f"),
        "single_diverged_max_pct": (per_rate[chapter.DIVERGED].max(), ".1f"),
    }
    fleet = {name: value for name, value, _, _ in small_fleet.records()}
    total = small_fleet.by_rate.loc["all clients"]
    assert fleet == {
        "fleet_requests_m": small_fleet.requests / 1e6,
        "fleet_cloudflare_pct": total[chapter.WRONG_VS_RATE],
        "fleet_diverged_pct": total[chapter.DIVERGED],
        "cloudflare_pct": chapter.CLOUDFLARE.percent,
    }
    assert all(what for *_, what in [*chapter.per_rate_records(per_rate), *small_fleet.records()])


def test_counter_figure_plots_the_tables(small_fleet):
    per_rate = chapter.counter_per_rate([0.1, 1, 3], 1_000)
    fig = chapter.counter_figure(per_rate, small_fleet)
    left, right = fig.axes
    single = left.get_lines()[0]
    assert list(single.get_ydata()) == list(per_rate[chapter.WRONG_VS_RATE])
    assert single.get_color() == COLORS["swc"]
    shown = np.ma.compressed(left.collections[0].get_offsets()[:, 0])  # empty classes: masked
    assert list(shown) == list(small_fleet.class_rate.dropna())
    assert list(right.get_lines()[0].get_ydata()) == list(per_rate[chapter.DIVERGED])
    # The published figure is drawn beside Cloudflare's metric only.
    labels = [line.get_label() for line in left.get_lines()]
    assert any(label.startswith("Cloudflare (2017)") for label in labels)
    assert not any("Cloudflare" in line.get_label() for line in right.get_lines())
    assert "Cloudflare's metric" in left.get_title() and "separate" in right.get_title()


# --- section 6 ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def geo():
    return chapter.geofence_traffic(6, 60, 0)


def test_cap_radius_comes_from_the_cost_function():
    radius = chapter.cap_radius_m()
    assert radius == 1_500.0
    assert geofence_cost(radius) == GEOFENCE_MAX_COST - 1
    assert geofence_cost(radius + 0.01) == GEOFENCE_MAX_COST
    assert chapter.cap_radius_m(500, 5) == 1_000.0


def test_cap_caveat_is_checked_on_the_cost_function():
    caveat = chapter.cap_caveat(1.5)
    assert caveat.startswith(f"Charged the cap of {GEOFENCE_MAX_COST} units above 1.5 km")
    assert "a 3 km look-up searches 36 discs and is charged 10 units" in caveat
    assert "a 2 km look-up searches 16 discs" in chapter.cap_caveat(1.5, 2_000)
    with pytest.raises(AssertionError):
        chapter.cap_caveat(1.4)  # the cap does not start there


def test_geofence_traffic_and_profiles(geo):
    assert np.allclose(geo.area, (geo.radius_m / 500) ** 2)
    profiles = chapter.geo_profiles(geo)
    assert list(profiles.index) == list(chapter.GEO_PROFILES)
    assert (
        profiles.loc["point look-ups", "mean cost (units)"]
        < profiles.loc["wide-area", "mean cost (units)"]
    )
    assert (profiles["charged at the cap (%)"].between(0, 100)).all()


def test_geo_policies_and_table(geo):
    policies = chapter.geo_policies(geo, 10, 20, 1)
    flat, weighted = list(policies)
    assert flat == "flat: 10 requests/s" and weighted == "weighted: 20 units/s"
    assert chapter.busiest_window(policies[weighted], 1) <= 20
    assert chapter.busiest_window(policies[flat].assign(cost=1), 1) <= 10
    geo_table = chapter.geo_table(policies, 60)
    clients = list(dict.fromkeys(geo_table.index.get_level_values("client")))
    assert clients == [*chapter.GEO_PROFILES, "all three"]
    all_three = geo_table.loc[("all three", weighted), "admitted per second"]
    assert all_three == round(policies[weighted].allowed.sum() / 60, 2)


def test_geo_figure_shows_the_table(geo):
    geo_table = chapter.geo_table(chapter.geo_policies(geo), 60)
    fig = chapter.geo_figure(geo_table, 6)
    left, _ = fig.axes
    heights = [round(p.get_height(), 2) for p in left.patches[:3]]
    flat = geo_table.xs("flat: 10 requests/s", level="policy")["admitted per second"]
    assert heights == list(flat.drop("all three"))


def test_chapter_templates_quote_only_recorded_names():
    import string

    for template in (chapter.SUMMARY, chapter.HEADLINE):
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
        assert fields and all(f.islower() for f in fields)
    assert chapter.TITLE == "Algorithms and their cost"
    # The README sets the fleet's figure beside Cloudflare's only with the caveat.
    assert "{cloudflare_pct}% for their own traffic, which" in chapter.SUMMARY
    assert "synthetic" in chapter.SUMMARY and "near their limit" in chapter.SUMMARY


def test_traffic_module_is_what_the_traces_use(small_traces):
    # The Poisson 1x trace is traffic.poisson at the limit's rate with the chapter's seed.
    expected = traffic.poisson(10.0, SMALL["duration_s"], seed=0)
    assert small_traces["Poisson 1x"].equals(expected)


def test_geo_explore_draws_the_section_figure_again():
    fig = chapter.geo_explore(duration_s=30, flat_limit=5.0, cost_limit=12.0)
    left, _ = fig.axes
    geo = chapter.geofence_traffic(6, 30, 0)
    table = chapter.geo_table(chapter.geo_policies(geo, 5, 12), 30)
    flat = table.xs("flat: 5 requests/s", level="policy")["admitted per second"]
    assert [round(p.get_height(), 2) for p in left.patches[:3]] == list(flat.drop("all three"))


def test_geo_sliders_build_and_redraw_from_the_chapters_parameters():
    calls = []
    chapter_figure = functools.partial(chapter.geo_explore, duration_s=30, cost_limit=15)

    @functools.wraps(chapter_figure)
    def draw(**values):
        calls.append(values)
        return chapter_figure(**values)

    widget = explorer(draw, flat_limit=ipywidgets.IntSlider(value=10, min=1, max=40))
    assert calls == [{"flat_limit": 10}]  # the slider starts at the chapter's value
    widget.children[0].value = 4
    assert calls[-1] == {"flat_limit": 4}  # the partial keeps its cost_limit
