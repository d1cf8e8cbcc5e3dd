"""Chapter 5's module: the traces and exactness tables, the cost of a check, the counter
at scale, the geofence policies, the capacity plans, and the figures drawn from them."""

from __future__ import annotations

import functools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import ipywidgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from ratelimit import algorithms  # noqa: E402
from ratelimit.lab import capacity, memory, traffic  # noqa: E402
from ratelimit.lab.chapters import algorithms_and_capacity as chapter  # noqa: E402
from ratelimit.lab.plotting import COLORS, explorer  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
LABELS = [a.label for a in algorithms.ALGORITHMS]
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
    return memory.load_table(NOTEBOOKS / "data" / "memory_per_key.csv")


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


def steps(fig):
    """(label, x, y) of each step line of the capacity figure, in legend order."""
    return [
        (line.get_label(), np.asarray(line.get_xdata()), np.asarray(line.get_ydata()))
        for line in fig.axes[0].get_lines()
        if not line.get_label().startswith("_")
    ]


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
    assert (log[["false admits (%)", "false rejects (%)"]] == 0).all().all()
    attack = exactness.loc["boundary attacker"]
    assert attack.loc["fixed window", "peak / limit"] == 2.0
    assert attack.loc["fixed window", "false admits (%)"] == 50.0
    admitted = exactness.loc[("Poisson 2x", "GCRA (token bucket)"), "admitted"]
    assert admitted == replayed["Poisson 2x"]["gcra"].allowed.sum()


def test_peaks_is_one_row_per_trace_one_column_per_algorithm(exactness, small_traces):
    peak = chapter.peaks(exactness)
    assert list(peak.index) == list(small_traces)
    assert list(peak.columns) == LABELS
    assert peak.loc["boundary attacker", "fixed window"] == 2.0


# --- section 3 ------------------------------------------------------------------------


def test_stored_table_is_read_not_measured(monkeypatch):
    monkeypatch.chdir(NOTEBOOKS)
    chapter.stored_table.cache_clear()
    stored = chapter.stored_table("data/memory_per_key.csv")
    assert stored.source == "stored"
    assert set(stored.table.algorithm) == set(algorithms.NAMES)
    with pytest.raises(FileNotFoundError):
        chapter.stored_table("data/no_such_table.csv")


def test_key_bytes(table):
    sizes = chapter.key_bytes(table, [10, 1_000])
    assert list(sizes.columns) == ["limit 10", "limit 1,000"]
    assert list(sizes.index) == LABELS
    assert sizes.loc["sliding log", "limit 1,000"] == int(
        capacity.bytes_per_key(table, "log", 1000)
    )
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
    assert list(check.index) == LABELS
    assert check["same decisions as the model"].all()
    assert (check["admitted"] < check["checks"]).all()
    for a in algorithms.ALGORITHMS:
        row, c = check.loc[a.label], a.commands
        extra = row["units admitted"] - row["admitted"]
        rejected = row["checks"] - row["admitted"]
        expected = row["admitted"] * c.admit + extra * c.per_extra_unit + rejected * c.reject
        assert row["commands predicted"] == expected
        assert row["commands per check: admit / extra unit / reject"].startswith(f"{c.admit} /")


# --- section 4 ------------------------------------------------------------------------


def test_decision_matrix(exactness, replayed, table):
    matrix = chapter.decision_matrix(exactness, chapter.key_bytes(table), replayed, 10)
    assert list(matrix.index) == LABELS
    assert matrix.loc["sliding log", "worst peak / limit"] == 1.0
    assert matrix.loc["fixed window", "worst peak / limit"] == 2.0
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
    assert [line.get_label() for line in memory_ax.get_lines()][:4] == LABELS
    counts = [int(p.get_height()) for p in commands_ax.patches[:4]]
    assert counts == [capacity.script_commands(a, True) for a in algorithms.NAMES]
    assert "limit 10 per 1 s" in fig._suptitle.get_text()


# --- section 5 ------------------------------------------------------------------------


def test_counter_per_rate():
    per_rate = chapter.counter_per_rate([0.1, 2], 2_000, 10, 1, 0)
    assert list(per_rate.index) == [0.1, 2]
    assert per_rate.loc[0.1, "decided differently (%)"] == 0
    assert per_rate.loc[2, "decided differently (%)"] > 5
    assert per_rate.loc[2, "admitted, counter / log"] < 1.001
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
    assert total["decided differently (%)"] == round(100 * wrong / small_fleet.requests, 4)
    assert small_fleet.busiest > 1
    assert f"{small_fleet.requests:,} requests from {small_fleet.clients} clients" in (
        small_fleet.summary()
    )


def test_counter_figure_plots_the_tables(small_fleet):
    per_rate = chapter.counter_per_rate([0.1, 1, 3], 1_000)
    fig = chapter.counter_figure(per_rate, small_fleet)
    left, right = fig.axes
    single = left.get_lines()[0]
    assert list(single.get_ydata()) == list(per_rate["decided differently (%)"])
    assert single.get_color() == COLORS["swc"]
    shown = np.ma.compressed(left.collections[0].get_offsets()[:, 0])  # empty classes: masked
    assert list(shown) == list(small_fleet.class_rate.dropna())
    assert list(right.get_lines()[0].get_ydata()) == list(100 * per_rate["admitted, counter / log"])


# --- section 6 ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def geo():
    return chapter.geofence_traffic(6, 60, 0)


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


# --- section 7 ------------------------------------------------------------------------


def test_fleet_plans_at_the_chapters_parameters(table):
    plans = chapter.fleet_plans(table, chapter.Fleet())
    assert list(plans) == [chapter.FULL, chapter.STEADY, *LABELS[1:]]
    assert plans[chapter.FULL].shards == 13 and plans[chapter.STEADY].shards == 3
    assert {plans[label].shards for label in LABELS[1:]} == {2}
    sized = chapter.plan("log", capacity.bytes_per_key(table, "log", 1000), chapter.Fleet())
    assert sized == plans[chapter.FULL]


def test_plan_rejects_bad_input(table):
    with pytest.raises(ValueError, match="headroom"):
        chapter.plan("fw", 120, chapter.Fleet(headroom=1.0))
    with pytest.raises(ValueError):
        chapter.fleet_plans(table, chapter.Fleet(limit=0))


def test_plan_table_and_summary(table):
    plans = chapter.fleet_plans(table, chapter.Fleet())
    plan_table = chapter.plan_table(plans)
    assert list(plan_table.index) == list(plans)
    assert plan_table.loc[chapter.FULL, "shards"] == 13
    fleet = chapter.Fleet()  # memory = N x (one full key from the stored table + overhead)
    full_key = capacity.bytes_per_key(table, "log", fleet.whole_limit) + fleet.key_overhead_bytes
    assert plan_table.loc[chapter.FULL, "memory"] == memory.format_bytes(fleet.keys * full_key)
    assert (plan_table["checks/s"] == 50_000).all()
    summary = chapter.fleet_summary(chapter.Fleet())
    assert "50,000 checks/s" in summary and "holds 180 members" in summary


def test_policy_sweep(table):
    sweep = chapter.policy_sweep(table, chapter.Fleet())
    assert list(sweep.index) == list(chapter.POLICY_SWEEP)
    counter = sweep[f"{chapter.LABELS['swc']}: shards"]
    full = sweep[f"{chapter.FULL}: shards"]
    assert counter.nunique() == 1 and full.is_monotonic_increasing
    assert sweep.loc["1,000 per hour", f"{chapter.FULL}: shards"] == 13


def test_default_figure_is_titled_labelled_and_tells_the_chapters_story(table):
    fig = chapter.figure(table=table)
    (ax,) = fig.axes
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    assert "shards" in ax.get_ylabel() and "requests/s" in ax.get_xlabel()
    assert ax.get_legend() is not None
    lines = steps(fig)
    assert len(lines) == 5
    shards_at_a_million = {label.split(":")[0]: y[x == 1_000_000][0] for label, x, y in lines}
    plans = chapter.fleet_plans(table, chapter.Fleet())
    assert shards_at_a_million == {label: p.shards for label, p in plans.items()}
    assert shards_at_a_million[chapter.FULL] == 13


def test_the_stored_table_is_read_relative_to_the_notebooks(table, monkeypatch):
    monkeypatch.chdir(NOTEBOOKS)
    fig, ref = chapter.figure(), chapter.figure(table=table)
    for (_, _, y), (_, _, y_ref) in zip(steps(fig), steps(ref), strict=True):
        assert np.array_equal(y, y_ref)


@pytest.mark.parametrize(
    "change", [{"limit": 100}, {"headroom": 0.2}, {"rate_per_key": 0.5}, {"window_s": 60}]
)
def test_a_parameter_changes_the_plotted_data(table, change):
    old = steps(chapter.figure(table=table))
    new = steps(chapter.figure(table=table, **change))
    assert any(not np.array_equal(y0, y1) for (_, _, y0), (_, _, y1) in zip(old, new, strict=True))


def test_active_keys_moves_the_marker_and_the_legend(table):
    labels = [label for label, _, _ in steps(chapter.figure(table=table, active_keys=1e8))]
    assert labels[0] != f"{chapter.FULL}: 13 shards"
    assert all(int(label.split(": ")[1].split()[0].replace(",", "")) > 100 for label in labels)


def test_figure_rejects_bad_input(table):
    with pytest.raises(ValueError, match="headroom"):
        chapter.figure(table=table, headroom=1.0)
    with pytest.raises(ValueError):
        chapter.figure(table=table, rate_per_key=-1)


def test_sliders_build_and_redraw_from_the_chapters_parameters(table):
    calls = []
    chapter_figure = functools.partial(chapter.figure, table=table, headroom=0.4)

    @functools.wraps(chapter_figure)
    def draw(**values):
        calls.append(values)
        return chapter_figure(**values)

    sliders = {
        "active_keys": ipywidgets.FloatLogSlider(value=1e6, base=10, min=3, max=8, step=0.1),
        "rate_per_key": ipywidgets.FloatLogSlider(value=0.05, base=10, min=-3, max=1, step=0.1),
        "limit": ipywidgets.FloatLogSlider(value=1_000, base=10, min=0, max=5, step=0.1),
        "headroom": (0.0, 0.9, 0.05),
    }
    widget = explorer(draw, **sliders)
    assert len(calls) == 1 and calls[0]["headroom"] == 0.4  # the partial's value, not 0.5
    assert [c.description for c in widget.children[:4]] == list(sliders)
    widget.children[2].value = 100.0
    assert len(calls) == 2 and calls[-1]["limit"] == 100.0


def test_traffic_module_is_what_the_traces_use(small_traces):
    # The Poisson 1x trace is traffic.poisson at the limit's rate with the chapter's seed.
    expected = traffic.poisson(10.0, SMALL["duration_s"], seed=0)
    assert small_traces["Poisson 1x"].equals(expected)
